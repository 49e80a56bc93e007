"""The zoom study's manipulation design, the survey before the first zoom, its controls, and evaluation seeded per episode."""
import os
import shutil
import threading
import time

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from forensicslab.imageio import load_image  # noqa: E402
from forensicslab.zoom.agents import Episode, parse_action  # noqa: E402
from forensicslab.zoom.construct import SurveyProposer  # noqa: E402
from forensicslab.zoom.rewards import union_iou  # noqa: E402
from forensicslab.zoom.data import ensure_artifacts, load_artifacts, mask_box  # noqa: E402
from forensicslab.zoom.pipeline import episode_views  # noqa: E402
from forensicslab.zoom.records import ZoomConfigError  # noqa: E402
from forensicslab.zoom.study import evaluation_store  # noqa: E402
from forensicslab.zoom.rules import ForensicViews, SurveyRulePolicy, survey, survey_text, tool_views  # noqa: E402
from forensicslab.zoom.train import HFZoomPolicy, ZoomTrainConfig, grpo_dataset, load_policy, sft_dataset  # noqa: E402

VIEWS = tool_views("detectors")


@pytest.fixture(scope="module")
def manip(tmp_path_factory):
    root = tmp_path_factory.mktemp("manip")
    ensure_artifacts(root, n_train=16, n_test=16, n_ood=8, design="manipulations")
    return {s: load_artifacts(s, root, design="manipulations") for s in ("train", "test", "ood")}


def test_manipulation_design_families_take_turns_photos_are_disjoint_and_boxes_come_from_masks(manip):
    train, test = manip["train"], manip["test"]
    fakes = [s for s in test if s.label]
    assert [s.family for s in fakes] == ["gen_inpaint", "classic_inpaint", "face", "splice"] * 2
    assert sum(s.label for s in test) == len(test) // 2
    assert {s.provenance["photo"] for s in train}.isdisjoint({s.provenance["photo"] for s in test + manip["ood"]})
    for s in fakes:
        mask = np.asarray(Image.open(s.mask)) > 0
        assert [b.box.as_list() for b in s.boxes if b.box is not None] == [mask_box(mask)]
    assert all(s.mask is None and all(b.box is None for b in s.boxes) for s in test if not s.label)


def test_survey_reaches_sft_grpo_and_evaluation_alike_and_shuffling_shows_another_image(manip):
    test = manip["test"][:4]
    fv = ForensicViews(test[1].image, VIEWS)
    text = fv.survey_text()
    entries = survey(fv)
    assert text == survey_text(entries) and len(entries) == 6 and text.count("\n") == 3
    assert [e["score"] for e in entries] == sorted((e["score"] for e in entries), reverse=True)
    proposer = SurveyProposer(lambda s: ForensicViews(s.image, VIEWS))
    traj = {"image": test[1].image, "sample": test[1].model_dump_json(),
            "steps": __import__("forensicslab.zoom.construct", fromlist=["trajectory_steps"]).trajectory_steps(test[1], proposer.propose(test[1]))}
    first = lambda msgs: [m for m in msgs if m["role"] == "user"][0]["content"][-1]["text"]
    assert first(sft_dataset([traj], "o3", 1, views=VIEWS, survey="regions")[0]["messages"]).endswith(text)
    assert text not in first(sft_dataset([traj], "o3", 1, views=VIEWS)[0]["messages"])        # survey: none
    assert first(grpo_dataset(test, "o3", 1, VIEWS, survey="regions")[1]["prompt"]).endswith(text)
    ep = Episode(image=load_image(test[1].image), variant="o3", max_turns=2, sample_id=test[1].id)
    assert first(HFZoomPolicy(None, None, views_for=episode_views(test, VIEWS), survey="regions").messages(ep)).endswith(text)
    ep2 = Episode(image=load_image(test[1].image), variant="o3", max_turns=2, sample_id=test[1].id)
    shuffled = first(HFZoomPolicy(None, None, views_for=episode_views(test, VIEWS, shuffle=True), survey="regions").messages(ep2))
    others = [ForensicViews(s.image, VIEWS).survey_text() for s in test if s.id != test[1].id]
    assert any(shuffled.endswith(o) for o in others) and not shuffled.endswith(text)
    with pytest.raises(ZoomConfigError, match="survey"): ZoomTrainConfig.smoke(survey="regions")     # crop only: nothing to survey
    with pytest.raises(ZoomConfigError, match="unknown survey"): ZoomTrainConfig.smoke(tools="detectors", survey="grid")


