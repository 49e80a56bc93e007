"""Build the course as a static site, offline: `python scripts/build_site.py [--out _site]` (what `make site` runs).

Why mkdocs + mkdocs-jupyter + mkdocs-material: all three are pure-Python wheels that install and build with no network
(nbdev's own site needs Quarto, whose binary is downloaded at install time; Jupyter Book 2 runs on Node's mystmd and
fetches its theme). The pages are the lesson notebooks as they are in nbs/ (with their stored outputs) and, for every
study, the executed notebook of its reference run in outputs/<study>/ when there is one (figures included), else the
study notebook itself. Links between notebooks are rewritten from .ipynb to the rendered .html pages; the navigation
follows the course table of nbs/index.ipynb.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
LINK = re.compile(r"\]\((?![a-z]+:|/|#)([^)#]+)\.ipynb(#[^)]*)?\)")
IMAGE = re.compile(r"(!\[[^\]]*\]\()(?![a-z]+:|/|#)([^)\s]+\.(?:png|jpe?g|gif|svg))(\))")


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


def assemble(docs: Path) -> list[str]:
    "Copy the pages into `docs`; returns the page paths (relative to docs)."
    pages = []
    for nb in sorted(NBS.glob("*.ipynb")):
        _copy_nb(nb, docs / nb.name, docs, NBS)
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


def build(out: Path = ROOT / "_site") -> Path:
    "Assemble the pages and run `mkdocs build`; returns the site folder."
    with tempfile.TemporaryDirectory(prefix="forensicslab-site-") as tmp:
        docs = Path(tmp) / "docs"
        assemble(docs)
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
    site = build(ap.parse_args().out.resolve())
    print(f"course site: {site / 'index.html'} ({sum(1 for _ in site.rglob('*.html'))} pages)")
