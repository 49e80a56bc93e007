#!/usr/bin/env python
"""Make NFA-ViT's golden fixture (tests/fixtures/nfavit/) with the authors' own inference, in their environment.

Run it with the python of an environment where IMDL-BenCo is installed (the authors' requirements; the lab installed
beside it for `random_checkpoint`), with a BR-Gen checkout named by FORENSICSLAB_NFAVIT_CODE:

    FORENSICSLAB_NFAVIT_CODE=~/BR-Gen ~/venvs/nfavit/bin/python scripts/make_nfavit_fixture.py

It writes a seeded random NFA-ViT checkpoint (`forensicslab.detectors.paper.nfavit.random_checkpoint`, seed 0: the
published architecture, no forensic meaning), builds the model as IMDL-BenCo's tester does (the class from
IMDL-BenCo's own model registry, its three init files, then `load_state_dict` of the checkpoint's `model` entry),
reads a test image through IMDL-BenCo's `ManiDataset` with resizing to 512 x 512 (the tester's `--if_resizing
--image_size 512`), runs the model's forward with the dataset's mask and label, and records what the lab's adapter
must reproduce: the mean of the top 1 % of `pred_mask` (the card's native metric), `pred_label`, and the mask brought
to the image's size with OpenCV's bilinear resize (the adapter's map). The test image is drawn here (seeded): a smooth
scene with a pasted noisy patch. tests/test_nfavit.py serves the adapter from such an environment and compares.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nfavit"
SEED = 0


def test_image(width: int = 160, height: int = 120) -> np.ndarray:
    "A seeded RGB test image: smooth colour gradients with a noisy rectangle pasted in (uint8)."
    rng = np.random.default_rng(SEED)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.stack([96 + 80 * np.sin(x / 23), 128 + 60 * np.cos(y / 17), 90 + 0.6 * x], -1)
    img[30:70, 60:120] = 140 + 40 * rng.standard_normal((40, 60, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def main() -> int:
    import cv2
    import torch
    from IMDLBenCo.datasets import ManiDataset
    from IMDLBenCo.registry import MODELS
    from forensicslab.detectors.paper.nfavit import _INIT_PARTS, authors_network, random_checkpoint, top1pct_mean

    code = Path(os.path.expanduser(os.environ["FORENSICSLAB_NFAVIT_CODE"]))
    authors_network(code)                        # with IMDL-BenCo installed, its registry records the class
    OUT.mkdir(parents=True, exist_ok=True)
    rgb = test_image()
    Image.fromarray(rgb).save(OUT / "input.png")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        ckpt = random_checkpoint(d / "nfavit.pth", seed=SEED, code=code)
        digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
        state = torch.load(ckpt, map_location="cpu", weights_only=False)["model"]   # as IMDL-BenCo's misc.load_model reads it
        init = {}
        for k, prefix in _INIT_PARTS.items():
            init[k] = str(d / f"{k}.pth")
            torch.save({n[len(prefix):]: t for n, t in state.items() if n.startswith(prefix)}, init[k])
        model = MODELS.get("NFA_ViT_modify1")(np_pretrain_weights=init["np"], seg_b0_pretrain_weights=init["b0"],
                                              seg_b2_pretrain_weights=init["b2"])
        model.load_state_dict(state)
        model.eval()
        (d / "set" / "Tp").mkdir(parents=True)
        (d / "set" / "Gt").mkdir()
        Image.fromarray(rgb).save(d / "set" / "Tp" / "input.png")
        Image.fromarray(np.zeros_like(rgb)).save(d / "set" / "Gt" / "input.png")
        item = ManiDataset(str(d / "set"), is_resizing=True, output_size=(512, 512))[0]
        with torch.no_grad():
            out = model(image=item["image"][None], mask=item["mask"][None], label=torch.tensor([item["label"]]))
    mask = out["pred_mask"][0, 0].float().numpy()
    heat = cv2.resize(mask, (rgb.shape[1], rgb.shape[0]), interpolation=cv2.INTER_LINEAR)
    np.save(OUT / "map.npy", heat.astype(np.float32))
    commit = subprocess.run(["git", "-C", str(code), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    golden = dict(seed=SEED, checkpoint_sha256=digest, score=top1pct_mean(mask), pred_label=float(out["pred_label"]),
                  mask_mean=float(mask.mean()), image="input.png", map="map.npy", brgen_commit=commit or os.environ.get("BRGEN_COMMIT", "unknown"),
                  made_with={p: md.version(p) for p in ("imdlbenco", "torch", "numpy", "albumentations", "opencv-python-headless")
                             if _has(p)}, python=sys.version.split()[0])
    (OUT / "golden.json").write_text(json.dumps(golden, indent=1) + "\n")
    print(json.dumps(golden, indent=1))
    return 0


def _has(dist: str) -> bool:
    try: md.version(dist); return True
    except md.PackageNotFoundError: return False


if __name__ == "__main__":
    sys.exit(main())
