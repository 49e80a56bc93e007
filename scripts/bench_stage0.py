#!/usr/bin/env python
"""Stage 0 wall time of the detector pool on a 1024x768 and a 2048x1536 JPEG.

The test images are made from a photograph shipped with scikit-learn (china.jpg), cropped to 4:3 and
resized with Lanczos, saved as JPEG quality 90. For each size the script times every detector alone
(`run_pool` with that one detector, no cache) and the whole pool dispatched concurrently (no cache),
each `--repeat` times, and reports the median wall time and the process CPU seconds (all threads);
wall far above CPU means the process waited for a core (the load average is printed: the machine may
be shared). Stage 0 caps each detector's library thread pools at one thread (`run_pool(intra_threads=1)`,
the pool's parallelism being across detectors); the column `alone, lib threads` shows each detector
alone with the libraries' default threading, for comparison. It prints the ratio concurrent wall / slowest single detector and the pool's wall time for both sizes,
and checks the 1024x768 ones against the targets (ratio <= 1.3, pool <= 3 s; exit status 2 when one is
missed). On 2 cores the ratio cannot beat max(1, sum of single CPU / 2 / slowest), printed as the lower bound.

Real-size check (issue 14): the same script then times the whole pool on a 1 MP (1155x866) and a 12 MP
(4000x3000) JPEG in the same run, alternating the two so both see the same machine load, and prints the
12 MP / 1 MP ratios of wall time and of process CPU time (target: 12 MP within 3x of 1 MP), with each
detector's in-pool runtime. `--real-size-only` runs just that part.

Paper pool (issue 26): `--paper` times the triage paper's pool instead (`forensicslab.detectors.paper`): each
of the seven whose adapter is in this build, with its installed weights, or, when none are installed and the
adapter can build them, with seeded random weights of the full published size (the output says which, per
detector; random weights time the same arithmetic but carry no forensic meaning). A detector with neither is
listed as skipped, with the reason. On the 1024x768 JPEG it reports each detector alone (median wall of
`--repeat` uncached `run_pool` calls with that one detector), their sum, and the whole pool concurrently,
after a warm-up that loads every model once (the pool keeps them); and how many distinct CLIP backbones the
process holds (adapters whose backbone tensors hash the same share one, and one forward pass per image).

With `--paper` every detector with installed weights uses them (`forensicslab weights list`), the others full-size
seeded random stand-ins; each detector alone is reported with its wall and CPU seconds and the growth of the process's
resident memory during the call (sampled every 5 ms), and the process's peak. `--big` then runs the pool once on a
12 MP JPEG (4000x3000) and reports seconds and peak memory (issue 48: <= 8 GB). `--detector ID` limits either. It also
prints the pool's arithmetic floor: its FLOPs per 1024x768 image (torch's counter) over the machine's fp32 matrix-multiply
rate on all cores, the least time any exact fp32 implementation could take here.

Usage: python scripts/bench_stage0.py [--repeat 3] [--detector ID ...] [--json out.json] [--real-size-only]
       python scripts/bench_stage0.py --paper [--big] [--detector ID ...] [--repeat 1] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image


TARGET_SIZE = (1024, 768)   # the Stage 0 targets (3 s, ratio 1.3) are stated for this size
REAL_SIZES = ((1155, 866), (4000, 3000))   # 1 MP and 12 MP
REAL_RATIO = 3.0                           # target: the pool on 12 MP within 3x of 1 MP


def make_jpeg(width: int, height: int, folder: Path) -> Path:
    "A width x height JPEG (q90) from sklearn's china.jpg, centre-cropped to the aspect and Lanczos-resized."
    from sklearn.datasets import load_sample_image
    src = Image.fromarray(load_sample_image("china.jpg"))
    w, h = src.size
    target = width / height
    if w / h > target: cw, ch = round(h * target), h
    else: cw, ch = w, round(w / target)
    box = ((w - cw) // 2, (h - ch) // 2, (w - cw) // 2 + cw, (h - ch) // 2 + ch)
    img = src.crop(box).resize((width, height), Image.Resampling.LANCZOS)
    p = folder / f"china_{width}x{height}.jpg"
    img.save(p, quality=90)
    return p


def timed_pool(path: Path, names: list[str], timeout: float, **kw) -> tuple[float, float, dict]:
    "Wall seconds, process CPU seconds (all threads) and detections of one uncached `run_pool`."
    from forensicslab.detectors.pool import run_pool
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_pool(path, names, timeout=timeout, cache=None, **kw)
    return time.perf_counter() - t0, time.process_time() - c0, res


def real_size(names: list[str], repeat: int, timeout: float, folder: Path) -> dict:
    "Pool wall and CPU on 1 MP and 12 MP JPEGs, alternated `repeat` times; prints and returns medians and ratios."
    paths = {s: make_jpeg(*s, folder) for s in REAL_SIZES}
    walls, cpus, runtimes = {s: [] for s in REAL_SIZES}, {s: [] for s in REAL_SIZES}, {}
    for _ in range(repeat):
        for s in REAL_SIZES:
            dt, cpu, res = timed_pool(paths[s], names, timeout)
            walls[s].append(dt)
            cpus[s].append(cpu)
            runtimes[s] = {n: round(res[n].runtime_s, 3) for n in names}
            bad = {n: res[n].status for n in names if res[n].status != "ok"}
            if bad: print(f"  {s[0]}x{s[1]}: not ok: {bad}")
    small, big = REAL_SIZES
    med = lambda v: statistics.median(v)
    wall_ratio, cpu_ratio = med(walls[big]) / med(walls[small]), med(cpus[big]) / med(cpus[small])
    print(f"== real size: 1 MP {small[0]}x{small[1]} vs 12 MP {big[0]}x{big[1]} JPEG, median of {repeat} alternated runs "
          f"(load average now {os.getloadavg()[0]:.1f})")
    for s in REAL_SIZES:
        print(f"{s[0]}x{s[1]}: pool wall {med(walls[s]):.3f} s (runs {', '.join(f'{t:.3f}' for t in walls[s])}), "
              f"CPU {med(cpus[s]):.3f} s; in-pool runtimes {runtimes[s]}")
    ok = wall_ratio <= REAL_RATIO
    print(f"12 MP / 1 MP: wall {wall_ratio:.2f}x, CPU {cpu_ratio:.2f}x (target wall <= {REAL_RATIO:.0f}x) -> {'OK' if ok else 'MISSED'}\n")
    return {"wall_s": {f"{w}x{h}": walls[(w, h)] for w, h in REAL_SIZES}, "cpu_s": {f"{w}x{h}": cpus[(w, h)] for w, h in REAL_SIZES},
            "in_pool_runtime_s": {f"{w}x{h}": runtimes[(w, h)] for w, h in REAL_SIZES},
            "wall_ratio": wall_ratio, "cpu_ratio": cpu_ratio, "ok": ok}


class PeakRSS:
    "Context manager sampling this process's resident memory every 5 ms: `.before`, `.peak` (GB) and `.growth` (peak - before)."
    def __init__(self): self.before = self.peak = 0.0
    @staticmethod
    def now() -> float:
        with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    def __enter__(self):
        import threading
        self.before = self.peak = self.now()
        self._stop = threading.Event()
        def watch():
            while not self._stop.wait(0.005): self.peak = max(self.peak, self.now())
        self._t = threading.Thread(target=watch, daemon=True); self._t.start()
        return self
    def __exit__(self, *exc):
        self._stop.set(); self._t.join()
        self.peak = max(self.peak, self.now())
    @property
    def growth(self) -> float: return self.peak - self.before


def max_rss_gb() -> float:
    "Peak resident memory of this process so far (GB)."
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def fa_on_d3_backbone(seed: int):
    """Forensics Adapter's random stand-in on the CLIP that `d3` holds (its installed ViT-L-14.pt or its stand-in): the
    published FA checkpoint keeps OpenAI's CLIP ViT-L/14 frozen, the tensors of D3's ViT-L-14.pt, so with the real files
    the two detectors share one backbone (by tensor hash); the stand-ins must too, or the bench holds a CLIP (1.2 GB)
    that the real pool does not."""
    import forensicslab.detectors.paper.forensicsadapter as FA
    from forensicslab.detectors.pool import get_detector
    vit, orig = get_detector("d3").vit.state_dict(), FA.random_fa_state
    def on_d3(s, seed):
        sd = orig(s, seed)
        for k in sd:
            t = FA.alias_of(k) or k
            if t.startswith("clip_model.visual.") and t[len("clip_model.visual."):] in vit: sd[k] = vit[t[len("clip_model.visual."):]]
        return sd
    FA.random_fa_state = on_d3
    try: return FA.ForensicsAdapter(random_init=seed)
    finally: FA.random_fa_state = orig


def paper_pool_detectors(seed: int = 0, only: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """Register the paper pool for timing: every detector with installed weights uses them (all seven weight sources are
    loaded first, so each installed set is seen), else seeded random weights of the full published size where the adapter
    builds them (`random_init`); returns (ids, how each was loaded or why skipped)."""
    import inspect
    from forensicslab.detectors.paper.pool import PAPER_POOL, load_adapters, paper_sources
    from forensicslab.detectors.pool import _FACTORIES, get_detector, register
    from forensicslab.detectors.weights import installed, weights_record
    errors = load_adapters()
    paper_sources()
    names, how = [], {}
    for i in PAPER_POOL:
        if only and i not in only: continue
        if i not in _FACTORIES:
            how[i] = f"skipped: {errors.get(i, 'not registered')}"; continue
        cls = _FACTORIES[i]
        try: have = installed(i) is not None
        except Exception: have = False
        if have:
            get_detector(i); names.append(i)
            how[i] = f"installed weights ({'verified' if weights_record(i)['verified'] else 'unverified'})"; continue
        if isinstance(cls, type) and "random_init" in inspect.signature(cls.__init__).parameters:
            det = fa_on_d3_backbone(seed) if i == "forensicsadapter" and "d3" in names else cls(random_init=seed)
            register(i, replace=True)(lambda det=det: det)
            get_detector(i); names.append(i); how[i] = f"RANDOM weights (seed {seed}, full published size): no weights installed"
            if i == "forensicsadapter" and "d3" in names: how[i] += "; its frozen CLIP is d3's, as with the published files"
        else: how[i] = "skipped: no weights installed and the adapter builds no random weights"
    return names, how


def arithmetic_floor(p: Path, names: list[str]) -> dict:
    """The paper pool's floating-point work on one image (torch's FLOP counter; each detector once, in this thread, the
    shared backbones' forward passes counted once as in the pool) over this machine's fp32 matrix-multiply rate on all
    its cores: an exact fp32 Stage 0 on this CPU cannot take less time than that, whatever the implementation."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from forensicslab.detectors.paper.backbones import shared_backbones
    from forensicslab.detectors.pool import get_detector
    from forensicslab.imageio import load_image
    image, flops = load_image(p), {}
    for v in shared_backbones().values(): v.clear()
    held = os.environ.get("FORENSICSLAB_TRUFOR_THREADS")
    os.environ["FORENSICSLAB_TRUFOR_THREADS"] = "1"   # TruFor's bands in this thread, where the counter sees them
    try:
        for n in names:
            with FlopCounterMode(display=False) as fc: get_detector(n).detect(image)
            flops[n] = fc.get_total_flops() / 1e9
    finally:
        if held is None: os.environ.pop("FORENSICSLAB_TRUFOR_THREADS")
        else: os.environ["FORENSICSLAB_TRUFOR_THREADS"] = held
    threads, cores = torch.get_num_threads(), os.cpu_count() or 1
    torch.set_num_threads(cores)
    a, b, n = torch.randn(2048, 2048), torch.randn(2048, 2048), 20
    for _ in range(3): a @ b
    t = time.perf_counter()
    for _ in range(n): a @ b
    rate = 2 * 2048 ** 3 * n / (time.perf_counter() - t) / 1e9
    torch.set_num_threads(threads)
    total = sum(flops.values())
    print(f"arithmetic floor: {total:.0f} GFLOP per image (" + ", ".join(f"{k} {v:.0f}" for k, v in flops.items())
          + f"); fp32 matrix multiply on {cores} threads {rate:.0f} GFLOPS -> at least {total / rate:.1f} s per image")
    return {"gflop": flops, "matmul_gflops": rate, "floor_s": total / rate}


