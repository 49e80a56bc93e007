"""Instrument-only controls for the zoom study (issue 30 item 1): what the forensic tools' readouts alone can tell.

A logistic regression over image-level readouts (`zoom.rules.instrument_features`: max and min of each readout over
a 3 x 3 grid of half-size windows), fitted on the artifact train split and scored on the test split; the same with
the test readouts shuffled across images (should fall to chance); and the oracle view (the true flaw boxes), a
ceiling by construction. These are the rows a trained policy with the same tools has to beat.

    OMP_NUM_THREADS=1 python scripts/zoom_diagnosis/instrument_controls.py [split ...]
"""
import json, sys, time
from forensicslab.zoom.data import load_study_data
from forensicslab.zoom.rules import TOOL_SETS
from forensicslab.zoom.study import instrument_baseline

train = load_study_data("artifacts", "train", seed=0)
for split in sys.argv[1:] or ["test"]:
    test = load_study_data("artifacts", split, seed=0)
    for name, views, shuffle in [("forensic", TOOL_SETS["forensic"], False), ("forensic, shuffled across images", TOOL_SETS["forensic"], True),
                                 ("forensic_pool", TOOL_SETS["forensic_pool"], False), ("oracle (true flaw boxes)", ("oracle",), False)]:
        t0 = time.time()
        r = instrument_baseline(train, test, views, shuffle=shuffle)
        print(json.dumps({"split": split, "tools": name, "n_train": len(train), "n_test": r["n"],
                          **{k: round(r[k], 3) for k in ("accuracy", "f1", "auc")}, "seconds": round(time.time() - t0)}), flush=True)
