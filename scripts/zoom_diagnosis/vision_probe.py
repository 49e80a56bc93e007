import time, sys, numpy as np, torch
torch.set_num_threads(1)
from forensicslab.zoom.data import load_artifacts
from forensicslab.zoom.tinyvlm import TinyVLMSpec, build_tiny_vlm
from forensicslab.imageio import load_image
H_=int(sys.argv[1]) if len(sys.argv)>1 else 64; L_=int(sys.argv[2]) if len(sys.argv)>2 else 2; MP=int(sys.argv[3]) if len(sys.argv)>3 else 256; EP=int(sys.argv[4]) if len(sys.argv)>4 else 30
t0=time.time()
tr, te = load_artifacts("train"), load_artifacts("test")
spec = TinyVLMSpec(vocab_size=1024, max_pixels=MP*MP, vision_hidden_size=H_, vision_layers=L_, hidden_size=64)
model, proc = build_tiny_vlm(spec)
vis = model.model.visual
ip = proc.image_processor
def prep(s):
    im = load_image(s.image).pil(); W,H = im.size
    b = ip(images=[im], return_tensors="pt")
    t,gh,gw = b["image_grid_thw"][0].tolist(); mh,mw = gh//2, gw//2
    tgt = np.zeros((mh,mw),np.float32)
    for e in s.boxes:
        if e.box is None: continue
        x1,y1,x2,y2 = e.box.as_list()
        for i in range(mh):
            for j in range(mw):
                cx1,cx2 = j*W/mw,(j+1)*W/mw; cy1,cy2=i*H/mh,(i+1)*H/mh
                ov = max(0,min(x2,cx2)-max(x1,cx1))*max(0,min(y2,cy2)-max(y1,cy1))
                tgt[i,j]=max(tgt[i,j], ov/((cx2-cx1)*(cy2-cy1)))
    return b["pixel_values"], b["image_grid_thw"], torch.tensor(tgt.ravel()), (mh,mw,W,H), s
D_tr=[prep(s) for s in tr]; D_te=[prep(s) for s in te]
print("prep", time.time()-t0, D_tr[0][1], flush=True)
head = torch.nn.Linear(spec.hidden_size, 1)
params = list(vis.parameters())+list(head.parameters())
opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.01)
def fwd(d):
    out = vis(d[0], grid_thw=d[1]).pooler_output
    return head(out).squeeze(-1)
from forensicslab.zoom.rewards import union_iou
def evaluate(D):
    vis.eval(); accs=[]; ious=[]
    with torch.no_grad():
        for d in D:
            p = torch.sigmoid(fwd(d)).numpy(); mh,mw,W,H = d[3]; s=d[4]
            pred = int(p.max()>0.5)
            accs.append(pred==s.label)
            if s.label==1:
                if pred:
                    m = (p.reshape(mh,mw)>0.5*p.max()); ii,jj=np.nonzero(m)
                    box=[jj.min()*W/mw, ii.min()*H/mh, (jj.max()+1)*W/mw, (ii.max()+1)*H/mh]
                    ious.append(union_iou([box],[e.box for e in s.boxes if e.box is not None]))
                else: ious.append(0.0)
    vis.train(); return np.mean(accs), np.mean(ious)
rng=np.random.default_rng(0)
for ep in range(EP):
    order=rng.permutation(len(D_tr)); tot=0
    for k in range(0,len(order),8):
        loss=0
        for i in order[k:k+8]:
            d=D_tr[i]; loss = loss + torch.nn.functional.binary_cross_entropy_with_logits(fwd(d), d[2], pos_weight=torch.tensor(3.0))
        loss=loss/8; opt.zero_grad(); loss.backward(); opt.step(); tot+=loss.item()
    if ep%3==2 or ep==EP-1: print(ep, round(tot,3), "train", evaluate(D_tr[:60]), "test", evaluate(D_te), round(time.time()-t0), flush=True)