def test_survey_teacher_zooms_on_the_region_nearest_the_truth_and_the_rule_answers_with_the_top(manip):
    views_for = lambda s: ForensicViews(s.image, VIEWS)
    proposer = SurveyProposer(views_for)
    for s in manip["test"][:8]:
        entries = survey(views_for(s))
        ann = proposer.propose(s)
        W, H = load_image(s.image).size
        crop = [st for st in ann.exploration_trajectory if st.bbox is not None]
        assert len(crop) == 1 and ann.verdict == ("fake" if s.label else "real")
        from forensicslab.zoom.records import norm_to_box
        box = norm_to_box(crop[0].bbox, W, H).as_list()
        if s.label:
            truth = [b.box.as_list() for b in s.boxes if b.box is not None][0]
            assert union_iou([box], [truth]) == pytest.approx(max(union_iou([e["box"]], [truth]) for e in entries), abs=0.03)
        else: assert union_iou([box], [entries[0]["box"]]) > 0.9
    s = manip["test"][1]
    ep = Episode(image=load_image(s.image), variant="o3", max_turns=2, sample_id=s.id)
    top = survey(views_for(s))[0]
    act = parse_action(SurveyRulePolicy(lambda ep: survey(views_for(s))).respond(ep), "o3", (ep.image.width, ep.image.height))
    assert act.kind == "answer" and act.answer.verdict == ("fake" if top["score"] > 0.5 else "real")
    if act.answer.verdict == "fake": assert act.answer.key_items[0].box.as_list() == top["box"]


def test_survey_controls_bound_iou_with_the_best_line_at_the_rules_verdicts_and_on_every_fake(manip):
    "ORACLE (d) keeps the rule's verdict on each fake (a 'real' scores 0), ORACLE (e) finds every fake; both take the best line."
    from forensicslab.zoom.study import survey_controls
    rows = {k.split(":")[0]: v for k, v in survey_controls(manip["train"], manip["test"]).items()}
    best, kept = [], []
    for s in (s for s in manip["test"] if s.label):
        entries = survey(ForensicViews(s.image, VIEWS))
        truth = [b.box.as_list() for b in s.boxes if b.box is not None]
        ep = Episode(image=load_image(s.image), variant="o3", max_turns=2, sample_id=s.id)
        act = parse_action(SurveyRulePolicy(lambda ep: entries).respond(ep), "o3", (ep.image.width, ep.image.height))
        best.append(max(union_iou([e["box"]], truth) for e in entries))
        kept.append(best[-1] if act.answer.verdict == "fake" else 0.0)
    assert kept != best            # a fake with no detector above 0.5: the two bounds differ on it
    assert rows["ORACLE (e)"]["iou"] == pytest.approx(np.mean(best))
    assert rows["ORACLE (d)"]["iou"] == pytest.approx(np.mean(kept))
    assert set(rows["ORACLE (d)"]) == {"iou", "n"} and rows["ORACLE (d)"]["n"] == len(manip["test"])


def test_a_reasked_turn_samples_from_the_episode_not_the_global_rng(manip, tmp_path):
    "The same checkpoint gives the same re-asked turn whatever the global RNG did before (was: torch's global RNG)."
    s = manip["test"][0]
    cfg = ZoomTrainConfig.smoke(tiny=dict(vocab_size=3072, max_pixels=64 * 64))
    model, proc = load_policy(cfg, texts=["<answer>{}</answer> crop bbox fake real"])
    pol = HFZoomPolicy(model, proc, max_new_tokens=12, max_zooms=1, temperature=1.5)
    outs = []
    for seed in (0, 1):
        torch.manual_seed(seed)                  # what ran before differs
        ep = Episode(image=load_image(s.image), variant="o3", max_turns=2, sample_id=s.id)
        ep.feedback = {"text": "bad", "error": "not JSON"}
        outs.append(pol.respond(ep))
    assert outs[0] == outs[1]
    ep = Episode(image=load_image(s.image), variant="o3", max_turns=2, sample_id=manip["test"][2].id, feedback={"text": "x", "error": "y"})


