"""The user study (MAD-Sherlock Tables 3 and 4): the loader of the authors' CSV format and the tables, on a MADE-UP
fixture of the same columns (tests/fixtures/debate_user_study_MADE_UP.csv: six invented participants, not study data);
the notebook skips without a CSV and keeps an earlier run's files; with FORENSICSLAB_USER_STUDY pointing at the authors'
user_study_data.csv, the paper's Table 3 is reproduced."""
import json
import os
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from forensicslab.data.datasets import MissingData
from forensicslab.debate.data import UserStudyError, load_user_study, user_study_spec
from forensicslab.debate.study import user_study_switches, user_study_table3, user_study_table4

ROOT = Path(__file__).resolve().parents[1]
MADE_UP = ROOT / "tests" / "fixtures" / "debate_user_study_MADE_UP.csv"
NB = ROOT / "nbs" / "studies" / "debate_user_study.ipynb"
ACC = "accuracy % (mean +/- SD, authors' population SD)"


def test_made_up_fixture_is_labelled_and_in_the_authors_columns():
    df = pd.read_csv(MADE_UP, dtype=str, keep_default_na=False)
    assert (df["Profession"] == "MADE-UP test participant").all()
    fields = ["GT", "MP", "C", "CONF", "RE-C", "RE-CONF"]
    assert list(df.columns) == ["Id", "Profession", "Organisation"] + [f"{f}{k}" for k in range(1, 11) for f in fields]


def test_loader_reads_answers_groups_and_missing_values():
    us = load_user_study(MADE_UP)
    assert (len(us), us.n_items) == (6, 10)
    assert sorted(us.groups) == ["Academics", "Journalists", "Others"]   # the authors' assignment by Id
    a = us.answers.set_index(["participant", "item"])
    assert bool(a.loc[("19", 3), "before"])   # " TRUE" (padded) is TRUE
    assert pd.isna(a.loc[("3", 8), "after"]) and np.isnan(a.loc[("3", 8), "conf_after"])
    assert us.items["truth"].tolist() == [True, False] * 5


def test_table3_on_the_made_up_study():
    t3 = user_study_table3(load_user_study(MADE_UP), n_boot=50).set_index("study setup")
    # before: 5, 7, 6, 6, 4, 8 of 10 right; after: 8, 9, 8, 8, 5 and 6 (an unanswered question counts as wrong)
    assert t3.loc["Humans", ACC] == "60.0 +/- 12.9"
    assert t3.loc["Humans + MAD-Sherlock", ACC] == "73.3 +/- 13.7"
    assert t3.loc["MAD-Sherlock", ACC] == "80.0 +/- 0.0"          # the made-up insight is wrong on pairs 2 and 5
    assert t3.loc["Humans", "sample SD"] == f"{np.std([50, 70, 60, 60, 40, 80], ddof=1):.1f}"
    assert "5 better, 0 same, 1 worse" in t3.loc["Humans + MAD-Sherlock", "vs Humans (paired)"]
    assert t3.loc["Humans", "paper"] == "60.3 +/- 13.5"


def test_table4_conventions_on_the_made_up_study():
    us = load_user_study(MADE_UP)
    a = user_study_table4(us, "authors").set_index("metric")
    assert list(a.columns[1::2]) == ["Journalists (n=2)", "Academics (n=2)", "Others (n=2)"]   # the paper's order
    assert a.loc["Accuracy (only human)", "Journalists (n=2)"] == "60.0 +/- 1.4"      # 5 and 7 right: SD in answers
    assert a.loc["Accuracy (with MAD-Sherlock)", "Others (n=2)"] == "55.0 +/- 0.7"    # 5 and 6 right
    assert a.loc["Confidence (only human)", "Journalists (n=2)"] == "2.9 +/- 0.1"     # (5 x 6 / 10 + 7 x 4 / 10) / 2
    assert a.loc["Accuracy (only human)", "Journalists (paper)"] == "70.0 +/- 1.4"
    p = user_study_table4(us, "plain").set_index("metric")
    assert p.loc["Accuracy (only human)", "Journalists (n=2)"] == "60.0 +/- 14.1"     # the same spread in %
    assert p.loc["Confidence (only human)", "Journalists (n=2)"] == "5.0 +/- 1.4"     # mean of 6 and 4
    with pytest.raises(ValueError, match="convention"): user_study_table4(us, "other")


