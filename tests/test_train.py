"""Zoom study training: SFT, GRPO with the crop tool, and the evidence verifier (tiny models on CPU)."""
import math
import os
from dataclasses import replace
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
torch.set_num_threads(1)

from forensicslab.core import Box, EvidenceItem, Sample  # noqa: E402
from forensicslab.zoom.records import zoom  # noqa: E402
from forensicslab.zoom.train import (HybridReward, ZoomTrainConfig, ZoomEnv, load_checkpoint, load_policy,  # noqa: E402
                                read_curves, run_grpo, run_sft, save_checkpoint)
from forensicslab.zoom.rewards import RewardConfig  # noqa: E402
from forensicslab.zoom.data import smoke_task  # noqa: E402
from forensicslab.zoom.verifier import (VerifierItem, VerifierTrainConfig, Verifier, new_verifier, soft_bce,  # noqa: E402
                                   train_verifier)
from forensicslab.zoom.tinyvlm import TinyVLMSpec, build_tiny_vlm, save_vlm  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(vocab_size=3072, max_pixels=64 * 64)


def _texts(trajs):
    return [s.text for t in trajs for s in t["steps"]]


def test_sft_loss_finite_and_decreasing_on_repeated_batch(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))        # where the trainer's throwaway output_dir goes
    trajs, _ = smoke_task(tmp_path / "data", n=1)
    cfg = ZoomTrainConfig.smoke(sft_steps=8, sft_batch_size=1, sft_lr=1e-2, tiny=TINY,
                                lora_modules_to_save=["lm_head", "embed_tokens"], trl_sft={"max_grad_norm": 0.5})
    model, proc = load_policy(cfg, texts=_texts(trajs))
    trainer = run_sft(cfg, model, proc, trajs * 8, tmp_path / "run")
    assert trainer.args.max_grad_norm == 0.5                     # a TRL SFTConfig field from the config reaches the trainer
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 8 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.8 * losses[0], losses
    # only LoRA adapters (text backbone) and the fully trained head/embeddings are trainable
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert any("lora_" in n for n in names) and not any("visual" in n for n in names)
    assert read_curves(tmp_path / "run" / "sft_log.csv")["loss"].notna().sum() == 8
    assert not list(tmp_path.glob("forensicslab-sft-*"))          # removed after training (one was left per run before)


def test_verifier_soft_bce_training(tmp_path):
    rng = np.random.default_rng(0)
    items = []
    for k in range(8):
        rgb = np.full((64, 64, 3), 90, np.uint8); x, y = (int(v) for v in rng.integers(0, 40, 2))
        rgb[y:y + 20, x:x + 20] = 250
        if k % 2: items.append(VerifierItem(rgb, [x, y, x + 20, y + 20], "bright patch without a light source", 1.0))
        else: items.append(VerifierItem(rgb, [0, 0, 12, 12], "garbled text", 1 / 3))
    vlm, proc = build_tiny_vlm(TinyVLMSpec(vocab_size=600, max_pixels=64 * 64))
    save_vlm(vlm, proc, tmp_path / "base")
    cfg = VerifierTrainConfig(epochs=6, batch_size=4, lr=3e-3, lora=False)
    model, vproc = new_verifier(tmp_path / "base", cfg, device="cpu")
    hist = train_verifier(model, vproc, items, cfg)
    assert all(math.isfinite(h) for h in hist)
    assert np.mean(hist[-3:]) < np.mean(hist[:3]), hist
    # soft BCE minimum sits at the soft label
    y = torch.tensor([1 / 3])
    assert soft_bce(torch.logit(y), y) < soft_bce(torch.tensor([3.0]), y)
    ver = Verifier(model, vproc)
    s = ver(items[1].image, [EvidenceItem(text=items[1].text, box=Box.from_list(items[1].box)), (items[0].box, "x")])
    assert len(s) == 2 and all(0.0 <= v <= 1.0 for v in s)


def test_grpo_reward_config_and_env_contract():
    cfg = ZoomTrainConfig()
    assert (cfg.beta, cfg.loss_type, cfg.epsilon, cfg.epsilon_high, cfg.mask_truncated_completions,
            cfg.num_generations, cfg.lora_r, cfg.lora_alpha) == (0.0, "dapo", 0.2, 0.28, True, 16, 16, 32)
    env = ZoomEnv(); env.reset(image=np.zeros((50, 80, 3), np.uint8))
    blocks = env.crop([0, 0, 40, 40])
    assert blocks[0]["type"] == "image" and blocks[0]["image"].size[0] >= 40
    with pytest.raises(ValueError, match="bad box"): env.crop([10, 10, 5, 5])
    with pytest.raises(ValueError, match="needs a verifier"): HybridReward(None, RewardConfig(alpha_m=0.5))


