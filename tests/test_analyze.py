"""`forensicslab analyze` over folders: results that never mix (issue 32 item 1), the folder index (issue 29 item 3),
hostile names and EXIF opened in headless Chromium, progress and resume."""
import base64
import hashlib
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image
from skimage import data as skdata
from typer.testing import CliRunner

from forensicslab.cli import app
from forensicslab.runs import StopRun
from forensicslab.triage import cli as tcli

DETS = ["--detectors", "noise,spectral"]


def _folder(root: Path) -> Path:
    (root / "in" / "sub").mkdir(parents=True)
    Image.fromarray(skdata.coffee()[:200, :300]).save(root / "in" / "a.png")
    Image.fromarray(skdata.chelsea()[:200, :300]).save(root / "in" / "sub" / "b.jpg")
    return root / "in"


def _verdict_in_report(page: str) -> str:
    m = re.search(r"<div class=\"banner (manip|auth|fail)\">", page)
    return {"manip": "manipulated", "auth": "authentic", "fail": "failed"}[m.group(1)]


def test_analyze_batch_over_folders(tmp_path):
    "Moved from test_triage: a folder with a sub-folder, --json lines, the index linking each report, CSV and JSON of the same rows."
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["analyze", str(_folder(tmp_path)), "--out", str(out), "--detectors", "noise", "--detectors", "spectral", "--json"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.output.splitlines() if x.startswith('{"image"')]
    assert [x["image"] for x in lines] == ["a.png", "sub/b.jpg"] and all(x["verdict"] in ("authentic", "manipulated") for x in lines)
    assert set(lines[0]["record"]["audits"]) == {"noise", "spectral"} and len(lines[0]["sha256"]) == 64
    assert set(lines[1]["provenance"]) == {"c2pa", "metadata", "jpeg"} and lines[1]["provenance"]["jpeg"]["status"] == "present"
    index = (out / "index.html").read_text()
    assert index.count("<a href='reports/") == 2 and all((out / x["report"]).is_file() for x in lines)
    csv_rows = (out / "results.csv").read_text().splitlines()
    assert len(csv_rows) == 3 and csv_rows[0].endswith("score:noise,score:spectral")
    js = json.loads((out / "results.json").read_text())
    assert [x["image"] for x in js["rows"]] == ["a.png", "sub/b.jpg"] and js["about"]["configuration"].endswith("(rules)")


def test_two_configurations_into_one_out_never_mix(tmp_path):
    "Issue 32 item 1: a second configuration into the same --out is refused with one line; every index row agrees with the report it links."
    src, out = _folder(tmp_path), tmp_path / "out"
    r1 = CliRunner().invoke(app, ["analyze", str(src), "--out", str(out), "--config", "fusion", *DETS, "--cache", "off"])
    assert r1.exit_code == 0, r1.output
    r2 = CliRunner().invoke(app, ["analyze", str(src), "--out", str(out), "--config", "rules", *DETS, "--cache", "off"])
    assert r2.exit_code == 2 and "holds the results of another configuration" in r2.output and "Traceback" not in r2.output
    rows = json.loads((out / "results.json").read_text())["rows"]
    for row in rows:
        assert _verdict_in_report((out / row["report"]).read_text()) == row["verdict"], row["image"]
        assert "configuration <b>fusion</b>" in (out / row["report"]).read_text()
    # another detector pool is another identity too
    r3 = CliRunner().invoke(app, ["analyze", str(src), "--out", str(out), "--config", "fusion", "--detectors", "noise", "--cache", "off"])
    assert r3.exit_code == 2 and "another configuration" in r3.output


