"""Do the anomaly readings generalise, or were they fit to the test split? (issue 30 item 4)

The instruments-alone control (a logistic regression over `zoom.verifier.box_cues`, fit on the training items, no words,
no model) scored on valid test evidence against wrong-box negatives, with the first seven instruments only (rule cues
and forensic readouts, session 15) and with the six anomaly z-scores added (`BoxInstruments.anomaly`, session 16).
The anomaly readings were chosen after one look at the `artifacts` test split; `artifacts_heldout` (test photographs
never seen in training, smaller crops, weaker flaws) had not been looked at when they were fixed, so it is the check.
The gain's 95 % interval comes from 2000 bootstrap resamples of the test items (valid and wrong-box apart), both
scorers on the same resample.

    OMP_NUM_THREADS=1 python scripts/zoom_diagnosis/instruments_anomaly.py [DESIGN ...]
"""
import json, sys
import numpy as np
from sklearn.linear_model import LogisticRegression
from forensicslab.metrics import roc_auc
from forensicslab.zoom.construct import construct, grounding_negatives
from forensicslab.zoom.data import extra_train, load_artifacts
from forensicslab.zoom.verifier import ANOMALY_MAPS, INSTRUMENTS, box_cues

auc = lambda pos, neg: round(roc_auc(np.r_[pos, neg], np.r_[np.ones(len(pos)), np.zeros(len(neg))]), 3)
for design in sys.argv[1:] or ["artifacts", "artifacts_heldout"]:
    train, test = load_artifacts("train", design=design), load_artifacts("test", design=design)
    pool = train + extra_train(2, seed=0, design=design)
    c_train, c_test = construct(pool, variants=("o3",), seed=0), construct(test, variants=("o3",), seed=1)
    valid = [r for r in c_test.verifier_items if r["kind"] == "valid"]
    neg = [r for r in c_test.verifier_items if r["kind"] == "wrong_box"] + grounding_negatives(valid, test, seed=5)
    recs = c_train.verifier_items + grounding_negatives(c_train.verifier_items, pool, seed=0, per_item=3,
                                                        text_modes=("copy", "own", "none"))
    X = {k: np.array([box_cues(r["image"], r["box"]) for r in rs]) for k, rs in (("train", recs), ("valid", valid), ("neg", neg))}
    kind_of = {s.id: s.provenance.get("kind", "") for s in test}
    kv, kn = (np.array([kind_of[r["sample_id"]] for r in rs]) for rs in (valid, neg))
    scores = {}
    for name, cols in (("rule cues + readouts", len(INSTRUMENTS) - len(ANOMALY_MAPS)), ("+ anomaly z-scores", len(INSTRUMENTS))):
        lr = LogisticRegression(max_iter=4000).fit(X["train"][:, :cols], [r["soft_label"] > 0.5 for r in recs])
        sv, sn = scores[name] = lr.decision_function(X["valid"][:, :cols]), lr.decision_function(X["neg"][:, :cols])
        print(json.dumps({"design": design, "instruments": name, "n_valid": len(valid), "n_wrong_box": len(neg),
                          "wrong_box_auc": auc(sv, sn), "by_kind": {k: auc(sv[kv == k], sn[kn == k]) for k in sorted(set(kv))}}), flush=True)
    rng, (a, b) = np.random.default_rng(0), scores.values()
    gains = []
    for _ in range(2000):
        iv, jn = rng.integers(0, len(valid), len(valid)), rng.integers(0, len(neg), len(neg))
        gains.append(auc(b[0][iv], b[1][jn]) - auc(a[0][iv], a[1][jn]))
    print(json.dumps({"design": design, "anomaly_gain": round(auc(*b) - auc(*a), 3),
                      "gain_95ci": [round(float(q), 3) for q in np.quantile(gains, [0.025, 0.975])]}), flush=True)
