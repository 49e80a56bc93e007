"""The paper pool's CLIP-based adapters against their authors' code: golden fixtures made by scripts/fixtures/<id>.py
from the official repositories (random weights from a seeded rule, the official checkpoint layout, the official
preprocessing and forward pass) are regenerated here, written in the official layout, loaded through each adapter's
real loader (strict) from the weights folder, and must give the official outputs to 1e-5. Reduced-width fixtures run
by default (seconds); full ViT-L/14 ones are slow."""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from forensicslab.detectors.imdl import CheckpointError
from forensicslab.detectors.paper import backbones as bb
from forensicslab.detectors.weights import WEIGHTS_ENV, WeightsError
from forensicslab.detectors.paper.clipsid import ClipSID
from forensicslab.detectors.paper.d3 import D3, permutation
from forensicslab.detectors.paper.effort import Effort
from forensicslab.imageio import load_image

FIX = Path(__file__).parent / "fixtures" / "pool"
TOL = 1e-5


def fixture(name: str) -> dict:
    return json.loads((FIX / f"{name}.json").read_text())


def install(fx: dict, root: Path) -> Path:
    "Regenerate every file of a fixture (its digest must match), write it in its official layout under root/<id>/."
    folder = root / fx["id"]
    folder.mkdir(parents=True, exist_ok=True)
    for fname, f in fx["files"].items():
        sd = bb.random_state(f["manifest"], fx["seed"])
        assert bb.state_digest(sd) == f["digest"], f"{fname}: regenerated weights differ from the fixture's"
        obj = {"model": sd} if f["layout"] == "{'model': state_dict}" else sd
        torch.save(obj, folder / fname)
    return folder


def image(fx: dict):
    return load_image(np.asarray(Image.open(io.BytesIO(base64.b64decode(fx["input_png"]))).convert("RGB")))


@pytest.fixture
def weights_root(tmp_path, monkeypatch):
    monkeypatch.setenv(WEIGHTS_ENV, str(tmp_path))
    return tmp_path


def check_clipsid(name, root):
    fx = fixture(name)
    install(fx, root)
    d = ClipSID().detect(image(fx))
    assert abs(d.raw["llr_score"] - fx["expected"]["llr_score"]) < TOL
    assert abs(d.score - fx["expected"]["score"]) < TOL
    return d


def check_d3(name, root):
    fx = fixture(name)
    install(fx, root)
    s = fx["shuffle"]
    assert permutation(len(s["permutation"]), s["seed"]).tolist() == s["permutation"]
    det = D3(shuffle_seed=s["seed"])
    d = det.detect(image(fx))
    assert abs(d.raw["logit"] - fx["expected"]["logit"]) < TOL
    assert abs(d.score - fx["expected"]["fake_score"]) < TOL
    # the shuffle matters, and another seed reproduces the official pass made with that seed
    other, _ = det.forward(image(fx).rgb, seed=s["seed"] + 1)
    assert abs(other - s["logit_with_seed_plus_1"]) < TOL and abs(other - d.raw["logit"]) > 10 * TOL
    return d


def check_effort(name, root):
    fx = fixture(name)
    install(fx, root)
    d = Effort().detect(image(fx))
    assert np.abs(np.array(d.raw["logits"]) - np.array(fx["expected"]["logits"])).max() < TOL
    assert abs(d.score - fx["expected"]["fake_prob"]) < TOL
    return d


def test_clipsid_matches_official_code_small(weights_root):
    check_clipsid("clipsid_small", weights_root)


def test_d3_matches_official_code_small(weights_root):
    check_d3("d3_small", weights_root)


def test_effort_matches_official_code_small(weights_root):
    check_effort("effort_small", weights_root)


@pytest.mark.slow
@pytest.mark.parametrize("name,check", [("clipsid_full", check_clipsid), ("d3_full", check_d3)])
def test_full_size_matches_official_code(name, check, weights_root):
    if not (FIX / f"{name}.json").is_file(): pytest.fail(f"{name}.json missing: run scripts/fixtures/{name.split('_')[0]}.py --full")
    check(name, weights_root)


def test_a_changed_weight_changes_the_output(weights_root):
    "The fixtures can fail: one perturbed head weight moves clipsid's output by more than the tolerance."
    fx = fixture("clipsid_small")
    folder = install(fx, weights_root)
    obj = torch.load(folder / "weights.pth", weights_only=True)
    obj["model"]["fc.bias"] += 1e-3
    torch.save(obj, folder / "weights.pth")
    assert abs(ClipSID().detect(image(fx)).raw["llr_score"] - fx["expected"]["llr_score"]) > 10 * TOL


def test_files_that_do_not_fit_give_one_line(weights_root):
    fx = fixture("effort_small")
    folder = install(fx, weights_root)
    sd = torch.load(folder / "effort.pth", weights_only=True)
    sd.pop("backbone.encoder.layers.0.self_attn.q_proj.U_residual")
    torch.save({"state_dict": {"module." + k: v for k, v in sd.items()}}, folder / "effort.pth")
    with pytest.raises(CheckpointError) as e: Effort()
    msg = str(e.value)
    assert "\n" not in msg and "missing backbone.encoder.layers.0.self_attn.q_proj.U_residual" in msg and "drive.google" in msg
    (folder / "effort.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="effort: effort.pth is not a readable tensor checkpoint"): Effort()
    (folder / "effort.pth").unlink()
    with pytest.raises(WeightsError, match="effort: weight file effort.pth is not installed"): Effort()


def test_pickled_code_is_refused(weights_root):
    "weights_only=True: a checkpoint that pickles a Python object is not read."
    fx = fixture("clipsid_small")
    folder = install(fx, weights_root)
    torch.save({"model": {"fc.weight": torch.zeros(1, 128), "fc.bias": torch.zeros(1)}, "args": Path("x")}, folder / "weights.pth")
    with pytest.raises(CheckpointError, match="not a readable tensor checkpoint"): ClipSID()


def test_identical_backbones_are_shared_and_run_once(weights_root):
    fx = fixture("d3_small")
    install(fx, weights_root)
    a, b = D3(shuffle_seed=0), D3(shuffle_seed=5)
    assert a.vit is b.vit
    a.vit.clear()
    n0 = a.vit.forwards
    img = image(fx)
    a.detect(img)
    b.detect(img)
    # a: shuffled + original; b: its own shuffle, the original pass is reused
    assert a.vit.forwards - n0 == 3
    c = D3(random_init=1, spec=a.vit.spec)
    assert c.vit is not a.vit and c.vit.digest != a.vit.digest


def test_check_weights_refuses_a_file_that_does_not_fit(weights_root):
    "What `forensicslab weights add` runs before installing: a fitting file passes, a wrong one gives one line."
    from forensicslab.detectors.paper import clipsid, effort
    folder = install(fixture("effort_small"), weights_root)
    effort.check_weights(folder / "effort.pth")
    torch.save({"model": {"fc.weight": torch.zeros(1, 768), "fc.bias": torch.zeros(1)}}, weights_root / "weights.pth")
    with pytest.raises(CheckpointError, match=r"clipsid: checkpoint does not fit .*shape weight \(1, 768\) != \(1, 1024\)"):
        clipsid.check_weights(weights_root / "weights.pth")
