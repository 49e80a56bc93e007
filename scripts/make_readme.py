"""Render nbs/index.ipynb to README.md (nbdev's own `nbdev-readme` needs Quarto, which is not installable offline).

Markdown cells are copied; code cells become fenced Python blocks followed by their stored text output.
Usage: python scripts/make_readme.py [--check]   (--check exits 1 when README.md is out of date)
"""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _from_nbs(md: str) -> str:
    "Links in the index are relative to nbs/ (so they work in JupyterLab and on the site); README sits one level up."
    return re.sub(r"\]\((?![a-z]+:|/|#|\.\./)([^)]+\.ipynb)\)", r"](nbs/\1)", md)


def render(nb_path: Path = ROOT / "nbs" / "index.ipynb") -> str:
    parts = []
    for cell in json.loads(nb_path.read_text())["cells"]:
        src = "".join(cell["source"]).strip()
        if not src or src.startswith("#|") and "hide" in src.splitlines()[0]: continue
        if cell["cell_type"] == "markdown":
            parts.append(_from_nbs(src))
        elif cell["cell_type"] == "code":
            code = "\n".join(l for l in src.splitlines() if not l.startswith("#|"))
            parts.append(f"```python\n{code}\n```")
            for out in cell.get("outputs", []):
                text = out.get("text") or out.get("data", {}).get("text/plain")
                if text: parts.append("```\n" + "".join(text).rstrip() + "\n```")
    body = "\n\n".join(parts) + "\n"
    return "<!-- Generated from nbs/index.ipynb by scripts/make_readme.py: edit the notebook, not this file. -->\n\n" + body


if __name__ == "__main__":
    text, readme = render(), ROOT / "README.md"
    if "--check" in sys.argv:
        sys.exit(0 if readme.exists() and readme.read_text() == text else 1)
    readme.write_text(text)
    print(f"wrote {readme}")
