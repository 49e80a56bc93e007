"""CNN image-level probe: can a conv net trained from scratch tell the artifact benchmark's fakes from reals (test split) in CPU minutes?

Usage: python cnn_probe_test_split.py K EPOCHS [NET]
  K       extra train-split draws of 200 images (forensicslab.zoom.data.extra_train; never the test split's seeds)
  NET     plain  (default): 5 blocks of two 3x3 convs at 224 px, batch 16, lr 2e-3, one thread (the session-4 logs)
          resnet: a 3x3 stem and 5 residual blocks, 4 of stride 2 (454k parameters) at 128 px, batch 32, one-cycle lr 3e-3, two threads
Each epoch prints the image AUC (highest cell) on 600 of the training images it fits ("fit") and on the test split,
overall and per flaw kind (each kind's fakes against all reals). Fit close to test means the net underfits: the
limit is capacity and compute, not memorised photographs.
"""
import sys, time
import numpy as np, torch
from torch import nn
from PIL import Image
from forensicslab.zoom.data import load_artifacts, extra_train
from forensicslab.metrics import roc_auc as _auc
from forensicslab.zoom.vision import token_targets

k, EP = int(sys.argv[1]), int(sys.argv[2])
NET = sys.argv[3] if len(sys.argv) > 3 else "plain"
S = {"plain": dict(res=224, batch=16, lr=2e-3, image_weight=0.3, threads=1, one_cycle=False),
     "resnet": dict(res=128, batch=32, lr=3e-3, image_weight=0.5, threads=2, one_cycle=True)}[NET]
torch.set_num_threads(S["threads"]); torch.manual_seed(0)
R = S["res"]
G = R // 32 if NET == "plain" else R // 16          # coverage grid = the net's output grid (5 or 4 stride-2 stages)

def arr(s):
    im = Image.open(s.image).convert("RGB").resize((R, R), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.asarray(im, np.float32) / 127.5 - 1).permute(2, 0, 1)

def cov(s):
    W, H = Image.open(s.image).size
    return torch.from_numpy(token_targets([b.box.as_list() for b in s.boxes if b.box is not None], W, H, (2 * G, 2 * G))[:, 0].reshape(G, G))

t0 = time.time()
tr, te = load_artifacts("train") + extra_train(k), load_artifacts("test")
Xtr, ytr, Ctr = torch.stack([arr(s) for s in tr]), torch.tensor([float(s.label) for s in tr]), torch.stack([cov(s) for s in tr])
Xte, yte = torch.stack([arr(s) for s in te]), np.array([s.label for s in te])
kinds = np.array([s.provenance.get("kind", "real") for s in te])
print("data", tuple(Xtr.shape), NET, S, round(time.time() - t0), flush=True)

def blk(i, o): return nn.Sequential(nn.Conv2d(i, o, 3, 2, 1), nn.BatchNorm2d(o), nn.ReLU(), nn.Conv2d(o, o, 3, 1, 1), nn.BatchNorm2d(o), nn.ReLU())

class Res(nn.Module):
    def __init__(self, i, o, st):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(i, o, 3, st, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(), nn.Conv2d(o, o, 3, 1, 1, bias=False), nn.BatchNorm2d(o))
        self.skip = nn.Sequential(nn.Conv2d(i, o, 1, st, bias=False), nn.BatchNorm2d(o))
    def forward(self, x): return torch.relu(self.a(x) + self.skip(x))

if NET == "plain": net = nn.Sequential(blk(3, 16), blk(16, 32), blk(32, 48), blk(48, 64), blk(64, 64), nn.Conv2d(64, 1, 1))
else:
    w = 24
    net = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1), nn.BatchNorm2d(w), nn.ReLU(), Res(w, w, 2), Res(w, 2 * w, 2), Res(2 * w, 3 * w, 2),
                        Res(3 * w, 4 * w, 2), Res(4 * w, 4 * w, 1), nn.Conv2d(4 * w, 1, 1))
print("parameters", sum(p.numel() for p in net.parameters()), flush=True)
opt = torch.optim.AdamW(net.parameters(), S["lr"], weight_decay=1e-3 if NET == "plain" else 1e-2)
steps = EP * -(-len(Xtr) // S["batch"])
sched = torch.optim.lr_scheduler.OneCycleLR(opt, S["lr"], total_steps=steps, pct_start=0.15) if S["one_cycle"] else None

def score(X):
    net.eval()
    with torch.no_grad(): return torch.cat([net(X[i:i + 50]).amax((1, 2, 3)) for i in range(0, len(X), 50)]).numpy()

for ep in range(EP):
    net.train(); perm = torch.randperm(len(Xtr)); L = []
    for i in range(0, len(perm), S["batch"]):
        b = perm[i:i + S["batch"]]; x, c = Xtr[b], Ctr[b]
        if torch.rand(1) < 0.5: x, c = x.flip(3), c.flip(2)
        o = net(x)[:, 0]
        loss = (nn.functional.binary_cross_entropy_with_logits(o, c, pos_weight=torch.tensor(3.0))
                + S["image_weight"] * nn.functional.binary_cross_entropy_with_logits(o.amax((1, 2)), ytr[b]))
        opt.zero_grad(); loss.backward(); opt.step(); L.append(loss.item())
        if sched: sched.step()
    s, sf = score(Xte), score(Xtr[:600])
    pk = {str(kk): round(_auc(np.r_[s[kinds == kk], s[yte == 0]], np.r_[np.ones((kinds == kk).sum()), np.zeros((yte == 0).sum())]), 2)
          for kk in sorted(set(kinds) - {"real"})}
    print(f"ep {ep + 1} loss {np.mean(L):.3f} fit AUC {_auc(sf, ytr[:600].numpy()):.3f} test image AUC {_auc(s, yte.astype(float)):.3f} "
          f"acc@0 {((s > 0) == yte).mean():.2f} per kind {pk} t {time.time() - t0:.0f}s", flush=True)