def test_file_added_then_resumed_keeps_reports_with_their_images(tmp_path):
    "Issue 32 item 1: report names come from the relative path and the content, so a file added before others never takes their report."
    src, out = _folder(tmp_path), tmp_path / "out"
    first = tcli.analyze_batch([src], out, detectors=["noise", "spectral"], progress=False)
    (src / "0new").mkdir()
    Image.fromarray(skdata.astronaut()[:200, :300]).save(src / "0new" / "b.jpg")   # same file name as sub/b.jpg
    second = tcli.analyze_batch([src], out, detectors=["noise", "spectral"], progress=False)
    by = {r["image"]: r for r in second}
    assert set(by) == {"a.png", "sub/b.jpg", "0new/b.jpg"}
    assert {r["image"]: r["report"] for r in first} == {k: by[k]["report"] for k in ("a.png", "sub/b.jpg")}
    for name, row in by.items():      # each linked report is the report of that image
        assert f"Triage case report: {html.escape(name)}" in (out / row["report"]).read_text()
    idx = (out / "index.html").read_text()
    assert idx.count("<a href='reports/") == 3
    # a file edited in place is analysed again (its content hash changed)
    Image.fromarray(skdata.rocket()[:200, :300]).save(src / "a.png")
    third = {r["image"]: r for r in tcli.analyze_batch([src], out, detectors=["noise", "spectral"], progress=False)}
    assert third["a.png"]["sha256"] != by["a.png"]["sha256"] and third["a.png"]["report"] != by["a.png"]["report"]


def test_early_stop_still_writes_index_and_csv(tmp_path, monkeypatch):
    "A budget stop (StopRun) after the first image: index, CSV and JSON list the finished row and say the run stopped; a re-run resumes."
    src, out = _folder(tmp_path), tmp_path / "out"
    real, calls = tcli.analyze_image, []
    def stop_on_second(*a, **kw):
        calls.append(a[0])
        if len(calls) == 2: raise StopRun("token budget spent")
        return real(*a, **kw)
    monkeypatch.setattr(tcli, "analyze_image", stop_on_second)
    with pytest.raises(StopRun): tcli.analyze_batch([src], out, detectors=["noise", "spectral"], progress=False)
    assert len((out / "results.csv").read_text().splitlines()) == 2
    assert "The run stopped early" in (out / "index.html").read_text() and len(json.loads((out / "results.json").read_text())["rows"]) == 1
    monkeypatch.setattr(tcli, "analyze_image", real)
    rows = tcli.analyze_batch([src], out, detectors=["noise", "spectral"], progress=False)
    assert len(rows) == 2 and "stopped early" not in (out / "index.html").read_text()


def test_failed_report_write_is_retried_on_resume(tmp_path, monkeypatch):
    src, out = _folder(tmp_path), tmp_path / "out"
    real = tcli.write_case_report
    def fail(*a, **kw): raise OSError(28, "No space left on device")
    monkeypatch.setattr(tcli, "write_case_report", fail)
    rows = tcli.analyze_batch([src], out, detectors=["noise", "spectral"], progress=False)
    assert all("report not written: No space left on device" in r["failure"] and r["report"] is None for r in rows)
    monkeypatch.setattr(tcli, "write_case_report", real)
    rows = tcli.analyze_batch([src], out, detectors=["noise", "spectral"], progress=False)
    assert all(r["failure"] is None and (out / r["report"]).is_file() for r in rows)


def test_traces_name_the_image(tmp_path, monkeypatch):
    "Every model call of a folder run is made inside chat_context(case=<relative name>), which the traces record."
    from forensicslab.chat.models import current_context
    seen, real = [], tcli.analyze_image
    def spy(*a, **kw):
        seen.append(current_context().get("case"))
        return real(*a, **kw)
    monkeypatch.setattr(tcli, "analyze_image", spy)
    tcli.analyze_batch([_folder(tmp_path)], tmp_path / "out", detectors=["noise"], progress=False, provenance=False)
    assert seen == ["a.png", "sub/b.jpg"]


def test_inputs_named_and_skipped(tmp_path):
    "`analyze dir.jpg` names the folder; dangling links, links to folders and folders named like images are listed."
    (tmp_path / "dir.jpg").mkdir()
    r = CliRunner().invoke(app, ["analyze", str(tmp_path / "dir.jpg")])
    assert r.exit_code == 2 and f"no images found in {tmp_path / 'dir.jpg'}" in r.output
    src = _folder(tmp_path)
    (src / "gone.jpg").symlink_to(tmp_path / "missing.jpg"); (src / "loop").symlink_to(src); (src / "x.png").mkdir()
    r = CliRunner().invoke(app, ["analyze", str(src), "--out", str(tmp_path / "o"), *DETS, "--no-provenance"])
    assert r.exit_code == 0, r.output
    assert "skipped gone.jpg: a dangling link (or a link loop)" in r.output and "skipped loop: a link to a folder" in r.output
    assert "skipped x.png: a folder named like an image" in r.output
    assert "gone.jpg (a dangling link (or a link loop))" in (tmp_path / "o" / "index.html").read_text()


