"`make site`: the course site builds offline, and in headless Chromium every page loads, every figure renders, no internal link is broken."
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from course_browser import ARTIFACTS, REPO, browser, serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs_jupyter", reason="mkdocs-jupyter is in the course extra: pip install -e '.[course]'")
    out = tmp_path_factory.mktemp("site") / "_site"
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "build_site.py"), "--out", str(out)],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_site_has_every_lesson_and_study(site):
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    want = {f"{nb.stem}.html" for nb in (REPO / "nbs").glob("*.ipynb")}
    want |= {f"studies/{nb.stem}.html" for nb in (REPO / "nbs" / "studies").glob("*.ipynb")}
    assert want <= pages, f"missing pages: {sorted(want - pages)}"


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
