"""After `make demo` in a fresh clone: which committed outputs changed beyond their timing fields?

`make demo` must regenerate every committed file in `outputs/` byte for byte but for timings. This script reads
`git diff` of the clone's `outputs/` against its commit and sorts each changed file:
- CSV: the columns that differ; timing columns (`timing_column`) are allowed;
- JSON (meta files, the benchmark card's data): the paths whose values differ; timing keys (`timing_key`) are allowed;
- Markdown, LaTeX and HTML (tables, captions, reports): the changed lines with every number next to a time unit, and
  every runtime cell, masked; what remains must be equal;
- run records, timings, executed notebooks and figures (`run.json`, `timings.json`, `*.ipynb`, PDF/PNG) carry
  timing, commit or date by design and are listed as such, not compared.
Prints one line per changed file (`ok`, `timing only`, or `CHANGED` with what changed) and exits 1 when a file
changed beyond timing. Run from the clone's root: `python scripts/compare_outputs.py` (optional: a revision to compare
against, default HEAD)."""
import io
import json
import re
import subprocess
import sys

import pandas as pd

BY_DESIGN = re.compile(r"(^|/)(run\.json|timings\.json)$|\.(ipynb|pdf|png|jpg)$")
"Files that record a run's time, commit and date (or embed them, as PDF metadata does): not compared."
_UNIT = re.compile(r"\d[\d,.]*\s*(?:s|ms|min|h|seconds?|minutes?|x)\b|[\d.]+ at the start and [\d.]+ at the end")
_CELL = re.compile(r"<td>[\d.]+</td>")

def timing_column(name: str) -> bool:
    "Whether a CSV column holds measured time (`runtime_s`, `seconds`, `SFT seconds`, `samples/s`, ...)."
    return name.endswith(("_s", " seconds")) or name in {"seconds", "samples/s", "s_per_image"}

def timing_key(key: str) -> bool:
    "Whether a JSON key holds a measured time, a load average or a CPU count of the run rather than a result."
    return key.endswith("_s") or key in {"seconds", "load", "load_avg", "loadavg", "cpu_s", "build_s", "date", "git_commit"}

def git(*args) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout

def csv_changes(old: str, new: str) -> list[str]:
    a, b = pd.read_csv(io.StringIO(old)), pd.read_csv(io.StringIO(new))
    if list(a.columns) != list(b.columns) or len(a) != len(b): return ["shape"]
    return [c for c in a.columns if not a[c].equals(b[c])]

def json_changes(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(set(a) | set(b)) for p in json_changes(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in json_changes(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]

def masked(text: str) -> list[str]:
    return [_CELL.sub("<td>#</td>", _UNIT.sub("#", line)) for line in text.splitlines()]

def compare(path: str, rev: str, tables: dict[str, str] = {}) -> tuple[str, str]:
    """(`ok` | `timing only` | `by design` | `CHANGED`, detail) for one changed file; `tables`: each changed CSV's
    verdict, read by the Markdown and LaTeX tables written from it."""
    if BY_DESIGN.search(path): return "by design", ""
    old, new = git("show", f"{rev}:{path}"), open(path, encoding="utf-8").read()
    if path.endswith(".csv"):
        diff = csv_changes(old, new)
        bad = [c for c in diff if not timing_column(c)]
        return ("CHANGED", f"columns {bad}") if bad else ("timing only", f"columns {diff}")
    if path.endswith(".json"):
        diff = json_changes(json.loads(old), json.loads(new))
        bad = [p for p in diff if not timing_key(re.sub(r"(\[\d+\])+$", "", p).rsplit("/", 1)[-1])]
        return ("CHANGED", f"{len(bad)} values, e.g. {bad[:3]}") if bad else ("timing only", f"{len(diff)} values")
    sibling = re.sub(r"\.(md|tex)$", ".csv", path)
    if sibling != path and sibling in tables:   # a table written from its CSV: the rows are judged there
        row = (lambda l: l.startswith("|")) if path.endswith(".md") else (lambda l: "&" in l)
        old, new = ("\n".join(l for l in t.splitlines() if not row(l)) for t in (old, new))
        if tables[sibling] == "CHANGED": return "CHANGED", f"its table, see {sibling}"
    a, b = masked(old), masked(new)
    if a == b: return "timing only", ""
    first = next(i for i, (x, y) in enumerate(zip(a + [""], b + [""])) if x != y)
    return "CHANGED", f"line {first + 1}: {b[first][:160] if first < len(b) else '(removed)'}"

if __name__ == "__main__":
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    files = [f for f in git("diff", "--name-only", rev, "--", "outputs").split() if f]
    new_files = [f for f in git("ls-files", "--others", "--exclude-standard", "--", "outputs").split() if f]
    csvs = {f: compare(f, rev) for f in files if f.endswith(".csv")}   # first: the tables written from them read these
    results = [(f, *(csvs.get(f) or compare(f, rev, {c: r[0] for c, r in csvs.items()}))) for f in files]
    for f, status, detail in results: print(f"{status:12s} {f} {detail}".rstrip())
    for f in new_files: print(f"{'NEW':12s} {f}")
    bad = [f for f, s, _ in results if s == "CHANGED"]
    print(f"{len(files)} changed files, {len(bad)} beyond timing; {len(new_files)} new files")
    sys.exit(1 if bad else 0)