# ------------------------------------------------------------------ the index in a browser
def _chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe: pytest.skip("chromium not installed (bash scripts/ensure-chromium.sh installs Debian's package)")
    return exe


def _dump(page: Path, tmp_path: Path) -> str:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
           "--allow-file-access-from-files", "--virtual-time-budget=3000", "--dump-dom", page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout


HOSTILE = "<img src=x onerror=document.title='PWNED'> #1 ?q=%41.png"


def test_index_in_chromium_hostile_names_sort_filter(tmp_path):
    "Hostile file names and EXIF run nothing; links with # ? % resolve; the banner is styled; thumbnails load; sort and filter work."
    src = _folder(tmp_path)
    ex = Image.Exif(); ex[0x0131] = "<script>document.title='PWNED'</script>"
    Image.fromarray(skdata.astronaut()[:200, :300]).save(src / HOSTILE, format="PNG")
    Image.fromarray(skdata.rocket()[:200, :300]).save(src / "exif.jpg", exif=ex.tobytes())
    out = tmp_path / "out"
    rows = tcli.analyze_batch([src], out, detectors=["noise", "spectral"], progress=False)
    names = {r["image"] for r in rows}
    assert HOSTILE in names
    idx = (out / "index.html").read_text()
    assert "<img src=x" not in idx and "<script>document" not in idx and idx.count("<script>") == 1
    for r in rows:                                   # every href, URL-decoded, names an existing report
        assert (out / r["report"]).is_file()
    for href in re.findall(r"href='(reports/[^']+)'", idx):
        from urllib.parse import unquote
        assert (out / unquote(html.unescape(href))).is_file(), href
    exif_report = (out / next(r["report"] for r in rows if r["image"] == "exif.jpg")).read_text()
    assert "<script>document" not in exif_report and "&lt;script&gt;document.title" in exif_report
    # the page as shipped (its content-security policy kept, the probe's hash added to it): the payloads are inert text
    # (no element made from them), sorting and filtering work, the banner is styled and the thumbnails load
    probe_js = """
    const rows = () => Array.from(document.querySelectorAll('#rows tbody tr'));
    const th = Array.from(document.querySelectorAll('#rows thead th')).find(t => t.textContent === 'noise');
    th.click(); const asc = rows().map(r => parseFloat(r.cells[th.cellIndex].dataset.v));
    th.click(); const desc = rows().map(r => parseFloat(r.cells[th.cellIndex].dataset.v));
    const q = document.getElementById('q'); q.value = 'exif'; q.dispatchEvent(new Event('input'));
    const shown = rows().filter(r => !r.hidden).map(r => r.cells[1].textContent);
    const b = getComputedStyle(document.querySelector('.banner'));
    setTimeout(() => { document.body.insertAdjacentHTML('beforeend', "<pre id='probe'>" + JSON.stringify({asc, desc, shown,
      title: document.title, injected: document.querySelectorAll('img[onerror], #rows script').length,
      thumbs: Array.from(document.querySelectorAll('img.t')).map(i => i.naturalWidth),
      banner: [b.getPropertyValue('background-color'), b.getPropertyValue('border-radius')]}) + "</pre>"); }, 500);
    """
    digest = base64.b64encode(hashlib.sha256(probe_js.encode()).digest()).decode()
    probed = out / "probed.html"
    page = idx.replace("script-src 'sha256-", f"script-src 'sha256-{digest}' 'sha256-", 1)
    assert page != idx
    probed.write_text(page.replace("</body>", f"<script>{probe_js}</script></body>"))
    dom = _dump(probed, tmp_path)
    m = re.search(r"<pre id=\"probe\">(.*?)</pre>", dom, re.S)
    assert m, dom[-2000:]
    s = json.loads(html.unescape(m.group(1)))
    assert s["title"].startswith("forensicslab analyze") and s["injected"] == 0
    assert s["asc"] == sorted(s["asc"]) and s["desc"] == sorted(s["desc"], reverse=True) and len(s["asc"]) == 4
    assert s["shown"] == ["exif.jpg"]
    assert s["banner"] == ["rgb(238, 243, 251)", "6px"] and len(s["thumbs"]) == 4 and all(w > 0 for w in s["thumbs"])