def test_the_shared_opening_is_computed_once_and_generates_what_the_whole_prompt_does(manip):
    "Generation from the cached opening (system prompt and tools) writes the same turns as from the whole padded prompt."
    cfg = ZoomTrainConfig.smoke(tiny=dict(vocab_size=3072, max_pixels=64 * 64))
    model, proc = load_policy(cfg, texts=["<answer>{}</answer> crop bbox fake real survey adq noise"])
    test = manip["test"][:3]
    pol = HFZoomPolicy(model, proc, max_new_tokens=16, max_zooms=1, views_for=episode_views(test, VIEWS), survey="named")
    eps = lambda: [Episode(image=load_image(s.image), variant="o3", max_turns=2, sample_id=s.id) for s in test]
    batch = pol._inputs([pol.messages(ep) for ep in eps()])           # three chats of different lengths, left-padded
    with torch.no_grad():
        whole = model.generate(**batch, max_new_tokens=16, do_sample=False, pad_token_id=proc.tokenizer.pad_token_id)
    cached, start = pol._generate(batch, do_sample=False)
    opening = pol._opening
    assert len(opening[0]) > 0.5 * batch["input_ids"].shape[1]         # most of the prompt is shared
    assert torch.equal(cached[:, start:], whole[:, batch["input_ids"].shape[1]:])
    pol.respond_batch(eps())
    assert pol._opening is opening                                     # computed once per policy


def test_pinned_run_files_return_to_the_run_folder_and_a_changed_file_is_refused(tmp_path):
    from forensicslab.zoom.pipeline import check_pins, pin_files, pin_run, unpin_run
    run, study, fresh = tmp_path / "run", tmp_path / "study", tmp_path / "fresh" / "run"     # same run key, another machine
    for d, body in (("base", b"base weights"), ("sft", b"sft adapter"), ("grpo", b"grpo adapter")):
        (run / d).mkdir(parents=True)
        (run / d / "w.safetensors").write_bytes(body)
    (run / "grpo" / "zoom_train.json").write_text("{}")
    (run / "eval.json").write_text("{}")
    pins = pin_run(run, study)
    assert sorted(pins) == ["base/w.safetensors", "grpo/w.safetensors", "grpo/zoom_train.json", "sft/w.safetensors"]
    assert __import__("json").loads((study / "grpo" / "zoom_train.json").read_text()) == {"base_path": "../base"}   # loads from the study folder
    assert not unpin_run(tmp_path / "nothing_pinned", fresh) and not check_pins(tmp_path / "nothing_pinned")
    assert check_pins(study) and set(pin_files(run)) == set(pins)     # weights kept in place (a study folder) pin the same way
    assert not unpin_run(study, tmp_path / "fresh" / "other-key")       # pins of another configuration: that one trains
    assert unpin_run(study, fresh) and (fresh / "grpo" / "w.safetensors").read_bytes() == b"grpo adapter"
    assert not (fresh / "eval.json").exists()              # evaluated again from the pinned weights
    (study / "sft" / "w.safetensors").write_bytes(b"tampered")
    with pytest.raises(ZoomConfigError, match="differ from pinned.json"): unpin_run(study, tmp_path / "other" / "run")
    with pytest.raises(ZoomConfigError, match="differ from pinned.json"): check_pins(study)


