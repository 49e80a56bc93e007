"""NFA-ViT served from its own environment through the remote protocol, held to the golden fixture that
scripts/fixtures/nfavit.py made with the authors' inference (IMDL-BenCo's test dataset and the model's forward).

The served test needs what the lab does not ship: a BR-Gen checkout (FORENSICSLAB_NFAVIT_CODE) and the python of an
environment where the authors' network runs with the lab installed (FORENSICSLAB_NFAVIT_PYTHON); without them it is
skipped. The rest runs everywhere."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from forensicslab.detectors.paper.nfavit import CODE_ENV, authors_network, nfavit_input
from forensicslab.core import ForensicsLabError

FIX = Path(__file__).parent / "fixtures" / "nfavit"
CODE, PY = os.environ.get(CODE_ENV), os.environ.get("FORENSICSLAB_NFAVIT_PYTHON")


def test_the_input_is_imdlbenco_s_resized_and_normalised_image():
    rgb = np.asarray(Image.open(FIX / "input.png").convert("RGB"))
    x = nfavit_input(rgb)
    assert tuple(x.shape) == (1, 3, 512, 512) and str(x.dtype) == "torch.float32"
    # a flat grey image normalises to (v / 255 - mean) / std per channel, whatever the size
    flat = nfavit_input(np.full((37, 53, 3), 128, np.uint8))[0, :, 0, 0].numpy()
    assert np.allclose(flat, (128 / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225]), atol=1e-6)


def test_a_missing_checkout_is_one_line_naming_the_variable(tmp_path):
    with pytest.raises(ForensicsLabError, match=CODE_ENV) as e: authors_network(tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(not (CODE and PY), reason=f"needs a BR-Gen checkout ({CODE_ENV}) and the python of an environment "
                                               "running the authors' network with the lab (FORENSICSLAB_NFAVIT_PYTHON)")
def test_nfavit_served_from_its_own_environment_matches_the_authors_inference(tmp_path):
    gold = json.loads((FIX / "golden.json").read_text())
    env = {**os.environ, CODE_ENV: CODE, "FORENSICSLAB_WEIGHTS_DIR": str(tmp_path / "weights")}
    ckpt = tmp_path / "nfavit.pth"
    subprocess.run([PY, "-c", "import sys; from forensicslab.detectors.paper.nfavit import random_checkpoint; "
                    "random_checkpoint(sys.argv[1], seed=int(sys.argv[2]))", str(ckpt), str(gold["seed"])], env=env, check=True)
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == gold["checkpoint_sha256"], "the seeded weights differ from the fixture's"
    lab = Path(sys.executable).parent / "forensicslab"
    add = subprocess.run([str(lab), "weights", "add", "nfavit", str(ckpt)], env=env, capture_output=True, text=True, timeout=300)
    assert add.returncode == 0, add.stderr            # the layout check of the lab's own environment accepts the authors' layout
    server = subprocess.Popen([str(Path(PY).parent / "forensicslab"), "serve-detector", "nfavit", "--plugin",
                               "forensicslab.detectors.paper.nfavit", "--port", "0"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("serving"), (line, server.stderr.read()[-2000:] if server.poll() is not None else "")
        url = line.split(" on ")[1].split()[0]
        out = subprocess.run([str(lab), "detect", str(FIX / "input.png"), "--remote", f"nfavit={url}", "-d", "nfavit", "--json"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        from forensicslab.detectors.remote import RemoteDetector
        d = RemoteDetector(url).detect(FIX / "input.png")
    finally:
        server.terminate()
        server.wait(10)
    assert d.status == "ok", d.error
    assert abs(d.score - gold["score"]) <= 1e-5 and abs(d.raw["pred_label"] - gold["pred_label"]) <= 1e-5, (d.score, d.raw)
    assert d.score == pytest.approx(json.loads(out.stdout)["nfavit"]["score"], abs=1e-12)
    gmap = np.load(FIX / "map.npy")
    assert d.heatmap.shape == gmap.shape and np.abs(d.heatmap - gmap).max() <= 1e-5 + 0.5 / 65535   # the map travels as 16-bit PNG
