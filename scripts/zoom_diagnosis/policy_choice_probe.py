"""Which surveyed region does the trained survey policy want, and does it fit its own teacher? (zoom issue 46, item 4)

The survey policy (`outputs/zoom_grounding`, pinned) answers with IoU 0.453 on the manipulation design's test fakes, the
same as the rule that answers with the survey's top line R1. Its teacher names the line nearest the truth, not always
R1. This probe reads the policy's own probabilities of each choice: for every fake it takes the greedy crop turn (a
thought naming a tool, then a region label) and scores the same turn rewritten for each surveyed line k (that line's
tool in the thought and `Rk` as the box). Printed per split and checkpoint: how often each label is chosen, the IoU of
R1, of the policy's most likely line and of the best line (the teacher's choice, an oracle), the mean probability of
R1 and of the best line, and that probability where the best line is not R1. On the TRAIN split this is the teacher's
own data: a policy that learned the choice puts its mass there. Run from the repository root (about 2 minutes with a
warm detection cache): `python scripts/zoom_diagnosis/policy_choice_probe.py`; output in `policy_choice_probe.log`."""
import collections
import re
import tempfile
from pathlib import Path

import numpy as np
import torch

from forensicslab.imageio import load_image
from forensicslab.zoom.agents import Episode
from forensicslab.zoom.pipeline import episode_views, pipeline_data, run_key, unpin_run
from forensicslab.zoom.rewards import union_iou
from forensicslab.zoom.rules import tool_views
from forensicslab.zoom.train import HFZoomPolicy, ZoomTrainConfig, load_checkpoint

cfg = ZoomTrainConfig.quick()
run = Path(tempfile.mkdtemp()) / run_key(cfg)
run.mkdir()
assert unpin_run(Path("outputs/zoom_grounding"), run), "outputs/zoom_grounding holds no pinned run of the quick configuration"
data = pipeline_data(cfg)

def choice_logprobs(model, proc, policy, sample):
    "The greedy crop turn, and the log-probability of that turn rewritten for each surveyed line."
    ep = Episode(image=load_image(sample.image), variant="o3", max_turns=2, sample_id=sample.id)
    batch = policy._inputs([policy.messages(ep)])
    n = batch["input_ids"].shape[1]
    with torch.no_grad():
        text = proc.tokenizer.decode(model.generate(**batch, max_new_tokens=60, do_sample=False,
                                                    pad_token_id=proc.tokenizer.pad_token_id)[0, n:])
    lines = ep.scratch["views"].surveyed
    tool, label = re.search(r"Zoom on the (\w+) region", text), re.search(r'"R(\d)"', text)
    if not (tool and label): return text, lines, None
    out = []
    for k, line in enumerate(lines, 1):
        turn = text[:tool.start(1)] + line["tool"] + text[tool.end(1):label.start(1)] + str(k) + text[label.end(1):]
        ids = proc.tokenizer(turn, add_special_tokens=False, return_tensors="pt")["input_ids"]
        extra = {k2: v for k2, v in batch.items() if k2 not in ("input_ids", "attention_mask", "mm_token_type_ids")}
        if "mm_token_type_ids" in batch: extra["mm_token_type_ids"] = torch.cat([batch["mm_token_type_ids"], torch.zeros_like(ids)], 1)
        full = torch.cat([batch["input_ids"], ids], 1)
        with torch.no_grad():
            lp = model(input_ids=full, attention_mask=torch.ones_like(full), **extra).logits[0, n - 1:-1].log_softmax(-1)
        out.append(float(lp.gather(1, ids[0][:, None]).sum()))
    return text, lines, np.array(out)

for stage in ("sft", "grpo"):
    model, proc = load_checkpoint(run / stage, device="cpu")
    for split, samples in (("train", data["train"]), ("test", data["eval"])):
        fakes = [s for s in samples if s.label == 1]
        policy = HFZoomPolicy(model, proc, max_new_tokens=cfg.max_completion_length, max_zooms=cfg.max_zooms,
                              views_for=episode_views(fakes, tool_views(cfg.tools)), survey=cfg.survey)
        chosen, P, I = collections.Counter(), [], []
        for s in fakes:
            text, lines, lp = choice_logprobs(model, proc, policy, s)
            m = re.search(r'"R(\d)"', text)
            chosen[f"R{m.group(1)}" if m else "no label"] += 1
            if lp is None: continue
            truth = [b.box.as_list() for b in s.boxes if b.box is not None][:1]
            P.append(np.exp(lp - np.logaddexp.reduce(lp)))
            I.append(np.array([union_iou([e["box"]], truth) for e in lines]))
        best = [int(np.argmax(i)) for i in I]
        off = [p[b] for p, b in zip(P, best) if b != 0]
        print(f"{stage} on {split} ({len(fakes)} fakes, {len(P)} with a labelled crop turn): chose {dict(sorted(chosen.items()))}")
        print(f"  IoU: R1 {np.mean([i[0] for i in I]):.3f}, the policy's most likely line "
              f"{np.mean([i[int(np.argmax(p))] for p, i in zip(P, I)]):.3f}, best line (oracle) {np.mean([i.max() for i in I]):.3f}")
        print(f"  mean P(R1) {np.mean([p[0] for p in P]):.3f}, mean P(best line) {np.mean([p[b] for p, b in zip(P, best)]):.3f}; "
              f"best line is not R1 for {len(off)} fakes, where P(best line) is {np.mean(off) if off else float('nan'):.3f}")
