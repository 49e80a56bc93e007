"The third-party protocol of the built-in pool (issue 27 item 1): ungated variants, own-family calibration, two specialists."
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from skimage import data as skdata

from forensicslab.core import Sample
from forensicslab.data.bench import GROUPS
from forensicslab.detectors.builtin import ungated as U
from forensicslab.detectors.learned import WEIGHTS_DIR, load_net, train_face_swap_net, train_splice_net
from forensicslab.detectors.paper.pool import resolve_pool
from forensicslab.detectors.pool import get_detector, list_detectors, load_card
from forensicslab.imageio import load_image

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def png():
    "A small lossless photo crop with no JPEG grid, no CFA trace and no face: out of scope for adq, cfa and face_blend."
    return load_image(np.ascontiguousarray(skdata.coffee()[40:200, 120:360]))


def test_pool_names():
    ids = resolve_pool("builtin-ungated")
    assert ids == sorted(U.UNGATED_POOL) and len(ids) == 10 and U.MISSING_CARDS == []
    assert not set(ids) & set(list_detectors())                     # opt-in: the default pool is unchanged
    assert set(resolve_pool("default")) == set(list_detectors())


@pytest.mark.parametrize("base", ["adq", "cfa", "face_blend"])
def test_ungated_scores_out_of_scope_and_reports_the_fact(png, base):
    gated = get_detector(base).detect(png)
    d = get_detector(U.ungated_id(base)).detect(png)
    native = d.raw[load_card(base).native_metric]
    assert d.status == "ok" and native is not None and np.isfinite(native)
    assert d.raw["applicable"] is False and d.raw["reason"] and d.raw["precondition"] == U.PRECONDITIONS[base]
    if base in ("adq", "cfa"): assert gated.score == 0.5 and d.score != 0.5     # the gate returned exactly 0.5
    else: assert gated.raw["faces"] == 0 and "per_face" not in gated.raw and d.raw["per_face"]


def test_every_pool_member_reports_applicability(png):
    small = load_image(np.ascontiguousarray(png.rgb[:96, :96]))
    for i in U.UNGATED_POOL:
        d = get_detector(i).detect(small)
        assert d.status == "ok" and 0 <= d.score <= 1, i
        assert isinstance(d.raw.get("applicable"), bool), i


def _sample(i, group, label, split="train"):
    return Sample(id=f"{split}-{group}-{label}-{i:02d}", image="x.png", label=label, split=split,
                  family=GROUPS[group] if label else None, provenance={"group": group})


def test_calibration_uses_only_its_own_family_train_group():
    own = [_sample(i, "face_blend", l) for i in range(4) for l in (0, 1)]
    other = [_sample(i, g, l) for i in range(4) for g in ("npr", "adq") for l in (0, 1)] + \
            [_sample(i, "face_blend", l, "id") for i in range(4) for l in (0, 1)]
    # own group: authentic 0..3, manipulated 10..13 -> cut 6.5 with no error; any leaked image sits across that cut
    val = lambda s: (10.0 if s.label else 0.0) + int(s.id[-2:]) if (s.split, s.provenance["group"]) == ("train", "face_blend") \
        else (-100.0 if s.label else 100.0)
    rec = U.calibrate("face_blend_ungated", own + other, val)
    assert (rec["n_manipulated"], rec["n_authentic"], rec["threshold"], rec["eer_fpr"], rec["eer_fnr"]) == (4, 4, 6.5, 0.0, 0.0)
    assert rec["ids_sha256"] == U.calibrate("face_blend_ungated", own, val)["ids_sha256"]
    with pytest.raises(U.CalibrationError, match="0 manipulated"): U.calibrate("cfa_ungated", own, val)


def test_committed_cards_were_calibrated_on_the_own_group():
    "Each committed card's record names its own group and, where the benchmark is built here, the exact train images."
    manifest = REPO / "data" / "bench" / "train" / "samples.jsonl"
    train = [Sample.model_validate(json.loads(l)) for l in manifest.read_text().splitlines() if l.strip()] if manifest.is_file() else None
    for i in U.UNGATED_POOL:
        rec = U.calibration_record(i)
        groups = U.OWN_GROUPS[i.removesuffix("_ungated")]
        assert f"group(s) {', '.join(groups)}" in rec["data"] and "collection train" in rec["data"], i
        card = load_card(i)
        assert card.normalisation.startswith(f"logistic(center={rec['threshold']:.6g}"), i
        if train is not None:
            pos, neg = U.own_group(train, i)
            if i in U.SPECIALISTS:
                from forensicslab.detectors.learned import calibration_split
                cal = calibration_split(pos + neg)[1]
                pos, neg = [s for s in cal if s.label == 1], [s for s in cal if s.label == 0]
            ids = sorted(s.id for s in pos + neg)
            assert rec["ids_sha256"] == hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16], i
            assert (rec["n_manipulated"], rec["n_authentic"]) == (len(pos), len(neg)), i


