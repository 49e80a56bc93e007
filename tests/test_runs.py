"Resumable runs: kill -9 mid-run and resume, executors, manifest."
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from forensicslab.runs import Case, Run

REPO_ROOT = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent("""
    import sys, time
    from forensicslab.runs import Run, Case
    def work(i):
        time.sleep(0.05)
        return {"value": i * i, "label": "even" if i % 2 == 0 else "odd"}
    run = Run(sys.argv[1], config={"study": "kill-test"}, seed=7)
    run.execute([Case(f"case-{i:03d}", i) for i in range(int(sys.argv[2]))], work, workers=4, progress=False)
""")


def _table(rows):
    return sorted((r["key"], r["value"], r["label"]) for r in rows)


def test_kill_9_midway_then_resume(tmp_path):
    n = 120
    script = tmp_path / "worker.py"; script.write_text(WORKER)
    run_dir = tmp_path / "run"
    p = subprocess.Popen([sys.executable, str(script), str(run_dir), str(n)])
    rows_file = run_dir / "rows.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline:   # wait until some, but not all, rows are written
        if rows_file.exists() and 20 < len(rows_file.read_text().splitlines()) < n - 20: break
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL); p.wait()
    written_before = len(rows_file.read_text().splitlines())
    assert 0 < written_before < n, "the kill should land mid-run"
    # a crash in the middle of a write leaves a torn last line: simulate the worst case too
    with open(rows_file, "a") as f: f.write('{"key": "case-999", "val')
    subprocess.run([sys.executable, str(script), str(run_dir), str(n)], check=True, timeout=120)
    lines = [json.loads(l) for l in rows_file.read_text().splitlines()]
    keys = [r["key"] for r in lines]
    assert len(keys) == len(set(keys)) == n, "no duplicate rows, no lost rows"
    ref_dir = tmp_path / "ref"
    subprocess.run([sys.executable, str(script), str(ref_dir), str(n)], check=True, timeout=120)
    assert _table(Run(run_dir, config={"study": "kill-test"}, seed=7).rows()) == _table(Run(ref_dir, config={"study": "kill-test"}, seed=7).rows())


def _cube(x):
    return {"y": x ** 3}


def test_process_executor(tmp_path):
    rows = Run(tmp_path).execute([Case(str(i), i) for i in range(6)], _cube, workers=2, executor="process", progress=False)
    assert [r["y"] for r in rows] == [i ** 3 for i in range(6)]


def test_ray_executor_on_local_instance(tmp_path):
    """A local Ray instance runs the cases, in a second process: Ray's threads, its object-store mapping and its
    child processes never enter the test session's own process."""
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'forensicslab[ray]'")
    code = textwrap.dedent(f"""
        import json, ray
        from forensicslab.runs import Case, Run
        try:   # Ray workers import the case function by reference: use one they can import (`dict`)
            rows = Run({str(tmp_path)!r}).execute([Case(str(i), [("y", i ** 3)]) for i in range(5)], dict, workers=2,
                                                 executor="ray", progress=False)
        finally: ray.shutdown()
        print(json.dumps([r["y"] for r in rows]))""")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [i ** 3 for i in range(5)]


def test_manifest_records_provenance(tmp_path):
    Run(tmp_path, config={"a": 1}, seed=3, backends={"judge": "openai:gpt-5"})
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["seed"] == 3 and m["backends"]["judge"] == "openai:gpt-5"
    assert "numpy" in m["packages"] and m["python"].startswith("3.")


def test_unknown_executor(tmp_path):
    with pytest.raises(ValueError, match="unknown executor"):
        Run(tmp_path).execute([Case("a", 1)], _cube, workers=2, executor="dask", progress=False)


LOCK_WORKER = textwrap.dedent("""
    import json, os, sys, time
    from forensicslab.runs import Run, Case, RunBusy, RunConfigMismatch
    folder, cfg, n, wait = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    log = os.path.join(os.path.dirname(folder), "computed.log")
    def work(i):
        with open(log, "a") as f: f.write(f"{cfg} {i}\\n")
        time.sleep(0.05)
        return {"cfg": cfg}
    try:
        Run(folder, config={"cfg": cfg}, lock_timeout=wait).execute([Case(f"c{i:03d}", i) for i in range(n)], work,
                                                                    workers=1, progress=False)
    except (RunBusy, RunConfigMismatch) as e:
        print(type(e).__name__, e); sys.exit(3)
""")


