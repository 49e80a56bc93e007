"The top-level CLI: one line per error (exit 2), no traceback anywhere, study parameters passed as -p/-y."
import io
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import forensicslab.cli as cli
import forensicslab.studies as studies
from forensicslab.core import ForensicsLabError
from forensicslab.imageio import ImageUnreadable

REPO = Path(__file__).resolve().parents[1]
EXE = Path(sys.executable).parent / "forensicslab"


def run_main(capsys, *argv):
    "Run the console script's `main` in-process: (exit status, stdout, stderr)."
    code = 0
    try: cli.main(list(argv))
    except SystemExit as e: code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_unknown_study_is_one_line_from_the_console_script():
    if not EXE.exists(): pytest.skip("console script not installed (pip install -e . creates it)")
    r = subprocess.run([str(EXE), "study", "nope"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    head = "error: unknown study 'nope'; available: "
    assert r.stderr.startswith(head) and r.stderr.count("\n") == 1, r.stderr
    listed = r.stderr[len(head):].strip().split(", ")   # the names, in whatever order the study list sorts them
    assert {"triage_table4", "triage_composite"} <= set(listed) and len(listed) == len(set(listed)) > 2, r.stderr


def test_study_passes_p_and_y_parameters(capsys, monkeypatch):
    seen = {}
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")     # the preflight checks the key is set; nothing is called
    def fake_run_study(name, params, out):
        seen.update(name=name, params=params)
        return REPO / "outputs" / name / f"{name}.ipynb"
    monkeypatch.setattr(cli, "run_study", fake_run_study)
    code, out, err = run_main(capsys, "study", "triage_table4", "-p", "backbone", "openai:gpt-4o", "-p", "seed", "3",
                              "-y", "collections", "[id]", "-p", "n_authentic", "None", "--quick")
    assert code == 0, err
    assert seen["params"] == {"quick": True, "backbone": "openai:gpt-4o", "seed": 3, "collections": ["id"],
                              "n_authentic": None}


def test_unknown_parameter_and_bad_yaml_are_one_line(capsys):
    code, _, err = run_main(capsys, "study", "triage_table4", "-p", "backbon", "x")
    assert code == 2 and err.count("\n") == 1 and "has no parameter 'backbon'" in err and "backbone" in err
    code, _, err = run_main(capsys, "study", "triage_table4", "-y", "collections", "[id")
    assert code == 2 and err.count("\n") == 1 and "not valid YAML" in err


def test_study_params_lists_declared_parameters(capsys):
    code, out, _ = run_main(capsys, "study", "triage_table4", "--params")
    assert code == 0 and 'backbone = ""' in out and "quick = True" in out


def test_reproduce_sends_each_parameter_only_where_declared(capsys, monkeypatch):
    seen = []
    monkeypatch.setattr(studies, "run_study", lambda n, p, out_root=None, out_dir=None, progress=False:
                        seen.append((n, p)) or REPO / "outputs" / n / f"{n}.ipynb")
    code, _, err = run_main(capsys, "reproduce", "--only", "triage_table4", "--only", "zoom_table3", "-p", "backbone", "x",
                            "-p", "detectors", "spectral", "--quick")
    assert code == 0, err
    got = dict(seen)
    assert got["triage_table4"]["backbone"] == "x" and "backbone" not in got["zoom_table3"]
    assert got["zoom_table3"]["detectors"] == "spectral"
    code, _, err = run_main(capsys, "reproduce", "--only", "zoom_table3", "-p", "no_such_knob", "1")
    assert code == 2 and "no_such_knob" in err


def test_reproduce_quick_prints_each_studys_own_folder(capsys, monkeypatch, tmp_path):
    """Issue 32 lesser: the printed location held another run's stale tables (the shared scratch parent). Quick runs now
    print each study's own new folder; `-p out_dir` (one folder for every study) is refused for reproduce."""
    monkeypatch.setattr(studies, "run_study", lambda n, p, out_root=None, out_dir=None, progress=False: tmp_path / f"{n}-abc" / f"{n}.ipynb")
    code, out, err = run_main(capsys, "reproduce", "--only", "triage_table4", "--only", "zoom_table3", "--quick")
    assert code == 0, err
    assert out.splitlines()[-1].endswith(f"{tmp_path / 'triage_table4-abc'}, {tmp_path / 'zoom_table3-abc'}"), out
    code, out, err = run_main(capsys, "reproduce", "--only", "triage_table4", "-p", "out_dir", str(tmp_path))
    assert code == 2 and "give --out ROOT, not -p out_dir" in err


@pytest.mark.parametrize("exc, code, text", [
    (ImageUnreadable("photo.jpg", "not a recognised image format"), 2, "error: photo.jpg: not a recognised image format"),
    (ForensicsLabError("no key for openai: set OPENAI_API_KEY"), 2, "error: no key for openai"),
    (ImportError("needs transformers: pip install 'forensicslab[train]'"), 2, "error: needs transformers"),
    (RuntimeError("boom\nsecond line"), 1, "error: unexpected RuntimeError: boom second line"),
])
def test_main_prints_typed_errors_as_one_line(capsys, monkeypatch, exc, code, text):
    def raiser(name, params, out): raise exc
    monkeypatch.setattr(cli, "run_study", raiser)
    got, out, err = run_main(capsys, "study", "triage_table4")
    assert got == code and err.startswith(text) and err.count("\n") == 1 and "Traceback" not in out + err, err


def test_debug_env_shows_the_traceback(capsys, monkeypatch):
    def raiser(name, params, out): raise ForensicsLabError("bad")
    monkeypatch.setattr(cli, "run_study", raiser)
    monkeypatch.setenv("FORENSICSLAB_DEBUG", "1")
    with pytest.raises(ForensicsLabError):
        cli.main(["study", "triage_table4"])


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "zero.jpg").write_bytes(b"")
    (d / "text.jpg").write_text("not an image\n")
    b = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 20, 30)).save(b, "JPEG")
    (d / "cut.jpg").write_bytes(b.getvalue()[:200])
    (d / "loop.jpg").symlink_to(d / "loop.jpg")
    return d


