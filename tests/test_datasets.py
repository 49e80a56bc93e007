"Dataset loaders on fixtures that mimic each layout, and on the real samples in ../shared/data when present."
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from forensicslab.data import datasets as ds
from forensicslab.data.datasets import _fake_image
from forensicslab.runs import project_root

SHARED = project_root(Path(__file__).resolve().parent).parent / "shared" / "data"


def _need_shared(name):
    p = SHARED / name
    if not p.is_dir(): pytest.skip(f"real data {p} not present (only on the lab's test machines)")
    return p


def test_casia2_fixture(tmp_path):
    _fake_image(tmp_path / "Au/Au_nat_00001.jpg"); _fake_image(tmp_path / "Tp/Tp_D_NRN_S_N_nat00001_art00002_10001.jpg")
    _fake_image(tmp_path / "CASIA 2 Groundtruth/Tp_D_NRN_S_N_nat00001_art00002_10001_gt.png", mode="L")
    s = ds.load_casia2(tmp_path)
    assert [(x.label, x.family) for x in s] == [(1, "splice"), (0, None)]
    assert s[0].provenance["source_image"] == "nat00001" and Path(s[0].mask).exists()


def test_missing_paths_are_named(tmp_path):
    loaders = [ds.load_casia2, ds.load_coverage, ds.load_columbia, ds.load_noso, ds.load_celebdf,
               ds.load_community_forensics, ds.load_iidnet, ds.load_pscc_samples, ds.load_folder]
    for f in loaders:
        with pytest.raises(FileNotFoundError) as e: f(tmp_path / "absent")
        assert str(tmp_path / "absent") in str(e.value), f.__name__
    with pytest.raises(FileNotFoundError, match="Expected layout"): ds.load_coverage(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="x.csv"): ds.load_manifest(tmp_path / "x.csv")


def test_coverage_columbia_noso_fixtures(tmp_path):
    _fake_image(tmp_path / "cov/image/4.tif"); _fake_image(tmp_path / "cov/image/4t.tif"); _fake_image(tmp_path / "cov/mask/4forged.tif", mode="L")
    assert sorted(x.label for x in ds.load_coverage(tmp_path / "cov")) == [0, 1]
    _fake_image(tmp_path / "col/4cam_auth/a.tif"); _fake_image(tmp_path / "col/4cam_splc/b.tif")
    with pytest.raises(FileNotFoundError, match="b_edgemask.jpg"): ds.load_columbia(tmp_path / "col")
    em = np.zeros((24, 32, 3), np.uint8); em[5:10, 5:10] = (0, 255, 0); em[15:, :] = (255, 0, 0)
    (tmp_path / "col/4cam_splc/edgemask").mkdir(); Image.fromarray(em).save(tmp_path / "col/4cam_splc/edgemask/b_edgemask.jpg", quality=95)
    s = ds.load_columbia(tmp_path / "col", mask_dir=tmp_path / "masks")
    m = np.asarray(Image.open(s[1].mask)) > 127
    assert m[6:9, 6:9].all() and not m[16:].any() and m.sum() < 40
    for n in ("05.png", "05_mod.png"): _fake_image(tmp_path / "noso" / n)
    with pytest.raises(FileNotFoundError, match="05_mod_gt.png"): ds.load_noso(tmp_path / "noso")