def test_checkpoint_names_its_base_relative_to_itself(tmp_path):
    "No absolute path in what a checkpoint writes (adapter config, model card, zoom_train.json): the run folder moves with the repo."
    from peft import get_peft_model
    from forensicslab.zoom.tinyvlm import load_vlm
    from forensicslab.zoom.train import lora_config
    vlm, proc = build_tiny_vlm(TinyVLMSpec(vocab_size=600, max_pixels=64 * 64))
    save_vlm(vlm, proc, tmp_path / "run" / "base")
    cfg = ZoomTrainConfig.smoke(base=str(tmp_path / "run" / "base"))
    base, proc = load_vlm(tmp_path / "run" / "base", device="cpu")        # loaded from its folder, as a pipeline does
    model = get_peft_model(base, lora_config(cfg))
    save_checkpoint(model, proc, tmp_path / "run" / "sft", tmp_path / "run" / "base", cfg)
    for f in ("adapter_config.json", "README.md", "zoom_train.json"):
        text = (tmp_path / "run" / "sft" / f).read_text()
        assert str(tmp_path) not in text and "../base" in text, (f, text[:400])
    assert str(tmp_path) in model.get_base_model().name_or_path     # the live model is left as it was
    cfg.to_yaml(tmp_path / "run" / "config.yaml")
    assert "base: base\n" in (tmp_path / "run" / "config.yaml").read_text()
    moved = tmp_path / "moved"
    (tmp_path / "run").rename(moved)
    m, _ = load_checkpoint(moved / "sft", device="cpu")
    assert sum(p_.numel() for p_ in m.parameters()) > 0
    assert ZoomTrainConfig.from_yaml(moved / "config.yaml").base == str((moved / "base").resolve())   # read from the file's folder


@pytest.mark.slow
def test_grpo_smoke_tool_called_and_verifier_scored(tmp_path):
    from forensicslab.zoom.rewards import aggregate_model_reward, item_reward
    trajs, samples = smoke_task(tmp_path / "data", n=4)
    cfg = ZoomTrainConfig.smoke(sft_steps=200, sft_batch_size=2, sft_lr=1e-2, tiny=TINY, grpo_steps=2,
                                num_generations=2, grpo_batch_size=4, max_completion_length=160,
                                lora_modules_to_save=["lm_head", "embed_tokens"])
    model, proc = load_policy(cfg, texts=_texts(trajs), save_to=tmp_path / "base")
    sft = run_sft(cfg, model, proc, trajs, tmp_path / "run")
    seen, crops_seen, parts = [], [], []
    from PIL import Image
    sizes = {Image.open(s.image).size for s in samples}

    def verifier(image, items):               # a score that depends on the box: how much of it is bright
        rgb = np.asarray(image.pil() if hasattr(image, "pil") else image)
        out = []
        for it in items:
            x1, y1, x2, y2 = (int(round(v)) for v in it.box.as_list())
            reg = rgb[y1:y2, x1:x2]
            out.append(float((reg.mean(-1) > 200).mean()) if reg.size else 0.0)
        seen.append((rgb.shape[1::-1], [it.box.as_list() for it in items], out))
        return out

    class Spy(HybridReward):
        def __call__(self, completions, environments=None, **kw):
            crops_seen.extend(len(e.crops) for e in environments or [])
            out = super().__call__(completions, **kw)
            parts.extend(self.last_parts)
            return out

    cfg_r = RewardConfig()
    reward = Spy(verifier, cfg_r, "o3")
    grpo = run_grpo(cfg, sft.model, proc, samples, reward, tmp_path / "run")
    log = read_curves(tmp_path / "run" / "grpo_log.csv")
    assert reward.calls == 2
    assert log["tools/call_frequency"].max() > 0, log.T
    assert sum(crops_seen) > 0, (crops_seen, log.filter(like="tools").T)
    # the verifier saw the rollout's own image and the boxes the policy wrote, and its scores (not a constant) are
    # what r_model is made of: one verifier call per fake answer with key evidence, r_model 0 for every other rollout
    assert seen and all(size in sizes for size, _, _ in seen)
    assert all(0 <= b[0] < b[2] <= size[0] and 0 <= b[1] < b[3] <= size[1] for size, boxes, _ in seen for b in boxes)
    expected = sum(aggregate_model_reward([item_reward(v, cfg_r) for v in sc], cfg_r.beta) for _, _, sc in seen)
    assert sum(p["r_model"] for p in parts) == pytest.approx(expected)
    save_checkpoint(grpo.model, proc, tmp_path / "grpo", tmp_path / "base", cfg)
    m, p = load_checkpoint(tmp_path / "grpo", device="cpu")
    assert sum(p_.numel() for p_ in m.parameters()) > 0

    # every crop fails: TRL 1.16 crashed on this path ('list' object has no attribute 'prod'); ZoomGRPOTrainer must not
    class BrokenCrop(ZoomEnv):
        def crop(self, bbox: list[int]) -> list:
            """Cut a region out of the full image and return it magnified.

            Args:
                bbox: Pixel box [x1, y1, x2, y2] in the full image: top-left and bottom-right corners.
            """
            raise ValueError("no crops today")

    run_grpo(replace(cfg, grpo_steps=1), grpo.model, proc, samples, HybridReward(verifier), tmp_path / "run2",
             env_factory=BrokenCrop)
    log2 = read_curves(tmp_path / "run2" / "grpo_log.csv")
    assert log2["tools/failure_frequency"].max() > 0, log2.T


