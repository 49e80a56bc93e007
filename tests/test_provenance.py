"""Provenance evidence (issue 29 item 1): Content Credentials signed and tampered at test time, metadata, JPEG history,
near-duplicates with a reference index, through `analyze` (terminal, --json, report, folder index)."""
import html
import io
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image
from skimage import data as skdata
from typer.testing import CliRunner

pytest.importorskip("c2pa", reason="the provenance extra: pip install -e '.[provenance]'")
pytest.importorskip("imagehash", reason="the provenance extra: pip install -e '.[provenance]'")

from forensicslab.cli import app
from forensicslab.provenance import credentials as C
from forensicslab.provenance.all import (ReferenceIndex, flip_scan_bytes, gather, jpeg_history, read_credentials,
                                         read_metadata, sign_image, throwaway_chain)
from forensicslab.provenance.cli import index_app
from forensicslab.triage import cli as tcli

DETS = ["--detectors", "noise,spectral"]


@pytest.fixture(scope="module")
def chain():
    return throwaway_chain()


def _jpeg(rgb, q=90, **kw) -> bytes:
    b = io.BytesIO(); Image.fromarray(rgb).save(b, "JPEG", quality=q, **kw); return b.getvalue()


@pytest.fixture
def three(tmp_path, chain):
    "A JPEG signed as AI-generated, the same with two pixel-data bytes flipped, and an unsigned JPEG."
    d = tmp_path / "three"; d.mkdir()
    plain = _jpeg(skdata.coffee()[:240, :320])
    signed = sign_image(plain, chain, source_type="trainedAlgorithmicMedia", generator="test-generator")
    (d / "signed.jpg").write_bytes(signed)
    (d / "tampered.jpg").write_bytes(flip_scan_bytes(signed))
    (d / "unsigned.jpg").write_bytes(plain)
    return d


def test_flip_scan_bytes_changes_two_bytes_of_pixel_data(chain):
    signed = sign_image(_jpeg(skdata.coffee()[:64, :64]), chain)
    bad = flip_scan_bytes(signed)
    diff = [i for i, (a, b) in enumerate(zip(signed, bad)) if a != b]
    assert len(bad) == len(signed) and len(diff) == 2 and min(diff) > signed.rfind(b"\xff\xda")


def test_credentials_valid_invalid_absent_trusted(three, chain, tmp_path):
    ok, bad, none = (read_credentials(three / f) for f in ("signed.jpg", "tampered.jpg", "unsigned.jpg"))
    assert (ok.facts["state"], bad.facts["state"], none.status) == ("valid", "invalid", "absent")
    assert [f["code"] for f in bad.facts["failures"]] == ["assertion.dataHash.mismatch"]
    assert ok.facts["signer_trusted"] is False and ok.facts["actions"] == ["c2pa.created"]
    assert ok.facts["claim_generator"] == "test-generator 1" and "c2pa: declares AI-generated (trained algorithmic media)" in ok.flags
    pem = tmp_path / "trust.pem"; pem.write_text(chain["root"])
    t = read_credentials(three / "signed.jpg", trust_anchors=pem)
    assert t.facts["state"] == "trusted" and t.facts["signer_trusted"] is True
    other = tmp_path / "other.pem"; other.write_text(throwaway_chain()["root"])
    assert read_credentials(three / "signed.jpg", trust_anchors=other).facts["state"] == "valid"
    junk = tmp_path / "junk.pem"; junk.write_text("not a certificate")
    with pytest.raises(C.ProvenanceError, match="no PEM certificate"): read_credentials(three / "signed.jpg", trust_anchors=junk)
    with pytest.raises(C.ProvenanceError, match="no such file"): read_credentials(three / "signed.jpg", trust_anchors=tmp_path / "nope.pem")


