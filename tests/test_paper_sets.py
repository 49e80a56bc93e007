"""The triage paper's own sets (issue 48 item 4): the in-distribution set's seven detector-keyed groups, the Adobe
Firefly edits, and the paper's diffusion / GAN inpainting split wherever the data says which inpainter made an image.
Every fixture is a few tiny images written here with PIL; nothing is downloaded."""
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from forensicslab.core import FAMILY_PARENTS, ForensicsLabError
from forensicslab.data import datasets as ds
from forensicslab.runs import project_root


def _img(path: Path, seed: int = 0, mask: bool = False) -> Path:
    "A 16x12 random RGB image (PNG or JPEG by suffix), or a 0/255 mask."
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    if mask:
        a = np.zeros((12, 16), np.uint8); a[3:8, 4:10] = 255
        Image.fromarray(a).save(path)
    else:
        Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)).save(path, **({"quality": 90} if path.suffix == ".jpg" else {}))
    return path


def _paper_id(root: Path) -> Path:
    "All seven groups: authentic images, fakes directly under fake/ and in family and inpainter subfolders, two masks."
    _img(root / "Cozzolino/real/coco_1.jpg"); _img(root / "Cozzolino/fake/ldm_1.png", 1)
    _img(root / "d3/authentic/r.jpg", 2); _img(root / "d3/manipulated/midj.png", 3)
    _img(root / "effort/real/ff_real.png", 4); _img(root / "effort/fake/ff_df.png", 5)
    _img(root / "ForensicsAdapter/fake/ff_fs.jpg", 6)
    _img(root / "radar/fake/r_sd.png", 7); _img(root / "radar/masks/r_sd.png", mask=True); _img(root / "radar/real/r0.jpg", 8)
    _img(root / "NFA-ViT/fake/LaMa/b1.png", 9); _img(root / "NFA-ViT/fake/SD-XL/b2.png", 10); _img(root / "NFA-ViT/fake/b3.png", 11)
    _img(root / "trufor/fake/splice/cm1.jpg", 12); _img(root / "trufor/fake/gan_inpaint/g1.png", 13)
    _img(root / "trufor/mask/g1.png", mask=True); _img(root / "trufor/pristine/p1.jpg", 14)
    return root


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, ForensicsLabError), msg
    return msg


def test_paper_id_layout_groups_and_families(tmp_path):
    ss = ds.load_paper_id(_paper_id(tmp_path / "id"))
    got = {s.id: (s.label, s.family, s.provenance["group"]) for s in ss}
    assert got == {
        "paper_id/clipsid/ldm_1": (1, "synthesis", "clipsid"), "paper_id/clipsid/real/coco_1": (0, None, "clipsid"),
        "paper_id/d3/midj": (1, "synthesis", "d3"), "paper_id/d3/real/r": (0, None, "d3"),
        "paper_id/effort/ff_df": (1, "face", "effort"), "paper_id/effort/real/ff_real": (0, None, "effort"),
        "paper_id/forensicsadapter/ff_fs": (1, "face", "forensicsadapter"),
        "paper_id/radar/r_sd": (1, "diffusion_inpaint", "radar"), "paper_id/radar/real/r0": (0, None, "radar"),
        "paper_id/nfavit/LaMa/b1": (1, "gan_inpaint", "nfavit"), "paper_id/nfavit/SD-XL/b2": (1, "diffusion_inpaint", "nfavit"),
        "paper_id/nfavit/b3": (1, None, "nfavit"),   # NFA-ViT declares diffusion and GAN inpainting: not guessed
        "paper_id/trufor/splice/cm1": (1, "splice", "trufor"), "paper_id/trufor/gan_inpaint/g1": (1, "gan_inpaint", "trufor"),
        "paper_id/trufor/real/p1": (0, None, "trufor")}
    by = {s.id: s for s in ss}
    assert by["paper_id/nfavit/LaMa/b1"].provenance == {"group": "nfavit", "family_from": "inpainter", "inpainter": "LaMa"}
    assert by["paper_id/trufor/splice/cm1"].provenance["family_from"] == "folder name"
    assert by["paper_id/radar/r_sd"].provenance["family_from"] == "detector scope"
    assert Path(by["paper_id/radar/r_sd"].mask).name == "r_sd.png" and Path(by["paper_id/trufor/gan_inpaint/g1"].mask).exists()
    assert [s for s in ss if s.mask] == [by["paper_id/radar/r_sd"], by["paper_id/trufor/gan_inpaint/g1"]]
    assert all(Path(s.image).is_absolute() and Path(s.image).exists() for s in ss)
    assert set(ds.PAPER_ID_GROUPS) == {"clipsid", "d3", "effort", "forensicsadapter", "radar", "nfavit", "trufor"}
    sub = ds.load_paper_id(tmp_path / "id", groups=["TruFor", "cozzolino"])
    assert sorted({s.provenance["group"] for s in sub}) == ["clipsid", "trufor"] and len(sub) == 5