def test_a_named_survey_lets_a_box_name_a_listed_region_in_the_crop_the_answer_and_the_teacher(manip):
    "survey: named: a bbox written as a surveyed tool's name is that tool's region; other names and plain runs refuse it."
    from forensicslab.zoom.construct import trajectory_steps
    from forensicslab.zoom.rewards import episode_answer
    from forensicslab.zoom.train import NamedZoomEnv, crop_tool_schema, name_trajectory
    s = next(x for x in manip["test"] if x.label)
    fv = ForensicViews(s.image, VIEWS)
    regions, top = fv.regions(), survey(fv)
    assert list(regions.values()) == [e["box"] for e in top] and list(regions)[:2] == ["R1", "R2"] and fv.survey_text(named=True).count("\n") == 7
    name, box = next(iter(regions.items()))
    call = '<tool_call>{"name": "crop", "arguments": {"bbox": "%s"}}</tool_call>' % name
    W, H = load_image(s.image).size
    assert parse_action(call, "o3", (W, H), regions).bbox.as_list() == box
    assert parse_action(call, "o3", (W, H)).kind == "invalid"                          # no named regions: refused
    assert "unknown region" in parse_action(call.replace(name, "oracle"), "o3", (W, H), regions).error
    ans = '<answer>{"verdict": "fake", "evidence": [{"bbox": null, "text": "edited"}, {"bbox": "%s", "text": "here"}]}</answer>' % name
    got, why = episode_answer([call, ans], "o3", (W, H), regions)
    assert why is None and got.key_items[0].box.as_list() == box
    env = NamedZoomEnv(views=VIEWS)
    env.reset(image=s.image, sample=s.model_dump_json())
    env.crop(name)
    assert env.crops == [box] and "anyOf" in str(crop_tool_schema(True)) and "anyOf" not in str(crop_tool_schema())
    proposer = SurveyProposer(lambda x: ForensicViews(x.image, VIEWS))
    traj = {"image": s.image, "steps": [st.model_dump() for st in trajectory_steps(s, proposer.propose(s))]}
    named = name_trajectory(traj, regions)
    crop_text, answer_text = named["steps"][0]["text"], named["steps"][-1]["text"]
    picked = parse_action(traj["steps"][0]["text"], "o3", (W, H)).bbox.as_list()
    if picked in regions.values():                   # the teacher's region is one of the three listed: it is named
        assert '"bbox": "' in crop_text and '"bbox": "' in answer_text
        assert parse_action(crop_text, "o3", (W, H), regions).bbox.as_list() == picked
    else: assert named["steps"] == traj["steps"]


def test_one_checkpoint_gives_the_same_numbers_through_the_training_run_and_a_table(manip, tmp_path):
    "The run's evaluation (`evaluate_checkpoint`) and a table's (`make_policy('ckpt:...')`) agree whatever ran before."
    from peft import get_peft_model
    from forensicslab.zoom.pipeline import evaluate_checkpoint
    from forensicslab.zoom.study import evaluate_policy, make_policy
    from forensicslab.zoom.tinyvlm import save_vlm
    from forensicslab.zoom.train import lora_config, save_checkpoint
    cfg = ZoomTrainConfig.smoke(tiny=dict(vocab_size=3072, max_pixels=64 * 64), tools="detectors", survey="named",
                                max_completion_length=24, data="manipulations")
    model, proc = load_policy(cfg, texts=['<answer>{"verdict": "fake"} R1 crop bbox real</answer>'])
    save_vlm(model, proc, tmp_path / "base")
    save_checkpoint(get_peft_model(model, lora_config(cfg)), proc, tmp_path / "ckpt", tmp_path / "base", cfg)
    samples = manip["test"][:4]
    torch.manual_seed(1)
    run = evaluate_checkpoint(tmp_path / "ckpt", samples, cfg, device="cpu")
    tables = []
    for seed in (2, 3):                                    # tables that ran something else first
        torch.manual_seed(seed); torch.rand(99)
        pol = make_policy(f"ckpt:{tmp_path / 'ckpt'}", max_new_tokens=cfg.max_completion_length)
        shutil.rmtree(evaluation_store(pol, cfg.variant, cfg.max_tool_calls + 1))   # generated afresh, not read back
        tables.append(evaluate_policy(pol, samples, variant=cfg.variant, max_turns=cfg.max_tool_calls + 1))
    results = [t.pop("results") for t in tables]
    assert any(r.reasked for r in results[0])             # a re-ask samples: what would follow the global RNG
    assert [[st.text for st in r.rejected + r.steps] for r in results[0]] == [[st.text for st in r.rejected + r.steps] for r in results[1]]
    assert run["per_sample"] and {k: run[k] for k in tables[0]} == tables[0] == tables[1]


def _smoke_checkpoint(tmp_path) -> ZoomTrainConfig:
    "A LoRA checkpoint of a tiny model built here (the survey tools, named regions) in tmp_path/ckpt, its base in tmp_path/base."
    from peft import get_peft_model
    from forensicslab.zoom.tinyvlm import save_vlm
    from forensicslab.zoom.train import lora_config, save_checkpoint
    cfg = ZoomTrainConfig.smoke(tiny=dict(vocab_size=3072, max_pixels=64 * 64), tools="detectors", survey="named",
                                max_completion_length=16, data="manipulations")
    model, proc = load_policy(cfg, texts=['<answer>{"verdict": "fake"} R1 crop bbox real</answer>'])
    save_vlm(model, proc, tmp_path / "base")
    save_checkpoint(get_peft_model(model, lora_config(cfg)), proc, tmp_path / "ckpt", tmp_path / "base", cfg)
    return cfg


