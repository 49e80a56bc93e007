#!/usr/bin/env python
"""Benchmark of forensicslab.chat.models against a local OpenAI-protocol server.

Pass 1: N distinct structured calls (schema-validated) to a server that adds LATENCY seconds to
every reply, at concurrency C, with cache='rw'. The ideal wall time is ceil(N / C) * LATENCY.
Pass 2: the same N calls replayed from the warm cache (cache='replay', a fresh Model, the server
is stopped first so that any network call would fail); timed 5 times, median kept.
The server runs in its own process (as a real one would), and the live pass is preceded by an
untimed warm-up of C calls that starts the worker threads and opens the connections.
Each figure is the median over --repeats repeats.

Targets (issue 5): pass 1 within 1.3x the ideal; pass 2 at least 50x faster than pass 1.

    .venv/bin/python scripts/bench_models.py [--calls 64] [--concurrency 16] [--latency 0.2] [--repeats 3]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from forensicslab.core import ChatMessage
from forensicslab.chat.models import get_model
from forensicslab.chat.testing import Delayed, openai_server


REPLAY_PASSES = 5


class Answer(BaseModel):
    verdict: Literal["authentic", "manipulated"]
    confidence: float
    case: int


def responder(latency: float):
    def answer(req):
        last = req["messages"][-1]["content"].rsplit(" ", 1)[-1]
        if not last.isdigit(): return "ready"
        n = int(last)
        return Delayed(latency, json.dumps({"verdict": "manipulated" if n % 2 else "authentic",
                                            "confidence": round(0.5 + n / 200, 3), "case": n}))
    return answer


def requests(n: int) -> list[dict]:
    system = ChatMessage.of("system", "You are an image forensics analyst. Reply with the requested JSON only.")
    return [{"messages": [system, ChatMessage.of("user", f"Give the verdict for case {i}")], "schema": Answer,
             "temperature": 0, "max_tokens": 64, "case": f"case-{i}", "role": "bench"} for i in range(n)]


def _serve(latency: float, conn):
    with openai_server(responder(latency)) as url:
        conn.send(str(url))
        conn.recv()                       # block until the parent says stop
        conn.send(url.hits)


@contextlib.contextmanager
def server_process(latency: float):
    """The local server in its own process, as a real server would be: its threads then do not
    compete with the client for this process's interpreter lock. Yields (url, hits())."""
    parent, child = mp.get_context("fork").Pipe()
    proc = mp.get_context("fork").Process(target=_serve, args=(latency, child), daemon=True)
    proc.start()
    url = parent.recv()
    hits = {}
    try: yield url, hits
    finally:
        parent.send("stop"); hits["n"] = parent.recv(); proc.join(timeout=10)


def one_repeat(calls: int, concurrency: int, latency: float, work: Path) -> dict:
    reqs = requests(calls)
    with server_process(latency) as (url, hits):
        spec = f"openai-compatible:{url}#bench-vlm"
        live = get_model(spec, {"cache": "rw", "cache_path": str(work / "chat.sqlite"), "concurrency": concurrency, "timeout": 30})
        # warm-up (untimed): start the worker threads and open the HTTP connections a long run would reuse
        live.chat_many([{"messages": f"warm up connection {i} client", "temperature": 0, "max_tokens": 1}
                        for i in range(concurrency)], workers=concurrency, return_exceptions=False)
        t0 = time.perf_counter()
        first = live.chat_many(reqs, workers=concurrency, return_exceptions=False)
        t_live = time.perf_counter() - t0
    hits_live = hits["n"] - concurrency
    replay = get_model(spec, {"cache": "replay", "cache_path": str(work / "chat.sqlite"), "concurrency": concurrency})
    passes = []
    for _ in range(REPLAY_PASSES):     # a replay pass takes milliseconds: time several, keep the median
        t0 = time.perf_counter()
        second = replay.chat_many(reqs, workers=concurrency, return_exceptions=False)
        passes.append(time.perf_counter() - t0)
    t_replay = statistics.median(passes)
    assert all(a.parsed == b.parsed and b.cached and not a.cached for a, b in zip(first, second))
    assert [r.parsed.case for r in second] == list(range(calls)) and replay.stats["network"] == 0
    return {"live_s": t_live, "replay_s": t_replay, "server_hits_live": hits_live,
            "network_calls_replay": replay.stats["network"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    ideal = math.ceil(a.calls / a.concurrency) * a.latency
    runs = []
    for _ in range(a.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-models-") as d:
            runs.append(one_repeat(a.calls, a.concurrency, a.latency, Path(d)))
    live = statistics.median(r["live_s"] for r in runs)
    replay = statistics.median(r["replay_s"] for r in runs)
    out = {"calls": a.calls, "concurrency": a.concurrency, "latency_s": a.latency, "repeats": a.repeats,
           "ideal_s": round(ideal, 3), "live_s_median": round(live, 3), "live_s_all": [round(r["live_s"], 3) for r in runs],
           "live_over_ideal": round(live / ideal, 3), "replay_s_median": round(replay, 4),
           "replay_s_all": [round(r["replay_s"], 4) for r in runs], "replay_speedup": round(live / replay, 1),
           "server_hits_live": runs[0]["server_hits_live"], "network_calls_replay": runs[0]["network_calls_replay"]}
    out["targets_met"] = {"live_within_1.3x_ideal": out["live_over_ideal"] <= 1.3, "replay_at_least_50x": out["replay_speedup"] >= 50}
    print(f"live pass   : {a.calls} calls, +{a.latency}s each, concurrency {a.concurrency}: {live:.3f}s "
          f"(ideal {ideal:.2f}s, ratio {live / ideal:.2f}, target <= 1.3)")
    print(f"replay pass : {replay * 1000:.1f} ms, {live / replay:.0f}x faster than live (target >= 50x), "
          f"{out['network_calls_replay']} network calls")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