@pytest.mark.parametrize("command", [["detect"], ["analyze"], ["zoom"], ["debate", "pair"]])
@pytest.mark.parametrize("name", ["zero.jpg", "text.jpg", "cut.jpg", "loop.jpg"])
def test_every_image_command_refuses_bad_files_in_one_line(capsys, bad_files, command, name):
    "Issue 17 item 3: every command that reads an image gives one line naming the file, exit 2, no traceback."
    args = [*command, str(bad_files / name)] + (["a caption"] if command[0] == "debate" else [])
    code, out, err = run_main(capsys, *args)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and name in err and "Traceback" not in out + err, err


def test_quick_study_never_writes_into_outputs(monkeypatch, tmp_path):
    """Issue 19 item 3: `study NAME --quick` with no --out ran into outputs/<study> and overwrote the reference run.
    A full run goes to <project>/outputs/<study>, staged beside it; the project here is a temporary folder, because a
    test must never replace the checkout's reference outputs (an earlier form of this test did, once runs were staged)."""
    import papermill
    import forensicslab.studies as S
    seen = {}
    monkeypatch.setattr(papermill, "execute_notebook", lambda src, dst, parameters, **kw: seen.update(dst=dst, p=parameters))
    nb = REPO / "nbs" / "studies" / "triage_table4.ipynb"
    S.run_study(nb, {"quick": True}, progress=False)
    assert not seen["p"]["out_dir"].startswith(str(REPO / "outputs")) and "forensicslab-quick" in seen["p"]["out_dir"]
    assert not seen["dst"].startswith(str(REPO / "outputs"))
    monkeypatch.setattr(S, "project_root", lambda start=None: tmp_path)
    S.run_study(nb, {"quick": False}, progress=False)
    assert seen["p"]["out_dir"] == str((tmp_path / "outputs" / ".triage_table4.running").resolve())
    assert (tmp_path / "outputs" / "triage_table4" / "run.json").is_file() and not (tmp_path / "outputs" / ".triage_table4.running").exists()


@pytest.fixture(scope="module")
def photo_file(tmp_path_factory):
    from forensicslab.data.photos import photo
    d = tmp_path_factory.mktemp("photo")
    Image.fromarray(photo("coffee")).save(d / "photo.jpg", quality=92)
    return d / "photo.jpg"


