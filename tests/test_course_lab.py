"`make lab`: JupyterLab starts headless on loopback, the course index renders in Chromium (screenshot kept), the server stops."
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from course_browser import ARTIFACTS, REPO, browser, chromium_path, free_port

pytestmark = pytest.mark.slow


def _wait_ready(url: str, proc, timeout: float = 120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None: raise AssertionError(f"jupyter lab exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r: return json.loads(r.read())
        except OSError: time.sleep(0.5)
    raise AssertionError(f"jupyter lab not ready after {timeout} s")


def test_lab_opens_the_course_index(tmp_path):
    pytest.importorskip("jupyterlab", reason="JupyterLab is in the course extra: pip install -e '.[course]'")
    chromium_path()
    port, token = free_port(), secrets.token_hex(16)
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "lab.py"), "--no-browser", "--ServerApp.ip=127.0.0.1",
                             f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
                             "--ServerApp.port_retries=0"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        status = _wait_ready(f"{base}/api/status?token={token}", proc)
        assert "started" in status
        kernels = _wait_ready(f"{base}/api/kernelspecs?token={token}", proc)
        assert "python3" in kernels["kernelspecs"], kernels
        with browser() as page:
            page.goto(f"{base}/lab/tree/nbs/index.ipynb?token={token}", wait_until="domcontentloaded", timeout=120_000)
            title = page.locator(".jp-NotebookPanel .jp-RenderedMarkdown h1").first
            title.wait_for(timeout=120_000)
            assert "forensicslab" in title.inner_text()
            parts = page.locator(".jp-NotebookPanel .jp-RenderedMarkdown h3").all_inner_texts()
            assert any("Part 1: the spine" in p for p in parts) or page.get_by_text("Part 1: the spine").count(), parts
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shot = ARTIFACTS / "lab_index.png"
            page.screenshot(path=str(shot))
            assert shot.stat().st_size > 10_000
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try: proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
    assert proc.returncode is not None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
