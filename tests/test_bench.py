"End-to-end checks of the offline benchmark: counts, masks against edits, hash stability (across threads and BLAS kernels too), CLI."
import csv
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from forensicslab.data import bench
from forensicslab.data.bench import COLLECTIONS, GROUPS, BenchSizes, ensure_bench, load_bench, mask_leak
from forensicslab.data.bench import IMAGE_FAMILIES as FAMILIES
from forensicslab.imageio import load_image

SIZES = BenchSizes.tiny(per_group=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return ensure_bench(tmp_path_factory.mktemp("bench") / "b", seed=0, sizes=SIZES, references=True, log=lambda m: None)


def test_counts_and_labels(tiny):
    s = {c: load_bench(c, tiny) for c in COLLECTIONS}
    assert len(s["id"]) == SIZES.id_manipulated + SIZES.id_authentic
    assert sum(x.label for x in s["id"]) == SIZES.id_manipulated
    assert {x.provenance["group"] for x in s["id"]} == set(GROUPS)
    for x in s["id"] + s["train"]:
        assert x.label == 0 or x.family == GROUPS[x.provenance["group"]]
    ood_fams = [x.family for x in s["ood"] if x.label]
    assert {f: ood_fams.count(f) for f in set(ood_fams)} == {f: SIZES.ood_per_family for f in FAMILIES}
    # the learned fills are GAN-style (not diffusion) inpaintings, in the id regime and the ood one keyed gen_inpaint
    assert "gan_inpaint" in FAMILIES and "gen_inpaint" not in FAMILIES
    assert {x.family for x in s["ood"] if x.label and x.id.startswith("ood-gen_inpaint-")} == {"gan_inpaint"}
    assert {x.family for x in s["id"] if x.label and x.provenance["group"] == "inpaint_net"} == {"gan_inpaint"}
    assert sum(1 - x.label for x in s["ood"]) == SIZES.ood_authentic + SIZES.ood_processed + SIZES.ood_hard
    hard = [x for x in s["ood"] if x.provenance["domain"].startswith("hard_")]
    assert {x.provenance["domain"] for x in hard} == {f"hard_{k}" for k in bench.HARD_AUTHENTIC} and len(hard) == SIZES.ood_hard
    assert all(x.label == 0 and x.family is None and x.mask is None for x in hard)
    for x in hard:   # the beauty filter and portrait mode run on the OOD portrait; a chain of 3-4 JPEG generations
        k = x.provenance["domain"][len("hard_"):]
        assert x.provenance["recipe"] == f"authentic_{k}" and (x.provenance["format"] == "PNG") == (k == "app_ui"), x.id
        if k in ("beauty", "bokeh"): assert x.provenance["sources"][0]["photo"] == "grace_hopper"
        if k == "generations": assert len(x.provenance["params"]["qualities"]) in (3, 4)
    proc = [x for x in s["ood"] if x.provenance["domain"].startswith("processed_")]
    assert len(proc) == SIZES.ood_processed and all(x.label == 0 and x.family is None for x in proc)
    assert {x.provenance["domain"] for x in proc} == {f"processed_{k}" for k in bench.PROCESSINGS}
    for x in proc:   # the processing really happened: JPEG generations, screenshots as PNG, recorded parameters
        k = x.provenance["domain"][len("processed_"):]
        assert x.provenance["recipe"] == f"authentic_{k}" and x.provenance["params"]["processing"] == k
        assert (x.provenance["format"] == "PNG") == (k == "screenshot"), x.id
        if k == "recompress": assert len(x.provenance["params"]["qualities"]) >= 2
    for c in COLLECTIONS:
        for x in s[c]:
            assert (x.mask is not None) == (x.label == 1 and x.family != "synthesis"), x.id
            assert x.split == c and x.provenance["recipe"] and x.provenance["sources"]


def test_masks_cover_edits(tiny):
    "The pixels that differ from the same pipeline without the edit lie inside the (slightly dilated) mask."
    n = 0
    for c in COLLECTIONS:
        for x in load_bench(c, tiny):
            if x.mask:
                outside, changed = mask_leak(x, tiny)
                assert changed > 0, f"{x.id}: the edit changed nothing"
                assert outside == 0, f"{x.id}: {outside} changed pixels outside the dilated mask"
                mk = np.asarray(Image.open(x.mask)) > 127
                assert mk.shape == load_image(x.image).rgb.shape[:2]
                n += 1
    assert n >= 30


def test_formats_match_between_labels(tiny):
    "Within an id group authentic and manipulated images share format and size (no shortcut)."
    s = load_bench("id", tiny)
    for g in GROUPS:
        kinds = {(load_image(x.image).format, load_image(x.image).size) for x in s if x.provenance["group"] == g}
        assert len(kinds) == 1, (g, kinds)


def test_collections_disjoint_and_hashes_recorded(tiny):
    hs = {c: [x.provenance["hash"] for x in load_bench(c, tiny)] for c in COLLECTIONS}
    for c in COLLECTIONS:
        assert len(set(hs[c])) == len(hs[c])
    assert not set(hs["train"]) & set(hs["id"]) and not set(hs["train"]) & set(hs["ood"]) and not set(hs["id"]) & set(hs["ood"])
    x = load_bench("id", tiny)[0]
    assert load_image(x.image).hash == x.provenance["hash"]


def test_same_seed_same_hashes(tiny, tmp_path):
    again = ensure_bench(tmp_path / "again", seed=0, sizes=SIZES, log=lambda m: None)
    for c in COLLECTIONS:
        a, b = load_bench(c, tiny), load_bench(c, again)
        assert [load_image(x.image).hash for x in b] == [x.provenance["hash"] for x in a]
    other = ensure_bench(tmp_path / "other", seed=1, sizes=BenchSizes.tiny(), log=lambda m: None)
    assert load_bench("id", other)[0].provenance["hash"] != load_bench("id", tiny)[0].provenance["hash"]


def test_files_card_manifest(tiny):
    card = (tiny / "README.md").read_text()
    assert "not** a substitute" in card and "teaching and CI benchmark" in card
    for c in COLLECTIONS:
        assert (tiny / f"contact_{c}.png").exists()
        rows = list(csv.DictReader(open(tiny / c / "manifest.csv")))
        assert len(rows) == len(load_bench(c, tiny)) and all(r["hash"] and r["recipe"] for r in rows)
    info = json.loads((tiny / "bench.json").read_text())
    assert info["counts"]["id"] == {"manipulated": SIZES.id_manipulated, "authentic": SIZES.id_authentic}


def test_cache_and_errors(tiny, tmp_path):
    stamp = (tiny / "bench.json").stat().st_mtime_ns
    assert ensure_bench(tiny, seed=0, sizes=SIZES) == tiny
    assert (tiny / "bench.json").stat().st_mtime_ns == stamp   # cached: nothing rebuilt
    with pytest.raises(ValueError, match="force=True"): ensure_bench(tiny, seed=3, sizes=SIZES)
    with pytest.raises(ValueError, match="unknown collection"): load_bench("val", tiny)
    with pytest.raises(FileNotFoundError, match="bench build"): load_bench("id", tmp_path / "none", build=False)
    with pytest.raises(ValueError, match="seed"): load_bench("id", tiny, seed=7)
    with pytest.raises(ValueError, match="multiple of 8"): BenchSizes(image=65).validate()


def test_cli_build_tiny(tmp_path):
    from forensicslab.cli import app
    r = CliRunner().invoke(app, ["bench", "build", "--tiny", "--root", str(tmp_path / "cli")])
    assert r.exit_code == 0, r.output
    assert "done in" in r.output and "id   :   16 images, 8 manipulated" in r.output
    r = CliRunner().invoke(app, ["bench", "info", "--root", str(tmp_path / "missing")])
    assert r.exit_code == 1


@pytest.mark.slow
def test_full_build_counts(tmp_path):
    "The default build from nothing, counts as in the paper (240 = 135 + 105, 200 = 5 x 20 + 100) plus 70 processed and 60 harder authentic OOD images."
    root = ensure_bench(tmp_path / "full", seed=0)
    idc, ood = load_bench("id", root), load_bench("ood", root)
    assert (len(idc), sum(s.label for s in idc)) == (240, 135)
    assert (len(ood), sum(s.label for s in ood)) == (330, 100)
    tr = load_bench("train", root)
    assert sum(s.family == "synthesis" for s in tr) >= 60 and sum(s.family == "gan_inpaint" for s in tr) >= 60


def test_one_source_of_shipped_photos():
    "Issue 12: the benchmark draws its photographs and face boxes from forensicslab.data.photos, read-only."
    from forensicslab.data import photos
    assert bench.shipped_photos is photos.shipped_photos and bench.FACE_BOXES is photos.FACE_BOXES
    ph = photos.shipped_photos()
    assert set(bench.ID_PHOTOS) | set(bench.OOD_PHOTOS) <= set(ph)
    a = photos.photo("astronaut")
    with pytest.raises(ValueError): a[0, 0, 0] = 1          # nobody can change what the next caller sees
    for name, (x, y, w, h) in photos.FACE_BOXES.items():
        assert photos.PHOTOS[name].category == "human" and x + w <= ph[name].shape[1] and y + h <= ph[name].shape[0]
    with pytest.raises(KeyError, match="unknown photograph"): photos.photo("nope")


# --- issue 24: the generators give the same bytes on any machine ---------------------------------------------

_GEN_SCRIPT = r"""
import hashlib, json, sys
import numpy as np, torch
torch.set_num_threads(int(sys.argv[1]))
from forensicslab.data.bench import BenchSizes, build_bench, load_bench, load_generators, shipped_photos
from forensicslab.data.generators import fill_hole, synthesize
from forensicslab.imageio import load_image
gens, _ = load_generators()
ph = shipped_photos()
a, b = np.ascontiguousarray(ph["astronaut"][:128, :128]), np.ascontiguousarray(ph["coffee"][100:228, 200:328])
hole = np.zeros((128, 128), bool); hole[40:80, 30:90] = True
sha = lambda x: hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()
raw = {n: sha(synthesize(g, a, b, 0.2, 0.8, seed=5) if n.startswith("vae") else fill_hole(g, a, hole)) for n, g in gens.items()}
sizes = BenchSizes(id_manipulated=0, id_authentic=0, ood_per_family=1, ood_authentic=0, ood_processed=0, ood_hard=0,
                   train_manipulated={"spectral": 1, "npr": 1, "inpaint_net": 2}, train_authentic={}, image=128)
root = build_bench(sys.argv[2], sizes=sizes, log=lambda m: None)
built = {s.id: load_image(s.image).hash for c in ("train", "ood") for s in load_bench(c, root, build=False)}
print(json.dumps({"raw": raw, "built": built}))
"""

# sha256 of the raw generator outputs above (uint8 arrays from package pixels, no resampling): the same on every machine
GOLDEN = {
    "vae_tconv": "f50d6925a125972fe06986867ea842d23d5caf5515e5948ca35faba595cf056f",
    "fill_tconv": "33b353a6f48474cf8b3e0acf67173a620e12493e986e8515cb6ad24b04772ba3",
    "vae_bilinear": "ea80347fdd1ec7f580da49489b8303bfa81dc42ecfb6181c5c170fc95d2396ba",
    "fill_bilinear": "3e7eaa3ed6836c209bc73361881924c54b9fc23b7e67affaaa2d3a4671ea5d8b",
}


def _generate(tmp_path, threads: int, extra: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads), **extra}
    r = subprocess.run([sys.executable, "-c", _GEN_SCRIPT, str(threads), str(tmp_path / f"b{threads}")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_generated_images_same_bytes_across_threads_and_kernels(tmp_path):
    "Issue 24: generated images rebuilt with 1 and 2 threads (torch, OpenMP, MKL, OpenBLAS) and, on x86, another BLAS kernel."
    one = _generate(tmp_path, 1, {})
    # x86: OpenBLAS's SSE kernels instead of the AVX2/AVX-512 ones, torch without vector kernels (the float generators of
    # benchmark v4 gave other pixels under ATEN_CPU_CAPABILITY=default: the issue-24 symptom on one machine)
    other = {"OPENBLAS_CORETYPE": "Prescott", "ATEN_CPU_CAPABILITY": "default"} if platform.machine() in ("x86_64", "AMD64") else {}
    two = _generate(tmp_path, 2, other)
    assert one == two
    assert one["raw"] == GOLDEN
    gen = [k for k in one["built"] if "spectral" in k or "npr" in k or "inpaint_net" in k or "synthesis" in k or "gen_inpaint" in k]
    assert len(gen) == 6, sorted(one["built"])


def test_generator_weights_pinned_and_recorded(tiny, tmp_path):
    "The shipped generator files are the pinned ones, a build records their sha256 (bench.json and card), other bytes are refused."
    files = {n: hashlib.sha256((bench.weights_dir() / f"{n}.safetensors").read_bytes()).hexdigest() for n in bench.GENERATORS}
    info = json.loads((tiny / "bench.json").read_text())
    assert info["generators"] == files == bench.GENERATOR_SHA256
    card = (tiny / "README.md").read_text()
    assert all(h in card for h in files.values())
    for n in bench.GENERATORS: shutil.copy(bench.weights_dir() / f"{n}.safetensors", tmp_path)
    p = tmp_path / "vae_bilinear.safetensors"
    p.write_bytes(p.read_bytes()[:-1] + bytes([p.read_bytes()[-1] ^ 1]))
    with pytest.raises(bench.BenchError, match="is not the pinned"): bench.load_generators(tmp_path)


def test_user_authentic_photos(tiny, tmp_path):
    "--authentic-dir: the folder's photos join id and ood as authentic images, bytes unchanged; the rest of the build is the same."
    d = tmp_path / "mine"; d.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (96, 80, 3), dtype=np.uint8)).save(d / f"IMG_{i}.jpg", quality=90)
    (d / "notes.txt").write_text("not a photo")
    root = ensure_bench(tmp_path / "b", seed=0, sizes=SIZES, log=lambda m: None, authentic_dir=d)
    user = {c: [x for x in load_bench(c, root) if x.provenance["recipe"] == "user_authentic"] for c in COLLECTIONS}
    assert [len(user[c]) for c in COLLECTIONS] == [0, 2, 1]
    assert all(x.label == 0 and x.provenance["format"] == "JPEG" and "/" not in x.provenance["sources"][0]["file"] for c in COLLECTIONS for x in user[c])
    assert open(user["id"][0].image, "rb").read() == (d / "IMG_0.jpg").read_bytes()
    base = {x.id: x.provenance["hash"] for x in load_bench("ood", tiny)}
    assert {x.id: x.provenance["hash"] for x in load_bench("ood", root) if x.id in base} == base
    assert json.loads((root / "bench.json").read_text())["user_authentic"]["files"] == 3
    with pytest.raises(ValueError, match="force=True"): ensure_bench(root, seed=0, sizes=SIZES)   # another benchmark now
    from forensicslab.cli import app
    r = CliRunner().invoke(app, ["bench", "build", "--tiny", "--out", str(tmp_path / "cli"), "--authentic-dir", str(tmp_path / "none")])
    assert r.exit_code == 2 and "no such folder" in r.output
