"""Does the verifier ground, or read the location words? (issue 30 item 4)

Wrong-box test negatives are rewritten three ways (`construct.place_text`): `copy` keeps the reference's place
(what the committed Figure 5 measured), `own` names the wrong box's own place (the location rule then agrees with
the box) and `none` drops the place. Each verifier is scored with its location rule on and off (`Verifier(location=False)`).
Verifiers: the one a study trained (`--verifier`, copy negatives) and one trained here with copy + own + none
negatives (the same settings as the pipeline's tiny verifier: grounding head, frozen pretrained tower, lr 3e-3);
with `instrument` = 1 the retrained head also reads the instruments measured inside each box (`VerifierTrainConfig.instrument`:
the rule cues, the residual, error-level and copy-move readouts and, since session 16, the box's anomaly z-scores),
and a logistic regression over those alone is scored.
The rule cues alone (the strongest inside the box, `RuleEvidenceJudge.strength`, no training, no words) are scored too.

    OMP_NUM_THREADS=1 python scripts/zoom_diagnosis/verifier_own_place.py BASE_DIR [VERIFIER_DIR|-] [epochs] [instrument]
"""
import json, sys, time
import numpy as np, torch
from forensicslab.metrics import roc_auc
from forensicslab.imageio import load_image
from forensicslab.zoom.data import extra_train, load_artifacts
from forensicslab.core import Box, EvidenceItem
from forensicslab.zoom.construct import construct, grounding_negatives, place_text
from forensicslab.zoom.rules import RuleEvidenceJudge
from forensicslab.zoom.verifier import (INSTRUMENTS, Verifier, VerifierTrainConfig, fit_box_instruments, items_from_records,
                                        load_verifier, new_verifier, train_verifier)

torch.set_num_threads(1)
base = sys.argv[1]
trained = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 8
instrument = len(sys.argv) > 4 and sys.argv[4] == "1"
train, test = load_artifacts("train"), load_artifacts("test")
pool = train + extra_train(2, seed=0)
c_train, c_test = construct(pool, variants=("o3",), seed=0), construct(test, variants=("o3",), seed=1)
valid = [r for r in c_test.verifier_items if r["kind"] == "valid"]
wrong = [r for r in c_test.verifier_items if r["kind"] == "wrong_box"]
# more wrong-box test negatives: each valid test item on a box away from every flaw
extra = grounding_negatives(valid, test, seed=5, text_modes=("copy",))
sizes = {r["sample_id"]: load_image(r["image"]).rgb.shape[1::-1] for r in valid + wrong}

def negatives(mode):
    return [dict(r, text=place_text(r["text"], r["box"], *sizes[r["sample_id"]], mode)) for r in wrong + extra]

def report(name, ver):
    out = {}
    for loc in (True, False):
        ver.location = loc
        sv = ver.score_items(items_from_records(valid, with_labels=False))
        for mode in ("copy", "own", "none"):
            sn = ver.score_items(items_from_records(negatives(mode), with_labels=False))
            out[f"{mode}{'' if loc else '_norule'}"] = round(roc_auc(np.r_[sv, sn], np.r_[np.ones(len(sv)), np.zeros(len(sn))]), 3)
    ver.location = True
    print(json.dumps({"verifier": name, "n_valid": len(valid), "n_wrong_box": len(wrong) + len(extra),
                      "location_weight": ver.location_weight, "wrong_box_auc": out}), flush=True)

judge = RuleEvidenceJudge()
cue = lambda recs: [judge.strength(r["image"], EvidenceItem(text=r["text"], box=Box.from_list(r["box"]))) for r in recs]
sv, sn = cue(valid), cue(wrong + extra)
print(json.dumps({"instrument only": "strongest rule cue inside the box (no words: the same for every wording)",
                  "wrong_box_auc": round(roc_auc(np.r_[sv, sn], np.r_[np.ones(len(sv)), np.zeros(len(sn))]), 3)}), flush=True)
modes = ("copy", "own", "none")
recs = c_train.verifier_items + grounding_negatives(c_train.verifier_items, pool, seed=0, per_item=len(modes), text_modes=modes)
if instrument:  # the instruments alone: a logistic regression over what the head reads under the box, no words, no model
    score = fit_box_instruments(recs)
    sv, sn = score(valid), score(wrong + extra)
    print(json.dumps({"instrument only": f"logistic regression over {list(INSTRUMENTS)} inside the box, fit on the training items",
                      "wrong_box_auc": round(roc_auc(np.r_[sv, sn], np.r_[np.ones(len(sv)), np.zeros(len(sn))]), 3)}), flush=True)
if trained: report(f"study verifier ({trained})", load_verifier(trained, device="cpu", base_path=base))
t0 = time.time()
cfg = VerifierTrainConfig(lora=False, lr=3e-3, freeze_vision=True, grounding=True, instrument=instrument, epochs=epochs, seed=0)
model, proc = new_verifier(base, cfg, device="cpu")
hist = train_verifier(model, proc, items_from_records(recs), cfg)
print(f"trained on {len(recs)} items (negatives copy/own/none), {len(hist)} steps in {time.time() - t0:.0f} s, "
      f"loss {np.mean(hist[:5]):.3f} -> {np.mean(hist[-20:]):.3f}", flush=True)
report(f"retrained, copy+own+none negatives{', with the instruments under the box' if instrument else ''}", Verifier(model, proc))
