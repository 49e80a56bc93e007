"""Issue 47: `forensicslab zoom IMAGE` with no `--policy` runs the survey of the built-in detectors over the whole
image (evidence the offline instruments support on photographs), not the artifact-cue rules, whose thresholds were
fitted on the synthetic artifact benchmark and which called the README's own authentic example photo fake."""
import json

from PIL import Image
from typer.testing import CliRunner

from forensicslab.cli import app
from forensicslab.data.photos import photo


def _zoom(*args):
    r = CliRunner().invoke(app, ["zoom", *map(str, args)])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_default_is_the_survey_and_the_readme_photo_is_real(tmp_path):
    img = tmp_path / "photo.jpg"
    Image.fromarray(photo("coffee")).save(img)          # the README's example, saved the way its set-up line saves it
    out = _zoom(img)
    assert out["policy"] == "rules:survey_top", out["policy"]
    assert out["answer"]["verdict"] == "real", out["answer"]
    assert "survey" in out["about"] and "not a trained model" in out["about"]


def test_default_flags_a_copy_move_in_the_same_photo(tmp_path):
    "Not a policy that always says real: a block pasted elsewhere in the photo is fake, with a box on the pasted block."
    a = photo("coffee").copy()
    a[200:280, 360:440] = a[40:120, 40:120]
    img = tmp_path / "cm.png"
    Image.fromarray(a).save(img)
    out = _zoom(img)
    assert out["answer"]["verdict"] == "fake", out["answer"]
    boxes = [e["bbox"] for e in out["answer"]["evidence"] if e["bbox"]]
    assert any(x1 < 440 and x2 > 360 and y1 < 280 and y2 > 200 for x1, y1, x2, y2 in boxes), boxes


def test_rules_policy_still_named_explicitly(tmp_path):
    img = tmp_path / "photo.jpg"
    Image.fromarray(photo("coffee")).save(img)
    out = _zoom(img, "--policy", "rules")
    assert out["policy"].startswith("rules:v2") and "rule-based offline baseline" in out["about"]
