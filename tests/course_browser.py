"Helpers for the course's browser checks: Debian's headless Chromium driven by playwright (no browser download)."
import shutil
import socket
import threading
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "tests" / "artifacts"
# the flags a closed network needs (no background connections, no sandbox as root), see the machine notes
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def chromium_path() -> str:
    "Debian's chromium, or skip with how to get it."
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe: pytest.skip("chromium not installed (bash scripts/ensure-chromium.sh installs Debian's package)")
    return exe


@contextmanager
def browser():
    "A playwright Chromium page on Debian's chromium binary."
    sync = pytest.importorskip("playwright.sync_api", reason="playwright is in the course extra: pip install -e '.[course]'")
    exe = chromium_path()
    with sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        try: yield b.new_page(viewport={"width": 1280, "height": 900})
        finally: b.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *a): pass


@contextmanager
def serve(folder: Path):
    "Serve `folder` on loopback; yields the base URL."
    srv = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(folder)))
    srv.handle_error = lambda request, address: None   # a browser closing a connection early is not an error here
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try: yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