def test_inpainting_split_follows_the_inpainter(tmp_path):
    "IID-Net: its six GAN inpainters are gan_inpaint, its four traditional methods classic_inpaint; unknown: gen_inpaint."
    for m in ("CA", "GC", "SH", "EC", "LB", "RN", "TE", "NS", "PM", "SG", "XYZ"):
        _img(tmp_path / f"iid/{m}/images/1.png"); _img(tmp_path / f"iid/{m}/masks/1.png", mask=True)
    _img(tmp_path / "iid/real/1.png")
    fam = {s.provenance.get("method", "real"): s.family for s in ds.load_iidnet(tmp_path / "iid")}
    assert fam == {**dict.fromkeys(["CA", "GC", "SH", "EC", "LB", "RN"], "gan_inpaint"),
                   **dict.fromkeys(["TE", "NS", "PM", "SG"], "classic_inpaint"), "XYZ": "gen_inpaint", "real": None}
    assert {s.family for s in ds.load_dataset(f"iidnet:{tmp_path / 'iid'}") if s.label} == {"gan_inpaint", "classic_inpaint", "gen_inpaint"}
    assert {s.family for s in ds.load_iidnet(tmp_path / "iid", family="gen_inpaint") if s.label} == {"gen_inpaint"}
    assert {FAMILY_PARENTS[f] for f in ("diffusion_inpaint", "gan_inpaint")} == {"gen_inpaint"}
    assert [ds.inpainter_family(n) for n in ("Firefly", "stable-diffusion", "MAT", "deepfill_v2", "gl")] == \
        ["diffusion_inpaint", "diffusion_inpaint", "gan_inpaint", "gan_inpaint", None]


def test_a_registered_inpainter_names_the_family(tmp_path):
    "The fix the malformed-folder error names: register the inpainter (any spelling) and its folder loads with its family."
    _img(tmp_path / "id/nfavit/fake/Big-GAN-Fill/x.png")
    with pytest.raises(ds.DatasetError, match="'Big-GAN-Fill' is neither"): ds.load_paper_id(tmp_path / "id")
    ds.INPAINTERS.register("Big-GAN-Fill", "gan_inpaint")
    try: assert [s.family for s in ds.load_paper_id(tmp_path / "id")] == ["gan_inpaint"]
    finally: ds.INPAINTERS.unregister("Big-GAN-Fill")


def test_firefly_edits_pair_with_originals(tmp_path):
    r = tmp_path / "ff"
    _img(r / "original/cat.jpg"); _img(r / "original/dog.jpg", 1); _img(r / "original/tree.png", 2)
    _img(r / "edited/cat.jpg", 3); _img(r / "edited/dog_2.jpg", 4); _img(r / "edited/lone.png", 5)
    _img(r / "masks/dog_2.png", mask=True)
    ss = ds.load_firefly(r)
    assert [(s.id, s.label, s.family) for s in ss] == [
        ("firefly/edited/cat", 1, "diffusion_inpaint"), ("firefly/edited/dog_2", 1, "diffusion_inpaint"),
        ("firefly/edited/lone", 1, "diffusion_inpaint"), ("firefly/original/cat", 0, None), ("firefly/original/dog", 0, None),
        ("firefly/original/tree", 0, None)]
    orig = {s.id: Path(s.provenance["original"]).name if "original" in s.provenance else None for s in ss if s.label}
    assert orig == {"firefly/edited/cat": "cat.jpg", "firefly/edited/dog_2": "dog.jpg", "firefly/edited/lone": None}
    assert [Path(s.mask).name for s in ss if s.mask] == ["dog_2.png"] and ss[0].provenance["inpainter"] == "firefly"
    assert ds.has_families(ss)


