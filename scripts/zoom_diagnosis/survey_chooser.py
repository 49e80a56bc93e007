"""Can a learned instrument-only chooser beat the survey's top region (R1) on IoU? (zoom issue 46, session 19)

For every fake of the manipulation design, each line of the built-in detectors' survey (`zoom.rules.survey`) is a
candidate box with features: its rank, score, contrast, area share, its mean and best IoU with the other lines' boxes,
which tool it is and every tool's score. A gradient-boosted regressor fitted on the TRAIN split's fakes predicts each
line's IoU with the true box; on the TEST split the line with the highest prediction is the answer. Printed beside it:
R1 (rule (a) of the zoom_grounding table) and the oracle choice (the best line, a bound). Run from the repository root:
`python scripts/zoom_diagnosis/survey_chooser.py` (about a minute with a warm detection cache)."""
import numpy as np, time
from forensicslab.zoom.all import ensure_artifacts, load_artifacts
from forensicslab.zoom.rules import ForensicViews, survey, tool_views
from forensicslab.zoom.rewards import union_iou
from forensicslab.imageio import load_image
from sklearn.ensemble import GradientBoostingRegressor
t=time.time()
root = ensure_artifacts(design="manipulations")
def feats(split):
    S = load_artifacts(split, root); out=[]
    for s in S:
        if s.label != 1: continue
        fv = ForensicViews(load_image(s.image), tool_views("detectors"))
        E = survey(fv)
        truth = [b.box.as_list() for b in s.boxes if b.box is not None][:1]
        W,H=fv.image.width,fv.image.height
        tools=sorted(e["tool"] for e in E); sc={e["tool"]:e["score"] for e in E}
        X=[];Y=[]
        for r,e in enumerate(E):
            b=e["box"]; area=(b[2]-b[0])*(b[3]-b[1])/(W*H)
            agree=[union_iou([b],[o["box"]]) for o in E if o is not e]
            X.append([r, e["score"], e["contrast"], area, np.mean(agree), max(agree)]+[float(e["tool"]==tt) for tt in tools]+[sc[tt] for tt in tools])
            Y.append(union_iou([b],truth))
        out.append((np.array(X),np.array(Y)))
    return out
tr=feats("train"); te=feats("test"); print("feats", round(time.time()-t), len(tr), len(te))
Xtr=np.concatenate([x for x,_ in tr]); Ytr=np.concatenate([y for _,y in tr])
m=GradientBoostingRegressor(n_estimators=200,max_depth=3,random_state=0).fit(Xtr,Ytr)
for name,data in (("train",tr),("test",te)):
    r1=np.mean([y[0] for _,y in data]); orc=np.mean([y.max() for _,y in data])
    ch=np.mean([y[int(np.argmax(m.predict(x)))] for x,y in data])
    print(name, "R1",round(r1,3),"learned chooser",round(ch,3),"oracle",round(orc,3), "share not R1", np.mean([int(np.argmax(m.predict(x)))!=0 for x,_ in data]))
