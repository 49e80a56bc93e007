#!/usr/bin/env python
"""Zoom study, device check: a few SFT and GRPO steps of the zoom policy, with step times and peak memory.

On a GPU machine (default: CUDA, bfloat16, an 8B-shaped Qwen3-VL with random weights, no download):

    python scripts/gpu_check_zoom.py                               # Qwen3-VL-8B shape, random weights, LoRA
    python scripts/gpu_check_zoom.py --config-json /models/Qwen3-VL-8B-Instruct/config.json   # the exact shape
    python scripts/gpu_check_zoom.py --base /models/Qwen3-VL-8B-Instruct --num-generations 4  # real weights
    python scripts/gpu_check_zoom.py --shape tiny                  # the tiny offline model on the GPU

Sized for one GPU in under 8 minutes with start-up (not yet measured: no GPU was lent to the session that wrote
this version), in the paper's setting where it can be: LoRA r16/alpha32 on the text backbone only (trainable
parameters printed beside the paper's 43.6 M), GRPO groups of 16, a 4,096-token completion budget, 768-px images
(--image-size/--max-pixels; the paper states no resolution, so this is the largest we expect to fit, not the
paper's), and an evidence verifier of the policy's size in bf16 (its own LoRA and head) scoring every fake answer.
Random weights never write a tool call, so by default every rollout's first turn is forced (a logits processor) to
be one crop call, token for token as the chat template writes it, on the image's centre; the turns after the tool's
reply are the model's own (`--no-force-first-call` leaves all turns free; the report gives the tool-call frequency).
Nothing is written but a temp folder of the tiny tokenizer.

Dry run on CPU (float32; checks the script itself, its numbers say nothing about a GPU):

    python scripts/gpu_check_zoom.py --device cpu

It trains on 8 images of the manipulation design with the built-in detectors' survey in the first turn (the offline
quick config's task; `--no-survey`: the toy square task of `forensicslab.zoom.data.smoke_task`, crop only), written to a
temp folder, with a policy-sized verifier (or a constant stand-in, `--no-verifier`), and prints one JSON object: device, dtype, parameter counts, per-stage mean
and median step time (first step excluded when there are more than two), peak CUDA memory, final SFT
loss, GRPO tool-call frequency, and total wall time (also on one last line prefixed `GPU_CHECK_REPORT`).
Exit status 0 when both stages ran.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TrainerCallback


class StepTimer(TrainerCallback):
    "Wall time of every optimiser step (CUDA synchronised)."
    def __init__(self): self.times, self._t = [], None
    def _sync(self):
        if torch.cuda.is_available(): torch.cuda.synchronize()
    def on_step_begin(self, args, state, control, **kw): self._sync(); self._t = time.perf_counter()
    def on_step_end(self, args, state, control, **kw):
        self._sync(); self.times.append(time.perf_counter() - self._t)


def summary(times: list[float]) -> dict:
    steady = times[1:] if len(times) > 2 else times
    return {"steps": len(times), "mean_s": round(statistics.mean(steady), 4) if steady else None,
            "median_s": round(statistics.median(steady), 4) if steady else None,
            "first_s": round(times[0], 4) if times else None}


class ForcedFirstCall(LogitsProcessor):
    "Forces rows still on their first turn (no tool response in the prompt) to write `call_ids` first, then frees them."
    def __init__(self, call_ids: list[int], prompt_len: int, first_turn: torch.Tensor):
        self.call_ids, self.prompt_len, self.first_turn = call_ids, prompt_len, first_turn

    def __call__(self, input_ids, scores):
        k = input_ids.shape[1] - self.prompt_len
        if k < len(self.call_ids) and self.first_turn.any():
            forced = torch.full_like(scores[0], float("-inf"))
            forced[self.call_ids[k]] = 0.0
            scores = torch.where(self.first_turn.to(scores.device)[:, None], forced, scores)
        return scores


def force_first_call(model, proc, bbox: list[int]) -> int:
    "Wrap `model.generate` so every rollout's first turn is the crop call on `bbox`; returns the call's token count."
    msgs = [{"role": "user", "content": [{"type": "text", "text": "x"}]},
            {"role": "assistant", "content": [], "tool_calls": [{"type": "function", "function": {"name": "crop", "arguments": {"bbox": bbox}}}]}]
    head = proc.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    turn = proc.apply_chat_template(msgs, tokenize=False)[len(head):]
    turn = turn[:turn.index(proc.tokenizer.eos_token) + len(proc.tokenizer.eos_token)]   # the call and its end token
    call_ids = proc.tokenizer(turn, add_special_tokens=False).input_ids
    reply_id = proc.tokenizer.convert_tokens_to_ids("<tool_response>")
    generate = model.generate

    def generate_with_forced_call(*args, **kw):
        ids = kw["input_ids"]
        first = ~(ids == reply_id).any(dim=1)
        return generate(*args, logits_processor=LogitsProcessorList([ForcedFirstCall(call_ids, ids.shape[1], first)]), **kw)
    model.generate = generate_with_forced_call
    return len(call_ids)


def peak_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if torch.cuda.is_available() else None


QWEN3_VL_8B = dict(
    # Sizes of Qwen3-VL-8B-Instruct's config.json as recalled when this script was written (no hub here to read it):
    # pass --config-json with the real file to use its exact values.
    text=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
              num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=262144,
              rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20],
                               "mrope_interleaved": True}),
    vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16, spatial_merge_size=2,
                temporal_patch_size=2, out_hidden_size=4096, num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24]))


def build_8b_shape(proc, config_json, device, dtype):
    "A Qwen3-VL with the 8B model's sizes and random weights, special-token ids pointing into the tiny tokenizer."
    from transformers import AutoModelForImageTextToText
    from transformers.models.qwen3_vl import Qwen3VLConfig
    tok = proc.tokenizer
    tid = tok.convert_tokens_to_ids
    if config_json:
        raw = json.load(open(config_json))
        text = {k: v for k, v in raw["text_config"].items() if k not in ("bos_token_id", "eos_token_id", "pad_token_id")}
        vision = raw["vision_config"]
    else:
        text, vision = dict(QWEN3_VL_8B["text"]), dict(QWEN3_VL_8B["vision"])
    text["vocab_size"] = max(text["vocab_size"], len(tok))
    cfg = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=tid("<|image_pad|>"),
                        video_token_id=tid("<|video_pad|>"), vision_start_token_id=tid("<|vision_start|>"),
                        vision_end_token_id=tid("<|vision_end|>"), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(cfg, dtype=getattr(torch, dtype))
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = tok.eos_token_id, tok.pad_token_id
    return model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--base", default="tiny", help="'tiny' or a local model folder (e.g. Qwen3-VL-8B-Instruct)")
    ap.add_argument("--sft-steps", type=int, default=4)
    ap.add_argument("--grpo-steps", type=int, default=3)
    ap.add_argument("--num-generations", type=int, default=16, help="GRPO group size (paper: 16)")
    ap.add_argument("--max-completion-length", type=int, default=4096, help="paper: 4,096")
    ap.add_argument("--max-pixels", type=int, default=768 * 768)
    ap.add_argument("--image-size", type=int, default=768)
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                    help="default: on for cuda (as the paper's config), off on cpu")
    ap.add_argument("--force-first-call", action=argparse.BooleanOptionalAction, default=True,
                    help="force each rollout's first turn to be a crop call on the image centre (default: on; random weights never call)")
    ap.add_argument("--no-verifier", action="store_true", help="a constant stand-in instead of a policy-sized bf16 verifier")
    ap.add_argument("--shape", default=None, choices=["tiny", "8b"],
                    help="model shape built from a config with random weights (default: 8b on cuda, tiny on cpu)")
    ap.add_argument("--config-json", default=None, help="a Qwen3-VL config.json whose sizes to use for --shape 8b")
    ap.add_argument("--survey", action=argparse.BooleanOptionalAction, default=True,
                    help="the offline quick config's task: 8 images of the manipulation design, the built-in detectors as tools "
                         "and their survey in the first turn (default); --no-survey: the toy square task, crop only")
    a = ap.parse_args(argv)
    shape = a.shape or ("8b" if a.device.startswith("cuda") and a.base == "tiny" else "tiny")

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "CUDA requested but torch.cuda.is_available() is False; "
                          "use --device cpu for a dry run"}))
        return 2
    if a.device == "cpu": torch.set_num_threads(1)
    dtype = a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32")

    from forensicslab.zoom.data import smoke_task
    from forensicslab.zoom.train import ZoomTrainConfig, HybridReward, load_policy, run_grpo, run_sft
    from forensicslab.zoom.rewards import RewardConfig

    tiny = dict(vocab_size=3072, max_pixels=a.max_pixels)
    gc = a.gradient_checkpointing if a.gradient_checkpointing is not None else a.device.startswith("cuda")
    # LoRA on the text backbone only: full copies of the embeddings and output layer (modules_to_save) are for the
    # tiny offline model, whose new tokenizer has no trained embeddings; on an 8B shape they would add 1.2 B parameters
    cfg = ZoomTrainConfig.smoke(base=a.base, device=a.device, dtype=dtype, tiny=tiny, max_pixels=a.max_pixels,
                                sft_steps=a.sft_steps, grpo_steps=a.grpo_steps, num_generations=a.num_generations,
                                grpo_batch_size=a.num_generations, max_completion_length=a.max_completion_length,
                                gradient_checkpointing=gc, lora_r=16, lora_alpha=32,
                                lora_modules_to_save=["lm_head", "embed_tokens"] if shape == "tiny" and a.base == "tiny" else [])
    report = {"device": a.device, "dtype": dtype, "base": a.base, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() and a.device != "cpu" else None}
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        if a.survey:                      # the survey task (zoom.data "manipulations", tools "detectors", survey "named")
            from dataclasses import replace
            from forensicslab.zoom.construct import SurveyProposer, construct
            from forensicslab.zoom.data import ensure_artifacts, load_artifacts
            from forensicslab.zoom.records import ZoomStep
            from forensicslab.zoom.rules import ForensicViews, tool_views
            from forensicslab.zoom.train import name_trajectory
            cfg = replace(cfg, tools="detectors", survey="named", box_grid=16)
            samples = load_artifacts("train", ensure_artifacts(d + "/data", n_train=8, n_test=2, n_ood=2, design="manipulations"), "manipulations")
            views_of = lambda s: ForensicViews(s.image, tool_views("detectors"))
            by_id = {s.id: s for s in samples}
            trajs = [name_trajectory(t, views_of(by_id[t["sample_id"]]).regions())     # the teacher names its region (R1..R6)
                     for t in construct(samples, SurveyProposer(views_of), variants=("o3",)).trajectories]
            trajs = [{**t, "steps": [ZoomStep(**st) for st in t["steps"]], "sample": by_id[t["sample_id"]].model_dump_json()} for t in trajs]
            a.image_size = 256                                     # the design's image side (the forced call's box)
            extra = [views_of(s).survey_text(named=True) for s in samples]
        else:
            trajs, samples = smoke_task(d + "/data", n=4, size=a.image_size)
            extra = []
        report["task"] = "manipulations + survey" if a.survey else "toy squares, crop only"
        model, proc = load_policy(cfg, texts=[s.text for t in trajs for s in t["steps"]] + extra,
                                  save_to=d + "/base" if a.base == "tiny" else None)
        if a.base == "tiny" and shape == "8b":
            model = build_8b_shape(proc, a.config_json, a.device, dtype)   # in memory only: nothing here reads a saved copy
        report["shape"] = shape if a.base == "tiny" else "checkpoint"
        report["params_total"] = sum(p.numel() for p in model.parameters())
        if torch.cuda.is_available(): torch.cuda.reset_peak_memory_stats()
        t_sft = StepTimer()
        sft = run_sft(cfg, model, proc, trajs, d + "/run", callbacks=[t_sft])
        report["params_trainable"] = sum(p.numel() for p in sft.model.parameters() if p.requires_grad)
        report["params_trainable_paper"] = 43_600_000      # seed 001: LoRA r16/alpha32 on Qwen3-VL-8B's text backbone
        report["params_trainable_ratio_to_paper"] = round(report["params_trainable"] / 43.6e6, 3)
        losses = [r["loss"] for r in sft.state.log_history if "loss" in r]
        tok_sft = max((r.get("num_tokens", 0) for r in sft.state.log_history), default=0)
        report["sft"] = {**summary(t_sft.times), "final_loss": losses[-1] if losses else None, "peak_gib": peak_gib(),
                         "tokens": tok_sft, "tokens_per_s": round(tok_sft / sum(t_sft.times), 1) if t_sft.times else None}
        if torch.cuda.is_available(): torch.cuda.reset_peak_memory_stats()
        t_grpo = StepTimer()
        if a.no_verifier: verifier = lambda image, items: [0.7] * len(items)
        else:                                         # a verifier of the policy's shape: own backbone, LoRA, head, bf16
            from forensicslab.zoom.verifier import EvidenceVerifier, Verifier, add_lora
            vb = build_8b_shape(proc, a.config_json, a.device, dtype) if shape == "8b" and a.base == "tiny" else \
                load_policy(cfg, texts=[s.text for t in trajs for s in t["steps"]] + extra)[0] if a.base == "tiny" else \
                load_policy(cfg)[0]
            verifier = Verifier(add_lora(EvidenceVerifier.from_vlm(vb)), proc)
            report["verifier_params"] = sum(p.numel() for p in verifier.model.parameters())
        reward = HybridReward(verifier, RewardConfig(), cfg.variant)
        if a.force_first_call:
            q = a.image_size // 4
            report["forced_first_call_tokens"] = force_first_call(sft.model, proc, [q, q, 3 * q, 3 * q])
        grpo = run_grpo(cfg, sft.model, proc, samples, reward, d + "/run", callbacks=[t_grpo])
        logs = [r for r in grpo.state.log_history if "reward" in r]
        n_tok = max((r.get("num_tokens", 0) for r in grpo.state.log_history), default=0)
        report["grpo"] = {**summary(t_grpo.times), "peak_gib": peak_gib(),
                          "tool_call_frequency": statistics.mean(r.get("tools/call_frequency", 0) for r in logs) if logs else None,
                          "mean_completion_length": statistics.mean(r.get("completions/mean_length", 0) for r in logs) if logs else None,
                          "reward_calls": reward.calls, "verifier_calls": reward.verifier_calls, "tokens": n_tok,
                          "tokens_per_s": round(n_tok / sum(t_grpo.times), 1) if t_grpo.times and n_tok else None}
    report["wall_s"] = round(time.perf_counter() - t_all, 2)
    if not report["grpo"]["tool_call_frequency"]:
        report["note"] = "no rollout called the crop tool: the GRPO figures are for answer-only rollouts"
    elif a.force_first_call:
        report["note"] = "every rollout's first turn was a forced crop call (the model's own turns follow the tool's reply)"
    report["ok"] = True
    print(json.dumps(report, indent=2))
    print("GPU_CHECK_REPORT " + json.dumps(report))  # one line for scripts
    return 0


if __name__ == "__main__":
    sys.exit(main())
