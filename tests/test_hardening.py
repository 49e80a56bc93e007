"""Issue #49 hardening: the judge's reply cache, the detector server's header deadline and per-client cap, the remote
heatmap's size check before decoding, the retrieval cache keyed on the index, and the remote card's threshold."""
import json
from pathlib import Path

import numpy as np
import pytest
from skimage import data as skdata

from forensicslab.core import ChatFailure, Detection
from forensicslab.imageio import load_image


# ---------------------------------------------------------------- defect 1: a judge reply naming a foreign tool
def _judge_case():
    from forensicslab.triage.all import make_card
    from forensicslab.triage.records import AuditVerdict
    img = load_image(skdata.coffee()[:96, :96])
    cards = {k: make_card(k, ["splice"]) for k in ("noise", "adq")}
    dets = {k: Detection.from_score(k, 0.9) for k in cards}
    audits = {k: AuditVerdict(reasoning="ok", tool_id=k, audit_verdict="valid") for k in cards}
    return img, dets, cards, audits

def _verdict(tool):
    return json.dumps({"reasoning": "STEP 1: looked.", "is_manipulated": True, "locality": "local", "region": "top",
                       "arbitrated_tools": [tool], "decision_path": ["looked"]})

def test_judge_reply_naming_a_foreign_tool_is_not_cached(tmp_path):
    "A reply naming a tool outside the pool fails the case without being stored: a rerun asks the model again."
    from forensicslab.chat.models import get_model
    from forensicslab.chat.testing import openai_server
    from forensicslab.triage.agents import LLMJudge
    img, dets, cards, audits = _judge_case()
    tool = {"name": "trufor"}
    with openai_server(lambda req: _verdict(tool["name"])) as url:
        model = lambda: get_model(f"openai-compatible:{url}#j", {"cache": "rw", "cache_path": str(tmp_path / "c.sqlite")})
        with pytest.raises(ChatFailure, match="trufor"):
            LLMJudge(model()).judge(img, dets, cards, audits)
        first = url.hits
        assert first == 2                                              # the answer and one re-ask naming the allowed ids
        tool["name"] = "noise"                                         # the model now answers within the pool
        v = LLMJudge(model()).judge(img, dets, cards, audits)
        assert url.hits > first, "the rerun was answered from the cache: the bad reply had been stored"
        assert v.arbitrated_tools == ["noise"]


# ---------------------------------------------------------------- defect 2: slow request heads starve the detector server
import socket
import threading
import time

import httpx


def _probe_server(**kw):
    "The detector server (`make_server`) for a cheap registered test detector, served from a thread of this process."
    from forensicslab.detectors.pool import card_from_dict, make_detection, register
    from forensicslab.detectors.remote import make_server

    @register("hardening_probe", replace=True)
    class _Probe:
        card = card_from_dict(dict(id="hardening_probe", name="Probe (test double)", version="1", scope=["splice"],
                                   native_metric="mean", normalisation="identity", score_reading="mean brightness"))
        def detect(self, image): return make_detection(self.card, float(image.rgb.mean()) / 255.0)
    return make_server("hardening_probe", **kw).start()


