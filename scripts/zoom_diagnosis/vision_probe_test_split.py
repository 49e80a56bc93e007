import sys, time, math, numpy as np, torch
from torch import nn
torch.set_num_threads(1)
from forensicslab.zoom.data import load_artifacts, extra_train
from forensicslab.zoom.tinyvlm import TinyVLMSpec, build_tiny_vlm
from forensicslab.metrics import roc_auc as _auc
from forensicslab.zoom.vision import _encode, vision_examples
args = dict(a.split("=") for a in sys.argv[1:])
vh=int(args.get("vh",64)); vl=int(args.get("vl",2)); ep=int(args.get("ep",6)); k=int(args.get("k",2)); lr=float(args.get("lr",3e-3)); crops=int(args.get("crops",1)); mp=int(args.get("mp",256)); bs=int(args.get("bs",8)); hp=int(args.get("hp",0)); il=float(args.get("il",0))
t0=time.time()
pool = load_artifacts("train") + (extra_train(k) if k else [])
test = load_artifacts("test")
spec = TinyVLMSpec(vocab_size=2048, max_pixels=mp*mp, split_digits=True, hidden_size=96, intermediate_size=192, vision_hidden_size=vh, vision_layers=vl, vision_heads=4)
model, proc = build_tiny_vlm(spec)
vis = model.model.visual
tr = _encode(proc, vision_examples(pool, crops, 0), "cpu")
te = _encode(proc, vision_examples(test, 0, 0), "cpu")
print("data", len(tr), len(te), round(time.time()-t0,1), flush=True)
head = nn.Linear(96, 3)
params = list(vis.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
steps = ep * math.ceil(len(tr)/bs)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
pw = torch.tensor(3.0)
def fwd(pv, g): return head(vis(pv, grid_thw=g).pooler_output)
rng = np.random.default_rng(0)
labels = np.array([s.label for s in test])
for e in range(ep):
    vis.train(); perm = rng.permutation(len(tr)); L=[]
    for i in range(0, len(perm), bs):
        loss = 0
        for j in perm[i:i+bs]:
            pv, g, t = tr[j]; o = fwd(pv, g)
            loss = loss + nn.functional.binary_cross_entropy_with_logits(o[:,0], t[:,0], pos_weight=pw) + nn.functional.mse_loss(torch.sigmoid(o[:,1:]), t[:,1:])
            if il: loss = loss + il * nn.functional.binary_cross_entropy_with_logits(o[:,0].max(), (t[:,0].max() > 0.3).float())
        loss = loss/len(perm[i:i+bs]); opt.zero_grad(); loss.backward(); opt.step(); sched.step(); L.append(loss.item())
    vis.eval(); S=[]; Y=[]; mx=[]
    with torch.no_grad():
        for pv,g,t in te:
            p = torch.sigmoid(fwd(pv,g)[:,0]).numpy(); S.append(p); Y.append((t[:,0]>=0.5).numpy()); mx.append(p.max())
    mx = np.array(mx); img_auc = _auc(mx, labels)
    thr = np.median(mx); acc = ((mx>thr)==labels).mean()
    kinds = np.array([s.provenance.get("kind", "real") for s in test])
    pk = {k: round(_auc(np.r_[mx[kinds == k], mx[labels == 0]], np.r_[np.ones((kinds == k).sum()), np.zeros((labels == 0).sum())]), 2) for k in sorted(set(kinds) - {"real"})}
    print(pk)
    print(f"ep {e+1} loss {np.mean(L):.3f} test token_auc {_auc(np.concatenate(S), np.concatenate(Y).astype(float)):.3f} img_auc(max) {img_auc:.3f} acc@median {acc:.2f} t {time.time()-t0:.0f}s", flush=True)
