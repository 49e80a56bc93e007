"""Detector pool infrastructure: cards, registry, entry-point plug-ins, Stage 0 dispatch, cache, panels, CLI.

The detectors defined here are test doubles (registered for the test, removed after); the built-in pool
is checked only for what the registry promises (every `forensicslab.det_*` module found, cards valid).
"""
import importlib
import json
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from forensicslab.detectors import pool as D
from forensicslab.core import Detection, ToolCard


CARD = """\
id: {id}
name: {name}
version: "{version}"
scope: [{scope}]
native_metric: {metric}
normalisation: "{norm}"
score_reading: test double
{extra}"""


def write_card(d: Path, id, scope="splice", metric="p", norm="identity", map_reading=None, version="1", name=None):
    extra = f"map_reading: {map_reading}\n" if map_reading else ""
    (d / f"{id}.yaml").write_text(CARD.format(id=id, name=name or f"{id} (test double)", version=version, scope=scope,
                                              metric=metric, norm=norm, extra=extra))
    return D.load_card(id, d)


@pytest.fixture
def doubles(tmp_path):
    "Register test-double detectors: a map detector, a scalar LLR one, one that raises, one that sleeps, one full-res."
    seen = {}

    class MapDet:
        card = write_card(tmp_path, "t_map", map_reading="bright = suspicious")
        calls = 0
        def detect(self, image):
            type(self).calls += 1
            seen["t_map"] = image.size
            g = image.grey / 255.0
            return D.make_detection(self.card, float(g.max()), heatmap=g)

    class LLRDet:
        card = write_card(tmp_path, "t_llr", scope="synthesis", metric="llr", norm="logistic(center=0, scale=2)")
        def detect(self, image):
            return D.make_detection(self.card, float(image.grey.mean() - 128) / 16)

    class RaiseDet:
        card = write_card(tmp_path, "t_raise", scope="face")
        def detect(self, image): raise RuntimeError("weights missing")

    class SleepDet:
        card = write_card(tmp_path, "t_sleep", scope="face")
        started, finished = threading.Event(), threading.Event()
        def detect(self, image):
            SleepDet.started.set()
            time.sleep(3.0)
            SleepDet.finished.set()
            return D.make_detection(self.card, 0.9)

    class FullResDet:
        card = write_card(tmp_path, "t_full", map_reading="uniform")
        max_side = None
        def detect(self, image):
            seen["t_full"] = image.size
            return D.make_detection(self.card, 0.2, heatmap=np.full(image.rgb.shape[:2], 0.2, np.float32))

    classes = dict(t_map=MapDet, t_llr=LLRDet, t_raise=RaiseDet, t_sleep=SleepDet, t_full=FullResDet)
    for k, c in classes.items(): D.register(k)(c)
    yield seen
    for k in classes: D.unregister(k)


def photo(w=320, h=240, seed=0):
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 200, w)[None, :, None] + np.linspace(0, 40, h)[:, None, None]
    return np.clip(x + rng.normal(0, 6, (h, w, 3)), 0, 255).astype(np.uint8)


# --- cards --------------------------------------------------------------------------------------------

def test_card_errors_name_the_file(tmp_path):
    with pytest.raises(D.CardError, match=r"missing\.yaml"): D.load_card("missing", tmp_path)
    (tmp_path / "bad.yaml").write_text("id: bad\nname: [unclosed\n")
    with pytest.raises(D.CardError, match=r"bad\.yaml: not valid YAML"): D.load_card("bad", tmp_path)
    write_card(tmp_path, "ok")
    (tmp_path / "other.yaml").write_text((tmp_path / "ok.yaml").read_text())
    with pytest.raises(D.CardError, match="named for 'other'"): D.load_card("other", tmp_path)
    (tmp_path / "norm.yaml").write_text((tmp_path / "ok.yaml").read_text().replace("id: ok", "id: norm")
                                        .replace('"identity"', '"sigmoid(2)"'))
    with pytest.raises(D.CardError, match=r"norm\.yaml: normalisation 'sigmoid\(2\)'"): D.load_card("norm", tmp_path)
    (tmp_path / "fam.yaml").write_text((tmp_path / "ok.yaml").read_text().replace("id: ok", "id: fam")
                                       .replace("[splice]", "[weather]"))
    with pytest.raises(D.CardError, match=r"fam\.yaml: invalid tool card \(scope"): D.load_card("fam", tmp_path)