class _SlowHeads:
    """`n` connections from this process, each sending one more header line every `every` seconds and never ending the
    head (the slow-loris of issue 49); records, per connection, the seconds it lived and the first bytes it was sent."""
    def __init__(self, address, n: int, every: float, source: str = "127.0.0.1"):
        self.address, self.n, self.every, self.source = address, n, every, source
        self.stop, self.lived, self.answers = threading.Event(), {}, {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        socks, t0 = {}, time.monotonic()
        for i in range(self.n):
            try:
                s = socket.create_connection(self.address, timeout=5, source_address=(self.source, 0))
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n"); s.setblocking(False); socks[i] = s
            except OSError: self.lived[i] = time.monotonic() - t0
        line = 0
        while socks and not self.stop.is_set():
            line += 1
            for i, s in list(socks.items()):
                try:
                    try:
                        got = s.recv(4096)
                        if got or got == b"":
                            self.answers.setdefault(i, got[:40]); raise ConnectionError
                    except BlockingIOError: pass
                    s.send(f"X-Slow-{line}: a\r\n".encode())
                except OSError:
                    self.lived[i] = time.monotonic() - t0; s.close(); del socks[i]
            self.stop.wait(self.every)
        for s in socks.values(): s.close()

    def __enter__(self): self.thread.start(); return self
    def __exit__(self, *exc): self.stop.set(); self.thread.join(10)


def test_slow_heads_do_not_starve_health():
    """66 connections from one address trickling header lines (the issue's attack, one line every 0.5 s instead of
    5 s) while /v1/health is asked ten times: every answer is 200 with the default limits. Before the fix the 66
    connections filled uvicorn's connection limit (64) and health answered 503."""
    srv = _probe_server()
    try:
        with _SlowHeads(srv.server_address, 66, 0.5) as attack:
            time.sleep(1.5)
            codes = []
            for _ in range(10):
                codes.append(httpx.get(srv.url + "/v1/health", timeout=5).status_code); time.sleep(0.2)
            assert codes == [200] * 10, (codes, len(attack.lived))
    finally: srv.close()


def test_request_head_has_a_total_deadline():
    """A head trickled a line every 0.3 s never trips the 5 s idle timeout; the 1.5 s head deadline closes it with a 408
    (before the fix it lived until the test gave up)."""
    srv = _probe_server(idle_timeout=5, head_timeout=1.5)
    try:
        with _SlowHeads(srv.server_address, 1, 0.3) as attack:
            attack.thread.join(6)
        assert 0 in attack.lived and 1.2 < attack.lived[0] < 3.5, attack.lived
        assert attack.answers[0].startswith(b"HTTP/1.1 408"), attack.answers
    finally: srv.close()


def test_one_address_cannot_take_every_connection():
    """With 8 connections per address, 20 idle heads from 127.0.0.2 keep at most 8 open; a client from 127.0.0.1 is
    answered at once, and so is a 21st connection from 127.0.0.2 (it evicts that address's oldest idle head)."""
    srv = _probe_server(max_per_client=8, idle_timeout=30, head_timeout=30)
    try:
        with _SlowHeads(srv.server_address, 20, 0.3, source="127.0.0.2") as attack:
            time.sleep(1.5)
            assert len(attack.lived) >= 12, attack.lived                     # the first 12 were evicted by the later ones
            assert httpx.get(srv.url + "/v1/health", timeout=5).status_code == 200
            with socket.create_connection(srv.server_address, timeout=5, source_address=("127.0.0.2", 0)) as s:
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert s.recv(100).startswith(b"HTTP/1.1 200")
    finally: srv.close()


# ---------------------------------------------------------------- defects 3 and 9: what a remote detector answers
import base64
import struct
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def lying_png(width: int, height: int) -> bytes:
    "A PNG of a few dozen bytes whose header declares `width` x `height` 16-bit grey pixels (a decompression bomb's header)."
    def chunk(kind, data): return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 16, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


class _Remote(BaseHTTPRequestHandler):
    "A detector server whose card and answer the test sets (`server.card`, `server.answer`)."
    def log_message(self, *a): pass
    def _send(self, obj):
        b = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def do_GET(self):
        if self.path == "/v1/health": self._send(dict(status="ok", protocol="1", detector="odd", version="1"))
        else: self._send(self.server.card)
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(self.server.answer)


CARD = dict(id="odd", name="Odd", version="1", scope=["splice"], native_metric="p", normalisation="identity",
            score_reading="x", map_reading="y")


class _Served:
    def __init__(self, card=CARD, answer=None):
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), _Remote); self.srv.card, self.srv.answer = card, answer
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
    def __enter__(self):
        threading.Thread(target=self.srv.serve_forever, daemon=True).start(); return self
    def __exit__(self, *exc): self.srv.shutdown(); self.srv.server_close()


@pytest.mark.parametrize("side", [12000, 30000])
def test_remote_heatmap_size_checked_before_decoding(monkeypatch, side):
    """A 100-byte map whose PNG header declares 12000x12000 or 30000x30000 pixels (288 MB / 1.8 GB as 16-bit grey) is
    refused from its header, by name, and never decoded. Before the fix the client decoded it first (Pillow's `load`
    ran for 12000; for 30000 Pillow's own bomb check escaped as a raw DecompressionBombError)."""
    from PIL import ImageFile
    from forensicslab.detectors.remote import RemoteDetector, RemoteError
    loads = []
    real = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: loads.append(self.size) or real(self))
    bomb = lying_png(side, side)
    assert len(bomb) < 200
    answer = dict(protocol="1", detector="odd", version="1", score=0.7, fired=True, map=base64.b64encode(bomb).decode())
    with _Served(answer=answer) as s:
        rd = RemoteDetector(s.url)
        with pytest.raises(RemoteError, match=f"map is {side}x{side}, the image is 30x20"):
            rd.detect(np.zeros((20, 30, 3), np.uint8))
    assert loads == [], f"the map was decoded before its size was checked: {loads}"


