"""Study variants (issue 27 item 6): a base study notebook + fixed parameters + its own output folder, listed, run by
`reproduce` after its base, accepted by `--only` and `study`, named in run.json; a clashing -p is refused in one line.
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
    seen = []
    def stand_in(n, p, out):
        seen.append((n, dict(p)))
        return S.run_study(n, p, out, progress=False)
    monkeypatch.setattr(cli, "run_study", stand_in)
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