def test_normalisation_rules():
    assert D.logistic(0) == 0.5 and D.logistic(3, center=1, scale=1) == pytest.approx(0.8808, abs=1e-4)
    assert D.two_sided(-3, critical=2) == D.two_sided(3, critical=2) > 0.85
    assert D.two_sided(0.5, critical=2) < 0.1
    assert D.linear(7, 5, 9) == 0.5 and D.linear(100, 5, 9) == 1.0
    with pytest.raises(ValueError, match="probability"): D.identity(1.5)
    f = D.parse_normalisation("two_sided(mean=10, std=2, critical=1.5, scale=0.25): prose after the rule is allowed")
    assert f(13) == pytest.approx(0.5) and f(7) == pytest.approx(0.5)


def test_builtin_cards_and_modules_are_consistent():
    "Every shipped card is valid, every built-in detector module registers a detector, and every built-in card has one."
    import pkgutil
    import forensicslab.detectors.builtin as B
    for cid in D.available_cards():
        card = D.load_card(cid)
        assert isinstance(card, ToolCard) and card.id == cid
    registered = D.list_detectors(include_opt_in=True)   # the ungated variants and the specialists register opt-in
    assert D.discovery_errors() == {}, D.discovery_errors()
    modules = [m.name for m in pkgutil.iter_modules(B.__path__)]
    assert len(modules) >= 8, modules                                   # the loop below must have something to check
    owners = {getattr(D._FACTORIES.get(r), "__module__", None) for r in registered}
    for m in modules: assert f"forensicslab.detectors.builtin.{m}" in owners, f"detectors.builtin.{m} registers no detector"
    cards = {p.stem for p in Path(B.__file__).parent.glob("*.yaml")}
    assert cards and cards <= set(registered), f"built-in cards without a detector: {sorted(cards - set(registered))}"


# --- registry -----------------------------------------------------------------------------------------

def test_registry(doubles, tmp_path):
    names = D.list_detectors()
    assert {"t_map", "t_llr", "t_raise"} <= set(names) and names == sorted(names)
    assert D.get_detector("t_map") is D.get_detector("t_map")
    assert D.get_card("t_llr").scope == ["synthesis"]
    with pytest.raises(KeyError, match="no detector named 'nope'"): D.get_detector("nope")

    class Other:
        card = D.load_card("t_map", tmp_path)
        def detect(self, image): ...
    with pytest.raises(ValueError, match="already registered"): D.register("t_map")(Other)
    with pytest.raises(ValueError, match="carries the card"): D.register("t_zzz")(Other)

    class NoDetect:
        card = D.load_card("t_llr", tmp_path)
    with pytest.raises(TypeError, match="no detect"): D.register("t_llr", replace=True)(NoDetect)