def _record_turns(monkeypatch, what) -> list:
    "`what(episode)` for every turn a checkpoint generates, one at a time or in a batch (a sampled turn in a batch twice)."
    seen, respond, batch = [], HFZoomPolicy.respond, HFZoomPolicy.respond_batch
    monkeypatch.setattr(HFZoomPolicy, "respond", lambda self, ep: seen.append(what(ep)) or respond(self, ep))
    monkeypatch.setattr(HFZoomPolicy, "respond_batch", lambda self, eps: seen.extend(map(what, eps)) or batch(self, eps))
    return seen


def test_a_checkpoint_is_evaluated_once_for_every_table_and_afresh_when_its_weights_change(manip, tmp_path, monkeypatch):
    "The evaluation store: a second table (another way of loading the same checkpoint) reads the episodes; new weights do not."
    from forensicslab.zoom.pipeline import evaluate_checkpoint
    from forensicslab.zoom.study import evaluate_policy, make_policy, per_sample
    cfg = _smoke_checkpoint(tmp_path)
    calls = _record_turns(monkeypatch, lambda ep: ep.sample_id)
    samples, turns = manip["test"][:3], cfg.max_tool_calls + 1
    run = evaluate_checkpoint(tmp_path / "ckpt", samples, cfg, device="cpu")
    generated = len(calls)
    pol = make_policy(f"ckpt:{tmp_path / 'ckpt'}", max_new_tokens=cfg.max_completion_length)
    table = evaluate_policy(pol, samples[:2], variant=cfg.variant, max_turns=turns)      # a table on a subset
    assert generated >= 3 and len(calls) == generated                                    # nothing generated again
    assert [r.policy for r in table["results"]] == [pol.policy_id] * 2                   # named as this table's policy
    assert per_sample(table["results"], samples[:2]) == [r for r in run["per_sample"] if r["id"] in {s.id for s in samples[:2]}]
    assert evaluate_policy(pol, samples[:2], variant=cfg.variant, max_turns=turns + 1) and len(calls) > generated   # other settings
    n = len(calls)
    other = make_policy(f"ckpt:{tmp_path / 'ckpt'}", max_new_tokens=cfg.max_completion_length + 1)   # another generation cap
    assert evaluation_store(other, cfg.variant, turns) != evaluation_store(pol, cfg.variant, turns)
    from safetensors.torch import load_file, save_file
    weights = tmp_path / "ckpt" / "adapter_model.safetensors"
    tensors = load_file(weights)
    save_file({k: v + 1e-3 for k, v in tensors.items()}, weights, metadata={"format": "pt"})   # the weights changed on disk
    changed = make_policy(f"ckpt:{tmp_path / 'ckpt'}", max_new_tokens=cfg.max_completion_length)
    assert changed.eval_id != pol.eval_id and evaluation_store(changed, cfg.variant, turns) != evaluation_store(pol, cfg.variant, turns)
    assert n == len(calls)


def test_a_table_that_set_its_own_thread_count_reads_the_same_evaluation(manip, tmp_path, monkeypatch):
    "Several training notebooks set 1 torch thread: their evaluations still run on the kernel's count and share the store."
    from forensicslab.zoom.pipeline import evaluate_checkpoint
    from forensicslab.zoom.study import _fingerprint
    monkeypatch.setenv("OMP_NUM_THREADS", "2")           # what the study runner gives a kernel
    monkeypatch.setenv("FORENSICSLAB_CACHE_DIR", str(tmp_path / "cache"))   # an empty evaluation store
    cfg = _smoke_checkpoint(tmp_path)
    threads = _record_turns(monkeypatch, lambda ep: torch.get_num_threads())
    held = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        first = evaluate_checkpoint(tmp_path / "ckpt", manip["test"][:2], cfg, device="cpu")
        n = len(threads)
        torch.set_num_threads(1)                           # a notebook that trains at one thread, in another kernel:
        _fingerprint.cache_clear()                         # that process measures its arithmetic afresh
        again = evaluate_checkpoint(tmp_path / "ckpt", manip["test"][:2], cfg, device="cpu")
        assert torch.get_num_threads() == 1                # the notebook's own setting is given back
    finally: torch.set_num_threads(held)
    assert n >= 2 and len(threads) == n and set(threads) == {2}   # read back, not generated at one thread
    assert again["per_sample"] == first["per_sample"]