@pytest.mark.slow
def test_real_photos_stopped_and_resumed(tmp_path, monkeypatch):
    "The real photographs of ../shared/data (linked, never copied): stopped half-way, resumed; every image once, each report its own."
    from conftest import SHARED_DATA
    photos = sorted(p for p in SHARED_DATA.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png")
                    and "_gt" not in p.name) if SHARED_DATA.is_dir() else []
    if len(photos) < 20: pytest.skip("needs ../shared/data with real photographs")
    src = tmp_path / "in"
    for p in photos:
        (src / p.parent.name).mkdir(parents=True, exist_ok=True)
        (src / p.parent.name / p.name).symlink_to(p)
    out, real, n = tmp_path / "out", tcli.analyze_image, []
    def stop_half(*a, **kw):
        n.append(1)
        if len(n) > len(photos) // 2: raise StopRun("stopped for the test")
        return real(*a, **kw)
    monkeypatch.setattr(tcli, "analyze_image", stop_half)
    with pytest.raises(StopRun): tcli.analyze_batch([src], out, detectors=["noise", "spectral"], progress=False)
    assert len(json.loads((out / "results.json").read_text())["rows"]) == len(photos) // 2
    monkeypatch.setattr(tcli, "analyze_image", real)
    rows = tcli.analyze_batch([src], out, detectors=["noise", "spectral"], progress=False)
    assert sorted(r["image"] for r in rows) == sorted(f"{p.parent.name}/{p.name}" for p in photos)
    for r in rows:
        assert f"Triage case report: {html.escape(r['image'])}" in (out / r["report"]).read_text()


