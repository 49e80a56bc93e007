"""Build the course as a static site, offline: `python scripts/build_site.py [--out _site]` (what `make site` runs).

Why mkdocs + mkdocs-jupyter + mkdocs-material: all three are pure-Python wheels that install and build with no network
(nbdev's own site needs Quarto, whose binary is downloaded at install time; Jupyter Book 2 runs on Node's mystmd and
fetches its theme). The lesson pages are the notebooks of nbs/ with their outputs: each lesson is executed as
`nbdev-test` runs it (its folder as working directory, the cells nbdev-test runs, `slow`/`gpu`/`network` ones left
out) into an executed copy under build/site-lessons/ (git-ignored; nbs/ is never written), reused while the lesson and
the package source are unchanged. For every study the page is the executed notebook of its reference run in
outputs/<study>/ when there is one (figures included), else the study notebook itself. On every page stderr streams
(warnings, progress bars) are dropped. Links between notebooks are rewritten from .ipynb to the rendered .html pages;
the navigation follows the course table of nbs/index.ipynb.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
LINK = re.compile(r"\]\((?![a-z]+:|/|#)([^)#]+)\.ipynb(#[^)]*)?\)")
IMAGE = re.compile(r"(!\[[^\]]*\]\()(?![a-z]+:|/|#)([^)\s]+\.(?:png|jpe?g|gif|svg))(\))")
LESSONS_BUILD = ROOT / "build" / "site-lessons"
WIDGET = "application/vnd.jupyter.widget-view+json"


def clean_outputs(outputs: list) -> list:
    "A cell's outputs without stderr streams (warnings, tqdm bars) and without progress-bar widgets."
    keep = []
    for o in outputs:
        if o.get("output_type") == "stream" and o.get("name") == "stderr": continue
        data = o.get("data") or {}
        if WIDGET in data: continue
        keep.append(o)
    return keep


def _source_key() -> str:
    "A hash of the package source and the nbdev settings: an executed lesson is reused only while they are unchanged."
    h = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    for f in sorted((ROOT / "forensicslab").rglob("*")):
        if f.is_file() and f.suffix in (".py", ".yaml", ".json") and "__pycache__" not in f.parts:
            h.update(f.relative_to(ROOT).as_posix().encode()); h.update(f.read_bytes())
    return h.hexdigest()


def execute_lesson(src: str, dest: str) -> tuple[str, bool, float, str]:
    """Execute lesson `src` as nbdev-test does (working directory its folder, `IN_TEST=1`, the cells `nbdev.test.nb_test_cells`
    selects with the project's `tst_flags` skipped) and write the notebook with those cells' outputs to `dest`; `src` is
    only read. Returns (name, ok, seconds, error); a failed lesson keeps the outputs of the cells before the failure."""
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory
    from nbdev.config import get_config
    from nbdev.process import NBProcessor
    from nbdev.test import nb_test_cells
    fn, t0 = Path(src), time.time()
    cfg = get_config(fn.parent)
    flags = cfg.tst_flags.split() if isinstance(cfg.tst_flags, str) else list(cfg.tst_flags or [])
    nb = NBProcessor(fn, rm_directives=False, process=True).nb
    run = {c.get("id") for c in nb_test_cells(fn, skip_flags=flags)}
    os.environ["IN_TEST"] = "1"
    shell, ok, err = CaptureShell(fn, profile=bool(cfg.get("exec_profile", False))), True, ""
    try:
        with working_directory(fn.parent):
            shell.run_all(nb, exc_stop=True, preproc=lambda c: c.get("id") not in run, cell_timeout=int(cfg.get("cell_timeout", 600)))
    except Exception as e:
        ok, err = False, " ".join(f"{type(e).__name__}: {e}".split())[:300]
    executed = {c.get("id"): c for c in nb.cells}
    raw = json.loads(fn.read_text(encoding="utf-8"))
    for c in raw["cells"]:
        e = executed.get(c.get("id"))
        if c["cell_type"] == "code" and e is not None:
            c["outputs"] = clean_outputs([dict(o) for o in e.get("outputs", [])])
            c["execution_count"] = e.get("execution_count")
    Path(dest).write_text(json.dumps(raw, indent=1), encoding="utf-8")
    return fn.name, ok, time.time() - t0, err


def executed_lessons(lessons: list[Path], workers: int = 2, cache: Path = LESSONS_BUILD, log=print) -> dict[str, Path]:
    """The executed copy of every lesson (`execute_lesson`), from `cache` where the lesson's bytes and the package source
    are unchanged, else executed there now, `workers` at a time. A lesson that fails is still shown, with the outputs
    it had before the failure, and named in the log."""
    cache.mkdir(parents=True, exist_ok=True)
    code, out, todo = _source_key(), {}, []
    for nb in lessons:
        key = hashlib.sha256(nb.read_bytes() + code.encode()).hexdigest()
        dest, mark = cache / nb.name, cache / f"{nb.stem}.key"
        out[nb.name] = dest
        if not (dest.is_file() and mark.is_file() and mark.read_text() == key): todo.append((nb, dest, mark, key))
    if not todo: return out
    t0 = time.time()
    log(f"executing {len(todo)} of {len(lessons)} lessons ({workers} at a time) into {cache.relative_to(ROOT)}/ ...")
    def one(item):
        nb, dest, mark, key = item
        mark.unlink(missing_ok=True); dest.unlink(missing_ok=True)
        r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--execute-lesson", str(nb), str(dest)],
                           capture_output=True, text=True, cwd=ROOT)
        try: _, ok, _, err = json.loads(r.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError): ok, err = False, " ".join((r.stderr or f"exit {r.returncode}").split()[-40:])
        if ok: mark.write_text(key)
        return nb, dest, ok, err
    failed = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:   # one fresh process per lesson, as a kernel would be
        for nb, dest, ok, err in pool.map(one, todo):
            if ok: continue
            failed.append(f"{nb.name}: {err}")
            if not dest.is_file(): out.pop(nb.name)   # nothing executed: the page shows the lesson as it is
    log(f"executed {len(todo)} lessons in {time.time() - t0:.0f} s" + (f"; {len(failed)} stopped early (shown with the outputs "
        f"they had): " + "; ".join(failed) if failed else ""))
    return out


def _rewrite_links(nb: dict) -> dict:
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            c["source"] = LINK.sub(lambda m: f"]({m.group(1)}.html{m.group(2) or ''})", src)
    return nb


def _local_images(nb: dict, src_dir: Path, page_dir: Path, docs: Path) -> None:
    "Images a markdown cell links by a relative path (e.g. ../outputs/bench/x.jpg): copied under docs/_files/, link rewritten."
    def fix(m):
        f = (src_dir / m.group(2)).resolve()
        if not f.is_file() or not f.is_relative_to(ROOT): return m.group(0)
        dst = docs / "_files" / f.relative_to(ROOT)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dst)
        return f"{m.group(1)}{Path(os.path.relpath(dst, page_dir)).as_posix()}{m.group(3)}"
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            c["source"] = IMAGE.sub(fix, "".join(c["source"]) if isinstance(c["source"], list) else c["source"])


def _reference_figures(nb: dict, study: str, page_dir: Path, docs: Path) -> None:
    "Append the figures of a study's reference run (outputs/<study>/*.png) to its page, with their captions."
    figs = sorted((ROOT / "outputs" / study).glob("*.png"))
    if not figs: return
    lines = ["## Figures of the reference run", "", f"The PNG figures in `outputs/{study}/`, as `make demo` wrote them.", ""]
    for f in figs:
        dst = docs / "_files" / f.relative_to(ROOT)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dst)
        cap = f.with_suffix(".caption.txt")
        lines += [f"![{f.stem}]({Path(os.path.relpath(dst, page_dir)).as_posix()})", "",
                  f"*{cap.read_text().strip() if cap.is_file() else f.name}*", ""]
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "\n".join(lines)})


def _copy_nb(src: Path, dst: Path, docs: Path, source_dir: Path, study: str | None = None) -> None:
    nb = json.loads(src.read_text(encoding="utf-8"))
    for c in nb["cells"]:
        if c["cell_type"] == "code": c["outputs"] = clean_outputs(c.get("outputs", []))
    nb.setdefault("metadata", {}).setdefault("kernelspec", {"name": "python3", "display_name": "python3", "language": "python"})
    dst.parent.mkdir(parents=True, exist_ok=True)
    _local_images(nb, source_dir, dst.parent, docs)
    if study: _reference_figures(nb, study, dst.parent, docs)
    dst.write_text(json.dumps(_rewrite_links(nb), indent=1), encoding="utf-8")


def course_nav(index: Path = NBS / "index.ipynb") -> list:
    "The site navigation: Home, then one section per course part with its lessons, from the index's course tables."
    nav, part = [{"Home": "index.ipynb"}], None
    for c in json.loads(index.read_text())["cells"]:
        if c["cell_type"] != "markdown": continue
        for line in "".join(c["source"]).splitlines():
            if line.startswith("### Part"):
                part = {line[4:].strip(): []}
                nav.append(part)
            m = re.match(r"\| \[([^\]]+)\]\(([^)]+\.ipynb)\)", line)
            if m and part is not None:
                next(iter(part.values())).append({m.group(1).replace("`", ""): m.group(2)})
    return nav


def assemble(docs: Path, execute: bool = True, workers: int = 2) -> list[str]:
    "Copy the pages into `docs` (the lessons executed, unless `execute` is False); returns the page paths (relative to docs)."
    pages, lessons = [], sorted(NBS.glob("*.ipynb"))
    executed = executed_lessons(lessons, workers) if execute else {}
    for nb in lessons:
        _copy_nb(executed.get(nb.name, nb), docs / nb.name, docs, NBS)
        pages.append(nb.name)
    for nb in sorted((NBS / "studies").glob("*.ipynb")):
        executed = ROOT / "outputs" / nb.stem / f"{nb.stem}.ipynb"
        _copy_nb(executed if executed.is_file() else nb, docs / "studies" / nb.name, docs, NBS / "studies", nb.stem)
        pages.append(f"studies/{nb.name}")
    return pages


def write_config(docs: Path, site: Path, path: Path) -> Path:
    cfg = {
        "site_name": "forensicslab: a course on agentic image forensics",
        "docs_dir": str(docs), "site_dir": str(site), "use_directory_urls": False,
        "theme": {"name": "material", "font": False, "features": ["navigation.sections", "navigation.indexes"]},
        "plugins": [{"search": {}}, {"mkdocs-jupyter": {"execute": False, "include_source": True,
                                                         "ignore_h1_titles": True, "include_requirejs": False}}],
        "nav": course_nav(),
        "markdown_extensions": ["tables", "admonition", "pymdownx.details", "pymdownx.superfences"],
    }
    import yaml
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def build(out: Path = ROOT / "_site", execute: bool = True, workers: int = 2) -> Path:
    "Assemble the pages (`assemble`) and run `mkdocs build`; returns the site folder."
    with tempfile.TemporaryDirectory(prefix="forensicslab-site-") as tmp:
        docs = Path(tmp) / "docs"
        assemble(docs, execute, workers)
        cfg = write_config(docs, out, Path(tmp) / "mkdocs.yml")
        if out.exists(): shutil.rmtree(out)
        exe = Path(sys.executable).parent / "mkdocs"
        r = subprocess.run([str(exe) if exe.exists() else "mkdocs", "build", "-f", str(cfg), "-q"],
                           capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"mkdocs build failed:\n{r.stdout}\n{r.stderr}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "_site")
    ap.add_argument("--no-execute", action="store_true", help="render the lessons as they are in nbs/ (no outputs), not executed")
    ap.add_argument("--workers", type=int, default=2, help="lessons executed at a time (default 2)")
    ap.add_argument("--execute-lesson", nargs=2, metavar=("SRC", "DEST"), help="(internal) execute one lesson into DEST")
    a = ap.parse_args()
    if a.execute_lesson:
        res = execute_lesson(*a.execute_lesson)
        print(json.dumps(res))
        sys.exit(0 if res[1] else 1)
    t0 = time.time()
    site = build(a.out.resolve(), execute=not a.no_execute, workers=a.workers)
    print(f"course site: {site / 'index.html'} ({sum(1 for _ in site.rglob('*.html'))} pages) in {time.time() - t0:.0f} s")