@pytest.mark.parametrize("where", ["card", "answer"])
@pytest.mark.parametrize("bad", [float("nan"), float("-inf"), float("inf"), 1.5, -0.1])
def test_remote_threshold_must_be_finite_in_unit_interval(where, bad):
    """A remote card or answer whose threshold is NaN, infinite or outside [0, 1] is refused with one line naming it.
    Before the fix a NaN or -inf threshold was accepted, and then every score counted as fired (or none)."""
    from forensicslab.detectors.remote import RemoteDetector, RemoteError
    card = {**CARD, "threshold": bad} if where == "card" else CARD
    answer = dict(protocol="1", detector="odd", version="1", score=0.7, fired=True)
    if where == "answer": answer.update(threshold=bad, fired=bool(0.7 > bad))   # consistent with the bad threshold
    # json.dumps writes NaN / Infinity / -Infinity, as a careless server would
    with _Served(card=card, answer=answer) as s:
        with pytest.raises(RemoteError, match=r"threshold .*not a number in \[0, 1\]") as e:
            RemoteDetector(s.url).detect(np.zeros((20, 30, 3), np.uint8))
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- defect 4: the retrieval cache and the index it used
def _two_indexes(tmp_path):
    "Two local indexes of the same photograph with different source pages, and the photograph's path."
    from PIL import Image
    from forensicslab.debate.retrieval import LocalIndex
    photo = tmp_path / "photo.png"; Image.fromarray(skdata.coffee()).save(photo)
    text = "The photograph shows a cup of coffee on a saucer, taken in a cafe in {} in the spring of 2019 by a staff photographer."
    paths = {}
    for name in ("A", "B"):
        ix = LocalIndex(); ix.add(photo, [{"url": f"https://example.org/{name}", "title": f"page {name}", "text": text.format(name)}])
        paths[name] = ix.save(tmp_path / f"idx{name}.json")
    return photo, paths

def test_retrieval_cache_is_keyed_on_the_index(tmp_path):
    """The same photograph looked up in index A then index B with one cache folder: B's pages come back, not A's.
    Before the fix the cache key named the backend ('local') but not the index, so B returned A's cached pages."""
    from forensicslab.debate.retrieval import make_retriever
    photo, idx = _two_indexes(tmp_path)
    a = make_retriever(f"local:{idx['A']}", cache_dir=tmp_path / "cache").retrieve(photo)
    b = make_retriever(f"local:{idx['B']}", cache_dir=tmp_path / "cache").retrieve(photo)
    assert [p.url for p in a.pages] == ["https://example.org/A"]
    assert [p.url for p in b.pages] == ["https://example.org/B"] and not b.cached
    again = make_retriever(f"local:{idx['B']}", cache_dir=tmp_path / "cache").retrieve(photo)
    assert again.cached and [p.url for p in again.pages] == ["https://example.org/B"]   # the cache still works
    # the same index rewritten in place with other pages is another index
    from forensicslab.debate.retrieval import LocalIndex
    ix = LocalIndex.load(idx["B"]); ix.entries[0]["pages"][0]["url"] = "https://example.org/B2"; ix.save(idx["B"])
    b2 = make_retriever(f"local:{idx['B']}", cache_dir=tmp_path / "cache").retrieve(photo)
    assert [p.url for p in b2.pages] == ["https://example.org/B2"] and not b2.cached

def test_debate_pair_cache_off_bypasses_the_retrieval_cache(tmp_path):
    """`forensicslab debate pair ... --retrieval local:idxB.json --cache off` after a run on idxA shows idxB's page and
    writes nothing to the retrieval cache (before the fix it showed idxA's page, read from the cache)."""
    import subprocess, sys, os
    photo, idx = _two_indexes(tmp_path)
    env = {**os.environ, "FORENSICSLAB_CACHE_DIR": str(tmp_path / "cache")}
    def run(index, *extra):
        exe = str(Path(sys.executable).parent / "forensicslab")
        r = subprocess.run([exe, "debate", "pair", str(photo), "A cup of coffee.",
                            "--retrieval", f"local:{index}", "--json", *extra], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode in (0, 1), r.stderr[-2000:]
        return json.loads(r.stdout)
    first = run(idx["A"])
    assert "https://example.org/A" in json.dumps(first["sources"])
    cached = sorted((tmp_path / "cache").rglob("retrieval/*.json"))
    assert cached                                                                # the rw run wrote its retrieval
    off = run(idx["B"], "--cache", "off")
    assert "https://example.org/B" in json.dumps(off["sources"]) and "example.org/A" not in json.dumps(off["sources"])
    assert sorted((tmp_path / "cache").rglob("retrieval/*.json")) == cached      # --cache off wrote nothing there

def test_debate_study_retriever_with_the_cache_off(tmp_path):
    "The debate study's retriever with the model cache off (`llm_rows` passes the models' cache mode) reads and writes no retrieval cache."
    from forensicslab.debate.study import study_retriever
    photo, idx = _two_indexes(tmp_path)
    r = study_retriever(f"local:{idx['A']}", None, tmp_path / "cache", use_cache=False)
    assert r.cache_dir is None and [p.url for p in r.retrieve(photo).pages] == ["https://example.org/A"]
    assert not (tmp_path / "cache").exists()
    on = study_retriever(f"local:{idx['A']}", None, tmp_path / "cache")
    on.retrieve(photo)
    assert on.retrieve(photo).cached
