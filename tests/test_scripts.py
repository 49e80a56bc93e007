"""The scripts under scripts/ are not imported by the library, so nothing else notices when a name they use moves.
Each one must still parse, and every name it imports from forensicslab must still exist there."""
import ast
import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parents[1] / "scripts").rglob("*.py"))


def _forensicslab_imports(tree: ast.AST) -> list[tuple[str, str]]:
    "(module, name) for every `from forensicslab... import name`, top level or inside functions."
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "forensicslab":
            out += [(node.module, a.name) for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.split(".")[0] == "forensicslab"]
    return out


def test_scripts_are_found():
    assert len(SCRIPTS) >= 10 and any(p.parent.name == "zoom_diagnosis" for p in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(p.parents[1] if p.parent.name != "scripts" else p.parent)))
def test_script_imports_resolve(script):
    tree = ast.parse(script.read_text(encoding="utf-8"), filename=str(script))
    missing = []
    for mod, name in _forensicslab_imports(tree):
        try: m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("forensicslab"): missing.append(mod); continue
            pytest.skip(f"optional dependency {e.name} not installed")
        if name is not None and not hasattr(m, name):
            try: importlib.import_module(f"{mod}.{name}")   # `from pkg import submodule`
            except ModuleNotFoundError: missing.append(f"{mod}.{name}")
    assert not missing, f"{script.name} imports names that no longer exist: {missing}"


def _stress_module():
    spec = importlib.util.spec_from_file_location("forensicslab_stress", Path(__file__).parents[1] / "scripts" / "stress.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table(out: str) -> dict[str, str]:
    lines = [l for l in out.splitlines() if l.strip() and not l.startswith("summary:")]   # the count line under the table
    head = next(i for i, l in enumerate(lines) if l.split()[:3] == ["attack", "result", "seconds"])
    return {l.split()[0]: l.split()[1] for l in lines[head + 1:]}


def test_stress_script_replays_the_quick_attacks(capsys, monkeypatch):
    """Issue 32 item 6: scripts/stress.py replays the attacks and prints a table. Two quick attacks on runs and data run
    here (in this process, each in a temporary folder; the environment is restored after) and must pass."""
    monkeypatch.setenv("FORENSICSLAB_CACHE_DIR", "/nonexistent-checked-below")
    st = _stress_module()
    quick = ["run-file-bad-lines", "folder-corrupt-image"]   # seconds each; the CLI ones run in the slow test below
    code = st.main(["--short", *[a for n in quick for a in ("--only", n)], "--max-seconds", "600"])
    printed = capsys.readouterr().out
    rows = _table(printed)
    assert rows == {n: "pass" for n in quick} and code == 0, rows
    assert printed.rstrip().splitlines()[-1] == "summary: 2 of 2 passed"
    import os
    assert os.environ["FORENSICSLAB_CACHE_DIR"] == "/nonexistent-checked-below"
    assert {"judge-foreign-tool", "detector-slow-heads", "remote-heatmap-bomb", "retrieval-index-cache", "analyze-non-row-line",
            "csv-formula-names", "out-foreign-files", "interrupted-run", "remote-threshold-nan"} <= {n for n, (_, q) in st.ATTACKS.items() if q}
    assert set(st.ATTACKS) >= {"analyze-two-configs", "analyze-file-added", "grid-long-prefix", "detector-slow-clients",
                               "chat-byte-per-second", "chat-unpriced-budget", "retrieval-redirect", "folder-corrupt-image"}


@pytest.mark.slow
def test_stress_script_short_mode_runs_every_quick_attack():
    "The whole short mode as a user runs it: a table with one row per quick attack; the grid and data attacks pass."
    import subprocess
    import sys
    st = _stress_module()
    r = subprocess.run([sys.executable, "scripts/stress.py", "--short"], cwd=Path(__file__).parents[1],
                       capture_output=True, text=True, timeout=1200)
    rows = _table(r.stdout)
    assert set(rows) == {n for n, (_, quick) in st.ATTACKS.items() if quick}, r.stdout + r.stderr[-2000:]
    assert all(rows[n] == "pass" for n in ("grid-long-prefix", "grid-misspelt-keys", "run-file-bad-lines", "disk-full",
                                           "folder-corrupt-image")), r.stdout
    assert r.returncode == (0 if set(rows.values()) <= {"pass", "skipped"} else 1)


def test_mutations_find_each_rule_once_and_name_real_test_files():
    "scripts/mutations.py looks each rule's text up in the package: after a refactor moves or rewrites a rule, this says so."
    import runpy
    root = Path(__file__).parents[1]
    mod = runpy.run_path(str(root / "scripts" / "mutations.py"), run_name="mutations")
    names = [m.name for m in mod["MUTATIONS"]]
    assert len(names) == len(set(names)) and names[0].startswith("control") and len(names) >= 10
    for m in mod["MUTATIONS"]:
        for old, new in m.edits:
            assert old != new and mod["_locate"](root, old).suffix == ".py"   # found exactly once, else LookupError
        assert m.tests and all((root / t).is_file() for t in m.tests), m
    with pytest.raises(LookupError, match="not once"):
        mod["_locate"](root, "this text is in no module of the package")
