"The course path: the index lists every lesson and study in dependency order; each study opens with an explainer and ends with exercises whose checks run and whose answers are folded."
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NBS = REPO / "nbs"
SYSTEM_ORDER = ["spine", "data", "detectors", "provenance", "chat", "triage", "debate", "zoom", "cli"]
MARK = "<!-- course -->"


def _system(path: str) -> str:
    stem = Path(path).stem
    if path.startswith("studies/"):
        return {"detectors": "triage"}.get(stem.split("_")[0], stem.split("_")[0])   # the pool's studies sit with triage
    mod = stem.split("_", 1)[1]
    return mod.split(".")[0] if "." in mod else ("cli" if mod in ("cli", "main") else "spine")   # main: python -m forensicslab


def course_links() -> list[tuple[str, str]]:
    "(part heading, linked notebook) in the order the index lists them."
    out, part = [], None
    for c in json.loads((NBS / "index.ipynb").read_text())["cells"]:
        if c["cell_type"] != "markdown": continue
        for line in "".join(c["source"]).splitlines():
            if line.startswith("### Part"): part = line
            m = re.match(r"\| \[[^\]]+\]\(([^)]+\.ipynb)\)", line)
            if m and part: out.append((part, m.group(1)))
    return out


def test_every_notebook_is_a_lesson_once_in_dependency_order():
    links = [p for _, p in course_links()]
    have = {p.relative_to(NBS).as_posix() for p in NBS.glob("*.ipynb") if p.name != "index.ipynb"}
    have |= {p.relative_to(NBS).as_posix() for p in (NBS / "studies").glob("*.ipynb")}
    assert len(links) == len(set(links)), "a lesson listed twice"
    assert set(links) == have, f"not in the course: {sorted(have - set(links))}; no such notebook: {sorted(set(links) - have)}"
    ranks = [SYSTEM_ORDER.index(_system(p)) for p in links]
    assert ranks == sorted(ranks), [p for p, r, q in zip(links, ranks, ranks[1:]) if q < r]


def test_every_lesson_row_has_goals_and_a_paper_section():
    for c in json.loads((NBS / "index.ipynb").read_text())["cells"]:
        for line in "".join(c["source"]).splitlines():
            if re.match(r"\| \[[^\]]+\]\([^)]+\.ipynb\)", line):
                cols = [x.strip() for x in line.strip("|").split("|")]
                assert len(cols) == 3 and len(cols[1]) > 15 and cols[2], line


STUDIES = sorted((NBS / "studies").glob("*.ipynb"))


@pytest.mark.parametrize("nb", STUDIES, ids=[p.stem for p in STUDIES])
def test_study_opens_with_an_explainer_and_ends_with_exercises(nb):
    cells = json.loads(nb.read_text())["cells"]
    text = lambda c: "".join(c["source"])
    assert cells[1]["cell_type"] == "markdown" and text(cells[1]).startswith(MARK), "second cell: the course explainer"
    for part in ("What this notebook reproduces", "can show", "cannot show"):
        assert part in text(cells[1]), part
    i = next(i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and "## Exercises" in text(c))
    tail = cells[i + 1:]
    questions = [j for j, c in enumerate(tail) if c["cell_type"] == "markdown" and "**Exercise" in text(c)]
    assert len(questions) >= 2
    for j in questions:
        check, answer = tail[j + 1], tail[j + 2]
        assert check["cell_type"] == "code" and "assert" in text(check), "each exercise has a runnable check"
        assert answer["cell_type"] == "markdown" and "<details><summary>Answer</summary>" in text(answer), "answers are folded"


def test_exercise_checks_run():
    "The checks run as written, in order, as a student would run them (nbdev-test runs them in their notebooks too)."
    seen = {}
    for nb in STUDIES:
        cells = json.loads(nb.read_text())["cells"]
        i = next(i for i, c in enumerate(cells) if "## Exercises" in "".join(c["source"]))
        code = "\n".join("".join(c["source"]) for c in cells[i:] if c["cell_type"] == "code")
        seen.setdefault(code, []).append(nb.stem)
    for code, users in seen.items():
        exec(compile(code, f"<exercises of {users[0]}>", "exec"), {})