def paper_stage0(repeat: int, timeout: float, folder: Path, only: list[str] | None = None, big: bool = False) -> dict:
    """The paper pool's Stage 0 on the 1024x768 JPEG: each detector alone (wall, CPU and memory growth), their sum, the
    pool concurrently; with `big`, then the whole pool once on a 12 MP (4000x3000) JPEG."""
    from forensicslab.detectors.paper.backbones import shared_backbones
    t0 = time.perf_counter()
    with PeakRSS() as load_mem: names, how = paper_pool_detectors(only=only)
    print(f"paper pool (models built in {time.perf_counter() - t0:.1f} s, +{load_mem.growth:.2f} GB):")
    for i, h in how.items(): print(f"  {i:<18}{h}")
    if not names:
        print("no paper-pool detector can run here"); return {"how": how}
    p = make_jpeg(*TARGET_SIZE, folder)
    t0 = time.perf_counter()
    with PeakRSS() as warm_mem: timed_pool(p, names, timeout)   # warm-up: the pool loads and keeps each model once
    print(f"warm-up (first calls) {time.perf_counter() - t0:.1f} s, peak {warm_mem.peak:.2f} GB")
    def forget():   # the backbones remember recent inputs; every timed run must pay its own forward passes
        for v in shared_backbones().values(): v.clear()
    single, cpu, mem, status = {}, {}, {}, {}
    for n in names:
        ts, cs, ms = [], [], []
        for _ in range(repeat):
            forget()
            with PeakRSS() as m: dt, c, res = timed_pool(p, [n], timeout)
            ts.append(dt); cs.append(c); ms.append(m.growth); status[n] = res[n].status
        single[n], cpu[n], mem[n] = statistics.median(ts), statistics.median(cs), max(ms)
    pool_ts, pool_cs, pool_mem = [], [], 0.0
    for _ in range(repeat):
        forget()
        with PeakRSS() as pm: dt, c, res = timed_pool(p, names, timeout)
        pool_ts.append(dt); pool_cs.append(c); pool_mem = max(pool_mem, pm.growth)
    pool = statistics.median(pool_ts)
    vits = shared_backbones()
    print(f"== paper pool, {TARGET_SIZE[0]}x{TARGET_SIZE[1]} JPEG, warm, median of {repeat} (load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores: other processes share them, compare ratios within one run)")
    print(f"{'detector':<18}{'alone (s)':>10}{'CPU (s)':>9}{'in pool (s)':>12}{'mem +GB':>9}  status")
    for n in names:
        print(f"{n:<18}{single[n]:>10.2f}{cpu[n]:>9.2f}{res[n].runtime_s:>12.2f}{mem[n]:>9.2f}  {status[n]}"
              + ("" if res[n].status == "ok" else f": {(res[n].error or '')[:80]}"))
    print(f"sum of detectors run separately: {sum(single.values()):.2f} s per image ({sum(cpu.values()):.2f} s CPU)")
    print(f"whole pool, Stage 0 (concurrent, one image): {pool:.2f} s per image, {statistics.median(pool_cs):.2f} s CPU "
          f"(target <= 10 s warm on 2 cores); memory +{pool_mem:.2f} GB during it, process peak {max_rss_gb():.2f} GB")
    print(f"forward passes run by the backbones: {sum(v.forwards for v in vits.values())}")
    print(f"CLIP backbones held by the process: {len(vits)} for {sum(1 for n in names if n in ('clipsid', 'd3', 'effort', 'forensicsadapter'))} "
          f"CLIP-based detectors (shared when their tensors hash the same)")
    floor = arithmetic_floor(p, names)
    out = {"how": how, "single_s": single, "single_cpu_s": cpu, "single_mem_growth_gb": mem, "sum_s": sum(single.values()), **floor,
           "pool_s": pool, "pool_runs_s": pool_ts, "pool_cpu_s": pool_cs, "status": {n: res[n].status for n in names},
           "pool_mem_growth_gb": pool_mem, "clip_backbones": len(vits), "loadavg": os.getloadavg()[0], "peak_gb": max_rss_gb()}
    if big:
        q = make_jpeg(*REAL_SIZES[1], folder)
        forget()
        with PeakRSS() as bm: dt, c, res = timed_pool(q, names, max(timeout, 3600))
        print(f"== paper pool, 12 MP {REAL_SIZES[1][0]}x{REAL_SIZES[1][1]} JPEG, once: {dt:.1f} s wall, {c:.1f} s CPU; "
              f"memory {bm.before:.2f} GB before, peak {bm.peak:.2f} GB (+{bm.growth:.2f} GB; target <= 8 GB)")
        for n in names: print(f"  {n:<18}{res[n].runtime_s:>8.1f} s  {res[n].status}" + ("" if res[n].status == "ok" else f": {(res[n].error or '')[:80]}"))
        out["12mp"] = {"wall_s": dt, "cpu_s": c, "before_gb": bm.before, "peak_gb": bm.peak, "growth_gb": bm.growth,
                       "runtime_s": {n: res[n].runtime_s for n in names}, "status": {n: res[n].status for n in names}}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per measurement (median reported)")
    ap.add_argument("--detector", action="append", help="limit to these detectors (repeatable)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-detector timeout in seconds")
    ap.add_argument("--json", type=Path, help="also write the measurements as JSON here")
    ap.add_argument("--real-size-only", action="store_true", help="only the 1 MP vs 12 MP comparison")
    ap.add_argument("--paper", action="store_true", help="time the triage paper's pool (installed weights, else full-size random ones)")
    ap.add_argument("--big", action="store_true", help="with --paper: also run the pool once on a 12 MP JPEG (seconds, peak memory)")
    a = ap.parse_args(argv)
    if a.paper:
        with tempfile.TemporaryDirectory() as tmp:
            out = {"paper": paper_stage0(a.repeat, a.timeout, Path(tmp), a.detector, a.big), "repeat": a.repeat,
                   "cpu_count": os.cpu_count()}
        if a.json: a.json.write_text(json.dumps(out, indent=1)); print(f"wrote {a.json}")
        return 0

    from forensicslab.detectors.pool import discovery_errors, list_detectors
    names = a.detector or list_detectors()
    if not names:
        print("no detectors registered; nothing to time", file=sys.stderr); return 1
    if discovery_errors(): print(f"warning: detector modules that failed to load: {discovery_errors()}", file=sys.stderr)
    print(f"pool: {', '.join(names)}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores, "
          f"Python {platform.python_version()}; median of {a.repeat} runs, no cache\n")

    out = {"detectors": names, "repeat": a.repeat, "cpu_count": os.cpu_count(), "sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        # warm-up: first calls load weights, build caches, import lazily
        warm = make_jpeg(320, 240, Path(tmp))
        timed_pool(warm, names, a.timeout)
        ok = True
        for (w, h) in ([] if a.real_size_only else [(1024, 768), (2048, 1536)]):
            p = make_jpeg(w, h, Path(tmp))
            single, single_cpu, free = {}, {}, {}
            status = {}
            for n in names:
                ts, cs = [], []
                for _ in range(a.repeat):
                    dt, cpu, res = timed_pool(p, [n], a.timeout); ts.append(dt); cs.append(cpu); status[n] = res[n].status
                single[n] = statistics.median(ts); single_cpu[n] = statistics.median(cs)
                free[n] = timed_pool(p, [n], a.timeout, intra_threads=None)[0]
            pool_ts, pool_cs = [], []
            for _ in range(a.repeat):
                dt, cpu, res = timed_pool(p, names, a.timeout); pool_ts.append(dt); pool_cs.append(cpu)
            pool, pool_cpu = statistics.median(pool_ts), statistics.median(pool_cs)
            slowest = max(single, key=single.get)
            ratio = pool / single[slowest]
            print(f"== {w}x{h} JPEG   (load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
            print(f"{'detector':<14}{'alone (s)':>10}  {'cpu alone':>9}  {'in pool (s)':>11}  {'alone, lib threads':>18}  status")
            for n in names:
                print(f"{n:<14}{single[n]:>10.3f}  {single_cpu[n]:>9.3f}  {res[n].runtime_s:>11.3f}  {free[n]:>18.3f}  {res[n].status if res[n].status == 'ok' else res[n].status + ': ' + (res[n].error or '')[:60]}")
            print(f"{'sum of singles':<14}{sum(single.values()):>10.3f}  {sum(single_cpu.values()):>9.3f}")
            print(f"whole pool, concurrent: {pool:.3f} s wall, {pool_cpu:.3f} s CPU (runs: {', '.join(f'{t:.3f}' for t in pool_ts)})")
            ncores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
            bound = max(max(single.values()), sum(single_cpu.values()) / ncores)
            print(f"lower bound on this machine, max(slowest single, sum of single CPU / {ncores} cores): {bound:.3f} s")
            verdict = lambda good: ("OK" if good else "MISSED") if (w, h) == TARGET_SIZE else "for reference; the targets are set on 1024x768"
            print(f"ratio concurrent / slowest single ({slowest}, {single[slowest]:.3f} s): {ratio:.2f} (target <= 1.3)"
                  f" -> {verdict(ratio <= 1.3)}")
            print(f"whole pool on {w}x{h}: {pool:.3f} s (target <= 3 s) -> {verdict(pool <= 3.0)}")
            if (w, h) == TARGET_SIZE: ok &= pool <= 3.0 and ratio <= 1.3
            print()
            out["sizes"][f"{w}x{h}"] = {"single_s": single, "single_cpu_s": single_cpu, "single_lib_threads_s": free, "pool_cpu_s": pool_cpu, "loadavg": os.getloadavg()[0], "pool_s": pool, "pool_runs_s": pool_ts,
                                        "in_pool_runtime_s": {n: res[n].runtime_s for n in names},
                                        "status": {n: res[n].status for n in names},
                                        "slowest": slowest, "ratio": ratio}
        out["real_size"] = real_size(names, a.repeat, a.timeout, Path(tmp))
        ok &= out["real_size"]["ok"]
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
        print(f"wrote {a.json}")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
