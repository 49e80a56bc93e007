"""Single-operator mutations of the lab's central rules, each run against its own module's pytest file.

A mutation that no test notices ("SURVIVED") marks a rule the tests cannot tell from a wrong one. A rule is guarded
where it lives: the fusion rules, Dempster-Shafer and the Table 4 formulas by `tests/test_triage.py`, McNemar by
`tests/test_metrics.py`, the Stage 0 fire rule by `tests/test_detectors.py`, the debate majority by
`tests/test_debate.py`, the zoom IoU and reward by `tests/test_zoom.py`; the lesson notebooks are not run here (they
are checked by nbdev-test on their own), so a rule caught only by a notebook counts as a survivor.

The script copies the checkout to a temporary folder once, checks that the copy is what the tests import and that
each test selection passes unmutated (a selection that fails already would "kill" every mutation), then applies one
mutation at a time to the exported module (the rule's text is looked up in the package, so it is found wherever the
rule's module moves), runs `pytest -x -k <selection>` on the guarding file, restores the module, and prints a table.
A control mutation (same behaviour, other text) must survive, or the harness is broken. Exit status: 0 when every
mutation was killed, 1 when one survived or the harness is broken, 2 for a bad argument.

    python scripts/mutations.py                   # all mutations, each on its own tests' -k selection (a few minutes)
    python scripts/mutations.py --only ds-tie     # one of them
    python scripts/mutations.py --full            # the whole guarding file for each (slower; checks the selections)
    python scripts/mutations.py --list            # the mutations and their guards, nothing run
    python scripts/mutations.py --rev HEAD        # the committed state (others' work in progress left out)
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "forensicslab"


@dataclass(frozen=True)
class Mutation:
    name: str
    rule: str                            # the rule it breaks, in words
    edits: tuple[tuple[str, str], ...]   # (old, new): each old text occurs exactly once in the package
    tests: tuple[str, ...]               # the rule's own module's pytest file(s)
    k: str = ""                          # pytest -k selection ("" = the whole file)


def M(name, rule, old, new, tests, k="", more=()):
    return Mutation(name, rule, ((old, new), *more), (tests,) if isinstance(tests, str) else tuple(tests), k)


TRIAGE, METRICS, DETECTORS, DEBATE, ZOOM = ("tests/test_triage.py", "tests/test_metrics.py", "tests/test_detectors.py",
                                            "tests/test_debate.py", "tests/test_zoom.py")
RULES = "fusion or ds_belief or rule_judge"
TABLE4 = "table4_formula or mcnemar_pairs"

MUTATIONS = [
    # the control: same behaviour, other text; it must survive, or the harness itself is broken (a copy that cannot import)
    M("control-same-behaviour", "(none: a no-op rewrite of the DS decision)",
      "if bel_m <= bel_a or not dets:", "if (bel_m <= bel_a) or not dets:", TRIAGE, RULES),
    M("fusion-any-fired", "algorithmic fusion: a scope is live when ANY of its detectors fired",
      "if any(dets[k].fired for k in ks)", "if all(dets[k].fired for k in ks)", TRIAGE, RULES),
    M("ds-tie", "Dempster-Shafer: a belief tie Bel(M) = Bel(authentic) is authentic",
      "if bel_m <= bel_a or not dets:", "if bel_m < bel_a or not dets:", TRIAGE, RULES),
    M("ds-conflict-normalise", "Dempster's rule: combined masses are divided by 1 - K",
      "return {a: v / (1 - k) for a, v in out.items()}, k", "return dict(out), k", TRIAGE, RULES),
    M("ds-bba-threshold-scale", "DS: a tool's belief below the threshold is scaled by the threshold (above it, by 1 - threshold)",
      "absent = max(0.0, (threshold - score) / threshold)", "absent = max(0.0, (threshold - score) / (1 - threshold))",
      TRIAGE, RULES),
    M("credibility-threshold-scale", "rule judge: a fired detection's credibility is its margin over 1 - threshold",
      "c = (det.score - det.threshold) / (1 - det.threshold)", "c = (det.score - det.threshold) / det.threshold", TRIAGE, RULES),
    M("rule-judge-accept", "rule judge: a family whose support is below accept_min is not accepted",
      "if by_scope[best] < self.params.accept_min:", "if by_scope[best] <= self.params.accept_min:", TRIAGE, RULES),
    M("mcnemar-arbitration-filter", "Table 4 McNemar on arbitration: only manipulated images of a known family are paired",
      'ra[i]["label"] == 1 and', 'ra[i]["label"] == 0 and', TRIAGE, TABLE4),
    M("arbitration-correct", "Table 4: an arbitration is correct when the answered scope covers the true family",
      'if on == "arbitration": return bool(r.get("in_scope"))', 'if on == "arbitration": return not r.get("in_scope")',
      TRIAGE, TABLE4),
    M("table4-arbitration-denominator", "Table 4: arbitration is averaged over manipulated images of a known family only",
      "scored = (yi == 1) & known[i]", "scored = known[i]", TRIAGE, TABLE4),
    M("table4-failure-is-wrong", "Table 4: a case without a verdict counts as a wrong answer",
      'p = np.array([(1 - r["label"]) if r.get("pred") is None else r["pred"] for r in rows], int)',
      'p = np.array([r["label"] if r.get("pred") is None else r["pred"] for r in rows], int)', TRIAGE, TABLE4),
    M("mcnemar-orientation", "McNemar: a_only counts cases only A got right",
      "n01, n10 = int((~a & b).sum()), int((a & ~b).sum())", "n10, n01 = int((~a & b).sum()), int((a & ~b).sum())",
      METRICS, "mcnemar"),
    M("mcnemar-discordant-filter", "McNemar: only discordant pairs enter the test",
      "n01, n10 = int((~a & b).sum()), int((a & ~b).sum())", "n01, n10 = int(b.sum()), int(a.sum())", METRICS, "mcnemar"),
    M("stage0-fire-rule", "Stage 0: a detector fires when score > threshold (a score at the threshold does not fire)",
      "fired=score > threshold,", "fired=score >= threshold,", DETECTORS, "fire_rule",
      more=(("if self.fired != (self.score > self.threshold):", "if self.fired != (self.score >= self.threshold):"),)),
    M("stage0-card-threshold", "Stage 0: a detection is judged against its card's threshold, not a fixed 0.5",
      "normalise(card, value), raw=raw, threshold=card.threshold,", "normalise(card, value), raw=raw,", DETECTORS, "fire_rule"),
    M("debate-majority", "debate: the final answer of an unresolved debate is the majority's",
      "if c[True] != c[False]: return c[True] > c[False], False", "if c[True] != c[False]: return c[True] < c[False], False",
      DEBATE, "majority"),
    M("debate-tie-first", "debate: a tie goes to the first agent's answer by default",
      'if tie_break == "first": return next(iter(answers.values())), True',
      'if tie_break == "first": return list(answers.values())[-1], True', DEBATE, "majority"),
    M("zoom-iou-union", "zoom: IoU's denominator is the area of the union (overlap counted once)",
      "union += a * (inp or inr)", "union += a * (inp + inr)", ZOOM, "iou"),
    M("zoom-iou-intersection", "zoom: IoU's numerator is the area both unions cover",
      "inter += a * (inp and inr)", "inter += a * inp", ZOOM, "iou"),
    M("reward-item-threshold", "zoom reward: an item scoring below tau is invalid",
      "if score < cfg.tau else", "if score <= cfg.tau else", ZOOM, "reward"),
    M("reward-second-item-weight", "zoom reward: the second evidence item is weighted by beta",
      "(beta * pos[1] if len(pos) > 1 else 0.0)", "(pos[1] if len(pos) > 1 else 0.0)", ZOOM, "reward"),
]


def _locate(work: Path, old: str) -> Path:
    "The one module of the package holding `old` exactly once (raises when it is missing or not unique)."
    hits = [(p, p.read_text(encoding="utf-8").count(old)) for p in sorted((work / PACKAGE).rglob("*.py"))]
    hits = [(p, n) for p, n in hits if n]
    if len(hits) != 1 or hits[0][1] != 1:
        where = ", ".join(f"{p.relative_to(work)} x{n}" for p, n in hits) or "nowhere"
        raise LookupError(f"rule text found {where}, not once: {old!r}")
    return hits[0][0]


def _env(work: Path) -> dict:
    return {"PYTHONPATH": str(work), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "HOME": str(Path.home()),
            "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}


def _pytest(m: Mutation, work: Path, full: bool, timeout: int) -> tuple[bool, str, float]:
    "Run the guarding selection: (passed, last line of pytest's output, seconds)."
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *m.tests]
    if m.k and not full: cmd += ["-k", m.k]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=work, env=_env(work), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timeout after {timeout} s", time.time() - t0
    lines = [ln for ln in (r.stdout + r.stderr).strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit {r.returncode}"
    first_failed = next((ln.split(" - ")[0] for ln in lines if ln.startswith(("FAILED ", "ERROR "))), "")
    if first_failed: last = f"{first_failed}; {last}"
    if r.returncode == 5: return False, f"no test selected ({last})", time.time() - t0
    return r.returncode == 0, last, time.time() - t0


def run_one(m: Mutation, work: Path, full: bool, timeout: int) -> dict:
    try: files = [_locate(work, old) for old, _ in m.edits]
    except LookupError as e: return dict(mutation=m.name, result=f"NOT APPLICABLE: {e}", seconds=0, where="")
    saved = {f: f.read_text(encoding="utf-8") for f in set(files)}
    try:
        for f, (old, new) in zip(files, m.edits): f.write_text(f.read_text(encoding="utf-8").replace(old, new), encoding="utf-8")
        passed, last, s = _pytest(m, work, full, timeout)
    finally:
        for f, text in saved.items(): f.write_text(text, encoding="utf-8")
    where = ", ".join(sorted({str(f.relative_to(work)) for f in files}))
    result = "SURVIVED" if passed else (f"killed by {' '.join(m.tests)}" + (f" -k '{m.k}'" if m.k and not full else "")
                                        if not last.startswith(("timeout", "no test")) else f"UNDECIDED: {last}")
    return dict(mutation=m.name, result=result, seconds=round(s), where=where)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="mutation names to run (default: all)")
    ap.add_argument("--full", action="store_true", help="run the whole guarding file, not the -k selection")
    ap.add_argument("--list", action="store_true", help="list the mutations and their guards, run nothing")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per pytest command")
    ap.add_argument("--rev", help="test a git revision (e.g. HEAD: the committed state, without work in progress) "
                                  "instead of the working tree")
    a = ap.parse_args(argv)
    names = [m.name for m in MUTATIONS]
    unknown = sorted(set(a.only or []) - set(names))
    if unknown: ap.error(f"unknown mutation(s) {', '.join(unknown)}; known: {', '.join(names)}")
    todo = [m for m in MUTATIONS if not a.only or m.name in a.only or m.name.startswith("control")]
    if a.list:
        for m in todo: print(f"{m.name:<32} {' '.join(m.tests)}" + (f" -k '{m.k}'" if m.k else "") + f"\n{'':<32} {m.rule}")
        return 0
    with tempfile.TemporaryDirectory(prefix="forensicslab-mutations-") as d:
        work = Path(d) / "repo"
        if a.rev:
            work.mkdir()
            tar = subprocess.run(["git", "-C", str(ROOT), "archive", a.rev], capture_output=True)
            if tar.returncode: ap.error(f"git archive {a.rev}: {tar.stderr.decode().strip()}")
            subprocess.run(["tar", "-x", "-C", str(work)], input=tar.stdout, check=True)
        else:
            shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(".git", ".venv", "data", "outputs", "_site", "_docs",
                                                                      "__pycache__", "*.pyc", ".ipynb_checkpoints"))
        r = subprocess.run([sys.executable, "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"], cwd=work, env=_env(work),
                           capture_output=True, text=True)
        if not r.stdout.strip().startswith(str(work)):
            print(f"the tests would import {r.stdout.strip() or r.stderr.strip()!r}, not the copy under {work}: harness broken")
            return 1
        baseline: dict[tuple, tuple] = {}       # each selection must pass unmutated, or its kills mean nothing
        for m in todo:
            key = (m.tests, "" if a.full else m.k)
            if key not in baseline:
                baseline[key] = _pytest(m, work, a.full, a.timeout)
                ok, last, s = baseline[key]
                print(f"{'(unmutated)':<32} {' '.join(m.tests)}" + (f" -k '{key[1]}'" if key[1] else "") +
                      f": {'passes' if ok else 'FAILS'} ({last}; {s:.0f} s)", flush=True)
        bad = [k for k, v in baseline.items() if not v[0]]
        if bad:
            print(f"{len(bad)} selection(s) fail without a mutation: fix them first, the table would mean nothing")
            return 1
        rows = []
        for m in todo:
            rows.append(run_one(m, work, a.full, a.timeout))
            row = rows[-1]
            print(f"{row['mutation']:<32} {row['result']}  ({row['where']}; {row['seconds']} s)", flush=True)
    control = [r for r in rows if r["mutation"].startswith("control")]
    if any(not r["result"].startswith("SURVIVED") for r in control):
        print("the control mutation was killed: the harness is broken, the table above means nothing")
        return 1
    real = [r for r in rows if not r["mutation"].startswith("control")]
    survived = [r["mutation"] for r in real if not r["result"].startswith("killed")]
    print(f"\n{len(real) - len(survived)} of {len(real)} mutations killed by their own module's tests; "
          f"{len(survived)} not killed" + (f" (survived, not applicable or undecided): {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