@pytest.mark.slow
def test_gpu_check_script_dry_run_on_cpu():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check_zoom.py"), "--device", "cpu", "--sft-steps", "2",
                        "--grpo-steps", "1", "--num-generations", "2", "--max-completion-length", "48",
                        "--image-size", "96", "--max-pixels", "4096"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    import json
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("GPU_CHECK_REPORT ")][-1]
    rep = json.loads(line.split(" ", 1)[1])
    assert rep["ok"] and rep["sft"]["steps"] == 2 and rep["grpo"]["steps"] == 1
    assert rep["grpo"]["tool_call_frequency"] > 0      # the forced first turn calls the crop tool (random weights never do: 0)


def test_grounding_negatives_that_name_their_own_place_defeat_the_location_rule(tmp_path):
    """A wrong-box negative whose text names its own box's place is not flagged by the location rule (it agrees), one
    with no place is neutral; the verifier scored without the rule ignores the text-box agreement entirely."""
    from forensicslab.zoom.construct import grounding_negatives, place_text
    from forensicslab.zoom.verifier import collate_items, location_agreement, load_verifier, save_verifier
    rgb = np.full((64, 64, 3), 90, np.uint8)
    rgb[4:24, 4:24] = 250
    text = "A bright patch in the upper left has no light source."
    right, wrong = [4, 4, 24, 24], [40, 40, 60, 60]
    own, none = place_text(text, wrong, 64, 64, "own"), place_text(text, wrong, 64, 64, "none")
    assert own == "A bright patch in the lower right has no light source." and none == "A bright patch has no light source."
    assert [location_agreement(t, wrong, 64, 64) for t in (text, own, none)] == [-1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="unknown text mode"): place_text(text, wrong, 64, 64, "elsewhere")
    # construct's negatives: a new box away from the flaw, the text worded by each mode in turn
    trajs, samples = smoke_task(tmp_path / "data", n=2)
    s0 = samples[0]
    W, H = __import__("PIL.Image", fromlist=["Image"]).open(s0.image).size
    flaw = [b.box.as_list() for b in s0.boxes if b.box is not None][0]
    rec = dict(sample_id=s0.id, image=s0.image, box=flaw, text=f"A bright square {__import__('forensicslab.zoom.records', fromlist=['where_phrase']).where_phrase(flaw, W, H)} has hard edges.",
               m=3, M=3, soft_label=1.0, kind="valid")
    negs = grounding_negatives([rec], samples, seed=0, per_item=3, text_modes=("copy", "own", "none"))
    assert [n["text_mode"] for n in negs] == ["copy", "own", "none"] and all(n["soft_label"] == 0.0 for n in negs)
    agree = [location_agreement(n["text"], n["box"], W, H) for n in negs]
    assert agree[1] == 1.0 and agree[2] == 0.0 and all(n["box"] != flaw for n in negs)
    # the verifier without its location rule: the agreement input is 0 for every item, so it cannot move the score
    vlm, proc = build_tiny_vlm(TinyVLMSpec(vocab_size=600, max_pixels=64 * 64))
    save_vlm(vlm, proc, tmp_path / "base")
    cfg = VerifierTrainConfig(lora=False, grounding=True, freeze_vision=True)
    model, vproc = new_verifier(tmp_path / "base", cfg, device="cpu")
    items = [VerifierItem(rgb, right, text), VerifierItem(rgb, wrong, text)]
    assert collate_items(vproc, items)["location"].tolist() == [1.0, -1.0]
    assert collate_items(vproc, items, location=False)["location"].tolist() == [0.0, 0.0]
    with torch.no_grad(): model.score.weight[0, -1] = 2.0
    on, off = Verifier(model, vproc), Verifier(model, vproc, location=False)
    assert on.location_weight == pytest.approx(2.0)
    s_on, s_off = on(rgb, [(right, text), (wrong, text)]), off(rgb, [(right, text), (wrong, text)])
    assert s_on[0] - s_on[1] > s_off[0] - s_off[1] + 0.5            # the rule's weight separates them only when on
    save_verifier(on, tmp_path / "ver", tmp_path / "base", cfg)
    s2 = load_verifier(tmp_path / "ver", device="cpu")(rgb, [(right, text), (wrong, text)])
    assert np.allclose(s_on, s2, atol=1e-5)


def test_snapped_trajectory_boxes_sit_on_the_grid(tmp_path):
    import re
    from forensicslab.zoom.agents import parse_action
    from forensicslab.zoom.train import snap_trajectory
    trajs, _ = smoke_task(tmp_path / "data", n=2, size=96)
    for t in trajs:
        sn = snap_trajectory(t, 16)
        for st in sn["steps"]:
            assert all(int(v) % 16 == 0 for v in re.findall(r"\d+", st["text"].split("</think>")[-1])), st["text"]
            assert parse_action(st["text"], "o3", (96, 96)).kind == st["kind"]   # still a valid turn


