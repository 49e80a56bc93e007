"""Remote detectors over real loopback HTTP: a TruFor-style detector served by a separate process.

The served detector is a test double with TruFor's interface (integrity score + anomaly map, scope: local
edits); it computes a real, cheap map (local high-frequency energy) so maps survive the round trip intact.
"""
import base64
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from forensicslab.detectors import pool as D
from forensicslab.detectors import remote as R
from forensicslab.detectors.remote import PROTOCOL, RemoteDetector, RemoteError

TRUFOR_SIM = '''
import time
import numpy as np
from scipy import ndimage
from forensicslab.detectors.pool import card_from_dict, make_detection, register

@register("trufor")
class TruForSim:
    "Test double with TruFor's interface: integrity score in [0, 1] and an anomaly map."
    card = card_from_dict(dict(
        id="trufor", name="TruFor (simulated)", version="sim-1",
        scope=["gen_inpaint", "classic_inpaint", "splice"],
        attack_classes=["inpaint_diffusion", "inpaint_gan_traditional", "splice_copymove"],
        native_metric="integrity_score", normalisation="identity",
        score_reading="Higher means more likely tampered; threshold 0.5.",
        map_reading="Red = likely manipulated, blue = pristine."))

    def detect(self, image):
        if image.width == 17: time.sleep(5)          # lets the tests exercise client timeouts
        g = image.grey / 255.0
        hp = g - ndimage.uniform_filter(g, 5)
        e = ndimage.uniform_filter(hp * hp, 15)
        m = e / (e.max() + 1e-9)
        return make_detection(self.card, float(np.quantile(m, 0.99)), raw={"detection": float(m.mean())}, heatmap=m)
'''


def _start(cmd, env=None):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    if not line.startswith("serving"):
        p.kill(); raise RuntimeError(f"server did not start: {line!r} {p.stderr.read()[-2000:]}")
    return p, line.split(" on ")[1].split()[0]


@pytest.fixture(scope="module")
def trufor_server(tmp_path_factory):
    "The simulated TruFor served by `python -m forensicslab.detectors.cli` in its own process."
    d = tmp_path_factory.mktemp("plug")
    (d / "trufor_sim.py").write_text(TRUFOR_SIM)
    p, url = _start([sys.executable, "-m", "forensicslab.detectors.cli", "trufor", "--plugin", str(d / "trufor_sim.py"),
                     "--port", "0", "--max-request-mb", "2"])
    yield url
    p.terminate()
    try: p.wait(5)
    except subprocess.TimeoutExpired: p.kill()


@pytest.fixture(autouse=True)
def _keep_trufor():
    "Tests here serve a simulated TruFor under the paper adapter's name, then unregister it: the adapter, if imported, is put back."
    held = D._FACTORIES.get("trufor", None), "trufor" in D.OPT_IN
    yield
    if held[0] is not None and D._FACTORIES.get("trufor", None) is not held[0]:
        D.register("trufor", replace=True, opt_in=held[1])(held[0])