def test_switches_count_persuasion_on_wrong_and_right_insights():
    sw = user_study_switches(load_user_study(MADE_UP)).set_index("pair")
    assert sw.loc[2, ["MAD-Sherlock", "right before", "right after", "right -> wrong"]].tolist() == ["WRONG", 6, 3, 3]
    assert sw.loc[5, ["MAD-Sherlock", "right -> wrong", "wrong -> right"]].tolist() == ["WRONG", 0, 1]
    assert sw.loc[8, "unanswered after"] == 1 and sw.loc[1, "MAD-Sherlock"] == "right"


def test_bad_input_is_one_clear_error(tmp_path):
    with pytest.raises(MissingData, match="MAD_Sherlock"): load_user_study(tmp_path / "absent.csv")
    df = pd.read_csv(MADE_UP, dtype=str, keep_default_na=False)
    df.drop(columns=["RE-CONF4"]).to_csv(tmp_path / "a.csv", index=False)
    with pytest.raises(UserStudyError, match="RE-CONF4"): load_user_study(tmp_path / "a.csv")
    df.assign(Id=["15", "19", "5", "8", "2", "77"]).to_csv(tmp_path / "b.csv", index=False)
    with pytest.raises(UserStudyError, match="77 have no group"): load_user_study(tmp_path / "b.csv")
    assert len(load_user_study(tmp_path / "b.csv", groups={i: "all" for i in ["15", "19", "5", "8", "2", "77"]})) == 6
    d = df.copy(); d.loc[2, "CONF3"] = "11"; d.to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(UserStudyError, match="outside 0-10"): load_user_study(tmp_path / "c.csv")
    d = df.copy(); d.loc[2, "MP4"] = "TRUE"; d.to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(UserStudyError, match=r"MP differs between participants .* \[4\]"): load_user_study(tmp_path / "d.csv")


def test_the_csv_is_not_redistributed_and_its_page_is_stated():
    spec = user_study_spec()
    assert spec["csv"]["page"].startswith("https://github.com/") and "no LICENSE" in spec["csv"]["licence"]
    assert not [p for d in ("forensicslab", "nbs", "tests", "outputs") for p in (ROOT / d).glob("**/user_study_data.csv")]
    assert sum(map(len, spec["groups"].values())) == 30


def _printed(nb_path):
    return "".join(o.get("text", "") for c in nbformat.read(nb_path, as_version=4).cells for o in c.get("outputs", []))


def test_notebook_without_a_csv_skips_and_keeps_earlier_files(tmp_path):
    pm = pytest.importorskip("papermill")
    out = tmp_path / "out"
    out.mkdir()
    (out / "table3_user_study.csv").write_text("rows made where the authors' CSV was present\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    pm.execute_notebook(str(NB), str(tmp_path / "o.ipynb"), cwd=str(NB.parent), progress_bar=False, kernel_name="python3",
                        language="python", parameters={"quick": False, "out_dir": str(out)})
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "run.json"} == before
    parts = json.loads((out / "run.json").read_text())["parts"]
    assert {k: v["status"] for k, v in parts.items()} == dict.fromkeys(["table3_user_study", "table4_user_study", "user_study_switches"], "skipped")
    printed = _printed(tmp_path / "o.ipynb")
    assert "skipped table3_user_study: no user-study CSV given" in printed and "(its earlier files are kept: 1)" in printed


@pytest.mark.slow
def test_notebook_on_a_csv_writes_the_tables(tmp_path):
    pm = pytest.importorskip("papermill")
    pm.execute_notebook(str(NB), str(tmp_path / "o.ipynb"), cwd=str(NB.parent), progress_bar=False, kernel_name="python3",
                        language="python", parameters={"quick": False, "out_dir": str(tmp_path), "user_study_csv": str(MADE_UP)})
    t3 = pd.read_csv(tmp_path / "table3_user_study.csv")
    assert t3[ACC].tolist() == ["60.0 +/- 12.9", "73.3 +/- 13.7", "80.0 +/- 0.0"]
    assert (tmp_path / "table4_user_study.csv").is_file() and (tmp_path / "user_study_switches.csv").is_file()


@pytest.mark.skipif(not os.environ.get("FORENSICSLAB_USER_STUDY"), reason="set FORENSICSLAB_USER_STUDY to the authors' user_study_data.csv")
def test_the_authors_csv_reproduces_table3():
    us = load_user_study(os.environ["FORENSICSLAB_USER_STUDY"])
    t3 = user_study_table3(us, n_boot=50)
    assert t3[ACC].tolist() == ["60.3 +/- 13.5", "76.7 +/- 12.2", "80.0 +/- 0.0"]   # the paper: 60.3, 76.7, 80.0
    sw = user_study_switches(us)
    assert sw.loc[sw["MAD-Sherlock"] == "WRONG", "right -> wrong"].tolist() == [6, 15]   # appendix A.7: 6 and 15 participants
