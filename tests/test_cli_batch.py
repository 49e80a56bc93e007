"`forensicslab batch`: a two-cell grid of real papermill runs, killed after the first cell and resumed without redoing it."
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]


def tiny_study(path: Path) -> Path:
    "A papermill notebook with a parameters cell that logs each execution, sleeps, and writes one table."
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('quick = True\nout_dir = ""\nseed = 0\nlog = ""\ndelay = 0.0')
    params.metadata["tags"] = ["parameters"]
    body = nbformat.v4.new_code_cell(
        "import time, pathlib\n"
        "with open(log, 'a') as f: f.write(f'{seed}\\n')\n"
        "time.sleep(delay)\n"
        "pathlib.Path(out_dir, 'table.csv').write_text(f'metric,value\\nacc,{0.5 + seed / 10}\\n')")
    nb.cells = [params, body]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_batch_two_cells_resume_after_kill(tmp_path):
    study = tiny_study(tmp_path / "tiny.ipynb")
    log = tmp_path / "executions.log"
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"study: {study}\nout: {tmp_path / 'out'}\nparams: {{quick: true, log: '{log}', delay: 2.5}}\n"
                    f"grid:\n  seed: [0, 1]\nsummary: table.csv\n")
    exe = Path(sys.executable).parent / "forensicslab"
    if not exe.exists(): pytest.skip("console script not installed (pip install -e . creates it)")
    cmd = [str(exe), "batch", str(grid), "--no-progress"]
    p = subprocess.Popen(cmd, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    first = tmp_path / "out" / "tiny__seed=0" / "cell.json"
    deadline = time.time() + 180
    while time.time() < deadline and not first.exists():
        time.sleep(0.1)
    assert first.exists(), p.stdout.read().decode() if p.poll() is not None else "first cell never finished"
    time.sleep(1.0)                                      # the second cell's kernel is running now
    os.killpg(p.pid, signal.SIGKILL)                     # kill the batch and its kernel, mid second cell
    p.wait()
    assert not (tmp_path / "out" / "tiny__seed=1" / "cell.json").exists()
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = log.read_text().split()
    assert runs.count("0") == 1, f"the finished cell ran again: {runs}"
    assert runs[-1] == "1"
    cells = json.loads((tmp_path / "out" / "tiny__seed=1" / "cell.json").read_text())
    assert cells["status"] == "ok" and cells["cost_usd"] == 0.0
    summary = (tmp_path / "out" / "summary.csv").read_text().splitlines()
    assert summary == ["seed,metric,value", "0,acc,0.5", "1,acc,0.6"], summary
    assert "2 of 2 cells done; total cost $0.0000" in r.stdout, r.stdout


def test_batch_refuses_unknown_parameter(tmp_path):
    study = tiny_study(tmp_path / "tiny.ipynb")
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"study: {study}\nout: {tmp_path / 'out'}\ngrid:\n  sed: [0, 1]\n")
    from forensicslab.studies import StudyError, run_batch
    with pytest.raises(StudyError, match="has no parameter 'sed'"):
        run_batch(grid, progress=False)


def test_example_grid_for_table4_names_three_backbones():
    from forensicslab.studies import check_parameters, grid_cells, load_grid
    g = load_grid(REPO / "grids" / "triage_table4_backbones.yaml")
    cells = grid_cells(g)
    assert len(cells) == 3 and len({c[2]["backbone"] for c in cells}) == 3
    for study, _, params in cells: check_parameters(study, params)