def test_absent_data_is_the_one_line_not_run_reason(tmp_path, monkeypatch):
    for load, name, env in ((ds.load_paper_id, "paper in-distribution set", "FORENSICSLAB_PAPER_ID"),
                            (ds.load_firefly, "Firefly edits", "FORENSICSLAB_FIREFLY")):
        with pytest.raises(ds.MissingData) as e: load(tmp_path / "absent")
        first, *rest = str(e.value).splitlines()
        assert first == f"{name}: {tmp_path / 'absent'} not found."          # what a study prints as "not run: ..."
        assert rest[0] == "Expected layout:" and rest[-1].startswith("Download: none public")
        with pytest.raises(ForensicsLabError, match="not found"): ds.load_dataset(f"{load.__name__.removeprefix('load_')}:{tmp_path / 'absent'}")
        (tmp_path / "empty").mkdir(exist_ok=True)
        with pytest.raises(ds.MissingData): load(tmp_path / "empty")         # a folder with nothing in it: still absent
        monkeypatch.setenv(env, str(tmp_path / "via_env"))
        (tmp_path / "via_env").mkdir(exist_ok=True)
        assert ds.paper_data_root(env.removeprefix("FORENSICSLAB_").lower()) == tmp_path / "via_env"
        others = [project_root() / "data", project_root().parent / "shared" / "data"]
        if not any((o / env.removeprefix("FORENSICSLAB_").lower()).is_dir() for o in others):
            monkeypatch.setenv(env, str(tmp_path / "not_here"))
            with pytest.raises(ds.MissingData, match=str(tmp_path / "not_here")): load()


def test_malformed_folders_are_one_line_errors(tmp_path):
    _img(tmp_path / "a/radar/fake/x.png"); _img(tmp_path / "a/holiday_snaps/y.png")
    with pytest.raises(ds.DatasetError) as e: ds.load_paper_id(tmp_path / "a")
    assert "folder 'holiday_snaps' is not a detector group; expected clipsid, d3" in _one_line(e)
    _img(tmp_path / "b/nfavit/fake/blurry/x.png")
    with pytest.raises(ds.DatasetError) as e: ds.load_paper_id(tmp_path / "b")
    assert "folder 'blurry' is neither a family" in _one_line(e) and "INPAINTERS.register" in str(e.value)
    _img(tmp_path / "c/d3/pics/x.png")
    with pytest.raises(ds.DatasetError) as e: ds.load_paper_id(tmp_path / "c")
    assert "holds neither fake/ nor real/" in _one_line(e)
    _img(tmp_path / "d/radar/fake/x.png"); _img(tmp_path / "d/radar/masks/typo.png", mask=True)
    with pytest.raises(ds.DatasetError) as e: ds.load_paper_id(tmp_path / "d")
    assert "mask masks/typo.png in " in _one_line(e) and "matches no manipulated image" in str(e.value)
    _img(tmp_path / "e/d3/fake/x.png"); _img(tmp_path / "e/D3/real/y.png")
    with pytest.raises(ds.DatasetError) as e: ds.load_paper_id(tmp_path / "e")
    assert "are both group 'd3'" in _one_line(e)
    with pytest.raises(ds.DatasetError) as e: ds.load_paper_id(tmp_path / "absent", groups=["gpt5"])   # a bad argument: said before looking for data
    assert "unknown group 'gpt5'" in _one_line(e)
    (tmp_path / "f/edited").mkdir(parents=True); (tmp_path / "f/edited/notes.txt").write_text("todo")
    with pytest.raises(ds.DatasetError) as e: ds.load_firefly(tmp_path / "f")
    assert "holds no image files" in _one_line(e)
    _img(tmp_path / "f/edited/a.jpg"); _img(tmp_path / "f/masks/b.png", mask=True)
    with pytest.raises(ds.DatasetError) as e: ds.load_firefly(tmp_path / "f")
    assert "mask b.png matches no edit" in _one_line(e)
    (tmp_path / "f/masks/b.png").rename(tmp_path / "f/masks/a.png")
    assert [s.id for s in ds.load_firefly(tmp_path / "f")] == ["firefly/edited/a"]   # the fix named by the error works


def test_specs_name_the_paper_sets(tmp_path):
    root = _paper_id(tmp_path / "ID")
    spec = ds.DatasetSpec.parse(f"paper_id:{root}")
    ss = spec.load()
    assert (spec.kind, spec.key, len(ss)) == ("paper_id", "ID", 15) and [s.id for s in ss] == sorted(s.id for s in ss)
    text = spec.describe(ss)
    assert text.startswith("the triage paper's in-distribution set") and "15 images, 10 manipulated, 1 manipulated image(s) of unknown family" in text
    assert not ds.has_families(ss) and ds.has_families([s for s in ss if s.provenance["group"] != "nfavit" or s.family])
    _img(tmp_path / "FF/edits/e.png"); _img(tmp_path / "FF/real/e.png")
    assert [(s.label, s.family) for s in ds.load_dataset(f"firefly:{tmp_path / 'FF'}")] == [(1, "diffusion_inpaint"), (0, None)]
    with pytest.raises(ds.DatasetError, match="paper_id, firefly"): ds.DatasetSpec.parse("paperid:/x")
