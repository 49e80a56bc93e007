"""Issue 49: Stage 0 as one named record passed to every configuration, one runner type for every configuration, the
configurations in their own module; and defect 5 (a `[1, 2]` line in `rows.jsonl`, `serve-detector --port 99999`)."""
import json
from pathlib import Path

import numpy as np
from PIL import Image

from forensicslab.cli import main


def _cli(argv, capsys) -> tuple[int, str]:
    "Run the console entry point as a user does: (exit code, stderr)."
    try: main(argv)
    except SystemExit as e: return e.code or 0, capsys.readouterr().err
    return 0, capsys.readouterr().err


def _images(root: Path) -> Path:
    (root / "imgs").mkdir()
    for i in range(2):
        Image.fromarray((np.random.default_rng(i).random((64, 64, 3)) * 255).astype(np.uint8)).save(root / "imgs" / f"{i}.png")
    return root / "imgs"


# ---------- defect 5 ----------

def test_analyze_resumes_past_a_json_line_that_is_not_a_row(tmp_path, capsys):
    "A `[1, 2]` line (valid JSON, not an object) in a run's rows.jsonl is skipped like any malformed line, not 'unexpected ... (a bug)'."
    src, out = _images(tmp_path), tmp_path / "out"
    args = ["analyze", str(src), "--out", str(out), "--detectors", "noise", "--no-provenance"]
    assert _cli(args, capsys)[0] == 0
    rows = next(out.glob("runs/*/rows.jsonl"))
    with open(rows, "ab") as f: f.write(b'[1, 2]\n"text"\n{"no": "key"}\n{"key": 3}\n\xff\n')
    code, err = _cli(args, capsys)
    assert code == 0 and "a bug" not in err and "unexpected" not in err, err
    assert len(json.loads((out / "results.json").read_text())["rows"]) == 2


def test_failure_history_skips_lines_that_are_not_rows(tmp_path):
    from forensicslab.runs import Run
    from forensicslab.triage.study import failure_history
    run = Run(tmp_path / "r", config={"x": 1})
    run.rows_path.write_bytes(b'[1, 2]\n{"key": "a", "status": "failed", "error": "boom"}\n42\nnull\n{"key": 7, "failure": "x"}\n'
                              b'\xff\xfe\n{"key": "a", "failure": "again"}\n')
    assert failure_history(run) == {"a": ["boom", "again"]}


def test_serve_detector_refuses_a_port_out_of_range_in_one_line(capsys):
    for port in ("99999", "-1"):
        code, err = _cli(["serve-detector", "noise", "--port", port], capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "0 to 65535" in err and "a bug" not in err, err


# ---------- one Stage 0 record, one runner type, the configurations in their own lesson ----------

def test_one_image_s_route_stage0_record_into_every_configuration(tmp_path):
    "Evidence returns one Stage0 record; every configuration kind is a Runner that takes it, and the unpacked call gives the same result."
    from forensicslab.detectors.pool import image_key
    from forensicslab.triage.configs import Runner, build_config, composite_configs, offline_configs, preset
    from forensicslab.triage.data import Evidence
    from forensicslab.triage.records import CaseResult, Stage0
    from forensicslab.triage.trust import TrustStore, trust_runner
    p = _images(tmp_path) / "0.png"
    ev = Evidence(tmp_path / "cache", detectors=["noise", "spectral"])
    s0 = ev(p)
    assert isinstance(s0, Stage0) and s0.key == image_key(s0.image) and s0.image.path.name == "0.png"
    assert set(s0.detections) == set(s0.cards) == {"noise", "spectral"} and s0.facts.width == 64
    configs = [*offline_configs(), preset("rules-single"), preset("rules-provenance"), *composite_configs(offline_configs())]
    for cfg in configs:
        run = build_config(cfg)
        assert isinstance(run, Runner) and run.config == cfg.name, cfg.name
        res = run(s0)
        assert isinstance(res, CaseResult) and res.config == cfg.name and res.verdict is not None, cfg.name
        assert run(s0.image, s0.detections, s0.cards, s0.facts).verdict == res.verdict, cfg.name
    store = TrustStore.model_validate({"overall": {}})
    assert isinstance(trust_runner(store, "trust-ds"), Runner)
    assert ev(p) is s0 and s0.with_facts(provenance=None) is not s0       # the cached record is never changed in place


def test_the_configurations_live_in_configs_and_the_study_keeps_runs_and_tables():
    from forensicslab.triage import configs, study
    from forensicslab.triage import all as face
    assert {"TriageConfig", "Runner", "build_config", "presets", "preset", "paper_configs", "offline_configs", "provenance_configs",
            "composite_configs", "judge_axis_configs", "study_configs"} <= set(configs.__all__)
    assert not set(configs.__all__) & set(study.__all__)
    assert {"open_run", "run_grid", "triage_metrics", "table4", "failure_history"} <= set(study.__all__)
    assert all(getattr(configs, n).__module__ == configs.__name__ for n in configs.__all__ if callable(getattr(configs, n)))
    assert len(face.__all__) == len(set(face.__all__)) and {"Stage0", "Runner", "build_config"} <= set(face.__all__)


def _lessons():
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_course import NBS, course_links
    return NBS, [p for _, p in course_links() if not p.startswith("studies/")]


def test_no_triage_lesson_imports_a_module_taught_later():
    import re
    nbs, links = _lessons()
    cells = {p: json.loads((nbs / p).read_text())["cells"] for p in links}
    pos = {}
    for i, p in enumerate(links):
        m = next((re.search(r"#\|\s*default_exp\s+(\S+)", "".join(c["source"])) for c in cells[p]
                  if "default_exp" in "".join(c["source"])), None)
        if m: pos[m.group(1)] = i
    assert pos["triage.data"] < pos["triage.configs"] < pos["triage.study"] < pos["triage.trust"]
    bad = []
    for i, p in enumerate(links):
        if "_triage." not in p: continue
        code = "\n".join("".join(c["source"]) for c in cells[p] if c["cell_type"] == "code")
        for m in re.finditer(r"(?:from|import)\s+forensicslab\.([\w.]+)(?:\s+import\s+\(?([\w, ]+))?", code):
            mods = [m.group(1)] + [f"{m.group(1)}.{n.strip().split(' ')[0]}" for n in (m.group(2) or "").split(",") if n.strip()]
            bad += [(p, x) for x in mods if pos.get(x, -1) > i]
    assert not bad, bad


def test_touched_triage_lessons_have_no_export_cell_over_60_lines():
    nbs, _ = _lessons()
    for name in ("06_triage.records", "06a_triage.rules", "06c_triage.judge", "06d_triage.data", "06da_triage.configs",
                 "06e_triage.study", "06ea_triage.trust", "06h_triage.all"):
        for c in json.loads((nbs / f"{name}.ipynb").read_text())["cells"]:
            text = "".join(c["source"])
            if c["cell_type"] == "code" and text.startswith("#| export"):
                assert len(text.splitlines()) <= 60, (name, text.splitlines()[1])