def test_shipped_configs_load_and_validate():
    from forensicslab.zoom.cli import shipped_config
    from forensicslab.zoom.train import ZoomConfigError
    c = ZoomTrainConfig.from_yaml(shipped_config("qwen3_vl_8b"))
    assert (c.lora_r, c.lora_alpha, c.sft_lr, c.sft_global_batch, c.grpo_lr, c.num_generations, c.epsilon, c.epsilon_high,
            c.beta, c.loss_type, c.mask_truncated_completions, c.max_zooms) == \
        (16, 32, 1e-4, 8, 1e-5, 16, 0.2, 0.28, 0.0, "dapo", True, 5)
    assert c.base == "Qwen/Qwen3-VL-8B-Instruct" and c.sft_per_device(8) == 1 and c.verifier["lora"]
    assert not c.vision and not c.extra_train and not c.curriculum          # offline aids are off for a real base
    q = ZoomTrainConfig.from_yaml(shipped_config("quick"))
    assert q == ZoomTrainConfig.quick(notes=q.notes)                        # the YAML is the preset
    assert (q.data, q.tools, q.survey) == ("manipulations", "detectors", "named")
    a = ZoomTrainConfig.from_yaml(shipped_config("quick_artifacts"))        # the paper's task, crop only
    assert a == ZoomTrainConfig.quick_artifacts(notes=a.notes) and (a.data, a.tools, a.survey) == ("artifacts", "crop", "none")
    from dataclasses import replace
    h = ZoomTrainConfig.from_yaml(shipped_config("quick_heldout"))           # the preset on the held-out design, in curriculum order
    assert h == replace(ZoomTrainConfig.quick_artifacts(notes=h.notes), data="artifacts_heldout", trl_sft={"train_sampling_strategy": "sequential"})
    with pytest.raises(ZoomConfigError, match="unknown config keys"):
        ZoomTrainConfig.from_yaml("base: tiny\nlearning_rate: 1\n")
    with pytest.raises(ZoomConfigError, match="not divisible"):
        c.sft_per_device(3)
    with pytest.raises(ZoomConfigError, match="trl_grpo: lerning_rate not field"):
        ZoomTrainConfig.from_yaml("base: tiny\ntrl_grpo: {lerning_rate: 1.0e-5}\n")
    assert "trl_sft" not in q.as_dict() and ZoomTrainConfig.quick(trl_sft={"weight_decay": 0.1}).as_dict()["trl_sft"] == {"weight_decay": 0.1}


def test_real_base_without_a_config_is_refused(tmp_path):
    from forensicslab.zoom.tinyvlm import ZoomModelError, load_vlm
    with pytest.raises(ZoomModelError, match="could not be fetched"):
        load_vlm("nobody-here/NoSuchModel-8B")                                # a hub id, and no hub here
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "llava"}')
    with pytest.raises(ZoomModelError, match="not supported by the zoom training path"):
        load_vlm(tmp_path / "m")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_vl", "qwen2_5_vl"])
def test_train_zoom_command_runs_each_family_and_resumes(tmp_path, family):
    import json
    from typer.testing import CliRunner
    from forensicslab.cli import app
    cfg = ZoomTrainConfig.smoke(tiny=dict(TINY, family=family), sft_steps=3, grpo_steps=1, num_generations=2,
                                grpo_batch_size=2, max_completion_length=64, max_tool_calls=1, max_zooms=1, n_eval=2,
                                verifier=dict(max_steps=1, batch_size=2, epochs=1))
    cfg.to_yaml(tmp_path / "c.yaml")
    args = ["train", "zoom", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out")]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, (r.output, r.exception)
    out = tmp_path / "out"
    assert json.loads((out / "base" / "config.json").read_text())["model_type"] == family
    ev = json.loads((out / "eval.json").read_text())
    assert set(ev) == {"sft", "grpo", "controls"} and ev["grpo"]["n"] == 2
    assert "instrument only" in r.output and "targets for the final checkpoint: acc" in r.output   # the printed table
    assert read_curves(out / "grpo_log.csv")["step"].max() == 1
    assert (out / "verifier" / "verifier.json").exists()
    stamp = (out / "sft" / "zoom_train.json").stat().st_mtime_ns
    r2 = CliRunner().invoke(app, args)                                        # resume: nothing is retrained
    assert r2.exit_code == 0 and (out / "sft" / "zoom_train.json").stat().st_mtime_ns == stamp
    import re
    assert "verifier: found, reused" in r2.output and not re.search(r"^(sft|grpo): \d+ steps", r2.output, re.M)


# ---- GRPO: every registered image has exactly one attended image-token run (issue 24) ---------------------------
def _image_runs(ids, keep, image_id) -> int:
    "Image-token runs among the tokens the model attends to (`keep`): what Qwen3-VL's rope index pairs with image grids."
    import itertools
    kinds = [int(t == image_id) for t, k in zip(ids.tolist(), keep.tolist()) if k]
    return sum(1 for k, _ in itertools.groupby(kinds) if k)


def _spy_batches(monkeypatch):
    "Record, for every GRPO batch, each rollout's registered images and attended image-token runs."
    import forensicslab.zoom.train as T
    seen, orig = [], T.ZoomGRPOTrainer._generate_and_score_completions

    def spy(self, inputs):
        out = orig(self, inputs)
        image_id = self.processing_class.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
        keep = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
        n = out.get("num_images") or [0] * len(ids)
        grids = out.get("image_grid_thw")
        seen.append(dict(images=list(n), runs=[_image_runs(ids[b], keep[b], image_id) for b in range(len(ids))],
                         grids=0 if grids is None else int(grids.shape[0]),
                         cut=[int(out["completion_mask"][b].sum()) == 0 for b in range(len(ids))]))
        return out
    monkeypatch.setattr(T.ZoomGRPOTrainer, "_generate_and_score_completions", spy)
    return seen


def test_grpo_rollout_cut_after_a_crop_registers_no_orphan_image(tmp_path, monkeypatch):
    """A rollout that crops, then runs past `max_completion_length`, is masked whole (DAPO `mask_truncated_completions`).
    Its crop must not stay registered: Qwen3-VL pairs image grids with the image-token runs it attends to, so an
    orphan crop shifts every later rollout's grid (the `make demo` crash of issue 24: 16 grids, 15 runs).
    Scripted turns drive TRL's real tool loop: every rollout crops a wide box (a crop grid unlike the full image's),
    then rollout 0 writes on without an end token and is cut, the others answer."""
    import forensicslab.zoom.train as T
    trajs, samples = smoke_task(tmp_path / "data", n=2, size=96)
    cfg = ZoomTrainConfig.smoke(tiny=TINY, grpo_steps=1, num_generations=2, grpo_batch_size=4, max_completion_length=160,
                                max_tool_calls=1, max_zooms=1)
    model, proc = load_policy(cfg, texts=_texts(trajs))
    tok = proc.tokenizer
    call = '<tool_call>\n{"name": "crop", "arguments": {"bbox": [0, 0, 90, 30]}}\n</tool_call><|im_end|>'
    answer = '<answer>{"verdict": "real", "evidence": [{"bbox": null, "text": "no flaw"}]}</answer><|im_end|>'
    ramble = "the crop shows a bright square " * 60                       # no end token: cut by the length limit
    turns = []

    def scripted(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        first = not turns or turns[-1] == "after"
        turns.append("first" if first else "after")
        if first: return [tok.encode(call, add_special_tokens=False) for _ in prompt_ids], None
        return [tok.encode(ramble if i == 0 else answer, add_special_tokens=False) for i in range(len(prompt_ids))], None
    monkeypatch.setattr(T.ZoomGRPOTrainer, "_generate_single_turn", scripted)
    seen = _spy_batches(monkeypatch)
    run_grpo(cfg, model, proc, samples[:2], HybridReward(lambda image, items: [0.7] * len(items)), tmp_path / "run")
    assert turns == ["first", "after"] and len(seen) == 1, (turns, seen)
    b = seen[0]
    assert b["cut"] == [True, False, False, False], b                 # the script did what it says: rollout 0 cut
    assert b["images"][1:] == [2, 2, 2], b                            # the others: full image + their crop
    assert b["runs"] == b["images"] and b["grids"] == sum(b["images"]), b


# ---- a failed stage never leaves a half-overwritten run (issue 24) ---------------------------------------------------
def _tree(root):
    "Relative path -> sha256 of every file under `root`, hidden work folders included."
    import hashlib
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(root).rglob("*"))
            if p.is_file()}