def test_analyze_json_and_report_show_the_three_states(three, tmp_path):
    "The issue's check: signed, tampered, unsigned through `analyze` -> valid / invalid (data hash) / absent, in --json and the report."
    want = {"signed.jpg": "valid", "tampered.jpg": "invalid", "unsigned.jpg": "absent"}
    for name, state in want.items():
        rep = tmp_path / f"{name}.html"
        r = CliRunner().invoke(app, ["analyze", str(three / name), *DETS, "--json", "--report", str(rep), "--cache", "off"])
        assert r.exit_code == 0, r.output
        rec = json.loads(r.output)
        c2 = rec["provenance"]["c2pa"]
        assert (c2["facts"].get("state") or c2["status"]) == state, name
        assert rec["file"]["sha256"] and rec["file"]["format"] == "JPEG"
        page = rep.read_text()
        if state == "invalid": assert "Content Credentials INVALID: assertion.dataHash.mismatch" in page and "c2pa: invalid (assertion.dataHash.mismatch)" in rec["provenance"]["c2pa"]["flags"]
        if state == "valid": assert "Content Credentials valid (signer not on the trust list)" in page
        if state == "absent": assert "no Content Credentials" in page
    r = CliRunner().invoke(app, ["analyze", str(three / "tampered.jpg"), *DETS, "--report", str(tmp_path / "t.html"), "--cache", "off"])
    assert "provenance: c2pa [present]: Content Credentials INVALID" in r.output
    # a folder: the index's C2PA column and flags
    out = tmp_path / "out"
    rows = tcli.analyze_batch([three], out, detectors=["noise", "spectral"], progress=False)
    assert {r["image"]: r["c2pa"] for r in rows} == want
    idx = (out / "index.html").read_text()
    assert "c2pa: invalid (assertion.dataHash.mismatch)" in idx and "c2pa: declares AI-generated" in idx