def _start(script, folder, cfg, n, wait=0.0):
    return subprocess.Popen([sys.executable, str(script), str(folder), cfg, str(n), str(wait)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_rows(rows_file, k, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if rows_file.exists() and len(rows_file.read_text().splitlines()) >= k: return
        time.sleep(0.02)
    raise AssertionError(f"{rows_file} never reached {k} rows")


def test_second_writer_same_config_is_refused_then_waits(tmp_path):
    "Issue 17 item 5: a second process on a busy run folder refuses (naming the holder) or waits; no case runs twice."
    script = tmp_path / "w.py"; script.write_text(LOCK_WORKER)
    folder, n = tmp_path / "run", 40
    a = _start(script, folder, "A", n)
    _wait_rows(folder / "rows.jsonl", 2)
    b = _start(script, folder, "A", n)
    out, err = b.communicate(timeout=60)
    assert b.returncode == 3, (out, err)
    assert "RunBusy" in out and f"pid {a.pid}" in out, out
    c = _start(script, folder, "A", n, wait=120)   # this one waits for the lock, then finds nothing left to do
    assert a.wait(timeout=120) == 0, a.stderr.read()
    out, err = c.communicate(timeout=120)
    assert c.returncode == 0, (out, err)
    computed = (tmp_path / "computed.log").read_text().split("\n")[:-1]
    assert len(computed) == len(set(computed)) == n, "every case computed exactly once"
    keys = [json.loads(l)["key"] for l in (folder / "rows.jsonl").read_text().splitlines()]
    assert len(keys) == len(set(keys)) == n


def test_two_configs_racing_on_a_fresh_folder_never_mix(tmp_path):
    "Two processes with different configurations start together on a fresh folder: only one writes rows."
    script = tmp_path / "w.py"; script.write_text(LOCK_WORKER)
    for trial in range(3):
        folder = tmp_path / f"run{trial}"
        ps = [_start(script, folder, cfg, 10) for cfg in ("A", "B")]
        codes = sorted(p.wait(timeout=120) for p in ps)
        assert codes == [0, 3], [p.stdout.read() + p.stderr.read() for p in ps]
        m = json.loads((folder / "manifest.json").read_text())["config"]["cfg"]
        cfgs = {json.loads(l)["cfg"] for l in (folder / "rows.jsonl").read_text().splitlines()}
        assert cfgs == {m}, f"rows of {cfgs} under a manifest of {m}"


def test_cache_dir_is_the_user_cache_never_a_checkout(tmp_path, monkeypatch):
    "Issue 24: every cache goes to the user cache folder (or $FORENSICSLAB_CACHE_DIR), inside a checkout or not."
    from forensicslab.runs import cache_dir, user_cache_dir
    repo = REPO_ROOT
    monkeypatch.delenv("FORENSICSLAB_CACHE_DIR", raising=False)
    for where in (tmp_path, repo):
        monkeypatch.chdir(where)
        assert cache_dir("detections") == user_cache_dir() / "detections"
        assert not cache_dir("detections").is_relative_to(where)
    monkeypatch.setenv("FORENSICSLAB_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir("chat", "x.sqlite") == tmp_path / "c" / "chat" / "x.sqlite"


def test_session_cache_is_outside_the_checkout():
    "conftest points FORENSICSLAB_CACHE_DIR at a temporary folder: no test writes a cache into the checkout."
    import os
    from forensicslab.runs import cache_dir
    repo = REPO_ROOT
    assert os.environ.get("FORENSICSLAB_CACHE_DIR") and not cache_dir("debate").resolve().is_relative_to(repo)


def test_run_record_holds_provenance_and_parts(tmp_path):
    "Issue 24: run.json (one writer, runs.write_run_record) and a skipped part that keeps its earlier files."
    from forensicslab.runs import part_skipped, part_written, read_run_record, write_run_record
    (tmp_path / "t_real.csv").write_text("committed rows\n")
    part_skipped(tmp_path, "t_real", "no real data", log=lambda m: None)
    part_written(tmp_path, "t_teaching", rows=2)
    rec = write_run_record(tmp_path, "demo", {"seed": 7, "backend": "openai:gpt-4o", "dataset": "verite", "quick": False})
    assert (tmp_path / "t_real.csv").read_text() == "committed rows\n"
    on_disk = read_run_record(tmp_path)
    assert on_disk == json.loads(json.dumps(rec, default=str))
    assert rec["seed"] == 7 and rec["backends"] == {"backend": "openai:gpt-4o"} and rec["data"] == {"dataset": "verite"}
    assert rec["parts"]["t_real"] == {"status": "skipped", "why": "no real data"} and rec["parts"]["t_teaching"]["status"] == "written"
    for k in ("forensicslab", "git_commit", "packages", "python", "platform", "machine", "cpus", "parameters", "date"):
        assert k in rec, k
    assert len(rec["git_commit"].split("+")[0]) == 40         # this checkout's commit (a test runs inside it)


def test_lines_that_are_not_rows_are_set_aside_not_fatal(tmp_path, capsys):
    """Issue 32 lesser: a valid-JSON line that is not a row (and a line that is not UTF-8) blocked resume with
    `error: key`. Such lines go to rows.set-aside.jsonl, untouched, with one printed line, and the run resumes."""
    from forensicslab.runs import SET_ASIDE
    run = Run(tmp_path, config={"s": 1})
    run.execute([Case(f"c{i}", i) for i in range(3)], lambda x: {"y": x}, workers=1, progress=False)
    junk = [b'"just a string"', b'{"key": 7}', b'{"no key": true}', b"\xff\xfe\x00 binary"]
    with open(run.rows_path, "ab") as f: f.write(b"\n".join(junk) + b"\n")
    assert sorted(r["key"] for r in Run(tmp_path, config={"s": 1}).rows()) == ["c0", "c1", "c2"]
    done = []
    rows = Run(tmp_path, config={"s": 1}).execute([Case(f"c{i}", i) for i in range(5)], lambda x: done.append(x) or {"y": x},
                                                  workers=1, progress=False)
    assert done == [3, 4] and [r["y"] for r in rows] == [0, 1, 2, 3, 4]
    assert (tmp_path / SET_ASIDE).read_bytes().splitlines() == junk
    assert "4 line(s) that are not rows set aside" in capsys.readouterr().err
    assert all(json.loads(l)["key"].startswith("c") for l in run.rows_path.read_text().splitlines())


def test_corrupt_manifest_and_full_disk_are_one_line_errors_naming_the_file(tmp_path):
    "Issue 32 item 4: a corrupt manifest beside rows, and a write that fails (disk full), name the file; no bare exception."
    import errno
    from unittest import mock
    from forensicslab.core import ForensicsLabError
    from forensicslab.runs import RunError
    run = Run(tmp_path, config={"s": 1})
    run.execute([Case("a", 1)], lambda x: {"y": x}, workers=1, progress=False)
    (tmp_path / "manifest.json").write_bytes(b'{"config_hash": "ab')
    with pytest.raises(RunError, match=r"manifest\.json: not a readable run manifest"): Run(tmp_path, config={"s": 1})
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "manifest.json").write_text("garbage")                       # no rows: rewritten, the run goes on
    assert Run(fresh, config={"s": 2}).manifest["config"] == {"s": 2}
    with mock.patch("os.write", side_effect=OSError(errno.ENOSPC, "No space left on device")):
        with pytest.raises(ForensicsLabError, match=r"rows\.jsonl: cannot append a row \(No space left on device\)"):
            Run(fresh, config={"s": 2}).execute([Case("b", 1)], lambda x: {"y": x}, workers=1, progress=False)
    with pytest.raises(RunError, match="'b' is given twice"):
        Run(fresh, config={"s": 2}).execute([Case("b"), Case("b")], lambda x: {}, progress=False)


def test_quick_study_folders_are_one_per_run(tmp_path):
    "Issue 32 lesser: quick studies shared one fixed temp folder, so two at once wrote into each other."
    from forensicslab.runs import study_output_dir
    a, b = study_output_dir("triage_table4"), study_output_dir("triage_table4")
    try: assert a != b and a.parent == b.parent and a.name.startswith("triage_table4-") and a.is_dir() and b.is_dir()
    finally: a.rmdir(); b.rmdir()
    assert study_output_dir("x", tmp_path / "given") == tmp_path / "given"


def _fingerprint(**env) -> str:
    code = "import torch; from forensicslab.runs import machine_info; print(machine_info()['arithmetic'])"
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_run_record_fingerprints_the_cpu_arithmetic():
    """run.json's `arithmetic` fingerprint is stable from run to run and changes when the float arithmetic does (torch's
    kernels without vector instructions, on x86): a rerun that differs from a committed output can be told apart from
    a code change by comparing fingerprints."""
    same = _fingerprint(OMP_NUM_THREADS="1")
    assert len(same) == 16 and same == _fingerprint(OMP_NUM_THREADS="1")
    import platform
    if platform.machine() in ("x86_64", "AMD64"):
        assert _fingerprint(OMP_NUM_THREADS="1", ATEN_CPU_CAPABILITY="default") != same


def test_a_study_kernel_runs_with_the_portable_arithmetic_and_run_json_records_the_kernels(tmp_path, monkeypatch, capsys):
    """Issue 24: study kernels get `PORTABLE_ARITHMETIC` (two threads, AVX2 caps) wherever the user has not set them, and
    run.json records the arithmetic the kernel computed with, measured by the kernel itself here; a folder committed
    with another fingerprint gets a one-line note before it is replaced."""
    import nbformat
    import forensicslab.studies as S
    from forensicslab.runs import PORTABLE_ARITHMETIC, note_run
    d = tmp_path / "nbs" / "studies"
    d.mkdir(parents=True)
    keys = sorted(PORTABLE_ARITHMETIC)
    probe = ("import json, os, torch\nfrom pathlib import Path\nfrom forensicslab.runs import cpu_arithmetic\n"
             f"env = {{k: os.environ.get(k) for k in {keys!r}}}\n"
             "Path(out_dir, 'kernel.json').write_text(json.dumps({**cpu_arithmetic(), 'env': env}))")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('quick = True\nout_dir = ""', metadata={"tags": ["parameters"]}),
                                         nbformat.v4.new_code_cell(probe)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, d / "probe_study.ipynb")
    monkeypatch.setattr(S, "project_root", lambda start=None: tmp_path)
    for k in PORTABLE_ARITHMETIC: monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))   # the kernel imports this checkout
    note_run(tmp_path / "out" / "probe_study", arithmetic="0000000000000000")
    out = S.run_study("probe_study", {}, out_root=tmp_path / "out", progress=False).parent
    kernel, rec = json.loads((out / "kernel.json").read_text()), json.loads((out / "run.json").read_text())
    assert "0000000000000000" in capsys.readouterr().err                       # the note before replacing it
    assert rec["arithmetic"] == kernel["arithmetic"] and rec["torch_threads"] == kernel["torch_threads"]
    import platform
    if platform.machine() in ("x86_64", "AMD64"):
        assert kernel["env"] == PORTABLE_ARITHMETIC and kernel["torch_threads"] == min(2, os.cpu_count() or 2)
    assert not any(k in os.environ for k in PORTABLE_ARITHMETIC)               # the runner's own environment is restored
    executed = nbformat.read(out / "probe_study.ipynb", as_version=4)   # papermill's random cell id is made fixed: reruns match
    assert [c.id for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])] == ["injected-parameters"]


def test_a_batch_function_gets_the_unfinished_cases_in_order_and_a_failed_batch_fails_each_case(tmp_path):
    seen = []
    def squares(xs):
        seen.append(list(xs))
        if 7 in xs: raise ValueError("seven")
        return [{"y": x * x} for x in xs]
    run = Run(tmp_path)
    run.execute([Case(str(i), i) for i in (1, 2)], squares, batch=3, progress=False)      # finished before
    rows = run.execute([Case(str(i), i) for i in range(9)], squares, batch=3, progress=False)
    assert seen == [[1, 2], [0, 3, 4], [5, 6, 7], [8]]
    assert [r["key"] for r in rows] == [str(i) for i in range(9)]
    assert [r.get("y") for r in rows] == [0, 1, 4, 9, 16, None, None, None, 64]
    assert {rows[i]["status"] for i in (5, 6, 7)} == {"failed"} and "seven" in rows[6]["error"]
    bad = Run(tmp_path / "bad").execute([Case("a", 1), Case("b", 2)], lambda xs: [{"y": 0}], batch=2, progress=False)
    assert [r["status"] for r in bad] == ["failed"] * 2 and "one result per case" in bad[0]["error"]
