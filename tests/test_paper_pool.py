"""The paper's detector pool (issue 26): TruFor against the authors' code through golden fixtures, in both checkpoint
layouts and through the real loader; weights management; the paper preset; families apart."""
import argparse
import base64
import json
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from forensicslab.core import FAMILIES, ToolCard
from forensicslab.detectors import pool as P
from forensicslab.detectors.cli import detect_cmd, weights_app
from forensicslab.detectors.imdl import CheckpointError, read_state
from forensicslab.detectors.paper.pool import PAPER_POOL, paper_pool, paper_sources, resolve_pool
from forensicslab.detectors.paper.trufor import TruFor, TruForNet, load_trufor
from forensicslab.detectors.weights import WEIGHTS_ENV, WeightsError, add_weights, golden_state, weights_record
from forensicslab.imageio import load_image

FIX = Path(__file__).parent / "fixtures" / "pool"
ARCH_KEYS = ("dims", "heads", "depths", "embed")


def _fixture(variant):
    fx = json.loads((FIX / f"trufor_{variant}.json").read_text())
    return fx, {k: fx["arch"][k] for k in ARCH_KEYS}


def _write_layouts(state, d: Path) -> dict:
    "The same tensors in the authors' layout and in IMDL-BenCo's (with its pickled Namespace)."
    torch.save({"epoch": 0, "state_dict": state}, d / "trufor.pth.tar")
    torch.save({"model": {"model." + k: v for k, v in state.items()}, "optimizer": {}, "epoch": 3, "scaler": {},
                "args": argparse.Namespace(model="Trufor", image_size=512, lr=1e-4, data_path="/data/CASIA2")}, d / "imdl.pth")
    return {"official": d / "trufor.pth.tar", "imdlbenco": d / "imdl.pth"}


def _assert_matches(det: TruFor, fx: dict):
    e = fx["expected"]
    r = det.detect(load_image(base64.b64decode(fx["input_png"])))
    assert r.heatmap.shape == tuple(e["map_shape"])
    assert abs(r.score - e["score"]) < 1e-5
    assert abs(r.raw["det_logit"] - e["det_logit"]) < 1e-5
    assert abs(float(r.heatmap.mean()) - e["map_mean"]) < 1e-5
    assert np.abs(r.heatmap[::8, ::8] - np.array(e["map_grid"])).max() < 1e-5
    assert abs(r.raw["conf_mean"] - e["conf_mean"]) < 1e-5


def _check(variant, tmp_path):
    fx, arch = _fixture(variant)
    state = golden_state(fx["manifest"], fx["seed"])
    for layout, path in _write_layouts(state, tmp_path).items():
        det = TruFor(path, arch=arch, protocol="official")
        assert det.layout == layout
        _assert_matches(det, fx)


def test_trufor_small_fixture_both_layouts(tmp_path):
    "Reduced-width TruFor (the authors' mit_b0 widths): the adapter reproduces the official outputs to 1e-5 in both layouts."
    _check("small", tmp_path)


def test_trufor_fixture_fails_when_the_network_differs(tmp_path):
    "The check can fail: the confidence decoder's batch-norm eps set like the anomaly decoder's moves the score."
    fx, arch = _fixture("small")
    det = TruFor(_write_layouts(golden_state(fx["manifest"], fx["seed"]), tmp_path)["official"], arch=arch)
    det.net.decode_head_conf.linear_fuse[1].eps = 1e-3
    with pytest.raises(AssertionError): _assert_matches(det, fx)
    det2 = TruFor(tmp_path / "trufor.pth.tar", arch=arch, protocol="imdlbenco")   # IMDL-BenCo's input convention differs
    with pytest.raises(AssertionError): _assert_matches(det2, fx)


@pytest.mark.slow
def test_trufor_full_fixture_both_layouts(tmp_path):
    "TruFor as released (68.7 M parameters, 952 keys) against the official code, both layouts."
    fx, arch = _fixture("full")
    assert len(fx["manifest"]) == 952 and arch == dict(dims=[64, 128, 320, 512], heads=[1, 2, 5, 8], depths=[3, 4, 6, 3], embed=512)
    _check("full", tmp_path)


def test_trufor_checkpoints_read_safely(tmp_path):
    "The Namespace is the one class allowed; any other pickled object, or a misfit, is one line naming the download page."
    sd = {"w": torch.ones(3)}
    torch.save({"model": {"model.w": sd["w"]}, "args": argparse.Namespace(a=1)}, tmp_path / "ok.pth")
    assert read_state(tmp_path / "ok.pth")[1] == "imdlbenco"
    torch.save({"model": {"model.w": sd["w"]}, "args": PurePosixPath("/etc")}, tmp_path / "other.pth")   # any other class
    with pytest.raises(CheckpointError, match="not a safely readable checkpoint"): read_state(tmp_path / "other.pth")
    torch.save({"state_dict": sd}, tmp_path / "small.pth.tar")
    with pytest.raises(CheckpointError) as e: load_trufor(tmp_path / "small.pth.tar")
    msg = str(e.value)
    assert "\n" not in msg and "952 missing" in msg and "1 unexpected" in msg and "github.com/grip-unina/TruFor" in msg


def test_trufor_state_dict_is_the_authors():
    "The adapter's parameter names are those of the official checkpoint (manifest made from the official code)."
    fx, _ = _fixture("full")
    sd = TruForNet().state_dict()
    assert sorted([k, list(v.shape), str(v.dtype)] for k, v in sd.items()) == sorted(fx["manifest"])