def test_failed_grpo_stage_leaves_the_previous_run_byte_identical(tmp_path, monkeypatch):
    "SFT succeeds, GRPO raises: base, SFT checkpoint, curves and config of the previous run stay byte for byte."
    import forensicslab.zoom.train as T
    trajs, samples = smoke_task(tmp_path / "data", n=2)
    runs = tmp_path / "runs"
    prev = runs / "run"
    for rel, text in {"base/config.json": "{}", "base/old_shard.bin": "old base", "sft/zoom_train.json": "{}",
                      "sft/adapter_model.safetensors": "old sft", "grpo/adapter_model.safetensors": "old grpo",
                      "verifier/verifier.json": "{}", "sft_log.csv": "stage,step\nsft,1\n", "config.yaml": "base: tiny\n",
                      "notes.md": "made elsewhere"}.items():
        (prev / rel).parent.mkdir(parents=True, exist_ok=True)
        (prev / rel).write_text(text)
    before = _tree(runs)
    cfg = ZoomTrainConfig.smoke(tiny=TINY, sft_steps=2, grpo_steps=1, num_generations=2, grpo_batch_size=2,
                                max_completion_length=48)
    verifier = lambda image, items: [0.7] * len(items)

    class Broken(T.HybridReward):
        def __call__(self, *a, **kw): raise RuntimeError("reward crashed in GRPO")
    with monkeypatch.context() as mp:
        mp.setattr(T, "HybridReward", Broken)
        with pytest.raises(RuntimeError, match="crashed in GRPO"):
            T.train_zoom(cfg, trajs, samples, prev, verifier=verifier, texts=_texts(trajs))
    assert _tree(runs) == before                                   # nothing replaced, no work folder left behind
    assert sorted(p.name for p in runs.iterdir()) == ["run"]
    # a run that succeeds replaces what it wrote (each folder whole), keeps the rest, and its checkpoints name ../base
    res = T.train_zoom(cfg, trajs, samples, prev, verifier=verifier, texts=_texts(trajs))
    assert res["grpo"] == prev / "grpo" and (prev / "grpo" / "zoom_train.json").exists()
    assert (prev / "notes.md").read_text() == "made elsewhere" and (prev / "verifier" / "verifier.json").read_text() == "{}"
    assert not (prev / "base" / "old_shard.bin").exists() and (prev / "base" / "config.json").read_text() != "{}"
    assert '"base_path": "../base"' in (prev / "sft" / "zoom_train.json").read_text()
    assert sorted(p.name for p in runs.iterdir()) == ["run"]
    m, _ = load_checkpoint(prev / "grpo", device="cpu")
    assert sum(p_.numel() for p_ in m.parameters()) > 0