def test_entry_point_plugin(tmp_path, monkeypatch):
    "A third-party package that declares an entry point in group forensicslab.detectors.pool joins the pool."
    pkg = tmp_path / "fl_thirdparty"; pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        from forensicslab.detectors.pool import card_from_dict, make_detection
        class PlugDet:
            card = card_from_dict(dict(id="plug", name="Plug-in (test double)", scope=["face"], native_metric="prob",
                                       normalisation="identity", score_reading="probability of a face swap"))
            def detect(self, image):
                return make_detection(self.card, 0.75)
    """))
    dist = tmp_path / "fl_thirdparty-0.1.dist-info"; dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fl-thirdparty\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[forensicslab.detectors]\nplug = fl_thirdparty:PlugDet\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        D.discover(force=True)
        assert "plug" in D.list_detectors()
        d = D.run_pool(photo(), ["plug"])["plug"]
        assert (d.status, d.score, d.fired, d.raw) == ("ok", 0.75, True, {"prob": 0.75})
    finally:
        D.unregister("plug")


# --- dispatch -----------------------------------------------------------------------------------------

def test_dispatch_survives_raise_and_timeout(doubles):
    sleeper = type(D.get_detector("t_sleep"))
    sleeper.started.clear()
    sleeper.finished.clear()
    res = D.run_pool(photo(), ["t_map", "t_llr", "t_raise", "t_sleep"], timeout=0.5)
    # behavioural, not a wall-clock bound: the sleeper had started and was still running when dispatch returned
    assert sleeper.started.is_set() and not sleeper.finished.is_set(), "dispatch waited for a detector past its timeout"
    assert list(res) == ["t_map", "t_llr", "t_raise", "t_sleep"]
    assert {k: v.status for k, v in res.items()} == dict(t_map="ok", t_llr="ok", t_raise="error", t_sleep="timeout")
    assert "RuntimeError: weights missing" in res["t_raise"].error
    assert res["t_sleep"].score is None and not res["t_sleep"].fired
    assert res["t_map"].heatmap.dtype == np.float32 and res["t_map"].heatmap.shape == (240, 320)
    assert res["t_llr"].raw["llr"] == pytest.approx((photo().astype(np.float32) @ [0.299, 0.587, 0.114]).mean() / 16 - 8, abs=1e-3)


@pytest.mark.skipif(not hasattr(__import__("os"), "getpriority"), reason="per-thread priorities are a Linux feature")
def test_critical_path_keeps_priority(tmp_path):
    "Once runtimes are known, the longest-expected detector runs at normal priority and the others in the background."
    import os, threading
    nice = {}

    def make(id, seconds):
        class Det:
            card = write_card(tmp_path, id)
            def detect(self, image):
                nice[id] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
                time.sleep(seconds); return D.make_detection(self.card, 0.1)
        return Det
    for id, sec in (("t_slow", 0.2), ("t_quick1", 0.0), ("t_quick2", 0.0)): D.register(id)(make(id, sec))
    try:
        base = os.getpriority(os.PRIO_PROCESS, 0)
        D.run_pool(photo(), ["t_quick1", "t_slow", "t_quick2"])          # first call: runtimes unknown, no priorities
        assert set(nice.values()) == {base}
        D.run_pool(photo(), ["t_quick1", "t_slow", "t_quick2"])
        assert nice["t_slow"] == base and nice["t_quick1"] == nice["t_quick2"] == min(base + 10, 19), nice
        nice.clear(); D.run_pool(photo(), ["t_quick1"])                  # a single detector is never put in the background
        assert nice == {"t_quick1": base}
    finally:
        for id in ("t_slow", "t_quick1", "t_quick2"): D.unregister(id); D._EXPECTED.pop(id, None)


def test_per_detector_timeout_and_unknown_detector(doubles):
    res = D.run_pool(photo(), ["t_map", "t_sleep", "ghost"], timeout={"t_sleep": 0.2, "t_map": 5})
    assert res["t_sleep"].status == "timeout" and res["t_map"].status == "ok"
    assert res["ghost"].status == "error" and "no detector named 'ghost'" in res["ghost"].error


def test_cache_hit(doubles, tmp_path):
    img = photo()
    a = D.run_pool(img, ["t_map", "t_raise"], cache=tmp_path / "c")
    calls = type(D.get_detector("t_map")).calls
    b = D.run_pool(img, ["t_map", "t_raise"], cache=tmp_path / "c")
    assert type(D.get_detector("t_map")).calls == calls, "cache hit must not run the detector again"
    assert b["t_map"].score == a["t_map"].score and np.array_equal(b["t_map"].heatmap, a["t_map"].heatmap)
    assert b["t_raise"].status == "error"
    ver = D.cache_version(D.get_detector("t_map"))
    entries = list(D.DetectionCache(tmp_path / "c").store)
    assert ver.startswith("1-") and entries == [f"{D.image_key(D.load_image(img))}/t_map@v{ver}@s2048"], entries  # no error cached
    # different compression history, same pixels -> different key
    Image.fromarray(img).save(tmp_path / "x.png")
    c = D.run_pool(tmp_path / "x.png", ["t_map"], cache=tmp_path / "c")
    assert type(D.get_detector("t_map")).calls == calls + 1 and c["t_map"].score == a["t_map"].score
    # an edited detector (other fingerprint) misses the cache
    D.get_detector("t_map").cache_salt = "retrained"; D._FINGERPRINTS.clear()
    D.run_pool(img, ["t_map"], cache=tmp_path / "c")
    assert type(D.get_detector("t_map")).calls == calls + 2


def test_two_runs_asking_for_one_uncached_image_compute_it_once(tmp_path):
    "Two runs (threads here, two studies' processes in `make demo`) on the same uncached image: one computes, the other waits and reads it."
    calls = []
    class Slow:
        card = write_card(tmp_path, "t_once")
        def detect(self, image):
            calls.append(1); time.sleep(0.5)
            return D.make_detection(self.card, 0.4)
    D.register("t_once")(Slow)
    try:
        img, res = photo(), []
        runs = [threading.Thread(target=lambda: res.append(D.run_pool(img, ["t_once"], cache=tmp_path / "c"))) for _ in range(2)]
        for t in runs: t.start()
        for t in runs: t.join()
        assert len(calls) == 1 and [r["t_once"].score for r in res] == [0.4, 0.4]
    finally: D.unregister("t_once")


def test_cache_entries_are_exact_shared_and_corruption_is_a_miss(tmp_path):
    "Issue 25: the diskcache-backed cache returns the exact heatmap, is shared by threads, and a corrupt entry is a miss."
    from concurrent.futures import ThreadPoolExecutor
    from forensicslab.core import Detection
    c = D.DetectionCache(tmp_path / "c")
    hm = np.random.default_rng(0).random((37, 53)).astype(np.float32)
    d = Detection(detector="x", version="1", status="ok", score=0.75, fired=True, raw={"p": 0.75}, heatmap=hm)
    with ThreadPoolExecutor(8) as ex: list(ex.map(lambda i: c.put(f"k{i % 4}", d, 2048), range(64)))
    got = D.DetectionCache(tmp_path / "c").get("k3", "x", "1", 2048)       # another instance: what another process sees
    assert got.score == 0.75 and got.raw == {"p": 0.75} and got.heatmap.dtype == np.float32 and np.array_equal(got.heatmap, hm)
    assert c.get("k3", "x", "2", 2048) is None and c.get("k3", "x", "1", None) is None and len(c.store) == 4
    c.store.set(c.entry("k0", "x", "1", 2048), b"not an npz")
    assert c.get("k0", "x", "1", 2048) is None


def test_tiny_grey_and_huge_images(doubles, tmp_path):
    tiny = D.run_pool(photo(16, 16), ["t_map", "t_llr"])
    assert all(d.status == "ok" for d in tiny.values()) and tiny["t_map"].heatmap.shape == (16, 16)
    grey = photo(100, 80)[..., 0]
    Image.fromarray(grey, mode="L").save(tmp_path / "grey.png")
    for src in (grey, tmp_path / "grey.png"):
        r = D.run_pool(src, ["t_map", "t_llr"])
        assert all(d.status == "ok" for d in r.values()) and r["t_map"].heatmap.shape == (80, 100)
    big = np.zeros((4000, 6000, 3), np.uint8); big[1000:2000, 2000:3000] = 255
    r = D.run_pool(big, ["t_map", "t_full", "t_raise"])
    assert doubles["t_map"] == (2048, 1365), "detectors get the long side fitted to DEFAULT_MAX_SIDE"
    assert doubles["t_full"] == (6000, 4000), "max_side=None detectors get full resolution"
    assert r["t_map"].heatmap.shape == (4000, 6000) and r["t_full"].heatmap.shape == (4000, 6000)
    hm = r["t_map"].heatmap
    assert hm[1500, 2500] > 0.99 and hm[100, 100] < 0.01, "the map is mapped back onto the original geometry"
    assert r["t_raise"].status == "error"


def test_make_detection_validates_maps(tmp_path):
    card = write_card(tmp_path, "v")
    with pytest.raises(ValueError, match="NaN"): D.make_detection(card, 0.5, heatmap=np.full((3, 3), np.nan))
    with pytest.raises(ValueError, match="HxW"): D.make_detection(card, 0.5, heatmap=np.zeros((3, 3, 3)))
    with pytest.raises(ValueError, match="not a finite"): D.make_detection(card, float("nan"))


# --- panels -------------------------------------------------------------------------------------------

def test_panels_written_and_sized(doubles, tmp_path):
    img = photo(640, 480)
    res = D.run_pool(img, ["t_map", "t_full", "t_llr", "t_raise"])
    paths = D.write_panels(img, res, tmp_path, side=400, tile=200)
    assert sorted(paths) == ["composite_overlay", "composite_raw", "t_full", "t_map"]
    pan = Image.open(paths["t_map"])
    assert pan.size[0] == 2 * 400 + 3 * 10 and pan.size[1] > 300
    arr = np.asarray(pan)
    assert arr[60:300, 10:410].std() > 5 and arr[60:300, 420:820].std() > 5, "both panels hold image content"
    ov, raw = Image.open(paths["composite_overlay"]), Image.open(paths["composite_raw"])
    assert ov.size == raw.size
    # 3 tiles (original + 2 map detectors) -> 2x2 grid of 200-px tiles with label bars
    assert ov.size[0] == 2 * 200 + 3 * 6 and ov.size[1] > 2 * 200
    with pytest.raises(ValueError, match="no heatmap"): D.heatmap_panel(img, res["t_llr"])


def test_failed_map_detector_keeps_its_tile(doubles, tmp_path):
    img = photo()
    res = D.run_pool(img, ["t_map", "t_full"])
    res["t_full"] = Detection(detector="t_full", status="timeout", error="slow")
    ov, _ = D.composite_panels(img, res, tile=100)
    assert ov.size[0] == 2 * 100 + 3 * 6 and ov.size[1] > 200  # still original + 2 tiles


def test_tiny_image_panel(doubles):
    res = D.run_pool(photo(16, 16), ["t_map"])
    pan = D.heatmap_panel(photo(16, 16), res["t_map"], side=256)
    assert pan.size[0] >= 2 * 256


# --- CLI ----------------------------------------------------------------------------------------------

def test_detect_cli(doubles, tmp_path):
    from forensicslab.cli import app
    p = tmp_path / "a.jpg"; Image.fromarray(photo()).save(p, quality=90)
    r = CliRunner().invoke(app, ["detect", str(p), "-d", "t_map", "-d", "t_llr", "-d", "t_raise",
                                 "--panels", str(tmp_path / "pan")])
    assert r.exit_code == 0, r.output
    assert "t_llr" in r.output and "llr = " in r.output and "error: RuntimeError" in r.output
    assert (tmp_path / "pan" / "t_map_panel.png").is_file() and (tmp_path / "pan" / "composite_raw.png").is_file()
    r = CliRunner().invoke(app, ["detect", str(p), "-d", "t_map", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["t_map"]["status"] == "ok"
    r = CliRunner().invoke(app, ["detect", str(tmp_path / "none.jpg")])
    assert r.exit_code == 2 and "no such file" in r.output
    r = CliRunner().invoke(app, ["detect", str(p), "-d", "ghost"])
    assert r.exit_code == 2 and "unknown detectors" in r.output


def test_stage0_runs_detectors_single_threaded_and_restores(tmp_path):
    "During dispatch torch and OpenCV use one intra-op thread per detector; the settings come back afterwards."
    import cv2
    import torch
    seen = {}

    class Probe:
        card = write_card(tmp_path, "t_probe")
        def detect(self, image):
            seen.update(torch=torch.get_num_threads(), cv2=cv2.getNumThreads())
            return D.make_detection(self.card, 0.1)

    D.register("t_probe")(Probe)
    before = (torch.get_num_threads(), cv2.getNumThreads())
    try:
        torch.set_num_threads(2); cv2.setNumThreads(2)
        D.run_pool(photo(), ["t_probe"])
        assert seen == {"torch": 1, "cv2": 1}
        assert (torch.get_num_threads(), cv2.getNumThreads()) == (2, 2)
        D.run_pool(photo(), ["t_probe"], intra_threads=None)
        assert seen == {"torch": 2, "cv2": 2}
    finally:
        torch.set_num_threads(before[0]); cv2.setNumThreads(before[1]); D.unregister("t_probe")


# --- the Stage 0 fire rule: a detector fires when its normalised score is ABOVE the card's threshold ---------------------
def test_fire_rule_is_score_above_threshold_not_at_it(tmp_path):
    assert not Detection.from_score("x", 0.5).fired and Detection.from_score("x", 0.5 + 2 ** -10).fired
    assert not Detection.from_score("x", 0.25, threshold=0.25).fired and Detection.from_score("x", 0.3, threshold=0.25).fired
    with pytest.raises(ValueError, match="score > threshold"):
        Detection(detector="x", score=0.5, fired=True, threshold=0.5)       # a record that says "fired at the threshold"
    # through Stage 0: two doubles whose identity-normalised scores sit exactly at 0.5 and one step above it
    class At:
        card = write_card(tmp_path, "t_at")
        def detect(self, image): return D.make_detection(self.card, 0.5)
    class Above:
        card = write_card(tmp_path, "t_above")
        def detect(self, image): return D.make_detection(self.card, 0.5 + 2 ** -10)
    D.register("t_at")(At); D.register("t_above")(Above)
    try:
        res = D.run_pool(photo(64, 48), ["t_at", "t_above"])
    finally:
        D.unregister("t_at"); D.unregister("t_above")
    assert {k: (d.status, d.score, d.fired) for k, d in res.items()} == {"t_at": ("ok", 0.5, False), "t_above": ("ok", 0.5 + 2 ** -10, True)}


def test_fire_rule_reads_the_card_threshold(tmp_path):
    "A card's own threshold (0.25 here) decides, not 0.5: 0.3 fires, 0.25 does not."
    write_card(tmp_path, "t_low")
    (tmp_path / "t_low.yaml").write_text((tmp_path / "t_low.yaml").read_text() + "threshold: 0.25\n")
    card = D.load_card("t_low", tmp_path)
    assert card.threshold == 0.25
    class Low:
        def __init__(self, v): self.card, self.v = card, v
        def detect(self, image): return D.make_detection(self.card, self.v)
    D.register("t_low")(lambda: Low(0.3))
    try:
        d = D.run_pool(photo(64, 48), ["t_low"])["t_low"]
    finally:
        D.unregister("t_low")
    assert (d.score, d.threshold, d.fired) == (0.3, 0.25, True)
    assert not D.make_detection(card, 0.25).fired and D.make_detection(card, 0.2500001).fired


def test_a_face_search_runs_once_per_image_and_every_caller_gets_its_own_answer(monkeypatch):
    "face_blend, its ungated variant and face_swap_net search the same image: the cascade runs once, answers unchanged."
    from skimage import data
    import forensicslab.detectors.builtin.face_blend as FB
    rgb = np.ascontiguousarray(data.astronaut()[::2, ::2])
    plain = FB.locate_faces.__wrapped__(rgb, 32), FB.most_face_like.__wrapped__(rgb, 32)
    calls = []
    real = FB.find_faces_haar
    monkeypatch.setattr(FB, "find_faces_haar", lambda *a, **k: calls.append(1) or real(*a, **k))
    FB._SEARCHES.clear()
    first = FB.locate_faces(rgb, 32)
    assert first == plain[0] and first[0], "the astronaut's face is found, as without the memo"
    first[0].clear()                                   # a caller that edits its answer does not edit the next caller's
    assert FB.locate_faces(rgb, 32) == plain[0] and len(calls) == 1
    assert FB.locate_faces(rgb.copy(), 32) == plain[0] and len(calls) == 1, "keyed by content, not by the array object"
    assert FB.locate_faces(rgb, min_size=32, max_faces=5) == plain[0] and len(calls) == 1, "keywords and defaults: one search"
    assert FB.locate_faces(rgb, 48) is not None and len(calls) == 2, "other arguments search again"
    other = np.ascontiguousarray(rgb[:, ::-1])
    mirrored = FB.locate_faces(other, 32)
    assert len(calls) == 3 and mirrored == FB.locate_faces.__wrapped__(other, 32)
    assert FB.most_face_like(rgb, 32) == plain[1]
