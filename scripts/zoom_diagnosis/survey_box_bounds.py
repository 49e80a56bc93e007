"""Two ways a survey policy could beat the survey's top region (R1) on IoU, measured without any model (zoom issue 46
item 4, session 31). For every fake of the manipulation design, against its true box:

- R1: the top surveyed line's box (rule (a) of the zoom_grounding table);
- zoom then refine: after zooming on R1, the strongest window of R1's own detector map inside R1's box on a grid twice
  as fine (32 cells, windows of 2-12 cells), i.e. what a finer reading of the crop could offer as a tighter box; and the
  best such window over every map (an oracle over the maps: a bound on refining inside R1);
- agreement: the line whose box overlaps (IoU > 0.25) the most other lines' boxes, over all lines or over the lines
  that fire (score > 0.5; R1 on ties); and R1 or R2, whichever agrees with more lines;
- the best surveyed line (an oracle over the six lines, the bound of any choice among them).

Run from the repository root: `python scripts/zoom_diagnosis/survey_box_bounds.py` (under a minute with a warm
detection cache)."""
import numpy as np
from forensicslab.imageio import load_image
from forensicslab.zoom.all import ensure_artifacts, load_artifacts
from forensicslab.zoom.rewards import union_iou
from forensicslab.zoom.rules import ForensicViews, best_window, survey, tool_views

FINE = dict(cells=32, sides=(2, 3, 4, 5, 6, 8, 10, 12))
root = ensure_artifacts(design="manipulations")
for split in ("train", "test"):
    fakes = [s for s in load_artifacts(split, root) if s.label == 1]
    got = {k: [] for k in ("R1", "zoom then refine (R1's map)", "zoom then refine (best map, oracle)",
                           "most agreed line", "most agreed firing line", "R1 or R2 by agreement", "best line (oracle)")}
    for s in fakes:
        fv = ForensicViews(load_image(s.image), tool_views("detectors"))
        lines = survey(fv)
        truth = [b.box.as_list() for b in s.boxes if b.box is not None][:1]
        iou = [union_iou([e["box"]], truth) for e in lines]
        r1 = lines[0]["box"]
        own = fv.maps.get("det_" + lines[0]["tool"], fv.maps.get(lines[0]["tool"]))
        agree = [sum(union_iou([e["box"]], [o["box"]]) > 0.25 for o in lines if o is not e) for e in lines]
        firing = [i for i, e in enumerate(lines) if e["score"] > 0.5] or [0]
        got["R1"].append(iou[0])
        got["zoom then refine (R1's map)"].append(union_iou([best_window(own, r1, **FINE)[0]], truth))
        got["zoom then refine (best map, oracle)"].append(max(union_iou([best_window(m, r1, **FINE)[0]], truth) for m in fv.maps.values()))
        got["most agreed line"].append(iou[int(np.argmax(agree))])
        got["most agreed firing line"].append(iou[max(firing, key=lambda i: (agree[i], -i))])
        got["R1 or R2 by agreement"].append(iou[0] if agree[0] >= agree[1] else iou[1])
        got["best line (oracle)"].append(max(iou))
    print(f"{split}: {len(fakes)} fakes, mean IoU with the true box")
    for k, v in got.items(): print(f"  {k:38s} {np.mean(v):.3f}")
