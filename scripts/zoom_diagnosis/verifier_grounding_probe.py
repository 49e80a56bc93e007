import sys, time, json, numpy as np, pandas as pd, torch
torch.set_num_threads(1)
from sklearn.metrics import roc_auc_score
from forensicslab.zoom.data import extra_train, load_artifacts
from forensicslab.zoom.construct import construct, grounding_negatives, random_items
from forensicslab.zoom.verifier import VerifierTrainConfig, Verifier, items_from_records, new_verifier, train_verifier
args = dict(a.split("=", 1) for a in sys.argv[1:])
if args.get("noloc"):
    import forensicslab.zoom.verifier as _V
    _V.location_agreement = lambda *a, **k: 0.0
kw = json.loads(args.get("kw", "{}")); neg = int(args.get("neg", 1))
train, test = load_artifacts("train"), load_artifacts("test")
pool = train + extra_train(2, seed=0)
c_train = construct(pool, variants=("o3",), seed=0); c_test = construct(test, variants=("o3",), seed=1)
recs = c_train.verifier_items + (grounding_negatives(c_train.verifier_items, pool, seed=0, per_item=neg) if neg else [])
test_recs = [dict(r, group="accepted" if r["soft_label"] > 0.5 else "rejected") for r in c_test.verifier_items]
rand = [dict(r, group="random in fake" if r["kind"] == "random_fake" else "random in real") for r in random_items(test, seed=0, per_image=1)]
vcfg = VerifierTrainConfig(**{"epochs": 4, "batch_size": 8, "lr": 3e-3, "lora": False, "seed": 0, "freeze_vision": True, "grounding": True, **kw})
t0 = time.time()
model, vproc = new_verifier(args.get("base", "/tmp/zh/f5/verifier_base"), vcfg, device="cpu")
hist = train_verifier(model, vproc, items_from_records(recs), vcfg)
print(f"{len(hist)} steps {time.time()-t0:.0f}s loss {np.mean(hist[:5]):.3f} -> {np.mean(hist[-20:]):.3f}")
ver = Verifier(model, vproc)
groups = test_recs + rand
sc = ver.score_items(items_from_records(groups, with_labels=False))
df = pd.DataFrame([{"group": g["group"], "kind": g["kind"], "score": s} for g, s in zip(groups, sc)])
kind = df["kind"].where(~df["kind"].str.startswith("random"), df["group"])
v = df.loc[kind == "valid", "score"]
out = {}
for k in ["wrong_box", "contradiction", "non_specific", "random in fake", "random in real"]:
    n = df.loc[kind == k, "score"]; out[k] = round(roc_auc_score(np.r_[np.ones(len(v)), np.zeros(len(n))], np.r_[v, n]), 3)
a = df[df.group.isin(["accepted", "rejected"])]
out["acc_vs_rej"] = round(roc_auc_score(a.group == "accepted", a.score), 3); out["valid_mean"] = round(v.mean(), 3)
print(kw, "neg", neg, out, flush=True)
