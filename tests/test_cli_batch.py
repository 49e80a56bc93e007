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
    def marker(seed):   # cell folders: a readable prefix and a hash of every parameter
        got = list((tmp_path / "out").glob(f"tiny__seed={seed}--*/cell.json"))
        return got[0] if got else None
    deadline = time.time() + 180
    while time.time() < deadline and marker(0) is None:
        time.sleep(0.1)
    assert marker(0), p.stdout.read().decode() if p.poll() is not None else "first cell never finished"
    time.sleep(1.0)                                      # the second cell's kernel is running now
    os.killpg(p.pid, signal.SIGKILL)                     # kill the batch and its kernel, mid second cell
    p.wait()
    assert marker(1) is None
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = log.read_text().split()
    assert runs.count("0") == 1, f"the finished cell ran again: {runs}"
    assert runs[-1] == "1"
    cells = json.loads(marker(1).read_text())
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


def _backbone_study(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('quick = True\nout_dir = ""\nbackbone = ""\nseed = 0')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_batch_long_backbones_sharing_a_prefix_are_two_cells(tmp_path):
    """Issue 32 item 3: two backbone names sharing their first 40 characters landed in one folder, the second never
    ran, the summary held the first row twice and the batch said "2 of 2 cells done". Now: two folders, two runs,
    one summary row each; a re-run runs nothing, and a changed shared parameter runs both again."""
    from forensicslab.studies import run_batch
    study = _backbone_study(tmp_path / "tiny.ipynb")
    long = "openai-compatible:http://127.0.0.1:8000/v1#qwen2.5-vl-instruct-"
    ran = []
    def runner(study, params, out_dir, kernel, progress):
        ran.append(params["backbone"])
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        Path(out_dir, "t.csv").write_text(f"model,acc,backbone\n{params['backbone'][-3:]},{len(params['backbone'])},x\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"study: {study}\nout: {tmp_path / 'out'}\nparams: {{seed: 0}}\n"
                    f"grid:\n  backbone: ['{long}7b', '{long}72b']\nsummary: t.csv\n")
    r = run_batch(grid, progress=False, runner=runner)
    assert ran == [long + "7b", long + "72b"]
    folders = sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir())
    assert len(folders) == 2 and folders[0].split("--")[0] == folders[1].split("--")[0]   # same readable prefix
    assert sorted(r["summary"]["model"]) == ["-7b", "72b"]
    assert len(r["summary"]) == 2 and r["summary"]["acc"].nunique() == 2
    assert list(r["summary"].columns) == ["grid_backbone", "model", "acc", "backbone"]   # a table column keeps its name
    run_batch(grid, progress=False, runner=runner)
    assert len(ran) == 2                                                                  # both finished: nothing re-runs
    grid.write_text(grid.read_text().replace("seed: 0", "seed: 1"))
    run_batch(grid, progress=False, runner=runner)
    assert len(ran) == 4                                                                  # a changed parameter is a new cell


@pytest.mark.parametrize("text,key", [("parms: {seed: 1}\ngrid: {seed: [0]}\n", "parms"),
                                      ("gird:\n  seed: [0, 1]\n", "gird")])
