"""Single-operator mutations of the lab's central rules, each run against the tests that guard it.

A mutation that no test notices ("survived") marks a rule the tests cannot tell from a wrong one. The script copies
the checkout to a temporary folder, applies one mutation at a time to the notebook (the source) and to the exported
module alike, runs the guarding notebook with nbdev-test and the guarding pytest file, and prints a table. It reports;
it does not fail CI (a full run takes several minutes per mutation on 2 cores).

    python scripts/mutations.py                 # all mutations
    python scripts/mutations.py --only ds-tie   # one of them
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    module: str          # exported module, relative to the checkout
    notebook: str        # its source notebook
    old: str
    new: str
    tests: tuple[str, ...] = ()   # pytest node ids / files guarding it, besides the notebook's own checks


MUTATIONS = [
    # the control: same behaviour, other text; it must survive, or the harness itself is broken (a copy that cannot import)
    Mutation("control-same-behaviour", "forensicslab/triage/judge.py", "nbs/06c_triage.judge.ipynb",
             "if bel_m <= bel_a or not dets:", "if (bel_m <= bel_a) or not dets:", ("tests/test_triage.py",)),
    Mutation("fusion-any-fired", "forensicslab/triage/judge.py", "nbs/06c_triage.judge.ipynb",
             "if any(dets[k].fired for k in ks)", "if all(dets[k].fired for k in ks)", ("tests/test_triage.py",)),
    Mutation("ds-tie", "forensicslab/triage/judge.py", "nbs/06c_triage.judge.ipynb",
             "if bel_m <= bel_a or not dets:", "if bel_m < bel_a or not dets:", ("tests/test_triage.py",)),
    Mutation("rule-judge-accept", "forensicslab/triage/rules.py", "nbs/06a_triage.rules.ipynb",
             "if by_scope[best] < self.params.accept_min:", "if by_scope[best] <= self.params.accept_min:",
             ("tests/test_triage.py",)),
    Mutation("mcnemar-arbitration-filter", "forensicslab/triage/study.py", "nbs/06e_triage.study.ipynb",
             'ra[i]["label"] == 1 and', 'ra[i]["label"] == 0 and', ("tests/test_triage.py",)),
    Mutation("arbitration-correct", "forensicslab/triage/study.py", "nbs/06e_triage.study.ipynb",
             'if on == "arbitration": return bool(r.get("in_scope"))', 'if on == "arbitration": return not r.get("in_scope")',
             ("tests/test_triage.py",)),
    Mutation("mcnemar-orientation", "forensicslab/metrics.py", "nbs/02a_metrics.ipynb",
             "n01, n10 = int((~a & b).sum()), int((a & ~b).sum())", "n10, n01 = int((~a & b).sum()), int((a & ~b).sum())",
             ("tests/test_metrics.py",)),
    Mutation("reward-item-threshold", "forensicslab/zoom/rewards.py", "nbs/08c_zoom.rewards.ipynb",
             "if score < cfg.tau else", "if score <= cfg.tau else", ("tests/test_zoom.py",)),
    Mutation("reward-second-item-weight", "forensicslab/zoom/rewards.py", "nbs/08c_zoom.rewards.ipynb",
             "(beta * pos[1] if len(pos) > 1 else 0.0)", "(pos[1] if len(pos) > 1 else 0.0)", ("tests/test_zoom.py",)),
]


def _replace_in_notebook(path: Path, old: str, new: str) -> int:
    nb = json.loads(path.read_text(encoding="utf-8"))
    hits = 0
    for c in nb["cells"]:
        s = "".join(c["source"])
        if old in s:
            hits += s.count(old)
            c["source"] = s.replace(old, new).splitlines(keepends=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return hits


def run_one(m: Mutation, work: Path, timeout: int) -> dict:
    mod, nb = work / m.module, work / m.notebook
    text = mod.read_text(encoding="utf-8")
    if text.count(m.old) != 1: return dict(mutation=m.name, result="not applicable (rule text not found once)", seconds=0)
    nb_text = nb.read_text(encoding="utf-8")
    mod.write_text(text.replace(m.old, m.new), encoding="utf-8")
    hits = _replace_in_notebook(nb, m.old, m.new)
    t0 = time.time()
    env = {"PYTHONPATH": str(work), "OMP_NUM_THREADS": "1", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    try:
        caught = []
        r = subprocess.run([str(Path(sys.executable).parent / "nbdev-test"), str(nb)], cwd=work, env=env,
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode: caught.append("notebook")
        for t in m.tests:
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", t], cwd=work, env=env,
                               capture_output=True, text=True, timeout=timeout)
            if r.returncode: caught.append(t)
        result = f"killed by {', '.join(caught)}" if caught else "SURVIVED"
    except subprocess.TimeoutExpired:
        result = "killed (timeout)"
    finally:
        mod.write_text(text, encoding="utf-8"); nb.write_text(nb_text, encoding="utf-8")
    return dict(mutation=m.name, result=result if hits else result + " (notebook text not found)", seconds=round(time.time() - t0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="mutation names to run (default: all)")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per test command")
    a = ap.parse_args(argv)
    todo = [m for m in MUTATIONS if not a.only or m.name in a.only]
    if not todo: ap.error(f"no mutation among {[m.name for m in MUTATIONS]} matches {a.only}")
    with tempfile.TemporaryDirectory(prefix="forensicslab-mutations-") as d:
        work = Path(d) / "repo"
        shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(".git", ".venv", "data", "outputs", "_site", "_docs", "__pycache__"))
        rows = []
        for m in todo:
            rows.append(run_one(m, work, a.timeout))
            print(f"{rows[-1]['mutation']:<28} {rows[-1]['result']}  ({rows[-1]['seconds']} s)", flush=True)
    survived = [r["mutation"] for r in rows if r["result"].startswith("SURVIVED") and not r["mutation"].startswith("control")]
    if any(r["mutation"].startswith("control") and not r["result"].startswith("SURVIVED") for r in rows):
        print("the control mutation was killed: the harness is broken, the table above means nothing")
        return 1
    real = [r for r in rows if not r["mutation"].startswith("control")]
    print(f"\n{len(real) - len(survived)} of {len(real)} mutations killed" + (f"; survived: {', '.join(survived)}" if survived else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
