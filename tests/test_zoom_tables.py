"""The evaluation-only zoom tables on the manipulation design (issue 46 item 6): Tables 1, 2, 3, S1 and S4 default to the
`manipulations` design, evaluate the survey run's checkpoints (`outputs/zoom_grounding`) by default, add the survey rule
as a row and keep the paper's task (the artifact design's final checkpoint, `outputs/zoom_training/grpo`) as its own,
labelled row."""
import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_quick_study

import forensicslab.zoom.checkpoint as C

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "nbs" / "studies"
TABLES = ("zoom_table1", "zoom_table2", "zoom_table3", "zoom_tableS1", "zoom_tableS4")


def _ckpt(folder: Path, stage: str, data: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "zoom_train.json").write_text(json.dumps({"stage": stage, "config": {"base": "tiny", "variant": "o3", "data": data}}))
    return folder


@pytest.fixture
def project(tmp_path, monkeypatch):
    "A made-up project root holding a survey run (SFT, GRPO) and an artifact run (SFT, GRPO, its training table)."
    monkeypatch.setattr(C, "project_root", lambda: tmp_path)
    for stage in ("sft", "grpo"):
        _ckpt(tmp_path / "outputs" / "zoom_grounding" / stage, stage, "manipulations")
        _ckpt(tmp_path / "outputs" / "zoom_training" / stage, stage, "artifacts")
    (tmp_path / "outputs" / "zoom_training" / "zoom_training.csv").write_text(
        f"checkpoint,acc,auc,n\nSFT + GRPO,0.5,,100\n{C.CEILING_ROW},0.63,0.622,100\n")
    return tmp_path


def test_the_default_checkpoints_are_the_survey_runs(project):
    cks = C.study_checkpoints("", quick=False)
    assert sorted(cks) == ["grpo", "sft"]
    assert all(c["folder"].parent == project / "outputs" / "zoom_grounding" for c in cks.values())
    assert all(c["info"]["config"]["data"] == "manipulations" for c in cks.values())
    assert C.study_checkpoints("", quick=True) == {} and C.study_checkpoints("none", quick=False) == {}


def test_the_paper_task_is_the_artifact_runs_grpo_labelled_with_its_ceiling(project):
    pt = C.paper_task_checkpoint("", quick=False)
    assert pt["folder"] == project / "outputs" / "zoom_training" / "grpo" and pt["name"] == "grpo"
    assert pt["label"] == "paper's task (artifact design): tiny offline VLM, quick config, SFT + GRPO"
    assert "AUC 0.622" in pt["ceiling"] and pt["note"].startswith(C.PAPER_TASK)
    assert C.paper_task_checkpoint("", quick=True)["folder"] is None                      # a quick run skips it...
    given = C.paper_task_checkpoint(str(project / "outputs" / "zoom_training"), quick=True)  # ...unless a folder is given
    assert given["folder"] == pt["folder"]
    assert C.paper_task_checkpoint("none", quick=False)["folder"] is None


def test_without_a_grpo_checkpoint_the_paper_task_says_notrun_quick_study(project):
    only_sft = project / "sft_only"
    _ckpt(only_sft / "sft", "sft", "artifacts")
    pt = C.paper_task_checkpoint(str(only_sft), quick=False)
    assert pt["folder"] is None and "not run, no GRPO checkpoint" in pt["note"] and pt["ceiling"] == ""


def _params(nb: str) -> dict:
    cells = json.loads((STUDIES / f"{nb}.ipynb").read_text())["cells"]
    src = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
    got: dict = {}
    exec(src, {}, got)
    return got


@pytest.mark.parametrize("nb", TABLES)
def test_tables_default_to_the_manipulation_design_with_the_survey_and_the_papers_task(nb):
    p = _params(nb)
    assert p["data"] == "manipulations" and p["quick"] is True
    assert [s.strip() for s in p["policies"].split(",")][:2] == ["rules", "survey"]
    assert p["checkpoints_root"] == "" and p["paper_checkpoints"] == ""
    assert p["paper_task"] is (nb != "zoom_tableS1")        # S1 leaves it out: 4 perturbations x its split cost over 3 minutes
    cells = json.loads((STUDIES / f"{nb}.ipynb").read_text())["cells"]
    line = next(ln for c in cells for ln in c["source"] if ln.startswith("checkpoints_root ="))
    assert "default outputs/zoom_grounding" in line and "zoom_training" not in line


def test_table1_quick_has_the_survey_row_and_names_its_design(tmp_path):
    out = run_quick_study("zoom_table1", tmp_path, n_samples=4)
    t = pd.read_csv(out / "table1.csv")
    survey = t[t["method"].str.startswith("survey's top region")]
    assert len(survey) == 1 and survey.iloc[0]["variant"] == "o3" and survey.iloc[0]["zooms"] == 0   # one row: no zoom
    assert (t["method"].str.startswith("rule policy")).sum() == 3 and t["data"].str.startswith("manipulations/test").all()
    caption = (out / "table1.md").read_text().splitlines()[0]
    assert "data design 'manipulations'" in caption and "paper's task (artifact design): skipped" in caption


@pytest.mark.slow
def test_table1_adds_the_papers_task_on_the_artifact_design(tmp_path):
    run = ROOT / "outputs" / "zoom_training"
    if not (run / "grpo" / "zoom_train.json").exists(): pytest.skip(f"no artifact-design GRPO checkpoint under {run}")
    out = run_quick_study("zoom_table1", tmp_path, n_samples=2, variants="o3", checkpoints_root="none", paper_checkpoints=str(run))
    t = pd.read_csv(out / "table1.csv")
    paper = t[t["method"].str.startswith("paper's task (artifact design): ")]
    assert len(paper) == 1 and paper.iloc[0]["data"].startswith("artifacts/test, 2 images")
    assert "trained on artifacts" in paper.iloc[0]["backend"]
    assert "AUC" in (out / "table1.md").read_text().splitlines()[0]