# ------------------------------------------------------------------ folder runs that never destroy or mix (#47 item 4, #49 defects 6-8)
def _small(path: Path, seed: int = 0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(skdata.coffee()[seed * 10:seed * 10 + 96, :128]).save(path)
    return path


def test_walk_skips_masks_and_the_labs_own_outputs(tmp_path):
    "CASIA-style masks are not photos; an --out inside the input folder is left out of the walk, so a rerun analyses the same images."
    src = _folder(tmp_path)
    for name in ("a_gt.png", "sub/b_mask.png", "c_mask_2.png", "D_GT.PNG"): _small(src / name)
    out = src / "runs"                    # inside the input folder
    for attempt in range(2):
        r = CliRunner().invoke(app, ["analyze", str(src), "--out", str(out), *DETS, "--no-provenance", "--cache", "off"])
        assert r.exit_code == 0, r.output
        assert "2 images, 0 failed" in r.output, (attempt, r.output)
    assert "skipped a_gt.png: a mask or ground-truth file" in r.output and "skipped 1 more: a mask" in r.output
    assert f"skipped {out.name}: forensicslab's own output" in r.output
    assert sorted(x["image"] for x in json.loads((out / "results.json").read_text())["rows"]) == ["a.png", "sub/b.jpg"]
    # a run folder given as the input is not analysed either; a mask named on the command line is
    r = CliRunner().invoke(app, ["analyze", str(out), *DETS])
    assert r.exit_code == 2 and "forensicslab's own output" in r.output
    r = CliRunner().invoke(app, ["analyze", str(src / "a_gt.png"), *DETS, "--report", str(tmp_path / "gt.html"), "--no-provenance"])
    assert r.exit_code == 0 and (tmp_path / "gt.html").is_file(), r.output


def test_out_that_holds_someone_elses_files_or_an_input_is_refused(tmp_path):
    "#49 defect 7: an --out holding files the lab did not write (index.html, results.csv) is refused, and they stay as they were."
    src = _folder(tmp_path)
    theirs = tmp_path / "theirs"; theirs.mkdir()
    (theirs / "index.html").write_text("my page"); (theirs / "results.csv").write_text("my,data\n")
    r = CliRunner().invoke(app, ["analyze", str(src), "--out", str(theirs), *DETS])
    assert r.exit_code == 2 and "holds files forensicslab did not write (index.html, results.csv)" in r.output, r.output
    assert (theirs / "index.html").read_text() == "my page" and sorted(x.name for x in theirs.iterdir()) == ["index.html", "results.csv"]
    for bad in (src, src / "a.png"):      # the input folder itself, an input file
        r = CliRunner().invoke(app, ["analyze", str(src), "--out", str(bad), *DETS])
        assert r.exit_code == 2 and "--out" in r.output, r.output
    assert sorted(p.name for p in src.rglob("*")) == ["a.png", "b.jpg", "sub"]


def test_report_that_names_an_input_or_a_foreign_file_is_refused(tmp_path):
    "#47: `analyze img.jpg --report img.jpg` replaced the image with its report (exit 0); now exit 2 and the image is unchanged."
    img = _small(tmp_path / "img.jpg")
    before = img.read_bytes()
    r = CliRunner().invoke(app, ["analyze", str(img), *DETS, "--report", str(img)])
    assert r.exit_code == 2 and "is the image being analysed" in r.output and img.read_bytes() == before, r.output
    notes = tmp_path / "notes.html"; notes.write_text("<p>mine</p>")
    r = CliRunner().invoke(app, ["analyze", str(img), *DETS, "--report", str(notes)])
    assert r.exit_code == 2 and "did not write" in r.output and notes.read_text() == "<p>mine</p>"
    r = CliRunner().invoke(app, ["analyze", str(img), str(img), *DETS, "--report", str(tmp_path / "x.html")])
    assert r.exit_code == 2 and "--report names the case report of one image" in r.output
    # two images of one name into one folder: the second report never replaces the first
    other = _small(tmp_path / "b" / "img.jpg", seed=3)
    for p in (img, other):
        r = CliRunner().invoke(app, ["analyze", str(p), *DETS, "--out", str(tmp_path / "o"), "--no-provenance"])
        assert r.exit_code == 0, r.output
    reports = sorted((tmp_path / "o").glob("img*.triage.html"))
    assert len(reports) == 2 and {tcli.report_owner(p) for p in reports} == {hashlib.sha256(p.read_bytes()).hexdigest() for p in (img, other)}


def test_second_run_into_a_folder_resumes_or_refuses(tmp_path, monkeypatch):
    "The same configuration and inputs resume; other inputs into the same --out are refused; the default folder is one per input set."
    a, b = _folder(tmp_path / "A"), _folder(tmp_path / "B")
    out = tmp_path / "out"
    args = [*DETS, "--no-provenance", "--cache", "off"]
    assert CliRunner().invoke(app, ["analyze", str(a), "--out", str(out), *args]).exit_code == 0
    csv_a = (out / "results.csv").read_text()
    r = CliRunner().invoke(app, ["analyze", str(a), "--out", str(out), *args])
    assert r.exit_code == 0 and (out / "results.csv").read_text() == csv_a
    r = CliRunner().invoke(app, ["analyze", str(b), "--out", str(out), *args])
    assert r.exit_code == 2 and "holds the results of other inputs" in r.output and (out / "results.csv").read_text() == csv_a
    monkeypatch.chdir(tmp_path)
    for src in (a, b): assert CliRunner().invoke(app, ["analyze", str(src), *args]).exit_code == 0
    assert len(list((tmp_path / "forensicslab-analyze").glob("*/results.csv"))) == 2


def test_results_csv_escapes_formula_names(tmp_path):
    "#49 defect 6: names that start with = + - @ (or a tab, a CR) reach the CSV with a leading quote (OWASP); JSON and numbers unchanged."
    names = ["=HYPERLINK(1).png", "+1.png", "-2.png", "@SUM(1).png", "\tx.png", "\rx.png", "ok.png"]
    rows = [dict(image=n, verdict="authentic", score=-0.5 if n == "ok.png" else None, region="-left", scores={"noise": -0.25}) for n in names]
    tcli.write_index(tmp_path, rows, "t")
    import csv
    got = list(csv.DictReader(open(tmp_path / "results.csv", newline="", encoding="utf-8")))
    assert [g["image"] for g in got] == ["'" + n for n in names[:-1]] + ["ok.png"]
    assert got[-1]["score"] == "-0.5" and got[-1]["score:noise"] == "-0.25" and got[0]["region"] == "'-left"
    assert [x["image"] for x in json.loads((tmp_path / "results.json").read_text())["rows"]] == names
    # and through the command: a file named like a formula
    src = tmp_path / "in"; _small(src / "=cmd.png"); _small(src / "@x.png", 2)
    r = CliRunner().invoke(app, ["analyze", str(src), "--out", str(tmp_path / "o"), *DETS, "--no-provenance", "--cache", "off"])
    assert r.exit_code == 0, r.output
    assert sorted(g["image"] for g in csv.DictReader(open(tmp_path / "o" / "results.csv", newline="", encoding="utf-8"))) == ["'=cmd.png", "'@x.png"]


@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_signal_mid_run_writes_the_finished_rows(tmp_path, sig, code):
    "#49 defect 8: SIGTERM (or Ctrl-C) mid-run: results.csv and index.html list the finished rows, exit 143 (130), never 134."
    import os
    import signal
    import sys
    import time
    exe = Path(sys.executable).parent / "forensicslab"
    if not exe.exists(): pytest.skip("console script not installed")
    src = tmp_path / "in"
    for i in range(40): _small(src / f"p{i:02d}.png", i % 8)
    out = tmp_path / "out"
    env = dict(os.environ, FORENSICSLAB_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.Popen([str(exe), "analyze", str(src), "--out", str(out), "--detectors", "noise,spectral,copymove", "--no-provenance",
                          "--cache", "off"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # as from a terminal: a suite started
    rows = out / "runs"                                                                         # in the background ignores SIGINT
    t0 = time.time()
    while time.time() - t0 < 240:
        done = sum(len(f.read_text().splitlines()) for f in rows.rglob("rows.jsonl")) if rows.is_dir() else 0
        if done >= 2 or p.poll() is not None: break
        time.sleep(0.2)
    assert p.poll() is None, "the run ended before the signal: make it longer"
    p.send_signal(getattr(signal, sig))
    _, err = p.communicate(timeout=120)
    assert p.returncode == code, (p.returncode, err[-2000:])
    assert "terminate called" not in err and "Traceback" not in err, err[-2000:]
    finished = sum(len(f.read_text().splitlines()) for f in rows.rglob("rows.jsonl"))
    import csv
    assert 2 <= finished < 40 and len(list(csv.DictReader(open(out / "results.csv", encoding="utf-8")))) == finished
    assert "The run stopped early" in (out / "index.html").read_text() and "run the same command again to resume" in err


def test_a_backend_that_stops_answering_stops_the_run(tmp_path):
    "#47 item 3 mid-run: after a case fails, the backend is checked again; a server that is gone stops the run (index written), not one failure per image."
    import socket
    from forensicslab.chat.models import ModelControls
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    dead = f"openai-compatible:http://127.0.0.1:{port}/v1#gone"
    src = tmp_path / "in"
    for i in range(5): _small(src / f"p{i}.png", i)
    out = tmp_path / "out"
    with pytest.raises(tcli.BackendLost, match=f"127.0.0.1:{port} does not answer"):
        tcli.analyze_batch([src], out, config="complete", auditor_backend=dead, judge_backend=dead, detectors=["noise"], progress=False,
                           provenance=False, cache=False, controls=ModelControls.of({"attempts": 1, "cache": "off"}))
    assert len(list((out / "runs").rglob("rows.jsonl"))) <= 1 and "The run stopped early" in (out / "index.html").read_text()
    assert sum(len(f.read_text().splitlines()) for f in (out / "runs").rglob("rows.jsonl")) == 0   # the failed image is retried on resume
