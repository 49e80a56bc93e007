"""How far can any policy that reads the built-in detectors' survey beat rule (a) on IoU? (zoom issue 46 item 4, session 32)

Rule (a) of the `zoom_grounding` table answers "fake" when a surveyed detector scores above 0.5 and then gives the top
line's box (R1). IoU is scored on every fake, and a fake answered "real" scores 0. So a policy can gain IoU over (a)
in only two ways:
1. choose a better line on the fakes where a detector fires (the verdict stays the rule's);
2. call some *quiet* fakes (no detector above 0.5) "fake" and box them, without calling as many authentic images fake.
This script measures the ceiling of each on the manipulation design, with no model:
- for 1, the oracle line (the best IoU of any surveyed line) on firing fakes, against R1;
- for 2, how well the quiet fakes can be told from the quiet authentic images by a logistic regression fitted on
  the TRAIN split: over the survey (each tool's score and contrast), and over the survey plus the readouts of a crop on
  the first line with a non-flat map (what the policy reads after its zoom). The trade is printed as the test
  split's acc, F1 and IoU when the k quiet images with the highest probability are called fake, for several k (k
  chosen on the test split: a bound), and with the probability threshold that maximises F1 on the train split
  (out-of-fold probabilities, 5 folds: a rule that could be deployed).
Run from the repository root: `python scripts/zoom_diagnosis/survey_headroom.py` (about a minute with a warm detection
cache)."""
import collections
import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_predict
from sklearn.metrics import roc_auc_score
from forensicslab.imageio import load_image
from forensicslab.zoom.all import ensure_artifacts, load_artifacts
from forensicslab.zoom.rewards import union_iou
from forensicslab.zoom.rules import ForensicViews, survey, tool_views

FLAT = 0.01   # a map whose strongest window stands out by less than this is flat (the detector has no map to show)

def rows(split, root):
    out = []
    for s in load_artifacts(split, root):
        fv = ForensicViews(load_image(s.image), tool_views("detectors"))
        E = survey(fv)
        truth = [b.box.as_list() for b in s.boxes if b.box is not None][:1]
        first = next((i for i, e in enumerate(E) if e["contrast"] >= FLAT), 0)
        crop = fv.readouts(E[first]["box"])
        by_tool = sorted(E, key=lambda e: e["tool"])
        out.append(dict(label=s.label, family=s.family, fires=E[0]["score"] > 0.5,
                        ious=[union_iou([e["box"]], truth) if truth else 0.0 for e in E], first=first,
                        survey=[e[k] for e in by_tool for k in ("score", "contrast")],
                        crop=[crop[k] for k in sorted(crop)]))
    return out

def scores(S, called_fake):
    "acc, F1 and IoU on fakes when `called_fake[i]` is the verdict of S[i] and a fake answered fake gets its box."
    y = np.array([r["label"] for r in S]); p = np.array(called_fake, bool)
    tp, fp, fn = int((p & (y == 1)).sum()), int((p & (y == 0)).sum()), int((~p & (y == 1)).sum())
    iou = np.mean([(r["ious"][r["first"]] if c else 0.0) for r, c in zip(S, p) if r["label"] == 1])
    return round(float((p == y).mean()), 3), round(2 * tp / (2 * tp + fp + fn), 3), round(float(iou), 3)

def _spread(S, Q, q):
    "The quiet subset's probabilities `q` placed on the whole split `S` (0 for firing images)."
    at = {id(r): v for r, v in zip(Q, q)}
    return [at.get(id(r), 0.0) for r in S]

root = ensure_artifacts(design="manipulations")
data = {split: rows(split, root) for split in ("train", "test")}
for split, S in data.items():
    F = [r for r in S if r["label"] == 1]
    fire = [r for r in F if r["fires"]]
    print(f"{split}: {len(F)} fakes, {len(fire)} with a detector above 0.5; quiet fakes by family "
          f"{dict(collections.Counter(r['family'] for r in F if not r['fires']))}; quiet authentic "
          f"{sum(1 for r in S if r['label'] == 0 and not r['fires'])} of {sum(1 for r in S if r['label'] == 0)}")
    print(f"  way 1, firing fakes: R1 IoU {np.mean([r['ious'][0] for r in fire]):.3f}, oracle line {np.mean([max(r['ious']) for r in fire]):.3f}"
          f" (a better line than R1 for {sum(max(r['ious']) > r['ious'][0] + 1e-9 for r in fire)} of {len(fire)})")
    print(f"  over all fakes with quiet fakes answered real: rule (a) {sum(r['ious'][0] for r in fire) / len(F):.3f},"
          f" oracle line {sum(max(r['ious']) for r in fire) / len(F):.3f}")
    print(f"  way 2, quiet fakes boxed by the first non-flat line (every quiet fake called fake): IoU on them "
          f"{np.mean([r['ious'][r['first']] for r in F if not r['fires']]):.3f}, oracle line {np.mean([max(r['ious']) for r in F if not r['fires']]):.3f}")

quiet = {split: [r for r in S if not r["fires"]] for split, S in data.items()}
for name, feats in (("survey", lambda r: r["survey"]), ("survey + crop readouts", lambda r: r["survey"] + r["crop"])):
    Xtr, ytr = np.array([feats(r) for r in quiet["train"]]), np.array([r["label"] for r in quiet["train"]])
    Xte, yte = np.array([feats(r) for r in quiet["test"]]), np.array([r["label"] for r in quiet["test"]])
    m = LogisticRegression(max_iter=5000).fit(Xtr, ytr)
    p = m.predict_proba(Xte)[:, 1]
    print(f"way 2, quiet images only, LR over the {name}: AUC train {roc_auc_score(ytr, m.predict_proba(Xtr)[:, 1]):.3f},"
          f" test {roc_auc_score(yte, p):.3f} ({int(yte.sum())} fakes of {len(yte)})")
    oof = cross_val_predict(LogisticRegression(max_iter=5000), Xtr, ytr, cv=5, method="predict_proba")[:, 1]
    spread = _spread(data["train"], quiet["train"], oof)
    f1_at = lambda t: scores(data["train"], [r["fires"] or q > t for r, q in zip(data["train"], spread)])[1]
    t = max(sorted(set(oof)) + [1.0], key=f1_at)
    called = [r["fires"] or q > t for r, q in zip(data["test"], _spread(data["test"], quiet["test"], p))]
    print(f"  test, rule (a) plus the quiet images above the threshold fitted on train ({t:.3f}, "
          f"{sum(q > t for q in p)} called fake): acc, F1, IoU {scores(data['test'], called)}")
    order = np.argsort(-p)
    for k in (0, 5, 10, 20, 40):
        flagged = {id(quiet["test"][i]) for i in order[:k]}
        called = [r["fires"] or id(r) in flagged for r in data["test"]]
        hit = sum(quiet["test"][i]["label"] for i in order[:k])
        acc, f1, iou = scores(data["test"], called)
        print(f"  test, rule (a) plus the {k:2d} most likely quiet images called fake ({hit} fakes): acc {acc}, F1 {f1}, IoU {iou}")
