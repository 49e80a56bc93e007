#!/usr/bin/env python
"""Out-of-scope firing on the OOD collection's processed authentic photos (issue 14 item 5).

Runs Stage 0 (the built-in pool, cached detections) and two offline configurations of `forensicslab.triage.study`
(algorithmic fusion and rule-based triage with the guided judge) on the `ood` collection's authentic images, split
into the 100 unprocessed ones and the processed ones (by processing), and prints per-detector fire rates and each
configuration's specificity (95% bootstrap CI) per split. Writes the table as CSV/Markdown to --out.

Usage: python scripts/ood_processed_contrast.py [--out DIR] [--n N]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "ood_processed_contrast")
    ap.add_argument("--n", type=int, default=None, help="at most N images per split (all by default)")
    a = ap.parse_args(argv)
    from forensicslab.data.bench import ensure_bench, load_bench
    from forensicslab.triage import all as T
    root = ensure_bench()
    auth = [s for s in load_bench("ood", root) if s.label == 0]
    split = lambda s: s.provenance["domain"] if s.provenance["domain"].startswith("processed_") else "unprocessed"
    colls = {}
    for s in auth: colls.setdefault("unprocessed" if split(s) == "unprocessed" else "processed", []).append(s)
    if a.n: colls = {k: v[:a.n] for k, v in colls.items()}
    ev = T.Evidence()
    cfgs = [c for c in T.offline_configs() if c.name in ("fusion", "rules")]
    a.out.mkdir(parents=True, exist_ok=True)
    results, _ = T.run_grid(cfgs, colls, ev, a.out / "runs", workers=2, progress=False)
    # per-detector fire rates, per split and per processing
    fire, sample_ids = [], []
    for coll, ss in colls.items():
        for s in ss:
            for det, d in ev(s.image).detections.items():
                fire.append(dict(split=coll, processing=split(s), detector=det, fired=bool(d.fired)))
                sample_ids.append(s.id)
    rows = []
    for (cfg, coll), rr in results.items():
        m = T.triage_metrics(rr, n_boot=1000)
        sp = m["specificity"]
        rows.append(dict(config=cfg, split=coll, n=m["n"], specificity=round(sp[0], 3), ci=f"[{sp[1]:.3f}, {sp[2]:.3f}]",
                         failed=m["failed"]))
        by = {}
        for r, s in zip(rr, colls[coll]):
            by.setdefault(split(s), []).append(r["pred"] == 0)
        for k, v in sorted(by.items()):
            if k != "unprocessed": rows.append(dict(config=cfg, split=k, n=len(v), specificity=round(sum(v) / len(v), 3), ci="", failed=0))
    tab = pd.DataFrame(rows)
    tab.to_csv(a.out / "specificity.csv", index=False)
    print(tab.to_markdown(index=False))
    if fire:
        f = pd.DataFrame(fire)
        ft = f.pivot_table(index="detector", columns="processing", values="fired", aggfunc="mean").round(3)
        ft.insert(0, "all_processed", f[f.split == "processed"].groupby("detector").fired.mean().round(3))
        ft.to_csv(a.out / "fire_rates.csv")
        print(ft.to_markdown())
        f["sample"] = [r for r in sample_ids]
        anyf = f.groupby(["split", "sample"]).fired.any().groupby("split").mean().round(3)
        print("share of images on which at least one detector fires:", anyf.to_dict())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