def test_trust_option_reaches_the_reader(three, chain, tmp_path):
    pem = tmp_path / "root.pem"; pem.write_text(chain["root"])
    r = CliRunner().invoke(app, ["analyze", str(three / "signed.jpg"), *DETS, "--json", "--trust", str(pem),
                                 "--report", str(tmp_path / "r.html"), "--cache", "off"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["provenance"]["c2pa"]["facts"]["state"] == "trusted"


def test_metadata_hostile_exif_and_processing_flags(tmp_path):
    e = Image.Exif(); e[0x010F] = "Canon"; e[0x0110] = "EOS <b>5D</b>"; e[0x0131] = "<script>alert(1)</script> Photoshop"
    e[0x0132] = "2024:01:02 10:00:00"; e.get_ifd(0x8769)[0x9003] = "2023:05:05 12:00:00"
    (tmp_path / "x.jpg").write_bytes(_jpeg(skdata.chelsea(), 85, exif=e.tobytes()))
    m = read_metadata(tmp_path / "x.jpg")
    assert m.flags[0] == "editor software: <script>alert(1)</script> Photoshop"
    assert any(f.startswith("modified 2024-01-02 10:00 after capture 2023-05-05") for f in m.flags)
    rep = tmp_path / "r.html"
    r = CliRunner().invoke(app, ["analyze", str(tmp_path / "x.jpg"), *DETS, "--report", str(rep), "--cache", "off"])
    assert r.exit_code == 0, r.output
    page = rep.read_text()
    assert "<script>alert" not in page and "<b>5D" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; Photoshop" in page


def test_jpeg_history_quality_and_double_compression(tmp_path):
    photo = skdata.astronaut()
    (tmp_path / "once.jpg").write_bytes(_jpeg(photo, 88))
    first = np.asarray(Image.open(io.BytesIO(_jpeg(photo, 70))).convert("RGB"))
    (tmp_path / "twice.jpg").write_bytes(_jpeg(first, 92))
    once, twice = jpeg_history(tmp_path / "once.jpg"), jpeg_history(tmp_path / "twice.jpg")
    assert (once.facts["quality"], once.facts["ijg_standard"]) == (88, True) and not once.facts["double_compression"]["found"]
    assert twice.facts["quality"] == 92 and twice.facts["double_compression"]["found"]
    assert abs(twice.facts["double_compression"]["first_quality"] - 70) <= 3


def test_missing_extra_is_reported_not_fatal(tmp_path, monkeypatch):
    def missing(name, extra="provenance"): raise ImportError(f"{name} is needed for provenance evidence: pip install 'forensicslab[{extra}]'")
    monkeypatch.setattr(C, "optional_import", missing)
    (tmp_path / "a.jpg").write_bytes(_jpeg(skdata.coffee()[:100, :100]))
    ev = gather(tmp_path / "a.jpg")
    assert ev["c2pa"].status == "unavailable" and "forensicslab[provenance]" in ev["c2pa"].summary and ev["jpeg"].status == "present"


def test_recompressed_crop_found_with_reference(tmp_path):
    "The issue's check: a recompressed crop of a reference image is found with --reference, and the report shows both and the map."
    ref = tmp_path / "ref"; (ref / "sub").mkdir(parents=True)
    Image.fromarray(skdata.astronaut()).save(ref / "sub" / "astronaut.png")
    Image.fromarray(skdata.coffee()).save(ref / "coffee.png")
    Image.fromarray(skdata.rocket()).save(ref / "rocket.jpg", quality=95)
    r = CliRunner().invoke(index_app, ["build", str(ref), "--no-progress"])
    assert r.exit_code == 0 and "3 images indexed" in r.output, r.output
    q = tmp_path / "q"; q.mkdir()
    (q / "crop.jpg").write_bytes(_jpeg(skdata.astronaut()[60:400, 120:470], 75))
    edited = skdata.coffee()[50:350, 100:500].copy(); edited[100:160, 150:230] = (250, 250, 250)
    (q / "edit.jpg").write_bytes(_jpeg(edited, 80))
    (q / "other.jpg").write_bytes(_jpeg(skdata.chelsea(), 85))
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["analyze", str(q), "--out", str(out), *DETS, "--reference", str(ref), "--json", "--cache", "off"])
    assert r.exit_code == 0, r.output
    rows = {x["image"]: x for x in map(json.loads, (l for l in r.output.splitlines() if l.startswith('{"image"')))}
    dup = {k: v["provenance"]["duplicates"] for k, v in rows.items()}
    assert dup["crop.jpg"]["facts"]["reference"] == "sub/astronaut.png" and dup["crop.jpg"]["facts"]["relation"] == ["crop", "recompression"]
    box = dup["crop.jpg"]["facts"]["box_in_reference"]
    assert abs(box[0] - 120) <= 4 and abs(box[1] - 60) <= 4 and abs(box[2] - 470) <= 4 and abs(box[3] - 400) <= 4
    assert dup["edit.jpg"]["facts"]["reference"] == "coffee.png" and "edit" in dup["edit.jpg"]["facts"]["relation"]
    assert dup["other.jpg"]["status"] == "absent"
    page = (out / rows["crop.jpg"]["report"]).read_text()
    assert "crop + recompression of reference sub/astronaut.png" in page and "alt='reference with the matched box'" in page
    assert "alt='difference map'" in page
    assert "crop + recompression of reference sub/astronaut.png" in (out / "index.html").read_text()
    r = CliRunner().invoke(app, ["analyze", str(q), "--reference", str(tmp_path / "nope"), *DETS])
    assert r.exit_code == 2 and "no such folder" in r.output


def test_index_refresh_reuses_unchanged_entries(tmp_path, monkeypatch):
    ref = tmp_path / "ref"; ref.mkdir()
    Image.fromarray(skdata.astronaut()).save(ref / "a.png")
    ReferenceIndex.build(ref).save()
    Image.fromarray(skdata.coffee()).save(ref / "b.png")
    from forensicslab.provenance import duplicates as Dp
    hashed, real = [], Dp.image_hashes
    monkeypatch.setattr(Dp, "image_hashes", lambda rgb, **kw: hashed.append(rgb.shape) or real(rgb, **kw))
    idx = ReferenceIndex.load(ref)
    assert sorted(e["path"] for e in idx.entries) == ["a.png", "b.png"] and hashed == [skdata.coffee().shape]


def test_report_provenance_styles_in_chromium(three, tmp_path):
    "The provenance table as a browser lays it out: the status pill and the flags get their rules."
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe: pytest.skip("chromium not installed (bash scripts/ensure-chromium.sh installs Debian's package)")
    rep = tmp_path / "r.html"
    r = CliRunner().invoke(app, ["analyze", str(three / "tampered.jpg"), *DETS, "--report", str(rep), "--cache", "off"])
    assert r.exit_code == 0, r.output
    probe = """<script>
    const css = (sel, ...props) => { const e = document.querySelector(sel); if (!e) return null;
      const s = getComputedStyle(e); return Object.fromEntries(props.map(p => [p, s.getPropertyValue(p)])); };
    document.body.insertAdjacentHTML("beforeend", "<pre id='computed'>" + JSON.stringify({
      pill: css(".pill.present", "background-color", "border-radius"), flag: css(".flag", "background-color", "display"),
      hash: css(".hash", "word-break"), thumb: css(".file img", "width"), banner: css(".banner", "font-weight", "display")}) + "</pre>");
    </script>"""
    probed = tmp_path / "probed.html"
    probed.write_text(rep.read_text().replace("</body>", probe + "</body>"))
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=2000",
           "--dump-dom", probed.resolve().as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    m = re.search(r"<pre id=\"computed\">(.*?)</pre>", p.stdout, re.S)
    assert m, p.stderr[-2000:]
    s = json.loads(html.unescape(m.group(1)))
    assert s["pill"] == {"background-color": "rgb(228, 236, 251)", "border-radius": "10px"}, s
    assert s["flag"] == {"background-color": "rgb(255, 240, 217)", "display": "inline-block"}, s
    assert s["hash"] == {"word-break": "break-all"} and s["thumb"] == {"width": "160px"}
    assert s["banner"] == {"font-weight": "700", "display": "inline-block"}
