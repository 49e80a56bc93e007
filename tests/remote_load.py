"""Load test of the detector server (issue 17): many concurrent clients against a server in its own process.

Used by tests/test_remote.py and runnable by hand against any checkout:
`python tests/remote_load.py` prints the server's peak memory growth, the answers and the wall time.
Loopback only; the request count and the wall time are bounded.
"""
import io
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

PROBE = '''
import numpy as np
from forensicslab.detectors.pool import card_from_dict, make_detection, register

@register("probe")
class Probe:
    "Load-test detector: reports the image size; its score is the mean brightness."
    card = card_from_dict(dict(id="probe", name="Load probe (test double)", version="1", scope=["splice"],
                               native_metric="mean", normalisation="identity", score_reading="mean brightness"))

    def detect(self, image):
        return make_detection(self.card, float(image.rgb[::16, ::16].mean()) / 255.0,
                              raw={"width": image.width, "height": image.height})
'''


def start_server(plugin_dir: Path, *args, env=None, pythonpath=None):
    "Start `python -m forensicslab.detectors.cli probe` in its own process; returns (process, url)."
    plugin_dir.mkdir(parents=True, exist_ok=True)
    (plugin_dir / "probe_det.py").write_text(PROBE)
    import os
    env = dict(os.environ if env is None else env)
    if pythonpath: env["PYTHONPATH"] = str(pythonpath)
    p = subprocess.Popen([sys.executable, "-m", "forensicslab.detectors.cli", "probe", "--plugin",
                          str(plugin_dir / "probe_det.py"), "--port", "0", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(plugin_dir))
    line = p.stdout.readline()
    if not line.startswith("serving"):
        p.kill()
        raise RuntimeError(f"server did not start: {line!r} {p.stderr.read()[-2000:]}")
    threading.Thread(target=p.stderr.read, daemon=True).start()  # drain the request log
    return p, line.split(" on ")[1].split()[0]


def rss_mb(pid: int) -> tuple[float, float]:
    "(current, peak) resident memory of a process in MB, from /proc."
    kv = dict(l.split(":", 1) for l in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in l)
    return int(kv["VmRSS"].split()[0]) / 1024, int(kv["VmHWM"].split()[0]) / 1024


def bomb_png(side: int = 4000) -> bytes:
    "A small PNG (tens of KB) that decodes to side x side x 3 bytes (48 MB for 4000)."
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (120, 130, 140)).save(buf, format="PNG")
    return buf.getvalue()


def small_jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (192, 256, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def run_load(url: str, n_requests: int = 72, clients: int = 24, bombs_every: int = 3, deadline_s: float = 240.0):
    "Send `n_requests` from `clients` threads (every `bombs_every`-th a 4000x4000 PNG); returns a summary dict."
    from forensicslab.detectors.remote import RemoteDetector
    bomb = bomb_png()
    jobs = [(i, bomb if i % bombs_every == 0 else small_jpeg(i)) for i in range(n_requests)]
    rd = RemoteDetector(url, timeout=deadline_s)
    t0 = time.perf_counter()

    def one(job):
        i, data = job
        try:
            d = rd.detect(data)
            want = 4000 if i % bombs_every == 0 else 256
            return "ok" if d.raw["width"] == want else f"wrong answer {d.raw}"
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    with ThreadPoolExecutor(clients) as ex:
        results = list(ex.map(one, jobs, timeout=deadline_s))
    return dict(requests=n_requests, ok=results.count("ok"), failures=[r for r in results if r != "ok"][:5],
                wall_s=round(time.perf_counter() - t0, 2), attempts=rd.attempts)


if __name__ == "__main__":
    import tempfile
    pp = sys.argv[1] if len(sys.argv) > 1 else None
    p, url = start_server(Path(tempfile.mkdtemp()), "--concurrency", "1", "--max-request-mb", "2", pythonpath=pp)
    try:
        base = rss_mb(p.pid)
        out = run_load(url)
        cur, peak = rss_mb(p.pid)
        print(json.dumps(dict(base_rss_mb=round(base[0], 1), peak_rss_mb=round(peak, 1),
                              growth_mb=round(peak - base[1], 1), **out), indent=1))
    finally:
        p.terminate()
        p.wait(10)
