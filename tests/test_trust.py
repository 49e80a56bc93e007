"""The experience store on a synthetic stream with known, context-specific fire rates (issue 28): the store's
interval covers the true false-alarm rate of each context, and the likelihood-ratio judge's specificity rises
with the number of labelled cases seen, beyond what a context-blind store reaches."""
import json

import numpy as np
import pytest

from forensicslab.core import Detection
from forensicslab.triage.records import make_card
from forensicslab.triage.trust import (Combiner, ExperienceRow, TrustError, TrustStore, lr_judge, lr_posterior,
                                       store_summary, trust_rules)

# true fire rates: fb (face-scoped) fires on 60% of authentic portraits and 2% of authentic images without a face
FIRE = {("fb", "authentic", "face"): 0.60, ("fb", "authentic", "no face"): 0.02, ("fb", "face", "face"): 0.80,
        ("fb", "splice", "face"): 0.02, ("fb", "splice", "no face"): 0.02,
        ("sp", "authentic", "face"): 0.05, ("sp", "authentic", "no face"): 0.05, ("sp", "face", "face"): 0.05,
        ("sp", "splice", "face"): 0.80, ("sp", "splice", "no face"): 0.80}
SCOPES = {"fb": ["face"], "sp": ["splice"]}

def stream(n: int, seed: int) -> list[ExperienceRow]:
    "n labelled cases: half authentic (half of them portraits), a quarter face edits, a quarter splices."
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        u = rng.random()
        cls, face = ("authentic", "face") if u < 0.25 else ("authentic", "no face") if u < 0.5 else \
                    ("face", "face") if u < 0.75 else ("splice", "face" if rng.random() < 0.5 else "no face")
        fired = {d: bool(rng.random() < FIRE[(d, cls, face)]) for d in SCOPES}
        out.append(ExperienceRow(id=f"s{seed}-{i}", label=int(cls != "authentic"), family=None if cls == "authentic" else cls,
                                 context={"face": face, "jpeg": "q90+", "size": "<0.25MP"},
                                 container={"is_jpeg": True, "quality": 92, "pixels": 65536}, fired=fired,
                                 scores={d: 0.9 if f else 0.1 for d, f in fired.items()}, scopes=SCOPES))
    return out

def specificity(store: TrustStore, test: list[ExperienceRow]) -> float:
    auth = [r for r in test if r.label == 0]
    return float(np.mean([lr_posterior(store, r.fired, r.context)["p_manipulated"] <= 0.5 for r in auth]))

def test_interval_covers_the_context_false_alarm_rate():
    store = TrustStore.fit(stream(2000, 0))
    for face in ("face", "no face"):
        r = store.rate("fb", "authentic", {"face": face, "jpeg": "q90+", "size": "<0.25MP"})
        lo, hi = r.interval()
        assert r.n > 400 and lo <= FIRE[("fb", "authentic", face)] <= hi, (face, r.n, r.k, lo, hi)
    lo, hi = store.rate("fb", "authentic").interval()     # the context-blind rate (about 0.31) covers neither context
    assert not lo <= 0.60 <= hi and not lo <= 0.02 <= hi

def test_specificity_rises_with_cases_seen_and_beats_a_context_blind_store():
    test = stream(1500, 99)
    sizes = (8, 40, 2000)
    spec = {n: np.mean([specificity(TrustStore.fit(stream(n, s)), test) for s in range(5)]) for n in sizes}
    blind = np.mean([specificity(TrustStore.fit(stream(2000, s), context_facts=()), test) for s in range(5)])
    assert spec[2000] > spec[8] + 0.1 and spec[2000] >= spec[40] - 0.01, spec
    assert spec[2000] > blind + 0.1, (spec, blind)       # the gain comes from the context buckets

def test_store_file_roundtrip_and_errors(tmp_path):
    store = TrustStore.fit(stream(300, 1), sources=["synthetic"])
    p = store.save(tmp_path / "t.json")
    assert TrustStore.load(p) == store and json.loads(p.read_text())["sources"] == ["synthetic"]
    p.write_text("not json")
    with pytest.raises(TrustError, match="not a trust store"): TrustStore.load(p)
    with pytest.raises(TrustError, match="no labelled rows"): TrustStore.fit([])
    with pytest.raises(TrustError, match="unknown context fact"): TrustStore.fit(stream(10, 0), context_facts=("texture",))
    s = store_summary(store)
    assert set(s.bucket[s.detector == "fb"]) == {"all", "face=face|jpeg=q90+|size=<0.25MP", "face=no face|jpeg=q90+|size=<0.25MP"}

def test_lr_judge_names_the_detector_that_moved_the_posterior():
    store = TrustStore.fit(stream(2000, 2))
    cards = {d: make_card(d, s, True) for d, s in SCOPES.items()}
    dets = {"fb": Detection.from_score("fb", 0.2), "sp": Detection.from_score("sp", 0.9)}
    v, info = lr_judge(store, dets, cards, {"face": "no face", "jpeg": "q90+", "size": "<0.25MP"})
    assert v.is_manipulated and v.decisive == "sp" and info["moved_most"] == "sp" and info["family"] == "splice"
    assert "fired on" in trust_rules(store, "fb", {"face": "face", "jpeg": "q90+", "size": "<0.25MP"})

def test_container_only_control_learns_the_container_when_classes_differ_in_it():
    rows = stream(400, 3)
    for r in rows:   # a collection whose manipulated files were all re-saved as PNG: the container alone separates it
        if r.label == 1: r.container = {"is_jpeg": False, "quality": None, "pixels": 65536}
    p = Combiner.fit(rows, "container").predict_proba(rows)
    y = np.array([r.label for r in rows])
    assert (p[y == 1] > 0.5).all() and (p[y == 0] < 0.5).all()