QUICK_RUN = ROOT / "outputs" / "zoom_training"   # the quick configuration's committed base, verifier and SFT checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_quick_config_across_seeds_and_threads(tmp_path, monkeypatch, seed, threads):
    """GRPO on the quick configuration from its SFT checkpoint, three steps per seed and torch thread count: every
    batch fed to the model holds one attended image-token run per registered image, and the steps complete.
    The length limit is 128 instead of 384 so that rollouts cut after a crop (the `make demo` crash of issue 24, seed 0,
    step 3 at 384) occur within a few steps; the old trainer fails here with Qwen3-VL's 'shape mismatch'."""
    import forensicslab.zoom.train as T
    from forensicslab.zoom.data import ensure_artifacts, load_artifacts
    from forensicslab.zoom.verifier import load_verifier
    if not (QUICK_RUN / "sft" / "zoom_train.json").exists():
        pytest.skip(f"no quick-configuration SFT checkpoint at {QUICK_RUN / 'sft'} (make it with `forensicslab study zoom_training`)")
    held = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cfg = replace(ZoomTrainConfig.quick_artifacts(seed=seed), grpo_steps=3, base=str(QUICK_RUN / "base"), max_completion_length=128)
        train = load_artifacts("train", ensure_artifacts(tmp_path / "data", n_train=8, n_test=2, n_ood=2, seed=0))
        verifier = load_verifier(QUICK_RUN / "verifier", device="cpu")
        model, proc = load_checkpoint(QUICK_RUN / "sft", device="cpu", trainable=True)
        seen, cuts, drop = _spy_batches(monkeypatch), [], T.drop_cut_crops

        def counting(ids, imgs, *a):
            out = drop(ids, imgs, *a)
            cuts.append(sum(1 for old, new in zip(imgs, out[1]) if old and not new))
            return out
        monkeypatch.setattr(T, "drop_cut_crops", counting)
        g = run_grpo(cfg, model, proc, train, HybridReward(verifier, cfg.reward_config, cfg.variant), tmp_path / "run")
    finally:
        torch.set_num_threads(held)
    assert g.state.global_step == 3 and len(seen) == 3
    for b in seen: assert b["runs"] == b["images"] and b["grids"] == sum(b["images"]), b
    assert sum(cuts) > 0, f"no rollout was cut after a crop ({cuts}): the test no longer reaches the path it guards"


def test_forensic_tool_set_reaches_sft_grpo_and_evaluation_alike(tmp_path):
    from forensicslab.imageio import load_image
    from forensicslab.zoom.agents import Episode
    from forensicslab.zoom.pipeline import episode_views
    from forensicslab.zoom.records import ZoomConfigError
    from forensicslab.zoom.rules import ForensicViews, tool_views
    from forensicslab.zoom.train import HFZoomPolicy, sft_dataset, zoom_env_factory
    trajs, samples = smoke_task(tmp_path / "data", n=3)
    with pytest.raises(ZoomConfigError, match="unknown tool set"): ZoomTrainConfig.smoke(tools="crop+xray")
    views = tool_views(ZoomTrainConfig.smoke(tools="forensic").tools)
    # SFT: the tool turn shows the crop, the forensic maps beside it and one readout line per view
    tool = [m for m in sft_dataset(trajs, "o3", 1, views=views)[0]["messages"] if m["role"] == "tool"][0]
    assert [p["type"] for p in tool["content"]] == ["image", "image", "text"]
    sft_text = tool["content"][-1]["text"]
    assert "noise residual" in sft_text and "copy-move" in sft_text and "cues:" in sft_text
    crop_only = [m for m in sft_dataset(trajs, "o3", 1)[0]["messages"] if m["role"] == "tool"][0]
    assert [p["type"] for p in crop_only["content"]] == ["image", "text"]          # the paper's crop-only tool
    # GRPO: the environment returns the same readouts for the same box
    step = [s for s in trajs[0]["steps"] if s.kind == "crop"][0]
    box = [int(v) for v in step.bbox]
    env = zoom_env_factory(views)()
    env.reset(image=load_image(trajs[0]["image"]).pil(), sample=samples[0].model_dump_json())
    blocks = env.crop(box)
    assert [b["type"] for b in blocks] == ["image", "image", "text"] and blocks[-1]["text"] == sft_text
    # evaluation: the same views; shuffled, another image's views (the control), never the episode's own
    ep = Episode(image=load_image(samples[0].image), variant="o3", max_turns=3, sample_id=samples[0].id)
    own, shuffled = episode_views(samples, views)(ep), episode_views(samples, views, shuffle=True)(ep)
    assert own.text(box) == ForensicViews(samples[0].image, views).text(box)
    others = {s.id: ForensicViews(s.image, views).readouts(box) for s in samples[1:]}
    assert shuffled.readouts(box) in others.values() and shuffled.readouts(box) != own.readouts(box)
    pol = HFZoomPolicy(None, None, views_for=episode_views(samples, views))
    ep.crops.append(zoom(ep.image, box))
    ep.steps.append(step)
    assert pol.messages(ep)[-1]["content"][-1]["text"] == sft_text
    # the oracle view reads the true flaw box and says so
    oracle = ForensicViews(samples[0].image, ("oracle",), flaw_boxes=[b.box.as_list() for b in samples[0].boxes if b.box])
    assert "ORACLE" in oracle.text(box) and oracle.readouts(box)["oracle"] > 0