def photo_jpeg(path, w=256, h=192):
    rng = np.random.default_rng(1)
    a = np.clip(np.linspace(30, 220, w)[None, :, None] + rng.normal(0, 3, (h, w, 3)), 0, 255).astype(np.uint8)
    a[60:120, 80:160] = np.clip(a[60:120, 80:160] + rng.normal(0, 25, (60, 80, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(a).save(path, quality=92)
    return path


def test_card_health_and_detect(trufor_server, tmp_path):
    rd = RemoteDetector(trufor_server)
    assert rd.card.id == "trufor" and rd.card.has_map and rd.card.version == "sim-1"
    assert rd.health().protocol == PROTOCOL
    p = photo_jpeg(tmp_path / "x.jpg")
    d = rd.detect(p)
    assert d.status == "ok" and 0 <= d.score <= 1 and d.fired == (d.score > 0.5)
    assert set(d.raw) == {"integrity_score", "detection"}
    assert d.heatmap.shape == (192, 256) and d.heatmap.dtype == np.float32
    # the noisy rectangle is where the map is hot
    assert d.heatmap[70:110, 90:150].mean() > 3 * d.heatmap[:, :50].mean()


def test_remote_in_the_pool(trufor_server, tmp_path):
    R.register_remote("trufor", trufor_server)
    try:
        assert "trufor" in D.list_detectors()
        p = photo_jpeg(tmp_path / "y.jpg")
        res = D.run_pool(p, ["trufor"])
        assert res["trufor"].status == "ok" and res["trufor"].heatmap.shape == (192, 256)
        paths = D.write_panels(p, res, tmp_path / "panels")
        assert paths["trufor"].is_file()
        # the pool's timeout still applies to a remote detector
        tiny = np.full((17, 17, 3), 128, np.uint8)
        r = D.run_pool(tiny, ["trufor"], timeout=0.5)
        assert r["trufor"].status == "timeout"
    finally:
        D.unregister("trufor")


def test_client_timeout_and_request_limit(trufor_server):
    with pytest.raises(RemoteError, match="no answer within the timeout"):
        RemoteDetector(trufor_server, timeout=0.5).detect(np.full((17, 17, 3), 128, np.uint8))
    noise = np.random.default_rng(0).integers(0, 255, (1200, 1200, 3), dtype=np.uint8)  # ~4 MB PNG > 2 MB limit
    with pytest.raises(RemoteError, match="HTTP 413"):
        RemoteDetector(trufor_server).detect(noise)
    with pytest.raises(RemoteError, match="exceeds the request limit"):
        RemoteDetector(trufor_server, max_request_bytes=1000).detect(noise)


def test_server_rejects_bad_requests(trufor_server):
    r = httpx.post(trufor_server + "/v1/detect", json={"image": "***"})
    assert r.status_code == 400 and "base64" in r.json()["error"]
    r = httpx.post(trufor_server + "/v1/detect", json={"image": base64.b64encode(b"not an image").decode()})
    assert r.status_code == 400 and "image" in r.json()["error"]
    r = httpx.post(trufor_server + "/v1/detect", json={"img": "x"})
    assert r.status_code == 400 and "invalid request" in r.json()["error"]
    assert httpx.get(trufor_server + "/v2/card").status_code == 404


def test_cli_serve_detector_in_subprocess(tmp_path):
    "The `forensicslab serve-detector` console command serves a built-in-style detector from a plug-in module."
    (tmp_path / "trufor_sim.py").write_text(TRUFOR_SIM)
    exe = Path(sys.executable).parent / "forensicslab"
    if not exe.exists(): pytest.skip(f"console script not installed at {exe}")
    p, url = _start([str(exe), "serve-detector", "trufor", "--plugin", str(tmp_path / "trufor_sim.py"), "--port", "0"])
    try:
        d = RemoteDetector(url).detect(photo_jpeg(tmp_path / "z.jpg"))
        assert d.status == "ok" and d.heatmap.shape == (192, 256)
    finally:
        p.terminate(); p.wait(5)
    bad = subprocess.run([str(exe), "serve-detector", "nosuch", "--port", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "no detector named 'nosuch'" in bad.stderr
    # an opt-in detector (a paper adapter) is served by its name: without weights, the weights message, not "no detector"
    env = {**os.environ, "FORENSICSLAB_WEIGHTS_DIR": str(tmp_path / "no-weights")}
    opt_in = subprocess.run([str(exe), "serve-detector", "trufor", "--plugin", "forensicslab.detectors.paper.trufor", "--port", "0"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert opt_in.returncode != 0 and "trufor: weights not installed" in opt_in.stderr, opt_in.stderr[-500:]


class _Liar(BaseHTTPRequestHandler):
    "A server that answers outside the protocol (score out of range, wrong map size)."
    def log_message(self, *a): pass
    def _send(self, obj):
        b = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def do_GET(self):
        if self.path == "/v1/health": self._send(dict(status="ok", protocol="1", detector="liar", version="1"))
        else: self._send(dict(id="liar", name="Liar", scope=["splice"], native_metric="p", normalisation="identity",
                              score_reading="x", map_reading="y"))
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        from forensicslab.detectors.remote import encode_map
        mode = self.server.mode
        if mode == "score": self._send(dict(protocol="1", detector="liar", version="1", score=1.5, fired=True))
        elif mode == "map": self._send(dict(protocol="1", detector="liar", version="1", score=0.7, fired=True,
                                            map=encode_map(np.zeros((5, 5), np.float32))))
        else: self._send(dict(protocol="1", detector="liar", version="1", score=0.7, fired=True, extra_field=1))


@pytest.mark.parametrize("mode,msg", [("score", "score: Input should be less than or equal to 1"),
                                      ("map", "map is 5x5, the image is 30x20"),
                                      ("extra", "extra_field: Extra inputs are not permitted")])
def test_client_validates_answers(mode, msg):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Liar); srv.mode = mode
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        rd = RemoteDetector(f"http://127.0.0.1:{srv.server_address[1]}")
        with pytest.raises(RemoteError, match=msg):
            rd.detect(np.zeros((20, 30, 3), np.uint8))
    finally:
        srv.shutdown(); srv.server_close()


def test_unreachable_server_is_a_clear_error():
    with pytest.raises(RemoteError, match="cannot reach the detector server"):
        RemoteDetector("http://127.0.0.1:9", connect_timeout=1)
    with pytest.raises(RemoteError, match="cannot reach"):
        R.register_remote("nowhere", "http://127.0.0.1:9", connect_timeout=1)
    assert "nowhere" not in D.list_detectors()


def test_remote_from_environment_and_cli(trufor_server, tmp_path, monkeypatch):
    "Remote detectors join the pool from FORENSICSLAB_REMOTE_DETECTORS or `forensicslab detect --remote`."
    from typer.testing import CliRunner
    from forensicslab.cli import app
    p = photo_jpeg(tmp_path / "e.jpg")
    monkeypatch.setenv(R.REMOTE_ENV, f"trufor={trufor_server},down=http://127.0.0.1:9")
    try:
        D.discover(force=True)
        assert {"trufor", "down"} <= set(D.list_detectors())
        res = D.run_pool(p, ["trufor", "down"])
        assert res["trufor"].status == "ok"
        assert res["down"].status == "error" and "cannot reach" in res["down"].error
    finally:
        D.unregister("trufor"); D.unregister("down")
    monkeypatch.delenv(R.REMOTE_ENV)
    r = CliRunner().invoke(app, ["detect", str(p), "--remote", f"trufor={trufor_server}", "-d", "trufor"])
    try:
        assert r.exit_code == 0, r.output
        assert "trufor" in r.output and "integrity_score = " in r.output
    finally:
        D.unregister("trufor")
    r = CliRunner().invoke(app, ["detect", str(p), "--remote", "trufor"])
    assert r.exit_code == 2 and "name=http://host:port" in r.output


# ---- hardening (issue 17 item 1): bounded bodies, decoding inside the slot, backlog, idle timeout, retries ----
import socket

from remote_load import bomb_png, rss_mb, run_load, start_server


@pytest.fixture(scope="module")
def probe_server(tmp_path_factory):
    "A cheap detector served with tight limits in its own process: 2 MB bodies, 10 MP, 1 s idle timeout."
    p, url = start_server(tmp_path_factory.mktemp("probe"), "--concurrency", "1", "--max-request-mb", "2",
                          "--max-mpix", "10", "--idle-timeout", "1")
    yield p, url
    p.terminate()
    try: p.wait(5)
    except subprocess.TimeoutExpired: p.kill()


def _raw(url, head: bytes, body: bytes = b"", wait: float = 10.0) -> bytes:
    "Send raw bytes to the server and return what it answers before closing (or within `wait` seconds)."
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as s:
        s.sendall(head + body)
        out = b""
        try:
            while b"\r\n\r\n" not in out or len(out) < out.find(b"\r\n\r\n") + 4 + int(
                    (out.split(b"Content-Length: ")[1].split(b"\r\n")[0] if b"Content-Length: " in out else b"0")):
                chunk = s.recv(65536)
                if not chunk: break
                out += chunk
        except socket.timeout:
            pass
        return out


def _post_head(length: str | None, extra: str = "") -> bytes:
    cl = "" if length is None else f"Content-Length: {length}\r\n"
    return f"POST /v1/detect HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{cl}{extra}\r\n".encode()


@pytest.mark.parametrize("length,extra,code", [("-1", "", b"400"), (None, "", b"411"), ("12abc", "", b"400"),
                                               (None, "Transfer-Encoding: chunked\r\n", b"411"),
                                               (str(200 * 2**20), "", b"413")])
def test_declared_size_refused_before_reading(probe_server, length, extra, code):
    "Content-Length -1, missing, malformed, chunked or over the limit: answered at once, the body never read."
    _, url = probe_server
    t0 = time.perf_counter()
    out = _raw(url, _post_head(length, extra), b'{"image": "' + b"A" * 4096, wait=8)
    assert out.split(b"\r\n")[0].split()[1] == code, out[:200]
    assert time.perf_counter() - t0 < 8


def test_body_shorter_than_declared(probe_server):
    _, url = probe_server
    out = _raw(url, _post_head("1000"), b'{"image": "AAAA', wait=8)
    # the client stops sending: the idle timeout (1 s) closes the connection instead of holding the thread
    assert out == b"" or out.split()[1] in (b"400", b"408")


def test_idle_connection_is_closed(probe_server):
    "A half-open client (headers never finished) is disconnected after the idle timeout."
    _, url = probe_server
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/detect HTTP/1.1\r\nHost: x\r\n")
        t0 = time.perf_counter()
        assert s.recv(1024) == b""          # closed by the server, not by our 10 s timeout
        assert time.perf_counter() - t0 < 6


def test_pixel_cap_from_the_header(probe_server):
    "A 63 KB PNG of 4000x4000 pixels is refused with 413 by a server capped at 10 MP, before decoding."
    _, url = probe_server
    r = httpx.post(url + "/v1/detect", json={"image": base64.b64encode(bomb_png()).decode()}, timeout=30)
    assert r.status_code == 413 and "pixels exceeds the cap" in r.json()["error"]


class _Flaky(BaseHTTPRequestHandler):
    "A server whose first `resets` connections are reset (RST) and whose next `busy` answers are 503."
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def _send(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code); self.send_header("Content-Length", str(len(b)))
        if code == 503 and getattr(self.server, "retry_after", None): self.send_header("Retry-After", self.server.retry_after)
        self.end_headers(); self.wfile.write(b)
    def handle(self):
        srv = self.server
        with srv.lock:
            srv.seen += 1
            reset = srv.seen <= srv.resets
        if reset:
            import struct
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            return
        super().handle()
    def do_GET(self):
        if self.path == "/v1/health": self._send(200, dict(status="ok", protocol="1", detector="flaky", version="1"))
        else: self._send(200, dict(id="flaky", name="Flaky", scope=["splice"], native_metric="p", normalisation="identity",
                                   score_reading="x"))
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.busy -= 1
            busy = self.server.busy >= 0
        if busy: return self._send(503, {"error": "busy"})
        self._send(200, dict(protocol="1", detector="flaky", version="1", score=0.7, fired=True))


@pytest.mark.parametrize("resets,busy", [(2, 0), (0, 2)])
def test_client_retries_resets_and_busy(resets, busy):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    srv.lock, srv.seen, srv.resets, srv.busy = threading.Lock(), 0, resets, busy
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        rd = RemoteDetector(f"http://127.0.0.1:{srv.server_address[1]}", backoff_s=0.05)
        d = rd.detect(np.zeros((8, 8, 3), np.uint8))
        assert d.score == 0.7 and rd.attempts >= 4   # health + card + detect, plus the retried attempts
        srv.resets, srv.seen = 10, 0
        with pytest.raises(RemoteError, match="4 attempts"):
            RemoteDetector(f"http://127.0.0.1:{srv.server_address[1]}", backoff_s=0.01)
    finally:
        srv.shutdown(); srv.server_close()


def test_client_honours_retry_after_and_names_the_503():
    "Issue 25: one retry policy (net.RetryPolicy): a 503's Retry-After is the wait, and a lasting 503 is named with the attempts."
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    srv.lock, srv.seen, srv.resets, srv.busy, srv.retry_after = threading.Lock(), 0, 0, 1, "0.6"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        rd = RemoteDetector(f"http://127.0.0.1:{srv.server_address[1]}", backoff_s=0.01)
        t0 = time.perf_counter()
        assert rd.detect(np.zeros((8, 8, 3), np.uint8)).score == 0.7
        assert 0.6 <= time.perf_counter() - t0 < 3, "the server's Retry-After (0.6 s) is the wait, not the 0.01 s backoff"
        srv.busy, srv.retry_after = 10, None
        with pytest.raises(RemoteError, match=r"HTTP 503.*busy.*\(2 attempts\)"):
            RemoteDetector(f"http://127.0.0.1:{srv.server_address[1]}", backoff_s=0.01, retries=1).detect(np.zeros((8, 8, 3), np.uint8))
    finally:
        srv.shutdown(); srv.server_close()


def test_stalled_body_gets_408_within_the_idle_timeout(probe_server):
    "A client that declares 1000 bytes, sends 15 and goes silent is answered 408 and disconnected after the 1 s idle timeout."
    _, url = probe_server
    t0 = time.perf_counter()
    out = _raw(url, _post_head("1000"), b'{"image": "AAAA', wait=10)
    assert out.split(b"\r\n")[0].split()[1] == b"408", out[:200]
    assert b"connection: close" in out.lower() and time.perf_counter() - t0 < 6


def test_admission_and_slot_limits_hold_in_a_second_process(tmp_path):
    """--concurrency 1 --queue 0: while one detection holds the only slot, a second request waits the idle timeout
    (1 s) for admission and is refused with 503 and Retry-After; the first still gets its answer."""
    (tmp_path / "trufor_sim.py").write_text(TRUFOR_SIM)
    p, url = _start([sys.executable, "-m", "forensicslab.detectors.cli", "trufor", "--plugin", str(tmp_path / "trufor_sim.py"),
                     "--port", "0", "--concurrency", "1", "--queue", "0", "--idle-timeout", "1"])
    try:
        buf = __import__("io").BytesIO(); Image.fromarray(np.full((17, 17, 3), 128, np.uint8)).save(buf, format="PNG")
        slow = {"image": base64.b64encode(buf.getvalue()).decode()}        # 17 px wide: the detector sleeps 5 s
        first = {}
        th = threading.Thread(target=lambda: first.update(r=httpx.post(url + "/v1/detect", json=slow, timeout=30)))
        th.start(); time.sleep(0.5)
        t0 = time.perf_counter()
        r = httpx.post(url + "/v1/detect", json=slow, timeout=30)
        assert r.status_code == 503 and r.headers["Retry-After"] == "1" and "busy" in r.json()["error"]
        assert 0.9 <= time.perf_counter() - t0 < 4
        th.join(30)
        assert first["r"].status_code == 200 and first["r"].json()["detector"] == "trufor"
    finally:
        p.terminate(); p.wait(10)


def test_one_pooled_connection_per_endpoint(trufor_server, tmp_path):
    "Issue 25: a RemoteDetector reuses one keep-alive connection for all its calls, and close() releases it."
    img = photo_jpeg(tmp_path / "k.jpg")
    with RemoteDetector(trufor_server) as rd:
        for _ in range(4): assert rd.detect(img).status == "ok"
        assert rd.attempts == 6 and len(rd._client._transport._pool.connections) == 1
    assert rd._client.is_closed


def test_load_memory_bounded_and_nothing_lost(tmp_path):
    """48 requests from 24 concurrent clients (16 of them 4000x4000 PNGs of 63 KB, 48 MB decoded each) against
    a server with --concurrency 1 in its own process: every request answered correctly, and the server's
    peak memory grows by less than 600 MB (at most 1 + 4 bodies of 2 MB and one decoded image with the loader's
    copies; decoding before the slot, as before, grew it by about 3 GB)."""
    p, url = start_server(tmp_path, "--concurrency", "1", "--max-request-mb", "2")
    try:
        _, base_peak = rss_mb(p.pid)
        out = run_load(url, n_requests=48, clients=24, deadline_s=240)
        _, peak = rss_mb(p.pid)
    finally:
        p.terminate(); p.wait(10)
    assert out["ok"] == 48, out["failures"]
    assert peak - base_peak < 600, f"server peak RSS grew by {peak - base_peak:.0f} MB"


# ---- the field's detectors through the protocol (issue 14 item 4) ----
IMDL_PYTHON = Path(os.environ.get("FORENSICSLAB_IMDL_PYTHON", "/work/venvs/imdl/bin/python"))


@pytest.mark.slow
def test_imdl_trufor_through_the_protocol(tmp_path):
    """TruFor built by IMDL-BenCo (numpy<2, its own venv, random weights) served by `python -m
    forensicslab.detectors.cli` and called from the lab's environment (numpy 2)."""
    if not IMDL_PYTHON.is_file():
        pytest.skip(f"no IMDL-BenCo environment at {IMDL_PYTHON} (see nbs/04m_detectors.imdl.ipynb; FORENSICSLAB_IMDL_PYTHON)")
    env = dict(os.environ, FORENSICSLAB_IMDL_SIDE="256")
    env.pop(R.REMOTE_ENV, None)
    p = subprocess.Popen([str(IMDL_PYTHON), "-m", "forensicslab.detectors.cli", "trufor-imdlbenco", "--plugin",
                          "forensicslab.detectors.imdl", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, cwd=str(tmp_path))
    try:
        url, t0 = None, time.time()
        while url is None and time.time() - t0 < 300:
            line = p.stdout.readline()
            if not line: raise RuntimeError(f"server exited: {p.stderr.read()[-2000:]}")
            if line.startswith("serving"): url = line.split(" on ")[1].split()[0]
        threading.Thread(target=p.stderr.read, daemon=True).start()
        R.register_remote("trufor_imdl", url, timeout=300)
        try:
            card = D.get_card("trufor_imdl")
            assert card.id == "trufor_imdl" and card.version == "imdlbenco-random-init" and card.has_map
            jpg = photo_jpeg(tmp_path / "t.jpg")
            res = D.run_pool(jpg, ["trufor_imdl"], timeout=300)
            d = res["trufor_imdl"]
            assert d.status == "ok", d.error
            assert d.heatmap.shape == (192, 256) and 0 <= d.heatmap.min() <= d.heatmap.max() <= 1
            assert d.raw["random_weights"] is True and d.raw["working_size"] == [256, 192]
            assert d.raw["numpy"].startswith("1.") and np.__version__.startswith("2.")   # two environments
            again = D.get_detector("trufor_imdl").detect(jpg)
            assert again.score == d.score and np.array_equal(again.heatmap, d.heatmap)
        finally:
            D.unregister("trufor_imdl")
    finally:
        p.terminate()
        try: p.wait(10)
        except subprocess.TimeoutExpired: p.kill()


def test_remote_listed_and_carded_under_its_registered_name(trufor_server, tmp_path):
    "Issue 19 item 2: a remote registered as `mytrufor` is listed, carded and reported under that name."
    R.register_remote("mytrufor", trufor_server)
    try:
        assert D.get_card("mytrufor").id == "mytrufor"
        assert D.pool_table(["mytrufor"])[0]["id"] == "mytrufor"
        res = D.run_pool(photo_jpeg(tmp_path / "n.jpg"), ["mytrufor"])
        assert res["mytrufor"].status == "ok" and res["mytrufor"].detector == "mytrufor"
        assert D.get_detector("mytrufor").served_id == "trufor"     # answers still checked against the served id
    finally:
        D.unregister("mytrufor")


# ---- real deadlines and bounded servers (issue 32 item 3), bounded and on 127.0.0.1 only ----
def _trickler(url, declared=1000, every=1.0, n=8, out=None):
    "A client that declares `declared` body bytes and sends one every `every` s (at most `n`), then reads the answer."
    host, port = url.split("//")[1].split(":")
    t0 = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=15) as s:
        s.sendall(_post_head(str(declared)))
        ans = b""
        try:
            for _ in range(n):
                s.sendall(b"A")
                s.settimeout(every)
                try:
                    ans = s.recv(4096)
                    if ans: break
                except socket.timeout: pass
            s.settimeout(10)
            ans = ans or s.recv(4096)
        except OSError: pass
    if out is not None: out.append((ans.split(b"\r\n")[0], time.perf_counter() - t0))
    return ans


def _png_body(side=32):
    buf = __import__("io").BytesIO()
    Image.fromarray(np.full((side, side, 3), 90, np.uint8)).save(buf, format="PNG")
    return {"image": base64.b64encode(buf.getvalue()).decode()}


def test_five_slow_clients_do_not_starve_real_requests(tmp_path):
    """Issue 32 item 4's attack replayed: five clients each trickle a body one byte a second into a server with one
    slot and a queue of four. Real requests are still answered at once, health stays ok, and each trickler gets 408
    when its body's total deadline (3 s) runs out; before the fix they held every slot and real requests got 503."""
    p, url = start_server(tmp_path, "--concurrency", "1", "--queue", "4", "--idle-timeout", "5", "--body-timeout", "3")
    try:
        slow = []
        threads = [threading.Thread(target=_trickler, args=(url,), kwargs=dict(out=slow)) for _ in range(5)]
        for t in threads: t.start()
        time.sleep(1.0)
        h = httpx.get(url + "/v1/health", timeout=5)
        assert h.status_code == 200 and h.json()["reading"] == 5 and h.json()["status"] == "ok", h.text
        t0 = time.perf_counter()
        for _ in range(3):
            r = httpx.post(url + "/v1/detect", json=_png_body(), timeout=10)
            assert r.status_code == 200, r.text
        assert time.perf_counter() - t0 < 5
        for t in threads: t.join(20)
        assert len(slow) == 5 and all(code.split()[1:2] == [b"408"] and 2.5 < dt < 7 for code, dt in slow), slow
    finally:
        p.terminate(); p.wait(10)


def test_health_reports_saturation_and_connections_are_capped(tmp_path):
    "With 2 readers both held by tricklers, health answers 503 'saturated'; with 6 connections capped at 4, uvicorn answers 503."
    p, url = start_server(tmp_path, "--readers", "2", "--idle-timeout", "5", "--body-timeout", "3", "--max-connections", "4")
    try:
        slow = []
        threads = [threading.Thread(target=_trickler, args=(url,), kwargs=dict(out=slow)) for _ in range(2)]
        for t in threads: t.start()
        time.sleep(1.0)
        h = httpx.get(url + "/v1/health", timeout=5)
        assert h.status_code == 503 and h.json()["status"] == "saturated" and h.json()["reading"] == 2, h.text
        for t in threads: t.join(20)
        h = httpx.get(url + "/v1/health", timeout=5)
        assert h.status_code == 200 and h.json()["status"] == "ok" and h.json()["reading"] == 0
        host, port = url.split("//")[1].split(":")
        held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(4)]
        try:
            for s in held: s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")   # headers never finished
            time.sleep(0.5)
            assert httpx.get(url + "/v1/health", timeout=5).status_code == 503
        finally:
            for s in held: s.close()
        time.sleep(0.5)
        assert httpx.get(url + "/v1/health", timeout=5).status_code == 200
    finally:
        p.terminate(); p.wait(10)


class _Trickle(BaseHTTPRequestHandler):
    "A server that answers every request with a valid header and then one body byte every 0.5 s."
    def log_message(self, *a): pass
    def do_GET(self):
        body = json.dumps(dict(status="ok", protocol="1", detector="slow", version="1")).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers()
        try:
            for b in body:
                self.wfile.write(bytes([b])); self.wfile.flush(); time.sleep(0.5)
        except OSError: pass


def test_client_total_deadline_against_a_trickling_server():
    "A reply trickled a byte every 0.5 s (about 30 s in all) is cut at the client's 2 s total deadline, not read to the end."
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        t0 = time.perf_counter()
        with pytest.raises(RemoteError, match="no answer within the timeout"):
            RemoteDetector(f"http://127.0.0.1:{srv.server_address[1]}", timeout=2)
        assert time.perf_counter() - t0 < 4
    finally:
        srv.shutdown(); srv.server_close()


def test_remote_card_declares_its_working_size(tmp_path):
    "A served detector with max_side None (full resolution) declares it on its card; the pool then sends the full image."
    plug = tmp_path / "full_res.py"
    plug.write_text(TRUFOR_SIM.replace('@register("trufor")', '@register("fullres")').replace('id="trufor"', 'id="fullres"')
                    .replace("    def detect(self, image):", "    max_side = None\n\n    def detect(self, image):\n        self.seen = image.size", 1))
    p, url = _start([sys.executable, "-m", "forensicslab.detectors.cli", "fullres", "--plugin", str(plug), "--port", "0"])
    try:
        rd = RemoteDetector(url)
        assert rd.max_side is None and D._detector_max_side(rd, D.DEFAULT_MAX_SIDE) is None
        assert httpx.get(url + "/v1/card").json()["max_side"] is None
    finally:
        p.terminate(); p.wait(10)