def test_specialists_load_committed_weights_and_are_deterministic():
    img = load_image(np.ascontiguousarray(skdata.astronaut()[::2, ::2]))
    for i in U.SPECIALISTS:
        assert (WEIGHTS_DIR / f"{i}.safetensors").is_file()
        a = get_detector(i).detect(img)
        load_net.cache_clear()
        b = get_detector(i).detect(img)
        assert a.status == "ok" and a.score == b.score and 0 < a.score < 1, i
    assert get_detector("face_swap_net").detect(img).raw["applicable"] is True       # the astronaut's face passes the cascade


def _tiny_bench(root: Path) -> list[Sample]:
    rng = np.random.default_rng(0)
    out = []
    for g, fam in (("face_blend", "face"), ("adq", "splice"), ("npr", "synthesis")):
        for label in (0, 1):
            for i in range(3):
                p = root / f"{g}-{label}-{i}.png"
                Image.fromarray(rng.integers(0, 255, (72, 72, 3), dtype=np.uint8)).save(p)
                m = None
                if label:
                    m = root / f"{g}-{label}-{i}_m.png"
                    mm = np.zeros((72, 72), np.uint8); mm[20:50, 20:50] = 255
                    Image.fromarray(mm).save(m)
                out.append(Sample(id=f"train-{g}-{label}-{i}", image=str(p), label=label, split="train",
                                  family=fam if label else None, mask=str(m) if m else None, provenance={"group": g}))
    return out


def test_specialist_training_is_seeded(tmp_path):
    s = _tiny_bench(tmp_path)
    for train in (lambda: train_face_swap_net(s, steps=2, batch=4, log=None),
                  lambda: train_splice_net(s, steps=2, batch=2, crop=32, log=None)):
        a, b = train().state_dict(), train().state_dict()
        assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    with pytest.raises(ValueError, match="splice and authentic"):
        train_splice_net([x for x in s if x.provenance["group"] != "adq"], steps=1, log=None)


def test_an_ungated_variant_that_only_rescores_is_read_from_its_builtins_cached_detection(png, tmp_path, monkeypatch):
    "Table 4 with the ungated pool after the scorecard: copy-move, noise... are not computed a second time."
    from forensicslab.detectors.pool import run_pool
    same = [U.ungated_id(b) for b in U.SAME_AS_GATED]
    direct = run_pool(png, same, cache=False)
    run_pool(png, list(U.SAME_AS_GATED), cache=tmp_path)                   # the built-ins' detections, cached
    for i in same: monkeypatch.setattr(type(get_detector(i)), "detect", lambda self, image: pytest.fail("computed again"))
    read = run_pool(png, same, cache=tmp_path)
    for i in same:
        assert read[i].status == "ok" and read[i].detector == i and abs(read[i].score - direct[i].score) < 1e-9
        assert read[i].raw["precondition"] == U.PRECONDITIONS[i.removesuffix("_ungated")]
        assert (read[i].heatmap is None) == (direct[i].heatmap is None)
        if read[i].heatmap is not None: assert np.allclose(read[i].heatmap, direct[i].heatmap, atol=1e-6)
    assert get_detector("adq_ungated").rescores is None                   # computes another value: runs itself


def test_an_ungated_variant_run_first_computes_its_builtin_for_the_cache(png, tmp_path, monkeypatch):
    "The ungated Table 4 beside the gated one (make demo): whichever runs first, copy-move... is computed once per image."
    from forensicslab.detectors import pool as P
    same, gated = [U.ungated_id(b) for b in U.SAME_AS_GATED], list(U.SAME_AS_GATED)
    fail = lambda self, image: pytest.fail("computed by the wrong detector")
    with monkeypatch.context() as m:
        m.setattr(P, "_rescorable", lambda det, max_side: False)          # before: every detector computes itself
        P.run_pool(png, same + gated, cache=tmp_path / "before")
        before = P.run_pool(png, same + gated, cache=tmp_path / "before")   # read back, as every later run reads them
    with monkeypatch.context() as m:
        for i in same: m.setattr(type(get_detector(i)), "detect", fail)
        first = P.run_pool(png, same + ["adq_ungated"], cache=tmp_path / "shared")   # the ungated pool first, empty cache
    with monkeypatch.context() as m:
        for b in gated: m.setattr(type(get_detector(b)), "detect", fail)
        then = P.run_pool(png, gated, cache=tmp_path / "shared")            # the gated pool reads what it stored
    for i in same + gated:
        got, want = (first | then)[i], before[i]
        assert got.status == "ok" and got.detector == i and got.score == want.score and got.raw == want.raw
        assert (got.heatmap is None) == (want.heatmap is None)
        if got.heatmap is not None: assert np.array_equal(got.heatmap, want.heatmap)
    assert first["adq_ungated"].status == "ok"                              # computes another value: ran itself