@pytest.mark.parametrize("argv", [
    ["models", "ask", "openai:gpt-4o", "hi"],
    ["analyze", "{photo}", "--config", "complete", "--auditor-backend", "openai:gpt-4o", "--judge-backend", "openai:gpt-4o",
     "--detectors", "noise", "--cache", "off"],
    ["zoom", "{photo}", "--policy", "openai:gpt-4o"],
    ["debate", "pair", "{photo}", "a caption", "--backend", "openai:gpt-4o", "--cache", "off"],
])
def test_missing_key_exits_2_in_one_line(capsys, monkeypatch, photo_file, argv):
    "Issue 24: the README promises exit 2 and one `error:` line for a missing key (models ask exited 1)."
    for v in ("OPENAI_API_KEY", "FORENSICSLAB_DEBUG"): monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("FORENSICSLAB_CACHE_DIR", str(photo_file.parent / "cache"))
    code, out, err = run_main(capsys, *[a.format(photo=photo_file) for a in argv])
    assert code == 2, (code, out, err)
    assert err.startswith("error:") and "OPENAI_API_KEY" in err and err.count("\n") == 1 and "Traceback" not in out + err, err


def test_missing_optional_package_exits_2_naming_the_extra(capsys, monkeypatch):
    "As in a plain `pip install .`: no openai client; the line says which extra to install."
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used-123456")
    monkeypatch.setitem(sys.modules, "openai", None)
    code, out, err = run_main(capsys, "models", "ask", "openai:gpt-4o", "hi")
    assert code == 2 and err.count("\n") == 1 and "pip install 'forensicslab[api]'" in err, err


def test_nothing_to_show_exits_1(capsys, monkeypatch, tmp_path):
    "Exit 1: the command ran but had nothing to show (README: `bench info` before a build, `cache-info` before any cache)."
    monkeypatch.delenv("FORENSICSLAB_CACHE", raising=False)
    code, _, err = run_main(capsys, "bench", "info", "--root", str(tmp_path / "none"))
    assert code == 1 and "no benchmark" in err
    code, _, err = run_main(capsys, "models", "cache-info", "--cache-dir", str(tmp_path / "c"))
    assert code == 1 and "no reply cache" in err and not (tmp_path / "c").exists()


def test_bad_option_values_exit_2(capsys, photo_file):
    "Exit 2 for a bad argument: a cache mode that is not one (a folder is --cache-dir), an unknown detector."
    for argv in (["detect", str(photo_file), "--cache", "somewhere"], ["detect", str(photo_file), "--detectors", "nope"],
                 ["models", "ask", "openai:gpt-4o", "hi", "--cache", "sometimes"]):
        code, out, err = run_main(capsys, *argv)
        assert code == 2 and "error" in (out + err).lower(), (argv, out, err)


def test_p_out_dir_puts_every_output_in_that_folder_and_prints_it(capsys, monkeypatch, tmp_path):
    """Issue 32 lesser: `-p out_dir X` split a study's outputs between two folders (the staging folder overrode X) and
    the printed location held another run's stale tables. Now X is the output folder, written aside and printed."""
    import papermill
    def fake_execute(src, dst, parameters, **kw):   # what a study does: its tables go to the out_dir it is given
        Path(parameters["out_dir"], "table.csv").write_text("acc\n0.9\n")
        Path(dst).write_text("{}")
    monkeypatch.setattr(papermill, "execute_notebook", fake_execute)
    mine = tmp_path / "mine"
    code, out, err = run_main(capsys, "study", "triage_table4", "--quick", "-p", "out_dir", str(mine))
    assert code == 0, err
    assert sorted(p.name for p in mine.iterdir()) == ["run.json", "table.csv", "triage_table4.ipynb"]
    assert f"outputs in {mine.resolve()}" in out and not list(tmp_path.glob(".mine.*"))
    code, out, err = run_main(capsys, "study", "triage_table4", "--quick", "-p", "out_dir", str(mine), "--out", str(tmp_path / "o"))
    assert code == 2 and "two output folders given" in err and err.count("\n") == 1


