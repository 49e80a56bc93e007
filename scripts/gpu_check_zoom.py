#!/usr/bin/env python
"""Zoom study, device check: a few SFT and GRPO steps of the zoom policy, with step times and peak memory.

On a GPU machine (default: CUDA, bfloat16):

    python scripts/gpu_check_zoom.py                               # tiny Qwen3-VL built from a config
    python scripts/gpu_check_zoom.py --base /models/Qwen3-VL-8B-Instruct --num-generations 4

Dry run on CPU (float32; checks the script itself, its numbers say nothing about a GPU):

    python scripts/gpu_check_zoom.py --device cpu

It trains on the toy square task of `forensicslab.zoom.train.smoke_task` (written to a temp folder), uses a
constant stand-in verifier, and prints one JSON object: device, dtype, parameter counts, per-stage mean
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
from transformers import TrainerCallback


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


def peak_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if torch.cuda.is_available() else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--base", default="tiny", help="'tiny' or a local model folder (e.g. Qwen3-VL-8B-Instruct)")
    ap.add_argument("--sft-steps", type=int, default=4)
    ap.add_argument("--grpo-steps", type=int, default=3)
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--max-completion-length", type=int, default=256)
    ap.add_argument("--max-pixels", type=int, default=256 * 256)
    ap.add_argument("--image-size", type=int, default=256)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    a = ap.parse_args(argv)

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "CUDA requested but torch.cuda.is_available() is False; "
                          "use --device cpu for a dry run"}))
        return 2
    if a.device == "cpu": torch.set_num_threads(1)
    dtype = a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32")

    from forensicslab.zoom.train import ZoomTrainConfig, HybridReward, load_policy, run_grpo, run_sft, smoke_task
    from forensicslab.zoom.rewards import RewardConfig

    tiny = dict(vocab_size=3072, max_pixels=a.max_pixels)
    cfg = ZoomTrainConfig.smoke(base=a.base, device=a.device, dtype=dtype, tiny=tiny, max_pixels=a.max_pixels,
                                sft_steps=a.sft_steps, grpo_steps=a.grpo_steps, num_generations=a.num_generations,
                                grpo_batch_size=2 * a.num_generations, max_completion_length=a.max_completion_length,
                                gradient_checkpointing=a.gradient_checkpointing,
                                lora_modules_to_save=["lm_head", "embed_tokens"] if a.base == "tiny" else [])
    report = {"device": a.device, "dtype": dtype, "base": a.base, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() and a.device != "cpu" else None}
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        trajs, samples = smoke_task(d + "/data", n=4, size=a.image_size)
        model, proc = load_policy(cfg, texts=[s.text for t in trajs for s in t["steps"]],
                                  save_to=d + "/base" if a.base == "tiny" else None)
        report["params_total"] = sum(p.numel() for p in model.parameters())
        if torch.cuda.is_available(): torch.cuda.reset_peak_memory_stats()
        t_sft = StepTimer()
        sft = run_sft(cfg, model, proc, trajs, d + "/run", callbacks=[t_sft])
        report["params_trainable"] = sum(p.numel() for p in sft.model.parameters() if p.requires_grad)
        losses = [r["loss"] for r in sft.state.log_history if "loss" in r]
        report["sft"] = {**summary(t_sft.times), "final_loss": losses[-1] if losses else None, "peak_gib": peak_gib()}
        if torch.cuda.is_available(): torch.cuda.reset_peak_memory_stats()
        t_grpo = StepTimer()
        reward = HybridReward(lambda image, items: [0.7] * len(items), RewardConfig(), cfg.variant)
        grpo = run_grpo(cfg, sft.model, proc, samples, reward, d + "/run", callbacks=[t_grpo])
        logs = [r for r in grpo.state.log_history if "reward" in r]
        report["grpo"] = {**summary(t_grpo.times), "peak_gib": peak_gib(),
                          "tool_call_frequency": statistics.mean(r.get("tools/call_frequency", 0) for r in logs) if logs else None,
                          "mean_completion_length": statistics.mean(r.get("completions/mean_length", 0) for r in logs) if logs else None,
                          "reward_calls": reward.calls}
    report["wall_s"] = round(time.perf_counter() - t_all, 2)
    report["ok"] = True
    print(json.dumps(report, indent=2))
    print("GPU_CHECK_REPORT " + json.dumps(report))  # one line for scripts
    return 0


if __name__ == "__main__":
    sys.exit(main())
