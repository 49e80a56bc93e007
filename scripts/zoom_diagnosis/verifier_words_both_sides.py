"""The committed zoom_figure5 verifier (with instruments) scored with the same wording on both sides: valid items and
wrong-box negatives both without a place (`none`), or both naming their own box's place (`own`), beside the study's
`own` row (valid items keep their words). If the study's own-place AUC came from the asymmetry of the wording, these
would differ from it. Session 15 (`python scripts/zoom_diagnosis/verifier_words_both_sides.py`, about 1 min):

    valid copy negatives own  rule on  AUC 0.812      (the study's own row)
    valid copy negatives own  rule off AUC 0.837
    valid none negatives none rule on  AUC 0.842
    valid none negatives none rule off AUC 0.842
    valid own  negatives own  rule on  AUC 0.838
    valid own  negatives own  rule off AUC 0.838
"""
import numpy as np, torch
from forensicslab.metrics import roc_auc
from forensicslab.zoom.data import load_artifacts
from forensicslab.zoom.construct import construct, grounding_negatives, place_text
from forensicslab.zoom.verifier import load_verifier, items_from_records, to_pil
torch.set_num_threads(1)
test = load_artifacts("test")
c_test = construct(test, variants=("o3",), seed=1)
recs = c_test.verifier_items
vrec = [g for g in recs if g["kind"] == "valid"]
wb = [g for g in recs if g["kind"] == "wrong_box"] + grounding_negatives(vrec, test, seed=5)
sizes = {s.id: to_pil(s.image).size for s in test}
ver = load_verifier("outputs/zoom_figure5/verifier", device="cpu")
y = np.r_[np.ones(len(vrec)), np.zeros(len(wb))]
for vmode, nmode in (("copy", "own"), ("none", "none"), ("own", "own")):
    for rule in (True, False):
        ver.location = rule
        v = [dict(r, text=place_text(r["text"], r["box"], *sizes[r["sample_id"]], vmode)) for r in vrec]
        n = [dict(r, text=place_text(r["text"], r["box"], *sizes[r["sample_id"]], nmode)) for r in wb]
        s = ver.score_items(items_from_records(v + n, with_labels=False))
        print(f"valid {vmode:4s} negatives {nmode:4s} rule {'on ' if rule else 'off'} AUC {roc_auc(np.array(s), y):.3f}")