def test_weights_add_and_list(tmp_path, monkeypatch):
    "weights add refuses a wrong archive in one line, installs the user's own file as unverified, the card says so."
    monkeypatch.setenv(WEIGHTS_ENV, str(tmp_path / "w"))
    paper_sources()
    fx, arch = _fixture("small")
    z = tmp_path / "TruFor_weights.zip"
    with zipfile.ZipFile(z, "w") as f: f.writestr("weights/trufor.pth.tar", b"x")
    with pytest.raises(WeightsError, match="has md5 .* the published TruFor_weights.zip has 7bee48f3476c75616c3c5721ab256ff8"):
        add_weights("trufor", z)
    with pytest.raises(WeightsError, match="not a safely readable checkpoint"): add_weights("trufor", z, unverified=True)
    assert not (tmp_path / "w" / "trufor" / "trufor.pth.tar").exists()          # a refused file is not installed
    pth = _write_layouts(golden_state(fx["manifest"], fx["seed"]), tmp_path)["official"]
    with pytest.raises(WeightsError, match="publish a checksum of TruFor_weights.zip only"): add_weights("trufor", pth)
    with pytest.raises(WeightsError, match="does not fit the network"):          # reduced width: not the released network
        add_weights("trufor", pth, unverified=True)
    rows = {r["id"]: r for r in json.loads(CliRunner().invoke(_app(), ["weights", "list", "--json"]).output)}
    assert list(rows) == list(PAPER_POOL) and rows["trufor"]["installed"] == "no"
    assert "CC BY-NC 4.0" in rows["effort"]["licence_weights"] and rows["radar"]["get_from"].startswith("https://github.com/")


def _app():
    import typer
    app = typer.Typer()
    app.add_typer(weights_app, name="weights")
    app.command("detect")(detect_cmd)
    return app


@pytest.mark.slow
def test_weights_add_then_detect_json(tmp_path, monkeypatch):
    "The issue's check: a full-size official-layout file through `weights add trufor FILE --unverified`, then `detect -d trufor --json`."
    monkeypatch.setenv(WEIGHTS_ENV, str(tmp_path / "w"))
    fx, _ = _fixture("full")
    pth = _write_layouts(golden_state(fx["manifest"], fx["seed"]), tmp_path)["official"]
    r = CliRunner().invoke(_app(), ["weights", "add", "trufor", str(pth), "--unverified"])
    assert r.exit_code == 0 and "UNVERIFIED" in r.output, r.output
    img = tmp_path / "in.png"
    img.write_bytes(base64.b64decode(fx["input_png"]))
    P.unregister("trufor")
    P.register("trufor", replace=True)(TruFor)
    assert "trufor" in paper_pool() and resolve_pool("paper") == [i for i in PAPER_POOL if i in paper_pool()]
    r = CliRunner().invoke(_app(), ["detect", str(img), "-d", "trufor", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)["trufor"]
    assert abs(d["score"] - fx["expected"]["score"]) < 1e-5 and d["raw"]["weights_verified"] is False
    assert weights_record("trufor")["verified"] is False


def test_paper_pool_is_opt_in_and_families_apart():
    "The paper's adapters never join the default pool; RADAR's family and TruFor's are apart, gen_inpaint covers both."
    paper_sources()
    assert "trufor" in P.list_detectors(include_opt_in=True) and "trufor" not in P.list_detectors()
    assert {"diffusion_inpaint", "gan_inpaint"} <= set(FAMILIES)
    card = TruFor.card
    assert card.in_scope("gan_inpaint") and not card.in_scope("diffusion_inpaint") and TruFor.max_side is None
    gen = ToolCard(id="g", name="g", scope=["gen_inpaint"], native_metric="p", normalisation="identity", score_reading="p")
    assert gen.in_scope("diffusion_inpaint") and gen.in_scope("gan_inpaint")


@pytest.mark.slow
def test_manifest_with_both_inpainting_families_runs_table4_with_the_paper_pool(tmp_path, monkeypatch):
    "The issue's check: a manifest naming diffusion_inpaint and gan_inpaint goes through Table 4 with `pool=paper`."
    from PIL import Image
    from forensicslab.studies import run_study
    monkeypatch.setenv(WEIGHTS_ENV, str(tmp_path / "w"))
    fx, _ = _fixture("full")
    add_weights("trufor", _write_layouts(golden_state(fx["manifest"], fx["seed"]), tmp_path)["official"], unverified=True)
    rng, rows = np.random.default_rng(0), ["image,label,family"]
    for i, fam in enumerate(["", "", "diffusion_inpaint", "gan_inpaint"]):
        Image.fromarray((rng.random((64, 80, 3)) * 255).astype(np.uint8)).save(tmp_path / f"im{i}.png")
        rows.append(f"{tmp_path / f'im{i}.png'},{int(bool(fam))},{fam}")
    (tmp_path / "m.csv").write_text("\n".join(rows) + "\n")
    run_study("triage_table4", {"quick": True, "dataset": f"manifest:{tmp_path / 'm.csv'}", "pool": "paper",
                                "provenance": False, "axis": False}, out_dir=tmp_path / "t4", progress=False)
    meta = json.loads((tmp_path / "t4" / "run.json").read_text())
    assert meta["backends"]["pool"] == "paper" and meta["backends"]["detectors"] == ["trufor"], meta["backends"]
    assert "Algorithmic fusion" in (tmp_path / "t4" / "table4.csv").read_text()