def test_reward_components_are_named_functions_whose_weighted_sum_is_the_total():
    from forensicslab.zoom.records import ZoomAnswer
    from forensicslab.zoom.agents import render_turn
    smp = Sample(
        id="s", image="x.png", label=1, boxes=[EvidenceItem(text="overall"), EvidenceItem(text="a bright square", box=Box(x1=10, y1=10, x2=40, y2=40))])
    rgb = np.zeros((64, 64, 3), np.uint8)
    fake = render_turn("", answer=ZoomAnswer(verdict="fake", evidence=[{"bbox": None, "text": "odd"},
                                                                       {"bbox": [12, 12, 40, 40], "text": "a bright square"}]))
    real = render_turn("", answer=ZoomAnswer(verdict="real", evidence=[{"bbox": None, "text": "fine"}]))
    comps = [[{"role": "assistant", "content": t}] for t in (fake, real, "no answer here")]
    cfg = RewardConfig(alpha_m=0.3)
    r = HybridReward(lambda image, items: [0.9] * len(items), cfg)
    names = [f.__name__ for f in r.funcs()]
    assert names == ["format", "classification", "evidence_rule", "evidence_verifier"]
    kw = dict(image=[rgb] * 3, sample=[smp.model_dump_json()] * 3)
    cols = np.array([f(comps, **kw) for f in r.funcs()])
    total = np.array(r.weights()) @ cols
    assert np.allclose(total, r(comps, **kw))                         # TRL's weighted sum is R_total
    assert cols[0].tolist() == [0.0, 0.0, -1.0] and cols[1].tolist() == [1.0, 0.0, 0.0]
    assert cols[2][0] > 0 and cols[3][0] > 0 and r.weights() == [1.0, 1.0, 0.7, 0.3]
    assert r.calls == 2                                               # one scoring pass for the four functions


def test_csv_logger_keeps_earlier_rows_when_resuming(tmp_path):
    from types import SimpleNamespace
    from forensicslab.zoom.train import CSVLogger
    p = tmp_path / "grpo_log.csv"
    a = CSVLogger(p, "grpo")
    for s in (1, 2): a.on_log(None, SimpleNamespace(global_step=s), None, logs={"loss": 0.5 * s})
    b = CSVLogger(p, "grpo", append=True)                             # a resumed run
    b.on_log(None, SimpleNamespace(global_step=3), None, logs={"loss": 1.5, "reward": 0.1})
    df = read_curves(p)
    assert df["step"].tolist() == [1, 2, 3] and df["reward"].isna().tolist() == [True, True, False]
    CSVLogger(p, "grpo").on_log(None, SimpleNamespace(global_step=1), None, logs={"loss": 9.0})   # a fresh run starts over
    assert read_curves(p)["step"].tolist() == [1]


def _groundfake_fixture(root: Path) -> Path:
    "A GroundFake-format folder made here: 6 train and 4 test images (a bright square on noise marks the fakes), rewritten trajectories and human votes."
    import json
    from PIL import Image
    from forensicslab.zoom.agents import steps_from_plan
    from forensicslab.zoom.records import ZoomAnswer, box_to_norm
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    ann, trajs, ver = [], [], []
    for i in range(10):
        split, fake = ("train" if i < 6 else "test"), i % 2 == 1
        rgb = rng.normal(110, 25, (96, 96, 3)).clip(0, 255).astype(np.uint8)
        box = [int(v) for v in (8 + 6 * i, 20, 40 + 6 * i, 52)]
        if fake: rgb[box[1]:box[3], box[0]:box[2]] = 245
        Image.fromarray(rgb).save(root / f"im{i}.png")
        norm = box_to_norm(box, 96, 96)
        ev = [{"bbox": None, "text": "Generated: a flat patch sits on the noise." if fake else "Camera noise everywhere."}]
        if fake: ev.append({"bbox": norm, "text": "A flat bright square with hard edges."})
        ann.append({"id": f"g{i}", "image": f"im{i}.png", "label": "fake" if fake else "real", "split": split, "evidence": ev})
        answer = ZoomAnswer(verdict="fake" if fake else "real", evidence=[{"bbox": box if e["bbox"] else None, "text": e["text"]} for e in ev])
        plan = [("The square looks flat; zoom in.", box)] if fake else []
        steps = steps_from_plan(plan, answer, "GroundFake's rewritten reasoning for g%d." % i)
        trajs.append({"sample_id": f"g{i}", "variant": "o3", "steps": [s.model_dump() for s in steps]})
        if fake:
            ver.append({"sample_id": f"g{i}", "bbox": norm, "text": "A flat bright square with hard edges.", "votes": [1, 1, 0]})
            ver.append({"sample_id": f"g{i}", "bbox": box_to_norm([60, 60, 90, 90], 96, 96), "text": "A flat bright square.", "votes": [0, 0, 0]})
    for name, recs in (("annotations.jsonl", ann), ("trajectories.jsonl", trajs), ("verification.jsonl", ver)):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    return root


