"The evidence verifier on the manipulation design (issue 46 item 8): detector instruments and own-place wrong boxes."
import numpy as np
import pytest

from forensicslab.core import Box
from forensicslab.zoom.construct import grounding_negatives
from forensicslab.zoom.data import load_study_data
from forensicslab.zoom.records import ZoomInputError
from forensicslab.zoom.tinyvlm import TinyVLMSpec, build_tiny_vlm, save_vlm
from forensicslab.zoom.verifier import (DETECTOR_INSTRUMENTS, INSTRUMENTS, BoxInstruments, VerifierItem,
                                        VerifierTrainConfig, Verifier, box_cues, instrument_set, load_verifier,
                                        location_agreement, new_verifier, save_verifier, to_pil)


@pytest.fixture(scope="module")
def inpaint_fake():
    "A test-split generative-inpainting fake of the manipulation design, with its true box."
    s = next(s for s in load_study_data("manipulations", "test") if s.label == 1 and s.provenance.get("group") == "inpaint_net")
    return s, next(b.box.as_list() for b in s.boxes if b.box is not None)


def _wrong_box(box, W, H):
    "A same-size box in the opposite corner, clear of `box`."
    w, h = box[2] - box[0], box[3] - box[1]
    x = 0 if box[0] > W / 2 else W - w
    y = 0 if box[1] > H / 2 else H - h
    return [x, y, x + w, y + h]


def test_detector_instruments_separate_true_from_wrong_box(inpaint_fake):
    s, box = inpaint_fake
    W, H = to_pil(s.image).size
    wrong = _wrong_box(box, W, H)
    true_r, wrong_r = (dict(zip(DETECTOR_INSTRUMENTS, box_cues(s.image, b, "detectors"))) for b in (box, wrong))
    assert len(true_r) == len(DETECTOR_INSTRUMENTS)
    # the inpainting detector's heatmap is hotter under the edited region than under a box away from it
    assert true_r["inpaint_net_read"] > wrong_r["inpaint_net_read"] + 0.1, (true_r, wrong_r)
    assert true_r["inpaint_net_z"] > wrong_r["inpaint_net_z"]
    assert true_r["inpaint_net_survey_iou"] > 0.2 > wrong_r["inpaint_net_survey_iou"]
    # the cue set is another set, of other length: the two are not mixed up
    assert len(box_cues(s.image, box, "cues")) == len(INSTRUMENTS) != len(DETECTOR_INSTRUMENTS)
    test_meas = BoxInstruments(s.image, "detectors").measure(box)
    assert list(test_meas) == box_cues(s.image, box, "detectors")


def test_instrument_set_names():
    assert instrument_set(False) is None and instrument_set(True) == "cues" and instrument_set("detectors") == "detectors"
    with pytest.raises(ZoomInputError, match="unknown instrument set"): instrument_set("pool")


def test_own_text_wrong_boxes_defeat_the_location_rule():
    samples = [s for s in load_study_data("manipulations", "test") if s.label == 1][:12]
    recs = [dict(sample_id=s.id, image=s.image, box=b.box.as_list(), text=b.text, m=3, M=3, soft_label=1.0, kind="valid")
            for s in samples for b in s.boxes if b.box is not None]
    size = {s.id: to_pil(s.image).size for s in samples}
    loc = lambda rs: np.array([location_agreement(r["text"], r["box"], *size[r["sample_id"]]) for r in rs])
    assert (loc(recs) == 1).all()       # every reference text names its own box's place
    copy = grounding_negatives(recs, samples, seed=0, text_modes=("copy",))
    own = grounding_negatives(recs, samples, seed=0, text_modes=("own",))
    assert len(own) == len(recs) and all(r["soft_label"] == 0 and r["text_mode"] == "own" for r in own)
    assert (loc(copy) == -1).mean() > 0.5          # the reference's place: the rule flags most
    assert (loc(own) == 1).all()                   # the wrong box's own place: the rule cannot flag any
    assert [r["box"] for r in own] == [r["box"] for r in copy]


def test_detector_verifier_saves_and_loads(tmp_path, inpaint_fake):
    s, box = inpaint_fake
    vlm, proc = build_tiny_vlm(TinyVLMSpec(vocab_size=600, max_pixels=64 * 64))
    save_vlm(vlm, proc, tmp_path / "base")
    cfg = VerifierTrainConfig(lora=False, grounding=True, instrument="detectors")
    model, vproc = new_verifier(tmp_path / "base", cfg, device="cpu")
    hidden = model.backbone.config.get_text_config().hidden_size
    assert model.score.in_features == 3 * hidden + len(DETECTOR_INSTRUMENTS) + 1
    ver = Verifier(model, vproc)
    item = VerifierItem(s.image, box, s.boxes[1].text)
    save_verifier(ver, tmp_path / "ver", tmp_path / "base", cfg)
    again = load_verifier(tmp_path / "ver", device="cpu")
    assert again.model.instrument == "detectors"
    assert abs(again.score_items([item])[0] - ver.score_items([item])[0]) < 1e-5
    # a verifier whose recorded instruments are not a known set is refused with one line
    meta = (tmp_path / "ver" / "verifier.json").read_text().replace('"inpaint_net_read"', '"inpaint_read"')
    (tmp_path / "ver" / "verifier.json").write_text(meta)
    with pytest.raises(ZoomInputError, match="other instruments"): load_verifier(tmp_path / "ver", device="cpu")
    assert Box.from_list(box).as_list() == box


@pytest.mark.parametrize("data,instrument", [("manipulations", "detectors"), ("artifacts", "cues")])
def test_figure5_quick_on_both_designs(tmp_path, data, instrument):
    "Figure 5 runs on the manipulation design (default) and on the paper's-task artifact design, one parameter away."
    import json

    import pandas as pd
    from conftest import run_quick_study
    out = run_quick_study("zoom_figure5", tmp_path, data=data)
    auc = pd.read_csv(out / "figure5_auc.csv")
    assert len(auc) == 6 and any("WITHOUT the location rule" in s for s in auc["scorer"])
    assert {"accepted vs rejected: AUC", "valid vs wrong box: AUC"} <= set(auc.columns)
    assert instrument_set(instrument) == instrument
    meta = json.loads((out / "verifier" / "verifier.json").read_text())
    names = {"detectors": DETECTOR_INSTRUMENTS, "cues": INSTRUMENTS}[instrument]
    assert meta["instrument"] == list(names)
    assert (pd.read_csv(out / "figure5_scores.csv")["data"] == data).all()
