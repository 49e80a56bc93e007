"""Replay the attacks of issues 32 and 49 against this checkout and print one table row per attack (pass / FAIL / error)
and a count line (`summary: N of M passed`).

Bounded: every server it starts listens on 127.0.0.1 only and closes each connection after a fixed time, every
command it runs has a deadline, and the whole script stops at `--max-seconds` (printing what it has). Nothing leaves
the machine. The commands are the project's own, called as they are when the script runs (`forensicslab.cli.main`
in this process, or the console script for the servers), so an attack whose fix has not landed shows as FAIL.

    python scripts/stress.py             # every attack (a few minutes on two cores)
    python scripts/stress.py --short     # the quick ones (what tests/test_scripts.py runs)
    python scripts/stress.py --only grid-long-prefix --only chat-unpriced-budget

Exit status: 0 when every attack run passed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import errno
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import httpx
import nbformat
import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
EXE = Path(sys.executable).parent / "forensicslab"


# ---------------------------------------------------------------- helpers
def cli(*args: str, cwd: Path | None = None) -> tuple[int, str, str, float]:
    "Run `forensicslab ARGS` in this process: (exit status, stdout, stderr, seconds)."
    from forensicslab.cli import main
    out, err, code, t0 = io.StringIO(), io.StringIO(), 0, time.monotonic()
    old = Path.cwd()
    try:
        if cwd: os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try: main([str(a) for a in args])
            except SystemExit as e: code = e.code if isinstance(e.code, int) else 1
    finally: os.chdir(old)
    return code, out.getvalue(), err.getvalue(), time.monotonic() - t0


def last_line(text: str) -> str:
    lines = [l for l in text.replace("\r", "\n").splitlines() if l.strip()]
    return lines[-1].strip() if lines else ""


class Loopback:
    "A raw HTTP server on 127.0.0.1: `respond(conn, method, path, body)` answers each request; connections close after `cap_s`."
    def __init__(self, respond: Callable, cap_s: float = 30.0):
        self.respond, self.cap_s, self.calls = respond, cap_s, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._stop:
            try: conn, _ = self.sock.accept()
            except OSError: return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        conn.settimeout(self.cap_s)
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk: return
                data += chunk
            head, body = data.split(b"\r\n\r\n", 1)
            n = int(re.search(rb"(?i)content-length:\s*(\d+)", head)[1]) if re.search(rb"(?i)content-length", head) else 0
            while len(body) < n: body += conn.recv(65536)
            method, path = head.split(b" ")[:2]
            self.calls += 1
            self.respond(conn, method.decode(), path.decode(), body, time.monotonic() + self.cap_s)
        except (OSError, ValueError): pass
        finally:
            with contextlib.suppress(OSError): conn.close()

    def close(self):
        self._stop = True
        self.sock.close()


def send(conn, status: int, body: bytes, ctype: str = "application/json", extra: str = "", dribble_s: float = 0.0,
         until: float = 0.0):
    "Answer with `body`; `dribble_s` > 0 sends it one byte at a time, that many seconds apart (until `until`)."
    conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n{extra}"
                 f"Connection: close\r\n\r\n".encode())
    if not dribble_s: conn.sendall(body); return
    for b in body:
        if time.monotonic() > until: return
        conn.sendall(bytes([b]))
        time.sleep(dribble_s)


def completion(model: str, text: str = "hello") -> bytes:
    return json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": model,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}}).encode()


def photo(path: Path, seed: int = 0, kind: str = "jpg") -> Path:
    rng = np.random.default_rng(seed)
    a = (rng.random((96, 128, 3)) * 60 + 100).astype(np.uint8)
    a[20:50, 30:70] = 230
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(a).save(path, quality=90) if kind == "jpg" else Image.fromarray(a).save(path)
    return path


def tiny_study(path: Path) -> Path:
    "A papermill study that declares `backbone` and writes a one-row table naming it."
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell('quick = True\nout_dir = ""\nbackbone = ""\nseed = 0')
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p, nbformat.v4.new_code_cell("import pathlib\npathlib.Path(out_dir, 't.csv').write_text(f'backbone,n\\n{backbone},{len(backbone)}\\n')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
    nbformat.write(nb, path)
    return path


# ---------------------------------------------------------------- attacks: each returns (passed, one-line detail)
def grid_long_prefix(tmp: Path, short: bool):
    "Issue 32 high 3: two backbones sharing a 40-character prefix must be two cells, two runs, two summary rows."
    study = tiny_study(tmp / "tiny.ipynb")
    srv = Loopback(lambda *a: None)   # a listening port: batch checks that a backend's server accepts connections first
    long = f"openai-compatible:http://127.0.0.1:{srv.port}/v1#qwen2.5-vl-instruct-"
    grid = tmp / "grid.yaml"
    grid.write_text(f"study: {study}\nout: {tmp / 'out'}\ngrid:\n  backbone: ['{long}7b', '{long}72b']\nsummary: t.csv\n")
    try: code, out, err, _ = cli("batch", grid, "--no-progress")
    finally: srv.close()
    folders = [p for p in (tmp / "out").iterdir() if p.is_dir()] if (tmp / "out").is_dir() else []
    rows = list(csv.DictReader(open(tmp / "out" / "summary.csv"))) if (tmp / "out" / "summary.csv").is_file() else []
    got = sorted(r.get("backbone", "")[-3:] for r in rows)
    ok = code == 0 and len(folders) == 2 and got == ["-7b", "72b"]
    return ok, f"exit {code}, {len(folders)} cell folder(s), summary backbones {got or 'none'}; {last_line(out + err)[:80]}"


def grid_misspelt_keys(tmp: Path, short: bool):
    "Issue 32 medium 10: `parms:` / `gird:` must be refused in one line naming the key."
    study = tiny_study(tmp / "tiny.ipynb")
    res = []
    for key, text in (("parms", "parms: {seed: 1}\ngrid: {seed: [0]}\n"), ("gird", "gird:\n  seed: [0, 1]\n")):
        g = tmp / f"{key}.yaml"
        g.write_text(f"study: {study}\nout: {tmp / key}\n{text}")
        code, out, err, _ = cli("batch", g, "--no-progress")
        res.append((code, key in err and err.count("\n") == 1, not (tmp / key).exists()))
    ok = all(c == 2 and named and clean for c, named, clean in res)
    return ok, "; ".join(f"{k}: exit {c}{', named' if n else ', NOT named'}" for (c, n, _), k in zip(res, ("parms", "gird")))


def _index_mismatches(out: Path) -> tuple[int, int]:
    "(rows checked, rows whose linked report shows another verdict or another image), over every results.csv under `out`."
    n = bad = 0
    for res in out.rglob("results.csv"):
        for r in csv.DictReader(open(res, encoding="utf-8")):
            if not r.get("report"): continue
            n += 1
            rep = res.parent / r["report"]
            html = rep.read_text(encoding="utf-8", errors="replace") if rep.is_file() else ""
            want = {"manipulated": "MANIPULATED", "authentic": "AUTHENTIC"}.get(r.get("verdict", ""), "?")
            if want not in html or f"<title>{r['image']} " not in html: bad += 1
    return n, bad


def analyze_two_configs(tmp: Path, short: bool):
    "Issue 32 high 1: `--config fusion` then `--config rules` into one --out: no index row may link another configuration's report."
    for i in range(6): photo(tmp / "in" / f"img{i}.jpg", seed=i)
    c1, *_ = cli("analyze", tmp / "in", "--out", tmp / "out", "--config", "fusion", "--detectors", "noise", cwd=tmp)
    c2, o2, e2, _ = cli("analyze", tmp / "in", "--out", tmp / "out", "--config", "rules", "--detectors", "noise", cwd=tmp)
    n, bad = _index_mismatches(tmp / "out")
    refused = c2 == 2 and e2.count("\n") == 1
    ok = c1 == 0 and (refused or c2 == 0) and n > 0 and bad == 0
    return ok, f"exits {c1}/{c2}{' (second refused)' if refused else ''}; {bad} of {n} index rows link a report with another verdict or image"


def analyze_file_added(tmp: Path, short: bool):
    "Issue 32 high 2: adding sub0/x.jpg and resuming must not link sub1/x.jpg to another image's report."
    photo(tmp / "in" / "sub1" / "x.jpg", seed=1)
    photo(tmp / "in" / "sub2" / "y.jpg", seed=2)
    c1, *_ = cli("analyze", tmp / "in", "--out", tmp / "out", "--config", "fusion", "--detectors", "noise", cwd=tmp)
    photo(tmp / "in" / "sub0" / "x.jpg", seed=7)
    c2, *_ = cli("analyze", tmp / "in", "--out", tmp / "out", "--config", "fusion", "--detectors", "noise", cwd=tmp)
    n, bad = _index_mismatches(tmp / "out")
    return c1 == 0 and c2 == 0 and n >= 3 and bad == 0, f"exits {c1}/{c2}; {bad} of {n} index rows link another image's report"


def _start_server(args: list[str], tmp: Path, wait_s: float = 240.0):
    "Start `forensicslab serve-detector ARGS --port 0` and return (process, url) once it prints its address."
    log = open(tmp / "server.log", "w+")
    p = subprocess.Popen([str(EXE), "serve-detector", *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < wait_s and p.poll() is None:
        m = re.search(r"serving \S+ on (http://127\.0\.0\.1:\d+)", (tmp / "server.log").read_text())
        if m: return p, m[1]
        time.sleep(0.5)
    p.kill()
    raise RuntimeError(f"detector server did not start: {last_line((tmp / 'server.log').read_text())[:120]}")


def detector_slow_clients(tmp: Path, short: bool):
    "Issue 32 medium 4: five clients sending one byte every 2 s must not starve a real request."
    if not EXE.exists(): return None, "console script not installed"
    p, url = _start_server(["noise", "--port", "0"], tmp)
    socks, stop = [], threading.Event()
    try:
        port = int(url.rsplit(":", 1)[1])
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"POST /v1/detect HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            socks.append(s)
        def drip():
            while not stop.wait(2.0):
                for s in socks:
                    with contextlib.suppress(OSError): s.sendall(b"{")
        threading.Thread(target=drip, daemon=True).start()
        time.sleep(3)
        b = io.BytesIO(); Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(b, "PNG")
        t0 = time.monotonic()
        try:
            r = httpx.post(url + "/v1/detect", json={"image": base64.b64encode(b.getvalue()).decode()}, timeout=45)
            status, secs = r.status_code, time.monotonic() - t0
        except httpx.HTTPError as e: status, secs = type(e).__name__, time.monotonic() - t0
        try: h = httpx.get(url + "/v1/health", timeout=10); health = f"{h.status_code} {h.text[:80]}"
        except httpx.HTTPError as e: health = type(e).__name__
        return status == 200 and secs < 30, f"real request: {status} after {secs:.1f} s; health during the attack: {health}"
    finally:
        stop.set()
        for s in socks: s.close()
        os.killpg(p.pid, 15)
        p.wait(10)


def chat_byte_per_second(tmp: Path, short: bool):
    "Issue 32 medium 5: `--timeout T` must bound a reply sent one byte per second (it took 128 s for T = 20)."
    t = 4 if short else 20
    srv = Loopback(lambda c, m, path, body, until: send(c, 200, completion("m"), dribble_s=1.0, until=until), cap_s=3 * t + 10)
    try:
        code, out, err, secs = cli("models", "ask", f"openai-compatible:{srv.url}/v1#m", "hi", "--timeout", t, "--cache", "off")
    finally: srv.close()
    return secs <= t + 5, f"--timeout {t}: ended after {secs:.1f} s, exit {code}; {last_line(err or out)[:90]}"


def chat_unpriced_budget(tmp: Path, short: bool):
    "Issue 32 medium 7: an unpriced model with --budget-usd must be refused (or its cost reported unknown), never $0."
    srv = Loopback(lambda c, m, path, body, until: send(c, 200, completion("unpriced-stress-model")))
    try:
        code, out, err, _ = cli("models", "ask", f"openai-compatible:{srv.url}/v1#unpriced-stress-model", "hi",
                                "--budget-usd", "0.01", "--cache", "off")
    finally: srv.close()
    refused = code != 0 and re.search(r"(?i)pric", err) is not None and srv.calls == 0
    unknown = code == 0 and re.search(r"(?i)cost=(unknown|n/a|\?)", out + err) is not None
    return refused or unknown, (f"exit {code}, {srv.calls} call(s) made; "
                                + ("refused before any call" if refused else "cost reported unknown" if unknown
                                   else f"neither refused nor unknown: {last_line(out + err)[:80]}"))


def retrieval_redirect(tmp: Path, short: bool):
    "Issue 32 medium 8: a redirect to 127.0.0.1 (and the address itself) must be refused, its text never read."
    from forensicslab.debate.retrieval import fetch_page
    secret = "METADATA-SECRET-TOKEN"
    srv = Loopback(lambda c, m, path, body, until: send(c, 200, f"<html><title>s</title><p>{secret}</p></html>".encode(), "text/html")
                   if path == "/secret" else send(c, 302, b"", "text/html", extra=f"Location: http://127.0.0.1:{srv.port}/secret\r\n"))
    first = {"n": 0}
    def resolve(host):   # the first lookup of `localhost` pretends to be public, as a real public page that redirects is
        first["n"] += 1
        return ["93.184.216.34"] if first["n"] == 1 else socket.gethostbyname_ex(host)[2]
    results = []
    try:
        with httpx.Client() as client:
            for url, kw in ((f"http://127.0.0.1:{srv.port}/secret", {}), (f"http://localhost:{srv.port}/go", {"resolve": resolve})):
                try: results.append(("read", fetch_page(url, client, deadline_s=5, **kw)))
                except Exception as e: results.append((type(e).__name__, str(e)))
    finally: srv.close()
    leaked = any(secret in json.dumps(r) for r in results)
    return not leaked and all(k != "read" for k, _ in results), "; ".join(f"{k}: {str(v)[:50]}" for k, v in results)


def retrieval_page_deadline(tmp: Path, short: bool):
    "Issue 32 medium 5: a page fetch must end at its total deadline (a 20 s timeout took 79 s)."
    from forensicslab.debate.retrieval import fetch_page
    d = 3 if short else 20
    srv = Loopback(lambda c, m, path, body, until: send(c, 200, b"<html>" + b"x" * 400 + b"</html>", "text/html", dribble_s=0.5,
                                                        until=until), cap_s=3 * d + 10)
    t0 = time.monotonic()
    try:
        with httpx.Client() as client:
            try: fetch_page(f"{srv.url}/slow", client, deadline_s=d, allow_private=True); what = "returned"
            except Exception as e: what = type(e).__name__
    finally: srv.close()
    secs = time.monotonic() - t0
    return secs <= d + 3, f"deadline {d} s: {what} after {secs:.1f} s"


def _corrupt_folder(root: Path) -> Path:
    for i in range(3): photo(root / "real" / f"r{i}.png", seed=i, kind="png"); photo(root / "fake" / f"f{i}.jpg", seed=10 + i)
    (root / "fake" / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg" * 10)
    return root


def folder_corrupt_image(tmp: Path, short: bool):
    "Issue 32 medium 9: a folder study with one corrupt image must skip it, count it and name it (short: the data layer)."
    root = _corrupt_folder(tmp / "set")
    if short:
        from forensicslab.data.datasets import describe_dataset, load_dataset
        with contextlib.redirect_stderr(io.StringIO()):
            try: s = load_dataset(f"folder:{root}")
            except Exception as e: return False, f"load_dataset: {type(e).__name__}: {str(e)[:80]}"
        text = describe_dataset(f"folder:{root}", s)
        return len(s) == 6 and "fake/bad.jpg" in text, f"{len(s)} images loaded; caption: ...{text[-70:]}"
    code, out, err, secs = cli("study", "triage_table4", "--quick", "-p", "dataset", f"folder:{root}", "--out", tmp / "o", cwd=REPO)
    caps = " ".join(p.read_text() for p in (tmp / "o" / "triage_table4").glob("table4*.md")) if code == 0 else ""
    return code == 0 and "fake/bad.jpg" in caps, f"triage_table4: exit {code} in {secs:.0f} s; " + (
        "tables name the skipped file" if "fake/bad.jpg" in caps else last_line(err or out)[:90])


def run_file_bad_lines(tmp: Path, short: bool):
    "Issue 32 lesser: a valid-JSON line that is not a row blocked resume with `error: key`; it must be set aside."
    from forensicslab.runs import Case, Run
    run = Run(tmp / "run")
    run.execute([Case(f"c{i}", i) for i in range(3)], lambda x: {"y": x}, workers=1, progress=False)
    with open(run.rows_path, "a") as f: f.write('[1, 2]\n{"not": "a row"}\n')
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            rows = Run(tmp / "run").execute([Case(f"c{i}", i) for i in range(4)], lambda x: {"y": x}, workers=1, progress=False)
    except Exception as e: return False, f"resume failed: {type(e).__name__}: {str(e)[:80]}"
    aside = list((tmp / "run").glob("*set-aside*"))
    return len(rows) == 4 and bool(aside), f"resumed with {len(rows)} rows; set aside in {aside[0].name if aside else 'nothing'}"


def disk_full(tmp: Path, short: bool):
    """Issue 32 lesser: a full disk must be one line naming the file. Simulated: the run's row write gets ENOSPC from
    `os.write` (a real full disk needs a small mounted file system, which a user cannot always make)."""
    from unittest import mock
    from forensicslab.cli import _machine_error
    from forensicslab.runs import Case, Run
    run = Run(tmp / "run")
    full = OSError(errno.ENOSPC, "No space left on device")
    try:
        with mock.patch("os.write", side_effect=full):
            run.execute([Case("a", 1)], lambda x: {"y": x}, workers=1, progress=False)
        return False, "the write did not fail"
    except Exception as e: line = _machine_error(e) or str(e)
    return "rows.jsonl" in line and "\n" not in line, line[:110]


def corrupt_cache(tmp: Path, short: bool):
    "Issue 32 lesser: a corrupt cache database must be one line naming the file, not 'unexpected ... (a bug)'."
    img = photo(tmp / "a.jpg")
    cache = tmp / "cache"
    os.environ["FORENSICSLAB_CACHE_DIR"] = str(cache)
    try:
        c1, *_ = cli("analyze", img, "--config", "fusion", "--detectors", "noise", "--out", tmp / "o1", cwd=tmp)
        dbs = [p for p in cache.rglob("*") if p.suffix in (".db", ".sqlite")]
        for p in dbs: p.write_bytes(b"this is not a database" * 50)
        c2, out, err, _ = cli("analyze", img, "--config", "fusion", "--detectors", "noise", "--out", tmp / "o2", cwd=tmp)
    finally: os.environ["FORENSICSLAB_CACHE_DIR"] = str(tmp.parent / "cache")
    line = last_line(err)
    named = any(str(p) in line for p in dbs)
    if c2 == 0: return True, f"{len(dbs)} cache file(s) corrupted; the run went on (exit 0)"
    return c2 == 2 and named and "a bug" not in line, f"exit {c2}: {line[:110]}"


def port_in_use(tmp: Path, short: bool):
    "Issue 32 lesser: a port in use must be one line naming it."
    if not EXE.exists(): return None, "console script not installed"
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
        try: r = subprocess.run([str(EXE), "serve-detector", "noise", "--port", str(port)], capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired as e:   # printed its line, then did not exit
            out = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            return False, f"no exit within 240 s; printed: {last_line(out)[:80]}"
    line = last_line(r.stderr)
    return r.returncode == 2 and str(port) in line and "a bug" not in line, f"exit {r.returncode}: {line[:100]}"


def zoom_ckpt_pickle(tmp: Path, short: bool):
    "Issue 32 lesser: `zoom --policy ckpt:` with pickle weights must be refused in one line before any unpickling."
    ck = tmp / "ckpt"
    ck.mkdir()
    (ck / "pytorch_model.bin").write_bytes(b"\x80\x04 not loaded")
    (ck / "config.json").write_text("{}")
    (ck / "zoom_train.json").write_text(json.dumps({"config": {}, "base_path": "."}))
    code, out, err, _ = cli("zoom", photo(tmp / "a.jpg"), "--policy", f"ckpt:{ck}")
    line = last_line(err)
    return code == 2 and "pickle" in line and "a bug" not in line, f"exit {code}: {line[:110]}"


# ---------------------------------------------------------------- issue 49: defects 1-9, through the commands users run
def _text_of(req: dict) -> str:
    "Every text part of a chat-completions request, joined."
    out = []
    for m in req.get("messages", []):
        c = m.get("content")
        out += [c] if isinstance(c, str) else [p.get("text", "") for p in c or [] if p.get("type") == "text"]
    return "\n".join(out)


def judge_foreign_tool(tmp: Path, short: bool):
    """Issue 49 defect 1: a judge reply naming a detector outside the pool must not be cached: `analyze --config complete`
    again (the model now answering within the pool) must ask the judge again and give a verdict."""
    from forensicslab.chat.testing import openai_server
    img = photo(tmp / "in" / "a.jpg")
    state = {"tool": "trufor", "judge_calls": 0}
    def respond(req):
        text = _text_of(req)
        if "You audit the output of exactly one forensic detector" in text:
            tool = re.search(r"Detector id: (\S+)", text).group(1)
            return json.dumps({"reasoning": f"STEP 1: checked {tool}.", "tool_id": tool, "audit_verdict": "valid"})
        state["judge_calls"] += 1
        return json.dumps({"reasoning": "STEP 1: looked.", "is_manipulated": True, "locality": "local", "region": "centre",
                           "arbitrated_tools": [state["tool"]], "decision_path": ["looked"]})
    args = ["--config", "complete", "--detectors", "noise", "--no-provenance", "--cache", "rw", "--cache-dir", tmp / "cache"]
    with openai_server(respond) as url:
        spec = f"openai-compatible:{url}/v1#stress-judge"
        c1, o1, e1, _ = cli("analyze", img, "--backend", spec, "--out", tmp / "o1", *args, cwd=tmp)
        first = state["judge_calls"]
        state["tool"] = "noise"
        c2, o2, e2, _ = cli("analyze", img, "--backend", spec, "--out", tmp / "o2", "--json", *args, cwd=tmp)
    again = state["judge_calls"] - first
    ok = again > 0 and c2 == 0 and '"noise"' in o2
    return ok, (f"first run: exit {c1}, {first} judge call(s) naming trufor; rerun: exit {c2}, {again} judge call(s)"
                + ("" if again else " (answered from the cache: the bad reply had been stored)"))


class _SlowHeads:
    "`n` connections each sending one more header line every `every` seconds, never ending the request head."
    def __init__(self, port: int, n: int, every: float):
        self.port, self.n, self.every, self.stop, self.closed = port, n, every, threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        socks = []
        for _ in range(self.n):
            with contextlib.suppress(OSError):
                s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n"); socks.append(s)
        line = 0
        while socks and not self.stop.wait(self.every):
            line += 1
            for s in list(socks):
                try: s.sendall(f"X-Slow-{line}: a\r\n".encode())
                except OSError: socks.remove(s); s.close(); self.closed += 1
        for s in socks: s.close()

    def __enter__(self): self.thread.start(); return self
    def __exit__(self, *exc): self.stop.set(); self.thread.join(10)


def detector_slow_heads(tmp: Path, short: bool):
    """Issue 49 defect 2: 66 connections each trickling a header line (every 1 s) made /v1/health answer 503 for as
    long as they lasted; health must stay 200 (a total head deadline and a per-address connection cap)."""
    if not EXE.exists(): return None, "console script not installed"
    p, url = _start_server(["noise", "--port", "0"], tmp)
    try:
        with _SlowHeads(int(url.rsplit(":", 1)[1]), 66, 1.0):
            time.sleep(2)
            codes = []
            for _ in range(10):
                try: codes.append(httpx.get(url + "/v1/health", timeout=10).status_code)
                except httpx.HTTPError as e: codes.append(type(e).__name__)
                time.sleep(0.5)
        return codes == [200] * 10, f"/v1/health during the attack: {codes.count(200)} of 10 answered 200 ({sorted(set(map(str, codes)))})"
    finally:
        os.killpg(p.pid, 15)
        p.wait(10)


def _bomb_png(side: int) -> bytes:
    "A real 16-bit grey PNG of side x side zeros (a decompression bomb: ~2 KB per 1000 rows, side*side*2 bytes decoded)."
    import struct
    import zlib
    def chunk(kind, data): return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    c = zlib.compressobj(9); row = b"\0" * (1 + 2 * side)
    idat = b"".join(c.compress(row) for _ in range(side)) + c.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 16, 0, 0, 0, 0)) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


def fake_remote(card: dict, answer: dict) -> Loopback:
    "A detector server speaking protocol v1 on loopback whose card and detect answer are given (json.dumps writes NaN as is)."
    health = {"status": "ok", "protocol": "1", "detector": card["id"], "version": "1"}
    def respond(c, method, path, body, until):
        send(c, 200, json.dumps(health if path == "/v1/health" else card if path == "/v1/card" else answer).encode())
    return Loopback(respond)


REMOTE_CARD = dict(id="odd", name="Odd (stress double)", version="1", scope=["splice"], native_metric="p",
                   normalisation="identity", score_reading="x", map_reading="y")


def _detect_rss(img: Path, url: str) -> tuple[int, str, float]:
    "`forensicslab detect IMG --remote odd=URL --json` in a child process: (exit status, stdout, the child's peak RSS in MB)."
    p = subprocess.Popen([str(EXE), "detect", str(img), "--remote", f"odd={url}", "-d", "odd", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, out, usage.ru_maxrss / 1024


def remote_heatmap_bomb(tmp: Path, short: bool):
    """Issue 49 defect 3: a remote detector's small heatmap that decodes to hundreds of MB (8000x8000 16-bit, ~120 KB)
    must be refused from its PNG header: `detect --remote` peaks no higher than with an honest map."""
    if not EXE.exists(): return None, "console script not installed"
    from forensicslab.detectors.remote import encode_map
    img = photo(tmp / "a.png", kind="png")
    runs = {}
    for name, m in (("honest", encode_map(np.zeros((96, 128), np.float32))), ("bomb", base64.b64encode(_bomb_png(8000)).decode())):
        srv = fake_remote(REMOTE_CARD, dict(protocol="1", detector="odd", version="1", score=0.7, fired=True, map=m))
        try: runs[name] = _detect_rss(img, srv.url)
        finally: srv.close()
    (c0, _, rss0), (c1, out, rss1) = runs["honest"], runs["bomb"]
    named = "map is 8000x8000" in out
    return named and rss1 < rss0 + 150, (f"exits {c0}/{c1}; peak RSS {rss1:.0f} MB with the bomb, {rss0:.0f} MB with an honest map; "
                                         + ("refused, naming the 8000x8000 map" if named else f"not refused: {last_line(out)[:70]}"))


def retrieval_index_cache(tmp: Path, short: bool):
    """Issue 49 defect 4: `debate pair --retrieval local:idxB.json` after a run on idxA returned idxA's pages, even with
    `--cache off`; each index must answer for itself, and `--cache off` must not touch the retrieval cache."""
    from forensicslab.debate.retrieval import LocalIndex
    img = photo(tmp / "photo.png", kind="png")
    text = "The photograph shows a street market in {} in the spring of 2019, taken by a staff photographer of the paper."
    idx = {}
    for n in ("A", "B"):
        ix = LocalIndex(); ix.add(img, [{"url": f"https://example.org/{n}", "title": f"page {n}", "text": text.format(n)}])
        idx[n] = ix.save(tmp / f"idx{n}.json")
    cache = tmp / "cache"
    def pair(index, *extra):
        code, out, err, _ = cli("debate", "pair", img, "A street market.", "--retrieval", f"local:{index}", "--json",
                                "--cache-dir", cache, *extra, cwd=tmp)
        try: return code, [s.get("url") for s in json.loads(out)["sources"]]
        except (ValueError, KeyError): return code, [last_line(err or out)[:60]]
    a = pair(idx["A"])
    b = pair(idx["B"])
    files = sorted(cache.rglob("retrieval/*.json"))
    off = pair(idx["A"], "--cache", "off")
    untouched = sorted(cache.rglob("retrieval/*.json")) == files
    ok = a[1] == ["https://example.org/A"] and b[1] == ["https://example.org/B"] and off[1] == ["https://example.org/A"] and untouched
    return ok, f"idxA -> {a[1]}; then idxB -> {b[1]}; idxA --cache off -> {off[1]}, cache {'untouched' if untouched else 'WRITTEN'}"


def _images(root: Path, names: list[str]) -> Path:
    for i, n in enumerate(names): photo(root / n, seed=i)
    return root


def analyze_non_row_line(tmp: Path, short: bool):
    """Issue 49 defect 5: a `[1, 2]` line in the run's rows.jsonl crashed `analyze` ("unexpected ... (a bug)"); it must
    resume past it. And `serve-detector --port 99999` must be one line, exit 2."""
    src = _images(tmp / "in", ["a.jpg", "b.jpg"])
    args = ["analyze", src, "--out", tmp / "out", "--config", "fusion", "--detectors", "noise", "--no-provenance"]
    c1, *_ = cli(*args, cwd=tmp)
    rows = next((tmp / "out").glob("runs/*/rows.jsonl"), None)
    if rows is None: return False, f"exit {c1}; no runs/*/rows.jsonl under --out"
    with open(rows, "a") as f: f.write("[1, 2]\n")
    c2, out, err, _ = cli(*args, cwd=tmp)
    c3, _, err3, _ = cli("serve-detector", "noise", "--port", "99999")
    port_ok = c3 == 2 and len(err3.strip().splitlines()) == 1 and "a bug" not in err3
    ok = c1 == 0 and c2 == 0 and "a bug" not in err and port_ok
    return ok, f"resume past [1, 2]: exit {c2} {last_line(err)[:50] if c2 else ''}; --port 99999: exit {c3}: {last_line(err3)[:50]}"


FORMULA = ("=HYPERLINK(1).jpg", "@SUM(1).jpg", "+cmd.jpg", "-cmd.jpg")


def csv_formula_names(tmp: Path, short: bool):
    "Issue 49 defect 6: file names starting with = @ + - must not reach results.csv as formulas (a cell starting so)."
    src = _images(tmp / "in", list(FORMULA))
    code, out, err, _ = cli("analyze", src, "--out", tmp / "out", "--config", "fusion", "--detectors", "noise", "--no-provenance", cwd=tmp)
    res = tmp / "out" / "results.csv"
    if not res.is_file(): return False, f"exit {code}; no results.csv: {last_line(err)[:70]}"
    cells = [v for r in csv.reader(open(res, encoding="utf-8")) for v in r if any(s[1:5] in v for s in FORMULA)]
    live = [v for v in cells if v[:1] in ("=", "@", "+", "-")]
    return code == 0 and len(cells) >= 4 and not live, f"exit {code}; {len(live)} of {len(cells)} cells naming the files start with = @ + - ({live[:2]})"


def out_foreign_files(tmp: Path, short: bool):
    "Issue 49 defect 7: `--out` at a folder holding someone else's index.html and results.csv must be refused, them untouched."
    src = _images(tmp / "in", ["a.jpg", "b.jpg"])
    dest = tmp / "mine"; dest.mkdir()
    (dest / "index.html").write_text("<html><body>my own page</body></html>")
    (dest / "results.csv").write_text("name,value\nmine,1\n")
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    code, out, err, _ = cli("analyze", src, "--out", dest, "--config", "fusion", "--detectors", "noise", "--no-provenance", cwd=tmp)
    kept = all((dest / n).read_bytes() == b for n, b in before.items())
    ok = code == 2 and len(err.strip().splitlines()) == 1 and kept
    return ok, f"exit {code}; their files {'untouched' if kept else 'OVERWRITTEN'}; {last_line(err)[:70]}"


def _interrupt(tmp: Path, sig: int) -> tuple[int | None, int, int, bool, str]:
    "analyze 40 images in a child process, `sig` once two rows are written: (exit, rows done, results.csv rows, index.html, stderr tail)."
    src = _images(tmp / "in", [f"p{i:02d}.jpg" for i in range(40)])
    out = tmp / "out"
    p = subprocess.Popen([str(EXE), "analyze", str(src), "--out", str(out), "--config", "fusion", "--detectors", "noise,adq",
                          "--no-provenance"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0, rows = time.monotonic(), None
    while time.monotonic() - t0 < 240 and p.poll() is None:
        rows = rows or next(out.glob("runs/*/rows.jsonl"), None)
        if rows and sum(1 for _ in open(rows)) >= 2: break
        time.sleep(0.2)
    if p.poll() is None: p.send_signal(sig)
    try: err = p.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired: p.kill(); err = p.communicate()[1]
    done = sum(1 for _ in open(rows)) if rows else 0
    res = out / "results.csv"
    n_csv = max(0, sum(1 for _ in csv.reader(open(res, encoding="utf-8"))) - 1) if res.is_file() else 0
    return p.returncode, done, n_csv, (out / "index.html").is_file(), last_line(err)


def interrupted_run(tmp: Path, short: bool):
    """Issue 49 defect 8: SIGTERM mid-run wrote no results.csv/index.html for the finished rows, and a SIGINT once ended
    with exit 134; both must leave results.csv and index.html of the rows done, and SIGINT no abort."""
    if not EXE.exists(): return None, "console script not installed"
    import signal as _signal
    out = []
    ok = True
    for sig in (_signal.SIGTERM, _signal.SIGINT):
        (tmp / sig.name).mkdir()
        code, done, n_csv, index, tail = _interrupt(tmp / sig.name, sig)
        good = done >= 1 and n_csv >= 1 and index and code not in (0, 134, -6) and "terminate called" not in tail
        ok = ok and good
        out.append(f"{sig.name}: exit {code}, {done} rows done, {n_csv} in results.csv, index.html {'written' if index else 'MISSING'}")
    return ok, "; ".join(out)


def remote_threshold_nan(tmp: Path, short: bool):
    "Issue 49 defect 9: a remote card or answer with a NaN or -inf threshold must be refused in one line naming it."
    img = photo(tmp / "a.png", kind="png")
    res = []
    for where, card, answer in (("card NaN", {**REMOTE_CARD, "threshold": float("nan")}, {"score": 0.7, "fired": True}),
                                ("answer -inf", REMOTE_CARD, {"score": 0.2, "fired": True, "threshold": float("-inf")})):
        srv = fake_remote(card, dict(protocol="1", detector="odd", version="1", **answer))
        try: code, out, err, _ = cli("detect", img, "--remote", f"odd={srv.url}", "-d", "odd", "--json")
        finally: srv.close()
        named = re.search(r"threshold .*not a number in \[0, 1\]", out + err) is not None
        fired = '"fired": true' in out
        res.append((where, code, named, fired))
    ok = all(named and not fired for _, _, named, fired in res)
    return ok, "; ".join(f"{w}: exit {c}, {'refused naming the threshold' if n else 'ACCEPTED'}" for w, c, n, _ in res)


ATTACKS: dict[str, tuple[Callable, bool]] = {   # name -> (attack, in the short mode)
    "grid-long-prefix": (grid_long_prefix, True),
    "grid-misspelt-keys": (grid_misspelt_keys, True),
    "run-file-bad-lines": (run_file_bad_lines, True),
    "disk-full": (disk_full, True),
    "folder-corrupt-image": (folder_corrupt_image, True),
    "chat-unpriced-budget": (chat_unpriced_budget, True),
    "chat-byte-per-second": (chat_byte_per_second, True),
    "retrieval-redirect": (retrieval_redirect, True),
    "retrieval-page-deadline": (retrieval_page_deadline, True),
    "analyze-two-configs": (analyze_two_configs, False),
    "analyze-file-added": (analyze_file_added, False),
    "corrupt-cache": (corrupt_cache, False),
    "zoom-ckpt-pickle": (zoom_ckpt_pickle, False),
    "port-in-use": (port_in_use, False),
    "detector-slow-clients": (detector_slow_clients, False),
    # issue 49, defects 1-9 (5-8: the folder runs; the rest: caches and the remote detector protocol)
    "judge-foreign-tool": (judge_foreign_tool, True),
    "detector-slow-heads": (detector_slow_heads, True),
    "remote-heatmap-bomb": (remote_heatmap_bomb, True),
    "retrieval-index-cache": (retrieval_index_cache, True),
    "analyze-non-row-line": (analyze_non_row_line, True),
    "csv-formula-names": (csv_formula_names, True),
    "out-foreign-files": (out_foreign_files, True),
    "interrupted-run": (interrupted_run, True),
    "remote-threshold-nan": (remote_threshold_nan, True),
}


def table(rows: list[tuple[str, str, float, str]]) -> str:
    w = max([len("attack")] + [len(r[0]) for r in rows])
    out = [f"{'attack':<{w}}  {'result':<7}  {'seconds':>7}  detail"]
    out += [f"{n:<{w}}  {r:<7}  {s:>7.1f}  {' '.join(d.split())[:150]}" for n, r, s, d in rows]
    return "\n".join(out)


def summary(rows: list[tuple[str, str, float, str]]) -> str:
    "The count line under the table: how many of the attacks run passed, and the rest by result."
    n = {k: sum(r[1] == k for r in rows) for k in ("pass", "FAIL", "error", "skipped")}
    rest = ", ".join(f"{v} {k}" for k, v in n.items() if k != "pass" and v)
    return f"summary: {n['pass']} of {len(rows)} passed" + (f" ({rest})" if rest else "")


@contextlib.contextmanager
def _restored(saved: dict):
    "Put the environment variables in `saved` back as they were (the script may run inside a test process)."
    try: yield
    finally:
        for k, v in saved.items():
            if v is None: os.environ.pop(k, None)
            else: os.environ[k] = v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--short", action="store_true", help="only the quick attacks")
    ap.add_argument("--only", action="append", choices=list(ATTACKS), help="run only these attacks (repeatable)")
    ap.add_argument("--max-seconds", type=float, default=1800, help="stop starting attacks after this long")
    a = ap.parse_args(argv)
    names = a.only or [n for n, (_, quick) in ATTACKS.items() if quick or not a.short]
    rows, t_start = [], time.monotonic()
    saved = {k: os.environ.get(k) for k in ("FORENSICSLAB_CACHE_DIR", "OPENAI_API_KEY")}
    with tempfile.TemporaryDirectory(prefix="forensicslab-stress-") as base, _restored(saved):
        base = Path(base)
        os.environ["FORENSICSLAB_CACHE_DIR"] = str(base / "cache")   # never the user's caches
        os.environ.setdefault("OPENAI_API_KEY", "sk-stress-not-used-000000")
        for n in names:
            if time.monotonic() - t_start > a.max_seconds:
                rows.append((n, "skipped", 0.0, f"--max-seconds {a.max_seconds:g} reached")); continue
            tmp = base / n
            tmp.mkdir()
            t0 = time.monotonic()
            try:
                ok, detail = ATTACKS[n][0](tmp, a.short)
                result = "skipped" if ok is None else "pass" if ok else "FAIL"
            except Exception as e:
                result, detail = "error", f"{type(e).__name__}: {e}"
            rows.append((n, result, time.monotonic() - t0, detail))
            print(table(rows).splitlines()[-1], file=sys.stderr, flush=True)
        shutil.rmtree(base / "cache", ignore_errors=True)
    print(table(rows))
    print(summary(rows))
    return 0 if all(r[1] in ("pass", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