def test_a_checkpoints_turns_in_one_batch_are_the_turns_one_at_a_time(manip):
    """The committed survey run's final checkpoint: greedy turns as one left-padded batch give the same texts and token
    counts (each cut at its end token), and a re-ask among them is still sampled from its episode's seed."""
    from forensicslab.runs import project_root
    from forensicslab.zoom.pipeline import episode_views
    from forensicslab.zoom.train import checkpoint_info, load_checkpoint
    folder = project_root() / "outputs" / "zoom_grounding" / "grpo"
    model, proc = load_checkpoint(folder, device="cpu")
    samples = manip["test"][:6]
    pol = HFZoomPolicy(model, proc, max_new_tokens=checkpoint_info(folder)["config"]["max_completion_length"],
                       views_for=episode_views(samples, VIEWS), survey="named")
    episodes = lambda: [Episode(image=load_image(s.image), variant="o3", max_turns=2, sample_id=s.id) for s in samples]
    one, many, side = episodes(), episodes(), proc.tokenizer.padding_side
    many[2].feedback = one[2].feedback = {"text": "x", "error": "not valid JSON"}     # a re-ask among them
    texts = [pol.respond(ep) for ep in one]
    assert pol.respond_batch(many) == texts and len(set(texts)) > 1
    assert [ep.usage for ep in many] == [ep.usage for ep in one] and proc.tokenizer.padding_side == side   # given back
    from forensicslab.zoom.agents import run_zoom, run_zoom_batch
    images, ids = [load_image(s.image) for s in samples], [s.id for s in samples]
    alone = [run_zoom(pol, im, "o3", 2, sample_id=i) for im, i in zip(images, ids)]
    together = run_zoom_batch(pol, images, "o3", 2, ids)
    drop = {"seconds": True, "steps": {"__all__": {"seconds"}}, "rejected": {"__all__": {"seconds"}}}
    assert [r.model_dump(exclude=drop) for r in together] == [r.model_dump(exclude=drop) for r in alone]
    assert len({r.output_tokens for r in alone}) > 1                               # answers of different lengths, each cut at its end


def test_a_run_evaluated_on_another_sample_keeps_its_run_key_and_its_own_evaluation_file(tmp_path):
    "n_eval and eval_split choose the evaluation, not the training: the run (and its pins) stay; each sample has its own eval file."
    from dataclasses import replace
    from forensicslab.zoom.pipeline import eval_name, pin_run, run_key, unpin_run
    cfg = ZoomTrainConfig.smoke(data="folder:/nowhere")
    sub = replace(cfg, n_eval=40)
    assert run_key(sub) == run_key(cfg) == run_key(replace(cfg, eval_split="ood"))
    assert run_key(replace(cfg, seed=cfg.seed + 1)) != run_key(cfg)                  # a training field still counts
    assert eval_name(cfg) == "eval.json" and eval_name(sub) == "eval_test_40.json" != eval_name(replace(sub, eval_split="ood"))
    run, study, fresh = tmp_path / "run", tmp_path / "study", tmp_path / "fresh" / "run"
    (run / "sft").mkdir(parents=True)
    (run / "sft" / "w.safetensors").write_bytes(b"sft adapter")
    pin_run(run, study)
    fresh.mkdir(parents=True)
    for name in (eval_name(cfg), eval_name(sub)): (fresh / name).write_text("{}")
    assert unpin_run(study, fresh) and not list(fresh.glob("eval*.json"))           # the new files: every evaluation again


def test_two_tables_measuring_one_images_instrument_readouts_at_once_measure_it_once(manip, monkeypatch):
    "zoom_training and zoom_training_oracle run side by side in make demo: their controls read one measurement per image."
    from forensicslab.zoom import study
    calls, real = [], study.instrument_features
    def slow(*a, **k):
        calls.append(a[0])
        time.sleep(0.3)                      # long enough for the other table to arrive while this one measures
        return real(*a, **k)
    monkeypatch.setattr(study, "instrument_features", slow)
    s = next(x for x in manip["test"] if x.label == 0)
    args = (str(s.image), tuple(tool_views("forensic")), ())
    got = [None, None]
    def table(i): got[i] = study._instrument_row.__wrapped__(*args)   # each "process" without the in-memory cache
    threads = [threading.Thread(target=table, args=(i,)) for i in range(2)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert len(calls) == 1 and got[0] == got[1] and got[0] is not None
