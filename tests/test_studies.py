"""Study variants (issue 27 item 6) and study profiles (issue 47 item 1): a base study notebook + fixed parameters + its own output folder, listed, run by
`reproduce` after its base, accepted by `--only` and `study`, named in run.json; a clashing -p is refused in one line. Profiles: the demo (the committed outputs) and the full run
of each study, `reproduce --profile`, `--list`, resuming and the ETA lines.
Every test runs in a temporary project with a stand-in executor (no kernel starts), so each takes well under a second."""
import json
from pathlib import Path

import nbformat
import papermill
import pytest

import forensicslab.cli as cli
import forensicslab.studies as S
from forensicslab.core import ForensicsLabError


def _notebook(path: Path, params: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(params, metadata={"tags": ["parameters"]}),
                                         nbformat.v4.new_code_cell("x = 1")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.fixture
def project(tmp_path, monkeypatch):
    "A project with two study notebooks (`triage_table4`, `triage_figure2`) and a variant of each; papermill is a stand-in that records its calls."
    d = tmp_path / "nbs" / "studies"
    d.mkdir(parents=True)
    _notebook(d / "triage_table4.ipynb", 'quick = True\nout_dir = ""\npool = "default"\nseed = 0\nvariant = ""')
    _notebook(d / "triage_figure2.ipynb", 'quick = True\nout_dir = ""\npool = "default"\ntable4_study = "triage_table4"\nvariant = ""')
    _notebook(d / "zoom_table1.ipynb", 'quick = True\nout_dir = ""\nseed = 0')       # no `variant` parameter
    (d / "variants.yaml").write_text(
        "triage_table4_ungated:\n  study: triage_table4\n  params: {pool: builtin-ungated}\n  about: ungated pool\n"
        "triage_figure2_ungated:\n  study: triage_figure2\n  params: {pool: builtin-ungated, table4_study: triage_table4_ungated}\n")
    monkeypatch.setattr(S, "project_root", lambda start=None: tmp_path)
    calls = []
    def execute(src, dst, parameters, **kw):
        calls.append(dict(src=Path(src).name, dst=Path(dst), params=dict(parameters)))
        Path(dst).write_text("{}")              # what the stand-in "executed"
    monkeypatch.setattr(papermill, "execute_notebook", execute)
    return tmp_path, calls


def test_variants_are_listed_right_after_their_base(project):
    names = list(S.list_studies())
    assert names == ["triage_table4", "triage_table4_ungated", "triage_figure2", "triage_figure2_ungated", "zoom_table1"]
    assert S.study_path("triage_table4_ungated").name == "triage_table4.ipynb"
    assert set(S.study_parameters("triage_table4_ungated")) == {"quick", "out_dir", "pool", "seed", "variant"}


def test_a_variant_runs_its_base_with_fixed_parameters_into_its_own_folder(project):
    root, calls = project
    nb = S.run_study("triage_table4_ungated", {"quick": True, "seed": 3}, out_root=root / "out", progress=False)
    call = calls[-1]
    assert call["src"] == "triage_table4.ipynb" and nb == (root / "out" / "triage_table4_ungated" / "triage_table4_ungated.ipynb").resolve()
    assert call["params"]["pool"] == "builtin-ungated" and call["params"]["variant"] == "triage_table4_ungated" and call["params"]["seed"] == 3
    rec = json.loads((nb.parent / "run.json").read_text())
    assert rec["study"] == "triage_table4_ungated" and rec["parameters"]["pool"] == "builtin-ungated"
    assert rec["variant"] == {"name": "triage_table4_ungated", "study": "triage_table4", "params": {"pool": "builtin-ungated"},
                              "about": "ungated pool"}
    S.run_study("triage_table4", {"quick": True}, out_root=root / "out", progress=False)   # the base is untouched by its variant
    assert "pool" not in calls[-1]["params"] and "variant" not in calls[-1]["params"]   # its own defaults
    assert not json.loads((root / "out" / "triage_table4" / "run.json").read_text()).get("variant")


def test_a_clashing_parameter_is_refused_in_one_line(project):
    root, calls = project
    with pytest.raises(S.StudyError) as e:
        S.run_study("triage_table4_ungated", {"quick": True, "pool": "paper"}, out_root=root / "out", progress=False)
    assert "\n" not in str(e.value) and "would change its fixed pool" in str(e.value) and "run triage_table4 with it" in str(e.value)
    S.run_study("triage_table4_ungated", {"quick": True, "pool": "builtin-ungated"}, out_root=root / "out", progress=False)   # same value: fine
    with pytest.raises(S.StudyError, match="set by running a study variant"):
        S.run_study("triage_table4", {"variant": "x"}, out_root=root / "out", progress=False)
    assert len(calls) == 1


def test_reproduce_runs_variants_after_their_base_and_refuses_a_clash_before_running(project, capsys, monkeypatch):
    root, calls = project
    seen, run_study = [], S.run_study
    def stand_in(n, p, out_root=None, out_dir=None, progress=False):
        seen.append((n, dict(p)))
        return run_study(n, p, out_root, out_dir=out_dir, progress=False)
    monkeypatch.setattr(S, "run_study", stand_in)
    def main(*argv):
        try: cli.main(list(argv))
        except SystemExit as e: return e.code, capsys.readouterr()
        return 0, capsys.readouterr()
    code, out = main("reproduce", "--quick", "--out", str(root / "out"), "-p", "seed", "2")
    assert code == 0, out.err
    assert [n for n, _ in seen] == ["triage_table4", "triage_table4_ungated", "triage_figure2", "triage_figure2_ungated", "zoom_table1"]
    assert (root / "out" / "triage_figure2_ungated" / "run.json").is_file()
    assert [c["params"].get("table4_study") for c in calls if c["src"] == "triage_figure2.ipynb"] == [None, "triage_table4_ungated"]
    seen.clear()
    code, out = main("reproduce", "--only", "triage_figure2_ungated", "--quick", "--out", str(root / "out"))
    assert code == 0 and [n for n, _ in seen] == ["triage_figure2_ungated"]
    seen.clear()
    code, out = main("reproduce", "--quick", "--out", str(root / "out"), "-p", "pool", "paper")
    assert code == 2 and not seen and out.err.count("\n") == 1 and "would change its fixed pool" in out.err, out.err
    code, out = main("study")
    assert "triage_table4_ungated\t" in out.out and "variant: triage_table4 with pool=builtin-ungated" in out.out


@pytest.mark.parametrize("text, message", [
    ("v:\n  study: nope\n  params: {pool: x}\n", "no study notebook 'nope'"),
    ("v:\n  study: triage_table4\n  params: {pol: x}\n", "has no parameter 'pol'"),
    ("v:\n  study: triage_table4\n  params: {quick: false}\n", "quick cannot be fixed"),
    ("v:\n  study: zoom_table1\n  params: {seed: 1}\n", "declares no `variant` parameter"),
    ("triage_figure2:\n  study: triage_table4\n  params: {seed: 1}\n", "a study notebook has that name"),
    ("v:\n  study: triage_table4_ungated\n  params: {seed: 1}\n", "not another variant"),
    ("v:\n  study: triage_table4\n", "give study"),
    ("v: [1\n", "not valid YAML"),
])
def test_a_bad_variant_file_is_one_line(project, text, message):
    root, _ = project
    (root / "nbs" / "studies" / "variants.yaml").write_text(text)
    with pytest.raises(ForensicsLabError) as e:
        S.list_studies()
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_shipped_variants_point_figure2_at_the_ungated_table4():
    "The checkout's own variants: Figure 2's ungated variant reads the ungated Table 4's folder, with the same pool."
    v = S.study_variants()
    t4, f2 = v["triage_table4_ungated"], v["triage_figure2_ungated"]
    assert f2.params["table4_study"] == t4.name and f2.params["pool"] == t4.params["pool"] == "builtin-ungated"
    assert t4.params["compare_with"] == t4.study


def test_printed_paths_in_cell_outputs_become_checkout_relative(tmp_path):
    root, stage, final = tmp_path / "co", tmp_path / "co/outputs/.s.running", tmp_path / "co/outputs/s"
    png = "iVBORw0KGgo=/" + str(root)   # image bytes are never rewritten
    out = {"output_type": "execute_result", "execution_count": 1, "metadata": {},
           "data": {"text/plain": [f"PosixPath('{stage}/t.csv')"], "text/html": f"<td>{root}/x</td>", "image/png": png}}
    stream = {"output_type": "stream", "name": "stderr", "text": f"{root}/.venv/lib/tqdm/auto.py:21: Warning\nkept /etc/hosts\n"}
    S._portable_output(out, stage, final, root)
    S._portable_output(stream, stage, final, root)
    assert out["data"]["text/plain"] == ["PosixPath('outputs/s/t.csv')"]
    assert out["data"]["text/html"] == "<td>x</td>" and out["data"]["image/png"] == png
    assert stream["text"] == ".venv/lib/tqdm/auto.py:21: Warning\nkept /etc/hosts\n"


def _main(capsys, *argv):
    try: cli.main(list(argv))
    except SystemExit as e: return e.code, capsys.readouterr()
    return 0, capsys.readouterr()


def _profiles(root, text):
    (root / "nbs" / "studies" / "profiles.yaml").write_text(text)


def test_profiles_default_to_the_study_and_read_one_line_each(project):
    root, _ = project
    p = S.study_profiles()
    assert list(p) == list(S.list_studies()) and all(x.same and not x.demo and not x.full for x in p.values())
    _profiles(root, "zoom_table1: {demo: {seed: 1}, full_seconds: 900}\ntriage_table4_ungated: {full: {seed: 5}}\n")
    p = S.study_profiles()
    assert p["zoom_table1"].params("demo") == {"seed": 1} and p["zoom_table1"].params("full") == {} and not p["zoom_table1"].same
    assert (p["zoom_table1"].describe("demo"), p["zoom_table1"].describe("full")) == ("seed=1", "defaults")
    assert p["triage_table4_ungated"].params("full") == {"seed": 5} and p["triage_table4"].describe("full") == "= demo"
    out = root / "out"
    assert S.profile_folder("zoom_table1", "demo", out) == (out / "zoom_table1").resolve()
    assert S.profile_folder("zoom_table1", "full", out) == (out / "full" / "zoom_table1").resolve()   # never the committed folder
    assert S.profile_folder("triage_table4", "full", out) == (out / "triage_table4").resolve()         # full = demo: one folder


@pytest.mark.parametrize("text, message", [
    ("nope: {demo: {seed: 1}}\n", "study 'nope': no such study"),
    ("zoom_table1: {demo: {sed: 1}}\n", "has no parameter 'sed'"),
    ("zoom_table1: {full: {quick: false}}\n", "quick cannot be set by a profile"),
    ("triage_table4_ungated: {demo: {pool: paper}}\n", "pool is fixed by the variant triage_table4_ungated"),
    ("zoom_table1: {demo: [seed]}\n", "give demo and full"),
    ("zoom_table1: {dmeo: {seed: 1}}\n", "give demo and full"),
    ("zoom_table1: {full_seconds: fast}\n", "full_seconds is a measured time"),
    ("zoom_table1: [1\n", "not valid YAML"),
])
def test_a_bad_profile_line_is_one_line(project, text, message):
    root, _ = project
    _profiles(root, text)
    with pytest.raises(ForensicsLabError) as e:
        S.study_profiles()
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_demo_regenerates_and_the_full_profile_resumes(project, capsys):
    root, calls = project
    out = root / "out"
    _profiles(root, "zoom_table1: {demo: {seed: 1}}\n")
    code, got = _main(capsys, "reproduce", "--out", str(out))
    assert code == 0, got.err
    assert [(c["src"], c["params"].get("seed")) for c in calls] == [("triage_table4.ipynb", None), ("triage_table4.ipynb", None),
        ("triage_figure2.ipynb", None), ("triage_figure2.ipynb", None), ("zoom_table1.ipynb", 1)]
    assert json.loads((out / "zoom_table1" / "run.json").read_text())["parameters"]["seed"] == 1   # the demo's folder
    calls.clear()
    code, got = _main(capsys, "reproduce", "--out", str(out))             # the demo always regenerates
    assert code == 0 and len(calls) == 5
    calls.clear()
    code, got = _main(capsys, "reproduce", "--profile", "full", "--out", str(out))
    assert code == 0, got.err
    assert [c["src"] for c in calls] == ["zoom_table1.ipynb"] and "seed" not in calls[0]["params"]   # only the one that differs
    assert calls[0]["dst"].parent.name == ".zoom_table1.running" and (out / "full" / "zoom_table1" / "run.json").is_file()
    assert json.loads((out / "zoom_table1" / "run.json").read_text())["parameters"]["seed"] == 1   # the demo's folder untouched
    assert got.out.count("finished earlier with these parameters") == 4 and "kept" in got.out
    calls.clear()
    code, got = _main(capsys, "reproduce", "--profile", "full", "--out", str(out))  # everything finished: nothing runs
    assert code == 0 and not calls and got.out.count("finished earlier with these parameters") == 5
    assert "full profile: 0 of 5 studies to run, expected 0 s; 5 finished earlier" in got.out
    code, got = _main(capsys, "reproduce", "--profile", "full", "--out", str(out), "-p", "seed", "7")   # other parameters: rerun
    assert code == 0 and [c["params"]["seed"] for c in calls] == [7, 7, 7]
    calls.clear()
    code, got = _main(capsys, "reproduce", "--profile", "full", "--no-resume", "--only", "triage_table4", "--out", str(out))
    assert code == 0 and len(calls) == 1
    code, got = _main(capsys, "reproduce", "--quick", "--profile", "full")
    assert code == 2 and "give one of them" in got.err and got.err.count("\n") == 1


def test_the_list_and_the_eta_come_from_the_run_records(project, capsys):
    root, calls = project
    out = root / "out"
    _profiles(root, "zoom_table1: {demo: {seed: 1}, full_seconds: 5400}\n")
    code, got = _main(capsys, "reproduce", "--list", "--out", str(out))
    assert code == 0 and not calls
    rows = {l.split()[0]: l for l in got.out.splitlines() if l.strip()}
    assert "seed=1" in rows["zoom_table1"] and rows["zoom_table1"].rstrip().endswith("1.5 h")   # declared full time
    assert rows["triage_table4"].split()[1:] == ["defaults", "?", "=", "demo", "?"]             # never run: unknown
    S.run_study("triage_table4", {}, out_dir=out / "triage_table4", progress=False)
    rec = json.loads((out / "triage_table4" / "run.json").read_text())
    (out / "triage_table4" / "run.json").write_text(json.dumps({**rec, "seconds": 330.0}))
    code, got = _main(capsys, "reproduce", "--list", "--out", str(out))
    rows = {l.split()[0]: l for l in got.out.splitlines() if l.strip()}
    assert rows["triage_table4"].split()[1:] == ["defaults", "5.5", "min", "=", "demo", "5.5", "min", "done"]
    assert S.expected_seconds("zoom_table1", "full", out) == 5400 and S.expected_seconds("triage_table4", "demo", out) == 330
    code, got = _main(capsys, "reproduce", "--only", "triage_table4", "--only", "zoom_table1", "--out", str(out))
    assert code == 0, got.err
    assert "demo profile: 2 of 2 studies to run, expected 5.5 min and 1 never measured" in got.out
    assert "== [1/2] triage_table4 (expected 5.5 min; all 5.5 min left, done by ~" in got.out
    assert "== [2/2] zoom_table1 (expected time unknown)" in got.out
    code, got = _main(capsys, "reproduce", "--list", "--only", "nope")
    assert code == 2 and "unknown study 'nope'" in got.err


def test_the_committed_outputs_are_the_demo_profiles():
    """Issue 47 item 1: `make demo` regenerates outputs/ as committed, so every committed study folder holds a finished run
    with exactly its demo profile's parameters (a new parameter, a changed default or a profile line that is not
    what made the folder shows up here: regenerate it with `forensicslab reproduce --only NAME`)."""
    from forensicslab.runs import checkout_root, shown_text
    out = S.project_root() / "outputs"
    bad = []
    for name, prof in S.study_profiles().items():
        folder = out / name
        if not (folder / "run.json").is_file(): continue            # not committed (yet): nothing to regenerate
        params = prof.params("demo", out)
        if S.finished_run(name, params, folder) is not None: continue
        rec = json.loads((folder / "run.json").read_text())
        v = S.study_variant(name)
        want = shown_text(S._recorded_parameters(S.study_path(name), v.apply(params) if v else params), checkout_root() or S.project_root())
        got = rec.get("parameters") or {}
        diff = sorted(k for k in set(want) | set(got) if want.get(k, "<absent>") != got.get(k, "<absent>"))
        bad.append(f"{name}: status {rec.get('status')}; parameters that differ: "
                   + ", ".join(f"{k} (demo {want.get(k, '<absent>')!r}, run.json {got.get(k, '<absent>')!r})" for k in diff))
    assert not bad, "committed outputs not made by their demo profile:\n" + "\n".join(bad)


def test_a_study_starts_after_the_studies_it_reads_and_the_others_run_side_by_side(project):
    """`study_needs` reads the parameters cell and a variant's fixed parameters; `reproduce(jobs=2)` starts each study
    only after those and runs the rest side by side; alone, in reproduction order."""
    import threading, time
    root, _ = project
    needs = {n: S.study_needs(n) for n in S.list_studies()}
    assert needs == {"triage_table4": [], "triage_table4_ungated": [], "triage_figure2": ["triage_table4"],
                     "triage_figure2_ungated": ["triage_table4", "triage_table4_ungated"], "zoom_table1": []}
    spans, lock = {}, threading.Lock()
    def runner(n, p, out_root=None, out_dir=None, progress=False):
        t0 = time.perf_counter()
        time.sleep(0.3)
        with lock: spans[n] = (t0, time.perf_counter())
        d = Path(out_root or root / "out") / n
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{n}.ipynb").write_text("{}")
        return d / f"{n}.ipynb"
    r = S.reproduce(quick=True, out_root=root / "out", runner=runner, progress=False, echo=lambda line: None, jobs=2)
    assert [x[0] for x in r["results"]] == list(needs) and {x[1] for x in r["results"]} == {"ok"}
    for n, before in needs.items():
        for b in before: assert spans[b][1] <= spans[n][0], (b, n)                     # never before what it reads
    starts = sorted(t0 for t0, _ in spans.values())
    assert starts[1] < min(t1 for _, t1 in spans.values())                              # two ran side by side
    spans.clear()
    S.reproduce(quick=True, out_root=root / "out", runner=runner, progress=False, echo=lambda line: None)
    order = sorted(spans, key=lambda n: spans[n][0])
    assert order == list(needs) and all(spans[a][1] <= spans[b][0] for a, b in zip(order, order[1:]))
    with pytest.raises(S.StudyError, match="at least 1"): S.reproduce(quick=True, runner=runner, jobs=0)
    _notebook(root / "nbs" / "studies" / "triage_table4.ipynb", 'quick = True\nout_dir = ""\npool = "default"\nseed = 0\n'
              'variant = ""\nfigure = "triage_figure2"')                                # now each reads the other
    with pytest.raises(S.StudyError, match="read each other's folders: triage_table4 -> triage_figure2 -> triage_table4"):
        S.reproduce(["triage_table4", "triage_figure2"], quick=True, runner=runner, jobs=2)


def test_the_expected_wall_time_follows_the_longest_chain_of_waiting_studies():
    "Side by side, a free worker takes the ready study with the longest path ahead: a (10 s) then b (10 s, reads a) beside c (15 s)."
    todo = [(1, dict(name="c", needs=[], expected=15.0)), (2, dict(name="a", needs=[], expected=10.0)),
            (3, dict(name="b", needs=["a"], expected=10.0))]
    assert S.wall_seconds(todo, 1) == 35 and S.wall_seconds(todo, 2) == 20
    assert S.wall_seconds(todo + [(4, dict(name="d", needs=[], expected=5.0))], 2) == 20    # d follows c while b follows a


def test_another_output_root_takes_its_expected_times_from_the_committed_runs(project):
    root, _ = project
    assert S.expected_seconds("zoom_table1", "demo", root / "elsewhere") is None     # nothing measured anywhere
    S.run_study("zoom_table1", {}, progress=False, out_dir=S.profile_folder("zoom_table1", "demo"))
    rec = json.loads((root / "outputs" / "zoom_table1" / "run.json").read_text())
    assert S.expected_seconds("zoom_table1", "demo", root / "elsewhere") == pytest.approx(rec["seconds"])