def test_batch_refuses_misspelt_grid_keys_in_one_line(tmp_path, capsys, text, key):
    "Issue 32 item 10: `parms:` and `gird:` were ignored and a cell ran with defaults, exit 0."
    from forensicslab import cli
    study = _backbone_study(tmp_path / "tiny.ipynb")
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"study: {study}\nout: {tmp_path / 'out'}\n" + text)
    with pytest.raises(SystemExit) as e: cli.main(["batch", str(grid), "--no-progress"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and f"unknown key '{key}'" in err, err
    assert not (tmp_path / "out").exists()


def test_batch_summary_never_counts_a_cell_twice(tmp_path):
    from forensicslab.studies import StudyError, _stack_summary
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "t.csv").write_text("acc\n0.5\n")
    rec = {"folder": "c", "status": "ok", "grid": {"seed": 0}}
    assert len(_stack_summary([rec], "t.csv", tmp_path)) == 1
    with pytest.raises(StudyError, match="listed twice"): _stack_summary([rec, dict(rec)], "t.csv", tmp_path)


def test_example_grid_for_table4_names_three_backbones():
    from forensicslab.studies import check_parameters, grid_cells, load_grid
    g = load_grid(REPO / "grids" / "triage_table4_backbones.yaml")
    cells = grid_cells(g)
    assert len(cells) == 3 and len({c[2]["backbone"] for c in cells}) == 3
    for study, _, params in cells: check_parameters(study, params)


def _study(path: Path, body: str) -> Path:
    "A throwaway study notebook: a parameters cell, then `body`."
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('quick = True\nout_dir = ""')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_reproduce_goes_on_after_a_failure_keeps_old_outputs_and_summarises(tmp_path):
    "Issue 24: a failing study leaves its folder byte-identical (attempt kept in .failed/), the next study runs, exit 1."
    from typer.testing import CliRunner
    from forensicslab.cli import app
    bad = _study(tmp_path / "broken.ipynb", "from pathlib import Path\nPath(out_dir, 'table.csv').write_text('half\\n')\n"
                                            "raise RuntimeError('the data went away')")
    good = _study(tmp_path / "fine.ipynb", "from pathlib import Path\nfrom forensicslab.runs import part_skipped\n"
                                           "Path(out_dir, 'table.csv').write_text('acc\\n0.9\\n')\n"
                                           "part_skipped(out_dir, 'table_real', 'no real data on this machine')")
    out = tmp_path / "outputs"
    old = out / "broken"
    old.mkdir(parents=True)
    (old / "table.csv").write_text("acc\n0.7\n")
    (old / "broken.ipynb").write_text("{}")
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    (out / "fine").mkdir()
    (out / "fine" / "table_real.csv").write_text("committed real rows\n")
    res = CliRunner().invoke(app, ["reproduce", "--only", str(bad), "--only", str(good), "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before            # not half-overwritten
    failed = out / ".failed" / "broken"
    assert (failed / "table.csv").read_text() == "half\n" and json.loads((failed / "run.json").read_text())["status"] == "failed"
    assert (out / "fine" / "table.csv").read_text() == "acc\n0.9\n"           # the study after the failure ran
    assert (out / "fine" / "table_real.csv").read_text() == "committed real rows\n"   # a skipped part keeps its files
    rec = json.loads((out / "fine" / "run.json").read_text())
    assert rec["status"] == "ok" and rec["parts"]["table_real"]["kept"] == ["table_real.csv"] and rec["packages"]
    lines = res.output.splitlines()
    head = next(i for i, l in enumerate(lines) if l.split()[:4] == ["study", "status", "seconds", "reason"])
    rows = {l.split()[0]: l.split() for l in lines[head + 1:head + 3]}
    assert rows["broken"][1] == "failed" and "RuntimeError: the data went away" in " ".join(rows["broken"])
    assert rows["fine"][1] == "ok" and "skipped table_real: no real data on this machine" in " ".join(rows["fine"])
    assert not list(out.glob(".*.running"))


def test_batch_summary_is_numeric_and_cell_folders_relative(tmp_path):
    "Issue 24: a table of display strings ('86.7 [81.1, 92.0]', '-') stacks into numbers; cell.json names its folder relatively."
    import pandas as pd
    from forensicslab.studies import run_batch
    study = tiny_study(tmp_path / "tiny.ipynb")
    def runner(study, params, out_dir, kernel, progress):
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        Path(out_dir, "t.csv").write_text(f'config,acc,paper\nfusion,"8{params["seed"]}.5 [80.0, 90.0]",-\n')
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"study: {study}\nout: {tmp_path / 'out'}\ngrid:\n  seed: [0, 1]\nsummary: t.csv\n")
    r = run_batch(grid, progress=False, runner=runner)
    s = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert list(s.columns) == ["seed", "config", "acc", "acc_lo", "acc_hi", "paper"]
    assert s.seed.tolist() == [0, 1] and s.acc.tolist() == [80.5, 81.5] and s.acc_hi.tolist() == [90.0, 90.0]
    assert s.paper.isna().all() and r["summary"].acc.dtype.kind == "f"
    folder = r["cells"][1]["folder"]
    assert folder.startswith("tiny__seed=1--") and json.loads((tmp_path / "out" / folder / "cell.json").read_text())["folder"] == folder


def test_study_written_aside_still_resumes_its_runs(tmp_path):
    "A study runs in a staged folder, yet finished runs are reused: a re-run starts from the last runs/, a killed attempt resumes."
    from forensicslab.studies import run_study
    # the study counts how often it ran, in the resumable part of its folder (runs/), and writes a table from it
    study = _study(tmp_path / "counting.ipynb", "from pathlib import Path\nr = Path(out_dir, 'runs'); r.mkdir(exist_ok=True)\n"
                                                "n = int((r / 'n').read_text()) if (r / 'n').exists() else 0\n"
                                                "(r / 'n').write_text(str(n + 1)); Path(out_dir, 'table.csv').write_text(f'n\\n{n + 1}\\n')")
    out = tmp_path / "outputs" / "counting"
    run_study(study, {"quick": True}, out_dir=out, progress=False)
    run_study(study, {"quick": True}, out_dir=out, progress=False)
    assert (out / "runs" / "n").read_text() == "2"                       # the second run started from the first one's runs
    assert not (out / ".parameters.json").exists() and not list(out.parent.glob(".*.running"))
    # what kill -9 leaves: a staged folder marked with the same parameters; the next attempt continues it
    stage = out.with_name(".counting.running")
    from forensicslab.studies import _open_stage, study_defaults
    record = {**study_defaults(study), "quick": True}
    record.pop("out_dir")                                                 # as run_study records it
    _open_stage(stage, out, record)
    (stage / "runs" / "n").write_text("7")                                # the killed attempt had got further
    run_study(study, {"quick": True}, out_dir=out, progress=False)
    assert (out / "runs" / "n").read_text() == "8"
    # a killed attempt with other parameters is not continued: the next one starts from the finished runs
    _open_stage(stage, out, {**record, "quick": False})
    (stage / "runs" / "n").write_text("100")
    run_study(study, {"quick": True}, out_dir=out, progress=False)
    assert (out / "runs" / "n").read_text() == "9"
