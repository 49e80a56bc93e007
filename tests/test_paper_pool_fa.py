"""Forensics Adapter against its authors' code: the golden fixture made by scripts/fixtures/forensicsadapter.py from the
official repository (random weights from a seed per tensor key, the official preprocessing and forward pass, the fusion
layers drawn right after `torch.manual_seed(fusion_seed)`) is regenerated here, written in the official layout (the
bare `DS` state dict, aliases sharing their tensors) and loaded through the adapter's real loader, strictly. The
reduced-CLIP fixture runs by default; the full ViT-L/14 one is slow."""
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
from forensicslab.detectors.paper import forensicsadapter as fa
from forensicslab.detectors.paper.forensicsadapter import ForensicsAdapter
from forensicslab.detectors.weights import WEIGHTS_ENV, WeightsError
from forensicslab.imageio import load_image

FIX = Path(__file__).parent / "fixtures" / "pool"
TOL = 1e-5


def fixture(name: str) -> dict:
    return json.loads((FIX / f"{name}.json").read_text())


def official_state(fx: dict) -> dict:
    "The fixture's weights (digest checked), each alias the very tensor it names, as a saved `DS` state dict holds them."
    f = fx["files"]["forensicsadapter.pth"]
    rule = f["aliases"]
    assert rule == fa.ALIASES

    def alias(k):
        return next((b + k[len(a):] for a, b in rule.items() if k.startswith(a)), None)
    sd = bb.random_state([m for m in f["manifest"] if alias(m[0]) is None], fx["seed"])
    sd = {n: sd[alias(n) or n] for n, _, _ in f["manifest"]}
    assert bb.state_digest(sd) == f["digest"], "regenerated weights differ from the fixture's"
    assert len(sd) == fx["n_keys"]
    return sd


def install(fx: dict, root: Path, sd: dict | None = None) -> Path:
    folder = root / "forensicsadapter"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(official_state(fx) if sd is None else sd, folder / "forensicsadapter.pth")
    return folder


