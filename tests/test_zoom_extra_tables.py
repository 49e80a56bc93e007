"""The zoom study's extra tables (issue 30 item 8): Table 4 on the external OOD sets scores a tiny MADE-UP folder
(random-noise images in the real/ + fake/ layout, not data of any set) and writes "not run: <reason>" for a set that is
not given or not found; Tables S3 and S5 and Figure S1 say "not run" when no training run is there to read; the paper
numbers of the new tables are well-formed."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import run_quick_study
from PIL import Image

from forensicslab.metrics import paper_numbers


def _made_up_set(root: Path, n: int = 2) -> Path:
    "A MADE-UP folder in the real/ + fake/ layout: random-noise images, n per class."
    for sub in ("real", "fake"):
        (root / sub).mkdir(parents=True)
        for i in range(n):
            rgb = np.random.default_rng([i, sub == "fake"]).integers(0, 256, (96, 128, 3), dtype=np.uint8)
            Image.fromarray(rgb).save(root / sub / f"made_up_{i}.png")
    return root


def test_table4_scores_a_given_folder_and_names_the_sets_notrun_quick_study(tmp_path):
    folder = _made_up_set(tmp_path / "aigi_now_MADE_UP")
    missing = tmp_path / "no_such_evalgen"
    out = run_quick_study("zoom_table4", tmp_path, aigi_now=str(folder), evalgen=str(missing), mnw="")
    t = pd.read_csv(out / "table4.csv")
    assert t["set"].tolist() == ["AIGI-Now", "EvalGEN", "MNW"]
    ran = t[t["set"] == "AIGI-Now"].iloc[0]
    assert ran["status"] == "ran on 4 images (2 fake)" and ran["n"] == 4 and ran["method"].startswith("rule policy")
    assert abs(ran["acc"] - (ran["real acc"] + ran["fake acc"]) / 2) < 1e-9      # balanced: acc is the mean of the two
    assert len(list((out / "runs").iterdir())) == 1                                 # one resumable run: one set x one policy
    ev, mnw = (t[t["set"] == s].iloc[0] for s in ("EvalGEN", "MNW"))
    assert ev["status"].startswith("not run: ") and "no_such_evalgen" in ev["status"] and pd.isna(ev["acc"])
    assert mnw["status"].startswith("not run: no data given (pass -p mnw") and "github.com/microsoft/MNW" in mnw["status"]
    assert (out / "table4_paper.csv").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("nb,table", [("zoom_tableS3", "tableS3"), ("zoom_tableS5", "tableS5"), ("zoom_figureS1", "figureS1")])
def test_without_a_training_run_the_table_says_notrun_quick_study(tmp_path, nb, table):
    empty = tmp_path / "no_training_run"
    empty.mkdir()
    out = run_quick_study(nb, tmp_path, checkpoints_root=str(empty))
    t = pd.read_csv(out / f"{table}.csv")
    text = " ".join(str(v) for v in t.to_numpy().ravel())
    assert "not run" in text and "no_training_run" in text
    if nb == "zoom_tableS3": assert t["valid"].isna().all()       # nothing was scored


@pytest.mark.parametrize("table", ["table4", "tableS3", "tableS5"])
def test_paper_numbers_of_the_new_tables(table):
    pp = paper_numbers("zoom", table)
    assert pp["rows"] and all(len(v) == len(pp["columns"]) for v in pp["rows"].values())
    nums = [x for v in pp["rows"].values() for x in v if not isinstance(x, str)]
    assert nums and all(0 <= x <= 1 for x in nums)


def test_paper_numbers_match_the_paper_where_tables_repeat():
    "Table S3's Defake rows are Table 1's; Table S5's last row is Table 1's Defake-o3 (Acc, IoU)."
    t1, s3, s5 = (paper_numbers("zoom", t) for t in ("table1", "tableS3", "tableS5"))
    col = {c: i for i, c in enumerate(t1["columns"])}
    assert s3["rows"]["Defake-o3"] == t1["rows"]["Defake-o3"] and s3["rows"]["Defake-Direct"] == t1["rows"]["Defake-Direct"]
    last = s5["rows"]["filtering, SFT + RL"]
    assert last[2:4] == [t1["rows"]["Defake-o3"][col["acc"]], t1["rows"]["Defake-o3"][col["iou"]]]