def test_celebdf_frames(tmp_path):
    import cv2
    for d in ("Celeb-real", "YouTube-real", "Celeb-synthesis"):
        (tmp_path / d).mkdir()
        w = cv2.VideoWriter(str(tmp_path / d / "v0.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 5, (32, 24))
        for i in range(5): w.write(np.full((24, 32, 3), 30 * i, np.uint8))
        w.release()
    s = ds.load_celebdf(tmp_path, split="all", frames_per_video=3, frames_dir=tmp_path / "fr")
    assert len(s) == 9 and [x.label for x in s] == [0] * 6 + [1] * 3
    assert all(Path(x.image).exists() for x in s) and len({x.id for x in s}) == 9
    with pytest.raises(FileNotFoundError, match="List_of_testing_videos.txt"): ds.load_celebdf(tmp_path)
    with pytest.raises(ValueError, match="split"): ds.load_celebdf(tmp_path, split="train")


def test_community_forensics_iidnet_realfake_manifest(tmp_path):
    import pyarrow as pa, pyarrow.parquet as pq
    b = io.BytesIO(); Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(b, "PNG")
    (tmp_path / "cf").mkdir()
    pq.write_table(pa.table({"image_name": ["x.png"], "image_data": [b.getvalue()], "model_name": ["m"], "label": [1]}), tmp_path / "cf/s.parquet")
    assert ds.load_community_forensics(tmp_path / "cf")[0].family == "synthesis"
    pq.write_table(pa.table({"foo": [1]}), tmp_path / "cf/bad.parquet")
    with pytest.raises(ValueError, match="missing columns"): ds.load_community_forensics(tmp_path / "cf")
    _fake_image(tmp_path / "iid/LB/img/1.png")
    with pytest.raises(FileNotFoundError, match="masks"): ds.load_iidnet(tmp_path / "iid")
    _fake_image(tmp_path / "iid/LB/mask/1.png", mode="L")
    assert ds.load_iidnet(tmp_path / "iid")[0].provenance["method"] == "LB"
    _fake_image(tmp_path / "rf/real/r.png"); _fake_image(tmp_path / "rf/fake/f.png")
    with pytest.raises(ValueError, match="unknown family"): ds.load_folder(tmp_path / "rf", family="gan")
    s = ds.load_folder(tmp_path / "rf", family="face")
    (tmp_path / "m.csv").write_text("image,label,family\nrf/fake/f.png,fake,face\nrf/real/missing.png,0,\n")
    with pytest.raises(FileNotFoundError, match="line 3"): ds.load_manifest(tmp_path / "m.csv")
    assert len(ds.load_manifest(tmp_path / "m.csv", check_files=False)) == 2 and s[1].label == 1


def test_bench_manifest_loads_with_load_manifest(tmp_path):
    from forensicslab.data.bench import BenchSizes, ensure_bench
    root = ensure_bench(tmp_path / "b", sizes=BenchSizes.tiny(), log=lambda m: None)
    s = ds.load_manifest(root / "id" / "manifest.csv")
    assert len(s) == 16 and all(Path(x.image).exists() for x in s)
    assert sum(x.mask is not None for x in s) == sum(x.label == 1 and x.family != "synthesis" for x in s)


def test_real_noso():
    s = ds.load_noso(_need_shared("noso_copymove"))
    assert sum(x.label == 0 for x in s) == 13 and sum(x.label for x in s) == 18
    for x in s:
        if x.label:
            assert Image.open(x.image).size == Image.open(x.mask).size
            assert 0 < (np.asarray(Image.open(x.mask).convert("L")) > 127).mean() < 0.5


def test_real_casia2():
    s = ds.load_casia2(_need_shared("casia2_samples"), require_masks=True)
    assert len(s) == 4 and all(x.label == 1 and x.family == "splice" for x in s)
    assert sorted(x.provenance["kind"] for x in s) == ["copy-move", "copy-move", "splicing", "splicing"]
    for x in s: assert Image.open(x.image).size == Image.open(x.mask).size


def test_real_pscc():
    s = ds.load_pscc_samples(_need_shared("pscc_samples"))
    fam = sorted((x.family or "authentic") for x in s)
    assert fam.count("authentic") == 6 and fam.count("splice") == 4 and fam.count("classic_inpaint") == 2


def test_dataset_specs(tmp_path):
    "Every spec kind reaches its loader; bad specs and missing folders are one-line library errors."
    from forensicslab.core import ForensicsLabError
    _fake_image(tmp_path / "mine/authentic/a.png"); _fake_image(tmp_path / "mine/tampered/face/b.png")
    _fake_image(tmp_path / "mine/tampered/c.png")
    s = ds.load_dataset(f"folder:{tmp_path / 'mine'}")
    assert [(x.id, x.label, x.family) for x in s] == [("mine/authentic/a", 0, None), ("mine/tampered/c", 1, None),
                                                     ("mine/tampered/face/b", 1, "face")]
    assert not ds.has_families(s) and ds.has_families([x for x in s if x.id != "mine/tampered/c"])
    assert "1 manipulated image(s) of unknown family" in ds.describe_dataset(f"folder:{tmp_path / 'mine'}", s)
    for bad in ("nope:/x", "folder:", "casia2"):
        with pytest.raises(ForensicsLabError, match="kind:argument"): ds.load_dataset(bad)
    for kind in ("folder", "casia2", "coverage", "columbia", "noso", "iidnet", "celebdf", "pscc", "comfor", "manifest"):
        with pytest.raises(ForensicsLabError, match="not found"): ds.load_dataset(f"{kind}:{tmp_path / 'absent'}")
    assert ds.dataset_key("bench:id") == "id" and ds.dataset_key(f"folder:{tmp_path / 'mine'}") == "mine"


def test_stratified_draw_caps_each_family():
    from forensicslab.core import Sample
    ss = [Sample(id=f"s{i}", image="x.png", label=int(i % 3 > 0), family=(None, "face", "splice")[i % 3]) for i in range(30)]
    d = ds.stratified_draw(ss, n_per_family=4, n_authentic=2, seed=1)
    assert sorted((x.family or "a") for x in d) == ["a"] * 2 + ["face"] * 4 + ["splice"] * 4
    assert d == ds.stratified_draw(ss, 4, 2, seed=1) and d != ds.stratified_draw(ss, 4, 2, seed=2)


def test_real_specs():
    "The shared real sets through their spec strings (what a study's `dataset` parameter takes)."
    n = {"pscc": (12, 6), "casia2": (4, 4), "noso": (31, 18)}
    folder = {"pscc": "pscc_samples", "casia2": "casia2_samples", "noso": "noso_copymove"}
    for kind, (total, manip) in n.items():
        s = ds.load_dataset(f"{kind}:{_need_shared(folder[kind])}")
        assert (len(s), sum(x.label for x in s)) == (total, manip) and ds.has_families(s)


def _corrupt_folder(root: Path) -> Path:
    "real/ + fake/ with one image of each kind that does not decode: random bytes, a cut JPEG, an empty file, a broken link."
    _fake_image(root / "real/a.png"); _fake_image(root / "fake/b.jpg"); _fake_image(root / "fake/c.png", seed=1)
    (root / "fake/noise.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg" * 8)
    (root / "real/cut.jpg").write_bytes((root / "fake/b.jpg").read_bytes()[:200])
    (root / "real/empty.png").write_bytes(b"")
    (root / "fake/gone.png").symlink_to(root / "nowhere.png")
    return root


def test_folder_with_unreadable_images_skips_counts_and_names_them(tmp_path, capsys):
    """Issue 32 item 9: one unreadable image in a folder: dataset aborted triage_table4 and zoom_table1 (no table).
    The data layer now keeps the images that decode, lists the others in `skipped`, prints one line naming them,
    and the caption text every study builds from the set says which were left out."""
    root = _corrupt_folder(tmp_path / "set")
    s = ds.load_dataset(f"folder:{root}")
    assert [x.id for x in s] == ["set/fake/b", "set/fake/c", "set/real/a"]
    assert sorted(p for p, _ in s.skipped) == ["fake/gone.png", "fake/noise.jpg", "real/cut.jpg", "real/empty.png"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "skipped 4 unreadable image(s)" in err and "fake/noise.jpg" in err
    drawn = ds.stratified_draw(s, n_per_family=1, n_authentic=1)
    assert drawn.skipped == s.skipped                                   # travels through the study's draw
    text = ds.describe_dataset(f"folder:{root}", drawn)
    assert "4 unreadable image(s) skipped: " in text and "real/empty.png (empty file (0 bytes))" in text
    assert [x.id for x in ds.load_folder(root)] == ["set/real/a", "set/fake/b", "set/fake/c"]   # zoom's direct call too
    for bad in root.rglob("*"):
        if bad.name in ("a.png", "b.jpg", "c.png") or bad.is_dir(): continue
        bad.unlink()
    assert ds.load_dataset(f"folder:{root}").skipped == []


def test_folder_of_only_unreadable_images_is_one_line_error(tmp_path):
    from forensicslab.core import ForensicsLabError
    (tmp_path / "s/real").mkdir(parents=True); (tmp_path / "s/fake").mkdir()
    (tmp_path / "s/real/x.jpg").write_text("not an image")
    with pytest.raises(ForensicsLabError, match=r"holds no readable images \(1 unreadable: real/x.jpg"):
        ds.load_dataset(f"folder:{tmp_path / 's'}")


def test_dataset_spec_is_parsed_once_and_travels(tmp_path):
    "Issue 25 item 2: a DatasetSpec record; every string API takes it too, and bad input is a ForensicsLabError."
    from forensicslab.core import ForensicsLabError
    _fake_image(tmp_path / "mine/real/a.png"); _fake_image(tmp_path / "mine/fake/b.png")
    spec = ds.DatasetSpec.parse(f"folder:{tmp_path / 'mine'}")
    assert (spec.kind, spec.key, spec.path) == ("folder", "mine", tmp_path / "mine")
    assert ds.parse_dataset_spec(spec) == ("folder", str(tmp_path / "mine")) and ds.dataset_key(spec) == "mine"
    assert [x.id for x in ds.load_dataset(spec)] == [x.id for x in ds.load_dataset(str(spec))]
    assert ds.describe_dataset(spec, ds.load_dataset(spec)) == spec.describe(spec.load())
    for bad in ("bench:idd", "nope:/x", " : "):
        with pytest.raises(ForensicsLabError): ds.DatasetSpec.parse(bad)
    (tmp_path / "m.csv").write_text("image,label\nmine/real/a.png,maybe\n")
    with pytest.raises(ds.DatasetError, match="line 2"): ds.load_manifest(tmp_path / "m.csv")
    (tmp_path / "m.csv").write_text("image,label\nmine/real/zz.png,1\n")
    with pytest.raises(ds.MissingFile, match="zz.png not found"): ds.load_manifest(tmp_path / "m.csv")
    with pytest.raises(ds.DatasetError, match="split must be"): ds.load_celebdf(tmp_path, split="val")
