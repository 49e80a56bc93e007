"The learned detectors: shipped weights load and run, training code runs on a small synthetic set."
import numpy as np
import pytest
import torch
from PIL import Image

from forensicslab.core import Sample
from forensicslab.detectors.learned import WEIGHTS_DIR, FillSegNet, NPRNet, load_net, train_inpaint_net, train_npr
from forensicslab.detectors.pool import run_pool


def test_weights_ship_and_are_small():
    for kind in ("npr", "inpaint_net"):
        p = WEIGHTS_DIR / f"{kind}.safetensors"
        assert p.is_file(), f"{p} missing: train it with nbs/04i_train_detectors.ipynb"
        assert p.stat().st_size < 5 * 2**20
        load_net(kind)


@pytest.mark.parametrize("shape", [(16, 16, 3), (7, 5, 3), (300, 201, 3)])
def test_detectors_on_odd_sizes(shape):
    img = np.random.default_rng(0).integers(0, 255, shape, dtype=np.uint8)
    out = run_pool(img, ["npr", "inpaint_net"], timeout=60)
    for d in out.values():
        assert d.status == "ok", d.error
    assert out["inpaint_net"].heatmap.shape == shape[:2]


def _samples(tmp_path, n=4):
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        real = rng.integers(0, 255, (128, 128, 3), dtype=np.uint8)
        Image.fromarray(real).save(tmp_path / f"real{i}.png")
        out.append(Sample(id=f"r{i}", image=str(tmp_path / f"real{i}.png"), label=0))
        # "synthetic": nearest 2x up-sampling, the trace NPR looks for
        small = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
        Image.fromarray(small.repeat(2, 0).repeat(2, 1)).save(tmp_path / f"syn{i}.png")
        out.append(Sample(id=f"s{i}", image=str(tmp_path / f"syn{i}.png"), label=1, family="synthesis"))
        filled = real.copy(); filled[40:80, 40:80] = filled[40:80, 40:80].mean((0, 1)).astype(np.uint8)
        mask = np.zeros((128, 128), np.uint8); mask[40:80, 40:80] = 255
        Image.fromarray(filled).save(tmp_path / f"fill{i}.png"); Image.fromarray(mask).save(tmp_path / f"fill{i}_mask.png")
        out.append(Sample(id=f"f{i}", image=str(tmp_path / f"fill{i}.png"), label=1, family="gen_inpaint",
                          mask=str(tmp_path / f"fill{i}_mask.png")))
    return out


def test_training_runs_and_learns_the_easy_case(tmp_path):
    torch.set_num_threads(1)
    samples = _samples(tmp_path)
    m = train_npr(samples, steps=60, batch=8, log=None)
    assert isinstance(m, NPRNet)
    x_syn = torch.from_numpy(np.asarray(Image.open(tmp_path / "syn0.png"))).permute(2, 0, 1).float()[None] / 255
    x_real = torch.from_numpy(np.asarray(Image.open(tmp_path / "real0.png"))).permute(2, 0, 1).float()[None] / 255
    with torch.no_grad():
        assert m(x_syn).item() > m(x_real).item(), "nearest-upsampled images must score above noise after training"
    f = train_inpaint_net(samples, steps=3, batch=4, crop=64, log=None)
    assert isinstance(f, FillSegNet)


def test_training_refuses_without_positives(tmp_path):
    samples = [s for s in _samples(tmp_path, 1) if s.label == 0]
    with pytest.raises(ValueError, match="needs synthesis"):
        train_npr(samples, steps=1)
