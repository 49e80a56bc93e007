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
