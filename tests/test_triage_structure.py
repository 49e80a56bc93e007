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
