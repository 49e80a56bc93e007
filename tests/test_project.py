"Project hygiene: notebooks and the exported library agree, nbdev-clean is a no-op, the CLI answers --help."
import filecmp
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _copy_project(dst: Path) -> Path:
    for name in ("nbs", "forensicslab"):
        shutil.copytree(REPO / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    shutil.copy(REPO / "pyproject.toml", dst / "pyproject.toml")
    return dst


def _diff(a: Path, b: Path, pattern: str) -> list[str]:
    out = []
    for f in sorted(a.rglob(pattern)):
        if "__pycache__" in f.parts or ".ipynb_checkpoints" in f.parts: continue
        g = b / f.relative_to(a)
        if not g.exists() or not filecmp.cmp(f, g, shallow=False): out.append(str(f.relative_to(a)))
    return out


def test_nbdev_export_and_clean_leave_tree_unchanged(tmp_path):
    work = _copy_project(tmp_path / "p")
    for cmd in ("nbdev-export", "nbdev-clean"):
        r = subprocess.run([str(BIN / cmd)], cwd=work, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{cmd} failed:\n{r.stdout}\n{r.stderr}"
    changed = _diff(REPO / "forensicslab", work / "forensicslab", "*.py") + _diff(REPO / "nbs", work / "nbs", "*.ipynb")
    assert not changed, f"run nbdev-export and nbdev-clean and commit: out of sync: {changed}"


def test_parameters_tag_survives_clean():
    import json
    for nb in (REPO / "nbs" / "studies").glob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{nb.name}: exactly one papermill 'parameters' cell expected"


def test_cli_help_on_every_command():
    from forensicslab.cli import app
    runner = CliRunner()
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0, top.output
    import typer.main
    group = typer.main.get_group(app)
    assert {"study", "reproduce"} <= set(group.commands)
    for name, cmd in group.commands.items():
        r = runner.invoke(app, [name, "--help"])
        assert r.exit_code == 0, f"{name} --help failed: {r.output}"
        if hasattr(cmd, "commands"):
            for sub in cmd.commands:
                r = runner.invoke(app, [name, sub, "--help"])
                assert r.exit_code == 0, f"{name} {sub} --help failed: {r.output}"


def test_console_script_installed():
    exe = BIN / "forensicslab"
    if not exe.exists(): pytest.skip("console script not installed (pip install -e . creates it)")
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "reproduce" in r.stdout


def test_readme_is_rendered_from_index_notebook():
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "make_readme.py"), "--check"], capture_output=True)
    assert r.returncode == 0, "README.md is out of date: run `python scripts/make_readme.py`"


def test_study_notebooks_name_the_registered_kernel():
    "Issue 13: papermill runs a study as written (`papermill nb out.ipynb`) only if the notebook names its kernel."
    import json
    import papermill as pm
    makefile = (REPO / "Makefile").read_text()
    assert "ipykernel install --sys-prefix --name python3" in makefile
    for nb in sorted((REPO / "nbs" / "studies").glob("*.ipynb")):
        ks = json.loads(nb.read_text())["metadata"].get("kernelspec", {})
        assert ks.get("name") == "python3" and ks.get("language") == "python", f"{nb.name}: kernelspec {ks}"
        assert "quick" in pm.inspect_notebook(str(nb)), f"{nb.name}: papermill cannot read its parameters"
