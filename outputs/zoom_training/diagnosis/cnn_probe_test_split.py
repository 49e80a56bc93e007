"CNN image-level probe: can a small conv net tell the artifact benchmark's fakes from reals (test split) in minutes on CPU?"
import time, numpy as np, torch, sys
from torch import nn
torch.set_num_threads(1); torch.manual_seed(0)
from forensicslab.zoom.artifacts import load_artifacts, extra_train
from forensicslab.zoom.vision import _auc
from PIL import Image
k = int(sys.argv[1]) if len(sys.argv) > 1 else 8; EP = int(sys.argv[2]) if len(sys.argv) > 2 else 5
def arr(s):
    im = Image.open(s.image).convert("RGB").resize((224, 224), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.asarray(im, np.float32) / 127.5 - 1).permute(2, 0, 1)
t0 = time.time()
tr = load_artifacts("train") + extra_train(k); te = load_artifacts("test")
Xtr = torch.stack([arr(s) for s in tr]); ytr = torch.tensor([float(s.label) for s in tr])
from forensicslab.zoom.vision import token_targets
def cov(s):
    W, H = Image.open(s.image).size
    return torch.from_numpy(token_targets([b.box.as_list() for b in s.boxes if b.box is not None], W, H, (14, 14))[:, 0].reshape(7, 7))
Ctr = torch.stack([cov(s) for s in tr])
Xte = torch.stack([arr(s) for s in te]); yte = np.array([s.label for s in te]); kinds = np.array([s.provenance.get("kind", "real") for s in te])
print("data", Xtr.shape, round(time.time() - t0), flush=True)
def blk(i, o): return nn.Sequential(nn.Conv2d(i, o, 3, 2, 1), nn.BatchNorm2d(o), nn.ReLU(), nn.Conv2d(o, o, 3, 1, 1), nn.BatchNorm2d(o), nn.ReLU())
net = nn.Sequential(blk(3, 16), blk(16, 32), blk(32, 48), blk(48, 64), blk(64, 64), nn.Conv2d(64, 1, 1))
opt = torch.optim.AdamW(net.parameters(), 2e-3, weight_decay=1e-3)
def score(X):
    net.eval()
    with torch.no_grad(): return torch.cat([net(X[i:i + 50]).amax((1, 2, 3)) for i in range(0, len(X), 50)]).numpy()
for ep in range(EP):
    net.train(); perm = torch.randperm(len(Xtr)); L = []
    for i in range(0, len(perm), 16):
        b = perm[i:i + 16]; x = Xtr[b]; c = Ctr[b]
        if torch.rand(1) < 0.5: x, c = x.flip(3), c.flip(2)
        o = net(x)[:, 0]
        loss = nn.functional.binary_cross_entropy_with_logits(o, c, pos_weight=torch.tensor(3.0)) + 0.3 * nn.functional.binary_cross_entropy_with_logits(o.amax((1, 2)), ytr[b])
        opt.zero_grad(); loss.backward(); opt.step(); L.append(loss.item())
    s = score(Xte)
    pk = {kk: round(_auc(np.r_[s[kinds == kk], s[yte == 0]], np.r_[np.ones((kinds == kk).sum()), np.zeros((yte == 0).sum())]), 2) for kk in sorted(set(kinds) - {"real"})}
    print(f"ep {ep + 1} loss {np.mean(L):.3f} test image AUC {_auc(s, yte.astype(float)):.3f} acc@0 {((s > 0) == yte).mean():.2f} per kind {pk} t {time.time() - t0:.0f}s", flush=True)
