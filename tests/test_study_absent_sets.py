"""Issue 48 item 4: a dataset spec whose data is absent (`paper_id:PATH`, `firefly:PATH`, ... not downloaded) is reported
"not run" with the loader's reason by Table 4 and the scorecard: the other sets of Table 4 still run; a study with no
set present stops with that reason in one line (no layout dump, no traceback)."""
import json

import numpy as np
import pytest

from forensicslab.studies import StudyFailed, run_study


def _one_line_not_run(e: StudyFailed, *names: str) -> None:
    msg = str(e)
    assert "not run" in msg and all(n in msg for n in names) and "Expected layout" not in msg and "\n" not in msg, msg


@pytest.mark.parametrize("study,dataset", [("triage_table4", "paper_id:{tmp}/no_pid,firefly:{tmp}/no_ff"),
                                           ("detectors_scorecard", "firefly:{tmp}/no_ff")])
def test_absent_set_alone_is_not_run_in_one_line(tmp_path, study, dataset):
    with pytest.raises(StudyFailed) as e:
        run_study(study, {"quick": True, "dataset": dataset.format(tmp=tmp_path)}, out_dir=tmp_path / "o", progress=False)
    _one_line_not_run(e.value, "no_ff", *(["no_pid"] if "no_pid" in dataset else []))


@pytest.mark.slow
def test_table4_runs_the_present_set_and_says_the_absent_one_was_not_run(tmp_path):
    from PIL import Image
    rng, rows = np.random.default_rng(0), ["image,label,family"]
    for i, fam in enumerate(["", "", "splice", "classic_inpaint"]):
        Image.fromarray((rng.random((64, 80, 3)) * 255).astype(np.uint8)).save(tmp_path / f"im{i}.png")
        rows.append(f"{tmp_path / f'im{i}.png'},{int(bool(fam))},{fam}")
    (tmp_path / "m.csv").write_text("\n".join(rows) + "\n")
    run_study("triage_table4", {"quick": True, "dataset": f"manifest:{tmp_path / 'm.csv'},paper_id:{tmp_path / 'no_pid'}",
                                "provenance": False, "axis": False}, out_dir=tmp_path / "t4", progress=False)
    parts = json.loads((tmp_path / "t4" / "run.json").read_text())["parts"]
    assert parts["table4_no_pid"]["status"] == "skipped" and "not run" in parts["table4_no_pid"]["why"], parts
    table = (tmp_path / "t4" / "table4.md").read_text()
    assert "paper_id:" in table and "not run" in table and "Algorithmic fusion" in table
