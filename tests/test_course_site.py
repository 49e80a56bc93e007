"""`make site`: the course site builds offline, and in headless Chromium every page loads, every figure renders, no internal
link is broken; the lesson pages show their executed outputs, with no stderr (warnings, progress bars) on any page.
The site tests are slow (they build the site); the lesson executor's own test is fast."""
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request

import nbformat
import pytest

from course_browser import ARTIFACTS, REPO, browser, serve


def _build_site_module():
    spec = importlib.util.spec_from_file_location("build_site", REPO / "scripts" / "build_site.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_lesson_is_executed_aside_as_nbdev_test_runs_it():
    "Issue 47 item 5: the executed copy has the outputs of the cells nbdev-test runs, no stderr, and the lesson is not written."
    bs = _build_site_module()
    (REPO / "build").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=REPO / "build") as d:   # inside the checkout: the project's nbdev settings apply
        src = REPO / "build" / d / "lesson.ipynb"
        cells = [nbformat.v4.new_code_cell('print("hello")'),
                 nbformat.v4.new_code_cell('import sys, warnings\nwarnings.warn("clutter")\nprint("bar 50%", file=sys.stderr)\n1 + 1'),
                 nbformat.v4.new_code_cell('#| slow\nraise RuntimeError("a slow cell ran")'),
                 nbformat.v4.new_code_cell('#| eval: false\nraise RuntimeError("an eval: false cell ran")'),
                 nbformat.v4.new_markdown_cell("text")]
        nbformat.write(nbformat.v4.new_notebook(cells=cells), src)
        before = src.read_bytes()
        name, ok, secs, err = bs.execute_lesson(str(src), str(src.with_name("out.ipynb")))
        assert ok and not err and src.read_bytes() == before, err
        got = json.loads(src.with_name("out.ipynb").read_text())["cells"]
        assert "".join(got[0]["outputs"][0]["text"]) == "hello\n"
        assert [o["output_type"] for o in got[1]["outputs"]] == ["execute_result"] and "".join(got[1]["outputs"][0]["data"]["text/plain"]) == "2"
        assert got[2]["outputs"] == [] and got[3]["outputs"] == [] and "".join(got[4]["source"]) == "text"


def test_clean_outputs_drops_stderr_and_progress_widgets():
    bs = _build_site_module()
    outs = [{"output_type": "stream", "name": "stderr", "text": "TqdmWarning: IProgress not found"},
            {"output_type": "stream", "name": "stdout", "text": "kept"},
            {"output_type": "display_data", "data": {bs.WIDGET: {"model_id": "x"}, "text/plain": "HBox()"}, "metadata": {}}]
    assert bs.clean_outputs(outs) == [outs[1]]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs_jupyter", reason="mkdocs-jupyter is in the course extra: pip install -e '.[course]'")
    out = tmp_path_factory.mktemp("site") / "_site"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "build_site.py"), "--out", str(out)],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.mark.slow
def test_site_has_every_lesson_and_study(site):
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    want = {f"{nb.stem}.html" for nb in (REPO / "nbs").glob("*.ipynb")}
    want |= {f"studies/{nb.stem}.html" for nb in (REPO / "nbs" / "studies").glob("*.ipynb")}
    assert want <= pages, f"missing pages: {sorted(want - pages)}"


@pytest.mark.slow
def test_every_page_loads_with_figures_and_links(site):
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                   if p.name != "404.html" and "assets" not in p.parts)
    problems, n_images, checked_links = [], 0, set()
    with serve(site) as base, browser() as page:
        for rel in pages:
            resp = page.goto(f"{base}/{rel}", wait_until="load")
            if resp is None or resp.status != 200:
                problems.append(f"{rel}: HTTP {resp.status if resp else 'no response'}")
                continue
            if not page.locator("article h1, .md-content h1").count():
                problems.append(f"{rel}: no title rendered")
            imgs = page.evaluate("[...document.querySelectorAll('.md-content img')].map(i => [i.src, i.complete && i.naturalWidth > 0])")
            n_images += len(imgs)
            problems += [f"{rel}: figure not rendered: {src[:80]}" for src, ok in imgs if not ok]
            hrefs = page.evaluate("[...document.querySelectorAll('a[href]')].map(a => a.href)")
            for h in hrefs:
                url = urllib.parse.urldefrag(h).url
                if not url.startswith(base) or url in checked_links: continue
                checked_links.add(url)
                try: urllib.request.urlopen(url, timeout=10).close()
                except Exception as e: problems.append(f"{rel}: broken link {url[len(base):]} ({e})")
        page.goto(f"{base}/index.html", wait_until="load")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "site_index.png"), full_page=False)
    assert not problems, "\n".join(problems[:40])
    assert len(pages) >= 60 and checked_links, (len(pages), len(checked_links))
    print(f"{len(pages)} pages, {n_images} figures, {len(checked_links)} internal links checked")


@pytest.mark.slow
def test_lesson_pages_show_outputs_and_no_page_shows_stderr(site):
    """Issue 47 item 5: the lessons' executed outputs are on their pages (before: none of the lesson pages had any; 65 of 92
    lessons print or display something when run); no page shows warnings or progress bars (stderr), only the
    traceback of a cell that failed."""
    lessons = sorted(nb.stem for nb in (REPO / "nbs").glob("*.ipynb"))
    shown = {n: (site / f"{n}.html").read_text(encoding="utf-8").count('<div class="jp-OutputArea-child') for n in lessons}
    with_outputs = [n for n, k in shown.items() if k]
    assert len(with_outputs) >= 0.6 * len(lessons), f"only {len(with_outputs)} of {len(lessons)} lesson pages show outputs"
    assert "02c_data.photos" in with_outputs and "02b_studies" in with_outputs
    stderr = re.compile(r'<div[^>]*data-mime-type="application/vnd\.jupyter\.stderr"[^>]*>\s*<pre>(.*?)</pre>', re.S)
    clutter = []
    for p in site.rglob("*.html"):
        text = p.read_text(encoding="utf-8")
        blocks = [re.sub(r"<[^>]+>", "", b)[:400] for b in stderr.findall(text)]
        if "TqdmWarning" in text or any("Traceback" not in b and "Error" not in b for b in blocks):
            clutter.append(p.relative_to(site).as_posix())
    assert not clutter, f"pages with stderr output (warnings, progress bars): {clutter[:10]}"
