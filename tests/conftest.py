"Shared pytest options: slow checks are opt-in and every skip prints its reason (-ra)."
import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Tests never write into the checkout: every cache of the session (detections, chat replies, debate embeddings,
# retrieval) goes to one temporary folder, removed at exit. A test that needs its own sets the variable itself.
_SESSION_CACHE = tempfile.TemporaryDirectory(prefix="forensicslab-test-cache-")
os.environ["FORENSICSLAB_CACHE_DIR"] = _SESSION_CACHE.name

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def run_quick_study(nb: str, tmp_path: Path, **params) -> Path:
    "Execute study notebook `nb` (nbs/studies) in its quick configuration with `params` into `tmp_path/out`; returns that folder."
    pm = pytest.importorskip("papermill")
    studies, out = REPO / "nbs" / "studies", tmp_path / "out"
    pm.execute_notebook(str(studies / f"{nb}.ipynb"), str(tmp_path / f"{nb}.ipynb"), cwd=str(studies), progress_bar=False,
                        kernel_name="python3", language="python", parameters={"quick": True, "out_dir": str(out), **params})
    return out


def pytest_runtest_logstart(nodeid, location):
    "The test now running, in `.pytest_cache/current-test`: when the run dies of a signal, `make test` names it."
    d = REPO / ".pytest_cache"
    d.mkdir(exist_ok=True)
    (d / "current-test").write_text(nodeid + "\n")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (make test-slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
    gpu = pytest.mark.skip(reason="needs a CUDA device")
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if not has_cuda:
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(gpu)


@pytest.fixture
def shared_data():
    "The real forensic test data beside the checkout (`../shared/data`), or skip with the reason."
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real test data not present at {SHARED_DATA} (only in the developers' workspace)")
    return SHARED_DATA


def _outputs_state() -> dict[str, tuple[int, int]]:
    "Size and modification time of every file of the reference outputs (and of the folders' names), to detect writes."
    root = REPO / "outputs"
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()} \
        if root.is_dir() else {}


@pytest.fixture(scope="session", autouse=True)
def reference_outputs_untouched():
    "No test may write, replace or delete anything under the checkout's outputs/ (the committed reference runs)."
    before = _outputs_state()
    yield
    after = _outputs_state()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"tests changed the reference outputs: {changed[:10]}{' ...' if len(changed) > 10 else ''}"