def test_machine_failures_are_one_line_naming_the_file_or_port(capsys, monkeypatch, tmp_path):
    """Issue 32 item 4: a port in use, a full disk and a corrupt cache printed "unexpected ... (a bug)" without naming
    the port or file. The exceptions here are real ones: a bound port, a diskcache folder whose cache.db is garbage,
    a write to /dev/full."""
    import socket
    from forensicslab.detectors.pool import DetectionCache
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
        with pytest.raises(OSError) as e: socket.create_server(("127.0.0.1", port))
    line = cli._machine_error(e.value)
    assert line.startswith(f"port {port} on 127.0.0.1 is already in use"), line
    (tmp_path / "det").mkdir(); (tmp_path / "det" / "cache.db").write_bytes(b"not a database" * 100)
    with pytest.raises(Exception) as e: DetectionCache(tmp_path / "det")
    assert cli._machine_error(e.value).startswith(f"{tmp_path / 'det' / 'cache.db'} is corrupt (file is not a database)")
    if Path("/dev/full").exists():
        def write_table(path):
            with open(path, "w") as f: f.write("x" * 100); f.flush()
        with pytest.raises(OSError) as e: write_table("/dev/full")
        assert cli._machine_error(e.value).startswith("no space left on the device while writing /dev/full")
    def full_disk(*a, **k): raise OSError(28, "No space left on device", str(tmp_path / "out" / "cells.csv"))
    monkeypatch.setattr(cli, "run_batch", full_disk)
    (tmp_path / "g.yaml").write_text(f"study: triage_table4\nout: {tmp_path / 'out'}\ngrid:\n  seed: [1]\n")
    code, out, err = run_main(capsys, "batch", str(tmp_path / "g.yaml"))
    assert code == 2 and err.count("\n") == 1 and "a bug" not in err and str(tmp_path / "out" / "cells.csv") in err, err


def test_train_zoom_prints_checkpoints_beside_controls_and_targets(capsys, monkeypatch, tmp_path):
    "`forensicslab train zoom` ends with the training table (each checkpoint under its study label, then the controls) and the targets."
    import forensicslab.zoom.pipeline as pipeline
    row = lambda acc: {"acc": acc, "f1": 0.5, "iou": 0.1, "valid": 1.0, "n": 100}
    res = {"sft": row(0.6), "grpo": row(0.9), "grpo_shuffled_views": row(0.5),   # quick reads a survey: SURVEY_TARGETS apply
           "controls": {"instrument-only (LR over forensic readouts)": {"acc": 0.63, "f1": 0.6, "auc": 0.62, "n": 100}}}
    monkeypatch.setattr(pipeline, "run_pipeline", lambda cfg, out, stages, resume, log: res)
    code, out, err = run_main(capsys, "train", "zoom", "--config", "quick", "--out", str(tmp_path))
    assert code == 0, err
    rows = [ln for ln in out.splitlines() if ln.startswith("|")][2:]   # below the header and its rule
    assert [ln.split("|")[1].strip() for ln in rows] == [
        "SFT (w/o RL)", "SFT + GRPO", "SFT + GRPO, tool outputs shuffled across images", "instrument-only (LR over forensic readouts)"]
    assert "targets for the final checkpoint: acc met, f1 NOT met, iou NOT met, valid met" in out


# ------------------------------------------------------------------ #47 item 3: fail fast on a missing key or server
def _dead_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]          # closed again: nobody listens there