def images(fx: dict):
    return [load_image(np.asarray(Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB"))) for b in fx["input_png"]]


def close(ours, expected) -> bool:
    "Within 1e-5 of the largest expected magnitude (per-query sums of many float32 terms)."
    e = np.asarray(expected, dtype=np.float64)
    return float(np.abs(np.asarray(ours, dtype=np.float64) - e).max()) <= TOL * max(1.0, float(np.abs(e).max()))


@pytest.fixture(scope="module")
def small_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fa_weights")
    install(fixture("forensicsadapter_small"), root)
    return root


@pytest.fixture
def weights_root(small_root, monkeypatch):
    monkeypatch.setenv(WEIGHTS_ENV, str(small_root))
    return small_root


def check(fx: dict, det: ForensicsAdapter) -> None:
    e = fx["expected"]
    assert det.fusion_seed == fx["fusion_seed"]
    for i, img in enumerate(images(fx)):
        trace = {}
        z = det.logits(img.rgb, trace=trace)
        assert np.abs(z.numpy() - np.array(e["logits"][i])).max() < TOL
        assert close(trace["attn_bias"].double().sum(dim=(1, 3, 4))[0], e["intermediate"]["attn_bias_sum_per_query"][i])
        assert close(trace["queries"].double().sum(dim=-1)[0], e["intermediate"]["queries_sum_per_query"][i])
        d = det.detect(img)
        assert abs(d.score - e["fake_prob"][i]) < TOL and d.raw["fusion_seed"] == fx["fusion_seed"]
    # the fusion layers are drawn: another seed reproduces the official pass made with that seed, and moves the bias
    trace = {}
    z = det.logits(images(fx)[0].rgb, fusion_seed=fx["fusion_seed"] + 1, trace=trace)
    assert np.abs(z.numpy() - np.array(e["logits_fusion_seed_plus_1"][0])).max() < TOL
    other = e["intermediate_fusion_seed_plus_1"]["attn_bias_sum_per_query"][0]
    assert close(trace["attn_bias"].double().sum(dim=(1, 3, 4))[0], other)
    assert not close(other, e["intermediate"]["attn_bias_sum_per_query"][0])


def test_matches_official_code_small(weights_root):
    fx = fixture("forensicsadapter_small")
    det = ForensicsAdapter()   # the real loader: weights folder, weights_only, strict
    assert det.spec.clip.width == fx["official"]["clip"]["width"] and det.spec.text_layers == fx["official"]["clip"]["text_layers"]
    check(fx, det)


@pytest.mark.slow
def test_matches_official_code_full(tmp_path, monkeypatch):
    if not (FIX / "forensicsadapter_full.json").is_file():
        pytest.fail("forensicsadapter_full.json missing: run scripts/fixtures/forensicsadapter.py --full")
    fx = fixture("forensicsadapter_full")
    assert fx["n_keys"] == 1253
    monkeypatch.setenv(WEIGHTS_ENV, str(tmp_path))
    install(fx, tmp_path)
    det = ForensicsAdapter()
    assert det.spec == fa.FASpec()
    check(fx, det)


@pytest.mark.parametrize("key", ["adapter.mask_decoder.bias_scaling.weight", "clip_model.visual.transformer.resblocks.20.mlp.c_fc.bias"])
def test_a_changed_weight_changes_the_output(key, tmp_path):
    "The fixture can fail: one perturbed tensor, of the adapter or of CLIP's second pass, moves the outputs past the tolerance."
    fx = fixture("forensicsadapter_small")
    sd = official_state(fx)
    sd[key] = sd[key] + 0.5
    sd.update({k: sd[key] for k in sd if fa.alias_of(k) == key})   # its aliases too, as a saved DS holds them
    torch.save(sd, tmp_path / "changed.pth")
    trace = {}
    ForensicsAdapter(checkpoint=tmp_path / "changed.pth").logits(images(fx)[0].rgb, trace=trace)
    assert not close(trace["queries"].double().sum(dim=-1)[0], fx["expected"]["intermediate"]["queries_sum_per_query"][0])


def test_files_that_do_not_fit_give_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(WEIGHTS_ENV, str(tmp_path))
    fx = fixture("forensicsadapter_small")
    sd = official_state(fx)
    bad = dict(sd, **{"rec_attn_clip.proj": sd["rec_attn_clip.proj"] + 1})   # an alias that disagrees
    torch.save(bad, tmp_path / "alias.pth")
    with pytest.raises(CheckpointError, match=r"^forensicsadapter: 1 aliased tensors differ .*rec_attn_clip.proj") as e:
        ForensicsAdapter(checkpoint=tmp_path / "alias.pth")
    assert "\n" not in str(e.value)
    torch.save({k: v for k, v in sd.items() if k != "clip_post_process.second_process.4.bias"}, tmp_path / "missing.pth")
    with pytest.raises(CheckpointError, match="missing clip_post_process.second_process.4.bias"):
        fa.check_weights(tmp_path / "missing.pth")
    torch.save(dict(sd, extra=torch.zeros(1)), tmp_path / "extra.pth")
    with pytest.raises(CheckpointError, match="unexpected extra"):
        fa.check_weights(tmp_path / "extra.pth")
    torch.save({"state_dict": {"module." + k: v for k, v in sd.items()}}, tmp_path / "wrapped.pth")
    fa.check_weights(tmp_path / "wrapped.pth")   # a DataParallel / wrapped save is the same layout
    torch.save({"head.weight": torch.zeros(2, 4)}, tmp_path / "other.pth")
    with pytest.raises(CheckpointError, match="not a Forensics Adapter checkpoint"):
        fa.check_weights(tmp_path / "other.pth")
    with pytest.raises(WeightsError, match="forensicsadapter: weight file forensicsadapter.pth is not installed"):
        ForensicsAdapter()


def test_pickled_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self): return (print, ("ran",))
    torch.save({"clip_model.visual.conv1.weight": Evil()}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError, match="not a readable tensor checkpoint"):
        fa.check_weights(tmp_path / "evil.pth")


def test_registered_opt_in_with_its_weights_source(weights_root):
    from forensicslab.detectors.paper.pool import paper_pool, paper_sources
    from forensicslab.detectors.pool import OPT_IN, list_detectors
    assert "forensicsadapter" in OPT_IN and "forensicsadapter" not in list_detectors()
    src = paper_sources()["forensicsadapter"]
    assert src.files[0].name == "forensicsadapter.pth" and src.check is fa.check_weights and "1,253 keys" in src.layout
    assert "forensicsadapter" in paper_pool()   # its weights are installed in weights_root
    assert ForensicsAdapter.card.version != "remote"