def test_groundfake_trajectories_and_votes_reach_the_pipeline(tmp_path):
    from forensicslab.zoom.pipeline import pipeline_data
    from forensicslab.zoom.records import ZoomInputError
    root = _groundfake_fixture(tmp_path / "gf")
    cfg = ZoomTrainConfig.smoke(data=f"groundfake:{root}")
    d = pipeline_data(cfg)
    assert sorted(s.id for s in d["train"]) == [f"g{i}" for i in range(6)] and len(d["eval"]) == 4
    texts = [st["text"] for t in d["trajectories"] for st in t["steps"]]
    assert len(d["trajectories"]) == 6 and sum("GroundFake's rewritten reasoning" in t for t in texts) == 6   # their own, not rule templates
    assert sorted((r["m"], r["M"], round(r["soft_label"], 3)) for r in d["verifier_items"]) == [(0, 3, 0.0)] * 3 + [(2, 3, 0.667)] * 3
    assert all(r["kind"] == "groundfake" for r in d["verifier_items"])
    (root / "verification.jsonl").unlink()
    with pytest.raises(ZoomInputError, match="verification.jsonl not found"): pipeline_data(cfg)


def test_n_train_trains_on_a_balanced_subset_and_keeps_every_committed_run_key(tmp_path):
    "`n_train` (a smoke run's few images) subsets the train split, both labels alike; at 0 the config hashes as before the field."
    from forensicslab.zoom.pipeline import pipeline_data
    root = _groundfake_fixture(tmp_path / "gf")
    d = pipeline_data(ZoomTrainConfig.smoke(data=f"groundfake:{root}", n_train=4))
    assert len(d["train"]) == 4 and sorted(s.label for s in d["train"]) == [0, 0, 1, 1]
    assert sorted(t["sample_id"] for t in d["trajectories"]) == sorted(s.id for s in d["train"])   # trained on those only
    assert "n_train" not in ZoomTrainConfig.quick().as_dict() and ZoomTrainConfig.quick(n_train=8).as_dict()["n_train"] == 8


@pytest.mark.slow
def test_groundfake_fixture_runs_the_whole_pipeline(tmp_path):
    import json
    from forensicslab.zoom.pipeline import run_pipeline
    root = _groundfake_fixture(tmp_path / "gf")
    # the reward verifier reads the instruments under each box (`verifier: {instrument: true}` in a config)
    cfg = ZoomTrainConfig.smoke(data=f"groundfake:{root}", tiny=TINY, sft_steps=6, grpo_steps=1,
                                verifier={"epochs": 1, "instrument": True})
    res = run_pipeline(cfg, tmp_path / "run", log=lambda *a: None)
    assert set(res) == {"sft", "grpo", "controls"} and res["grpo"]["n"] == 4
    meta = json.loads((tmp_path / "run" / "verifier" / "verifier.json").read_text())
    assert meta["steps"] >= 1 and meta["instrument"] and (tmp_path / "run" / "grpo_log.csv").exists()


def test_instrument_verifier_reads_the_cues_under_the_box_and_round_trips(tmp_path):
    "With `instrument`, the head reads the instruments inside each box (a duplicated patch scores high on `dup` and `copymove` only there); saved and loaded, it scores the same."
    import json
    from forensicslab.zoom.records import ZoomInputError
    from forensicslab.zoom.verifier import INSTRUMENTS, box_cues, collate_items, load_verifier, save_verifier
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 255, (96, 96, 3), dtype=np.uint8)
    rgb[10:30, 40:60] = rgb[10:30, 10:30]                      # a copied patch: the dup cue's evidence
    on_copy, elsewhere = [8, 8, 62, 32], [8, 60, 62, 90]
    c_on, c_off = box_cues(rgb, on_copy), box_cues(rgb, elsewhere)
    assert len(c_on) == len(INSTRUMENTS) and all(c_on[INSTRUMENTS.index(k)] > c_off[INSTRUMENTS.index(k)] for k in ("dup", "copymove"))
    vlm, proc = build_tiny_vlm(TinyVLMSpec(vocab_size=600, max_pixels=64 * 64))
    save_vlm(vlm, proc, tmp_path / "base")
    cfg = VerifierTrainConfig(lora=False, grounding=True, instrument=True, freeze_vision=True)
    model, vproc = new_verifier(tmp_path / "base", cfg, device="cpu")
    items = [VerifierItem(rgb, on_copy, "two patches repeat"), VerifierItem(rgb, elsewhere, "two patches repeat")]
    assert collate_items(vproc, items, cues=True)["cues"].shape == (2, len(INSTRUMENTS))
    with torch.no_grad(): model.score.weight[0, -1 - len(INSTRUMENTS) + INSTRUMENTS.index("dup")] = 3.0   # the dup cue's input (location is last)
    ver = Verifier(model, vproc)
    s = ver.score_items(items)
    assert s[0] > s[1] + 0.2
    save_verifier(ver, tmp_path / "ver", tmp_path / "base", cfg)
    assert np.allclose(s, load_verifier(tmp_path / "ver", device="cpu").score_items(items), atol=1e-5)
    # a verifier whose head was trained on another instrument set (here: an earlier version's `true`) is refused, not misread
    meta = json.loads((tmp_path / "ver" / "verifier.json").read_text())
    (tmp_path / "ver" / "verifier.json").write_text(json.dumps(dict(meta, instrument=True)))
    with pytest.raises(ZoomInputError, match="other instruments"): load_verifier(tmp_path / "ver", device="cpu")