def test_study_batch_and_analyze_check_backends_before_the_first_case(capsys, monkeypatch, tmp_path, photo_file):
    "No key, no server: `study`, `batch` and `analyze` stop in one line with exit 2 before any case (no kernel, no image)."
    import time
    for v in ("OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "FORENSICSLAB_DEBUG"): monkeypatch.delenv(v, raising=False)
    started = []
    monkeypatch.setattr(cli, "run_study", lambda *a, **k: started.append(a))
    monkeypatch.setattr(cli, "run_batch", lambda *a, **k: started.append(a))
    dead = f"openai-compatible:http://127.0.0.1:{_dead_port()}/v1#gemma"
    t0 = time.time()
    code, out, err = run_main(capsys, "study", "triage_table4", "-p", "backbone", "openai:gpt-4o")
    assert code == 2 and err.count("\n") == 1 and "backend openai:gpt-4o has no API key: set OPENAI_API_KEY" in err, err
    code, out, err = run_main(capsys, "study", "triage_table4_ungated", "-p", "backbone", dead)     # a variant: the same check
    assert code == 2 and "does not answer" in err and err.count("\n") == 1, err
    code, out, err = run_main(capsys, "study", "debate_table7", "-p", "backend", f"gemini:gemini-2.5-flash,{dead}")
    assert code == 2 and "GEMINI_API_KEY" in err and "does not answer" in err and err.count("\n") == 1, err
    grid = tmp_path / "g.yaml"
    grid.write_text(f"study: triage_table4\nout: {tmp_path / 'out'}\ngrid:\n  backbone: ['{dead}', 'openai:gpt-4o']\n")
    code, out, err = run_main(capsys, "batch", str(grid))
    assert code == 2 and err.count("\n") == 1 and "does not answer" in err and "OPENAI_API_KEY" in err, err
    code, out, err = run_main(capsys, "analyze", str(photo_file), str(photo_file.parent), "--config", "complete", "--auditor-backend", dead,
                              "--judge-backend", dead, "--out", str(tmp_path / "a"))
    assert code == 2 and err.count("\n") == 1 and f"{dead.split('#')[0].split('//')[1].split('/')[0]} does not answer" in err, err
    assert started == [] and not (tmp_path / "a").exists() and not (tmp_path / "out").exists()
    assert time.time() - t0 < 30
    # a replayed cache needs no server; a key that is set passes
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    code, out, err = run_main(capsys, "study", "triage_table4", "-p", "backbone", dead, "-p", "model_cache", "replay")
    assert code != 2 and len(started) == 1, err

def test_detect_list_fits_the_terminal_and_wide_or_json_keep_everything(capsys, monkeypatch):
    "#47 item 7: `detect --list` rows were about 450-500 characters wide; now cut to the terminal (COLUMNS), --wide and --json in full."
    import json
    monkeypatch.setenv("COLUMNS", "100")
    code, out, err = run_main(capsys, "detect", "--list")
    assert code == 0 and max(map(len, out.splitlines())) <= 100 and "..." in out, out
    code, wide, _ = run_main(capsys, "detect", "--list", "--wide")
    assert code == 0 and max(map(len, wide.splitlines())) > 100
    code, js, _ = run_main(capsys, "detect", "--list", "--json")
    rows = {r["id"]: r for r in json.loads(js)}
    assert code == 0 and rows["adq"]["name"] in wide and "adq" in out and rows["adq"]["name"] not in out


def test_reproduce_checks_backends_before_the_first_study(capsys, monkeypatch):
    "#47 item 3 for `reproduce`: a -p backbone without its key stops before any study runs (exit 2, one line)."
    import forensicslab.studies as studies
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    ran = []
    monkeypatch.setattr(studies, "run_study", lambda *a, **k: ran.append(a))
    code, out, err = run_main(capsys, "reproduce", "--only", "triage_table4", "--only", "zoom_table3", "-p", "backbone", "openai:gpt-4o",
                              "--quick")
    assert code == 2 and err.count("\n") == 1 and "OPENAI_API_KEY" in err and ran == [], (code, err)


def test_batch_checks_only_the_cells_still_to_run(capsys, monkeypatch, tmp_path):
    "A resumed grid: a finished cell's backend (here gpt-4o without a key) is not checked again; the unfinished cells' are."
    import json
    from forensicslab.studies import grid_cells, load_grid
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(cli, "run_batch", lambda *a, **k: (_ for _ in ()).throw(SystemExit(0)))
    dead = f"openai-compatible:http://127.0.0.1:{_dead_port()}/v1#gemma"
    grid = tmp_path / "g.yaml"
    grid.write_text(f"study: triage_table4\nout: {tmp_path / 'out'}\ngrid:\n  backbone: ['{dead}', 'openai:gpt-4o']\n")
    for study, name, params in grid_cells(load_grid(grid)):
        if params["backbone"] == "openai:gpt-4o":
            (tmp_path / "out" / name).mkdir(parents=True)
            (tmp_path / "out" / name / "cell.json").write_text(json.dumps(dict(status="ok", params=params)))
    code, out, err = run_main(capsys, "batch", str(grid))
    assert code == 2 and "does not answer" in err and "OPENAI_API_KEY" not in err, err
