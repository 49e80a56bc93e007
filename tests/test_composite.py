"Composite manipulations (issue 28 items 5-6): the benchmark's composite collection, families and masks per family through every reader, the composite-aware judge and its scoring."
import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from forensicslab.core import FAMILIES, Detection, Sample
from forensicslab.data import bench
from forensicslab.data.bench import COLLECTIONS, COMPOSITE, COMPOSITE_RECIPES, BenchSizes, ensure_bench, load_bench
from forensicslab.data.datasets import DatasetError, DatasetSpec, family_masks, has_families, is_composite, load_manifest, sample_families, stratified_draw
from forensicslab.metrics import MetricError, family_recall, mask_scores, set_arbitration
from forensicslab.triage.judge import (CompositeJudge, TriagePipeline, arbitrated_families, composite_case, composite_extend,
                                       decisive_by_family)
from forensicslab.triage.records import AuditVerdict, Verdict, make_card
from forensicslab.triage.rules import RuleAuditor, RuleJudge


@pytest.fixture(scope="module")
def comp(tmp_path_factory):
    "A composite collection of one image per recipe at 128 px, written by the builder itself (no other collection needed)."
    root = tmp_path_factory.mktemp("comp")
    models, sums = bench.load_generators()
    ss = bench._build_composite(root, 0, 1, 128, models, sums, lambda m: None, set())
    return root, ss


def _bytes(root: Path, sub: str) -> str:
    h = hashlib.sha256()
    for p in sorted((root / sub).rglob("*")):
        if p.is_file(): h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def test_composite_samples_carry_two_families_with_disjoint_masks(comp):
    root, ss = comp
    assert [s.provenance["recipe"] for s in ss] == list(COMPOSITE_RECIPES)
    for s in ss:
        fams = sample_families(s)
        assert tuple(fams) == COMPOSITE_RECIPES[s.provenance["recipe"]] and set(fams) <= set(FAMILIES)
        assert s.label == 1 and s.family is None and is_composite(s)
        ms = {f: np.asarray(Image.open(root / p)) > 127 for f, p in family_masks(s).items()}
        a, b = ms.values()
        assert a.any() and b.any() and not (a & b).any(), s.id
        assert np.array_equal(np.asarray(Image.open(root / s.mask)) > 127, a | b)
    assert has_families(ss)
    assert sorted({"+".join(sample_families(s)) for s in stratified_draw(ss, n_per_family=1)}) == sorted("+".join(v) for v in COMPOSITE_RECIPES.values())


def test_composite_manifest_round_trips_through_the_manifest_reader(comp):
    root, ss = comp
    got = {s.id: s for s in load_manifest(root / COMPOSITE / "manifest.csv")}
    for s in ss:
        g = got[s.id]
        assert sample_families(g) == sample_families(s) and g.family is None and g.label == 1
        assert {f: Path(p) for f, p in family_masks(g).items()} == {f: (root / p).resolve() for f, p in family_masks(s).items()}


def test_composite_build_is_deterministic(comp, tmp_path):
    root, ss = comp
    models, sums = bench.load_generators()
    again = bench._build_composite(tmp_path, 0, 1, 128, models, sums, lambda m: None, set())
    assert [s.provenance["hash"] for s in again] == [s.provenance["hash"] for s in ss]
    other = bench._build_composite(tmp_path / "seed1", 1, 1, 128, models, sums, lambda m: None, set())
    assert not {s.provenance["hash"] for s in other} & {s.provenance["hash"] for s in ss}   # the seed reaches the composite stream
    with pytest.raises(bench.BenchError, match="same pixels"):
        bench._build_composite(tmp_path / "dup", 0, 1, 128, models, sums, lambda m: None, {ss[0].provenance["hash"]})


def test_single_family_readers_unchanged(tmp_path):
    "Old manifests and single-edit samples: one family, the sample's own mask."
    (tmp_path / "a.png").write_bytes(b"")
    s = Sample(id="x", image="a.png", label=1, family="splice", mask="m.png")
    assert sample_families(s) == ["splice"] and family_masks(s) == {"splice": "m.png"} and not is_composite(s)
    assert sample_families(Sample(id="y", image="a.png", label=0)) == []
    assert sample_families(Sample(id="z", image="a.png", label=1)) == [] and family_masks(Sample(id="z", image="a.png", label=1)) == {}
    (tmp_path / "m.csv").write_text("image,label,family\na.png,1,splice\n")
    assert [sample_families(x) for x in load_manifest(tmp_path / "m.csv")] == [["splice"]]
    (tmp_path / "bad.csv").write_text("image,label,family,families\na.png,1,face,splice;gen_inpaint\n")
    with pytest.raises(DatasetError, match="not both"): load_manifest(tmp_path / "bad.csv")


def test_bench_spec_names_the_composite_collection():
    assert (DatasetSpec.parse("composite").kind, DatasetSpec.parse("bench:composite").arg) == ("bench", COMPOSITE)
    with pytest.raises(DatasetError, match="composite"): DatasetSpec.parse("bench:composites")
    with pytest.raises(bench.BenchError, match="composite"): load_bench("composites", "/nonexistent")


def _map(*boxes):
    h = np.zeros((64, 64), np.float32)
    for y0, y1, x0, x1 in boxes: h[y0:y1, x0:x1] = 0.9
    return h


CARDS = {"face_blend": make_card("face_blend", ["face"], True), "noise": make_card("noise", ["classic_inpaint"], True),
         "cfa": make_card("cfa", ["splice"], True)}


def test_composite_rule_adds_only_disjoint_localised_scopes():
    dets = {"face_blend": Detection.from_score("face_blend", 0.9, heatmap=_map((0, 20, 0, 20))),
            "noise": Detection.from_score("noise", 0.7, heatmap=_map((40, 60, 40, 60))),
            "cfa": Detection.from_score("cfa", 0.8, heatmap=_map((4, 24, 4, 24)))}
    one = Verdict(reasoning="f", is_manipulated=True, locality="local", arbitrated_tools=["face_blend"], decision_path=["p"])
    v = composite_extend(one, dets, CARDS)
    assert v.arbitrated_tools == ["face_blend", "noise"] and arbitrated_families(v, CARDS) == ["face", "classic_inpaint"]
    assert decisive_by_family(v, CARDS) == {"face": "face_blend", "classic_inpaint": "noise"}
    # the same scene with the inpainting map moved onto the face: nothing is added
    moved = {**dets, "noise": Detection.from_score("noise", 0.7, heatmap=_map((2, 22, 2, 22)))}
    assert composite_extend(one, moved, CARDS).arbitrated_tools == ["face_blend"]
    # a dropped detection is not a candidate
    drop = {"noise": AuditVerdict(reasoning="r", tool_id="noise", audit_verdict="invalid")}
    assert composite_extend(one, dets, CARDS, drop).arbitrated_tools == ["face_blend"]


def test_composite_judge_in_a_pipeline_keeps_the_base_decision():
    "No face in a grey image: the rule auditor drops face_blend; the splice and inpainting maps are kept and disjoint."
    dets = {"cfa": Detection.from_score("cfa", 0.9, heatmap=_map((0, 20, 0, 20))),
            "noise": Detection.from_score("noise", 0.7, heatmap=_map((40, 60, 40, 60)))}
    img = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    base = TriagePipeline("rules", auditor=RuleAuditor(), judge=RuleJudge())(img, dets, CARDS).verdict
    comp = TriagePipeline("rules+composite", auditor=RuleAuditor(), judge=CompositeJudge(RuleJudge()))(img, dets, CARDS).verdict
    assert comp.is_manipulated == base.is_manipulated and comp.decisive == base.decisive
    assert len(arbitrated_families(comp, CARDS)) == len(arbitrated_families(base, CARDS)) + 1


def test_right_family_wrong_region_is_visible(tmp_path):
    for f, box in (("face", (0, 20, 0, 20)), ("classic_inpaint", (40, 60, 40, 60))):
        Image.fromarray((_map(box) > 0).astype(np.uint8) * 255).save(tmp_path / f"{f}.png")
    s = Sample(id="c", image="x.png", label=1, provenance={"families": ["face", "classic_inpaint"],
                                                           "masks": {f: str(tmp_path / f"{f}.png") for f in ("face", "classic_inpaint")}})
    v = Verdict(reasoning="f", is_manipulated=True, locality="local", arbitrated_tools=["face_blend"], decision_path=["p"])
    right = composite_case(s, v, {"face_blend": Detection.from_score("face_blend", 0.9, heatmap=_map((0, 20, 0, 20)))}, CARDS)
    wrong = composite_case(s, v, {"face_blend": Detection.from_score("face_blend", 0.9, heatmap=_map((40, 60, 40, 60)))}, CARDS)
    assert right["jaccard"] == wrong["jaccard"] == 0.5                 # the family set cannot tell them apart ...
    assert right["region"]["face"]["iou"] == 1.0 and wrong["region"]["face"]["iou"] == 0.0   # ... the region can
    assert wrong["other"]["face"]["iou"] == 1.0


def test_set_metrics_refuse_unpaired_inputs():
    with pytest.raises(MetricError): set_arbitration([{"a"}], [])
    with pytest.raises(MetricError): family_recall([{"a"}, {"b"}], [{"a"}])
    with pytest.raises(MetricError): mask_scores(np.zeros((2, 2), bool), np.zeros((3, 3), bool))


def test_adding_the_composite_collection_leaves_the_others_byte_identical(tmp_path, monkeypatch):
    "Two tiny builds, with and without the composite step: train, id and ood hold the same bytes (13 s on the shared 2-core machine)."
    sizes = BenchSizes.tiny()
    with_c = ensure_bench(tmp_path / "with", 0, sizes, log=lambda m: None)
    monkeypatch.setattr(bench, "_build_composite", lambda *a, **k: [])
    without = ensure_bench(tmp_path / "without", 0, sizes, log=lambda m: None)
    assert (with_c / COMPOSITE).is_dir() and not (without / COMPOSITE).exists()
    for c in COLLECTIONS: assert _bytes(with_c, c) == _bytes(without, c), c


# Table 4 with both judge rules (issue 28 item 5): composite-aware twins of the study's configurations, rows and tables

def _t4_case(sid, label, fams, dets):
    prov = {"families": fams} if len(fams) > 1 else {}
    s = Sample(id=sid, image="x.png", label=label, family=fams[0] if len(fams) == 1 else None, provenance=prov)
    return s, dets


def _t4_rows():
    "Rows of every offline configuration and its composite-aware twin on a composite, a single-edit and an authentic case."
    from forensicslab.triage.configs import build_config, composite_configs, offline_configs
    from forensicslab.triage.study import case_row
    img = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    both = {"cfa": Detection.from_score("cfa", 0.9, heatmap=_map((0, 20, 0, 20))),   # no face in the image: the rule auditor
            "noise": Detection.from_score("noise", 0.8, heatmap=_map((40, 60, 40, 60)))}   # would drop face_blend
    cases = [_t4_case("comp", 1, ["splice", "classic_inpaint"], both),
             _t4_case("single", 1, ["classic_inpaint"], {**both, "cfa": Detection.from_score("cfa", 0.1)}),
             _t4_case("auth", 0, [], {k: Detection.from_score(k, 0.1) for k in both})]
    configs = offline_configs()
    configs += composite_configs(configs)
    return {(c.name, "x"): [case_row(s, build_config(c)(img, d, CARDS), CARDS, d) for s, d in cases] for c in configs}


def test_table4_twins_score_set_arbitration_with_the_single_edit_and_authentic_controls():
    from forensicslab.triage.study import composite_finding, composite_table, family_breakdown, fire_events, triage_metrics
    rows = _t4_rows()
    r = {k: {x["sample"]: x for x in v} for k, v in rows.items()}
    assert r[("fusion", "x")]["comp"]["families"] == ["splice", "classic_inpaint"] and r[("fusion", "x")]["comp"]["family"] is None
    assert r[("fusion", "x")]["comp"]["answer"] == ["splice"] and r[("fusion+composite", "x")]["comp"]["answer"] == ["splice", "classic_inpaint"]
    assert r[("fusion", "x")]["comp"]["in_scope"]                          # credited by either family, not left out as unknown
    assert not np.isnan(triage_metrics(rows[("fusion", "x")], n_boot=0)["arbitration"][0])
    ev = fire_events(rows[("fusion", "x")])
    assert ev[ev["sample"] == "comp"].event.tolist() == ["in scope, manipulated"] * 2     # both fires, neither "unknown family"
    assert "splice+classic_inpaint" in set(family_breakdown(rows[("rules", "x")]).family)
    ct = composite_table(rows, n_boot=20).set_index(["config", "part"])
    for base in ("fusion", "ds", "rules"):
        one, two = ct.loc[(base, "composite")], ct.loc[(f"{base}+composite", "composite")]
        assert (one.set_arbitration, two.set_arbitration, two.exact_set) == (0.5, 1.0, 1.0), base
        assert (two.a_only, two.b_only) == (1, 0)
        # the controls: the extension never changes a binary verdict and adds no family where one map fired
        assert ct.loc[(f"{base}+composite", "authentic"), "correct"] == ct.loc[(base, "authentic"), "correct"] == 1.0
        assert ct.loc[(f"{base}+composite", "single edit"), "extra_family"] == ct.loc[(base, "single edit"), "extra_family"] == 0.0
    assert "fusion one-family -> composite-aware: on 1 composite images of x set arbitration 50.0% -> 100.0%" in composite_finding(ct.reset_index())


def test_table4_twins_leave_the_other_configurations_run_keys_alone():
    from forensicslab.triage.configs import TriageConfig, composite_configs, offline_configs, preset
    from forensicslab.triage.records import TriageConfigError
    rules = preset("rules")
    assert "composite" not in rules.model_dump() and "composite" not in rules.model_dump_json()   # manifests (and run tags) as before
    twin = composite_configs([rules], max_overlap=0.2)[0]
    assert (twin.name, twin.composite) == ("rules+composite", {"base": "rules", "max_overlap": 0.2, "max_hot": 0.5})
    assert TriageConfig.model_validate(twin.model_dump()) == twin and TriageConfig.model_validate(rules.model_dump()) == rules
    with pytest.raises(TriageConfigError, match="max_hot"):
        composite_configs(offline_configs(), max_hot=0)


def test_a_twin_of_a_given_runner_extends_that_runner_s_verdict():
    "A configuration run by a runner built elsewhere (a trust store's rows): its twin runs the same runner, verdict extended."
    from forensicslab.triage.records import CaseResult
    from forensicslab.triage.configs import Runner, TriageConfig, build_config, composite_configs
    dets = {"cfa": Detection.from_score("cfa", 0.9, heatmap=_map((0, 20, 0, 20))),
            "noise": Detection.from_score("noise", 0.8, heatmap=_map((40, 60, 40, 60)))}
    calls = []
    def given(image, detections, cards, facts=None):
        calls.append(1)
        return CaseResult(config="store-lr", verdict=Verdict(reasoning="lr", is_manipulated=True, locality="local",
                                                             arbitrated_tools=["cfa"], decision_path=["p"]))
    cfg = TriageConfig(name="store-lr", label="a store's judge", kind="pipeline", judge="learned")
    twin = composite_configs([cfg])[0]
    res = build_config(twin, runners={"store-lr": (given, "fp")})(None, dets, CARDS)
    assert calls == [1] and res.config == "store-lr+composite" and res.verdict.arbitrated_tools == ["cfa", "noise"]
    plain = build_config(cfg, runners={"store-lr": (given, "fp")})   # the given runner, as the one runner type
    assert isinstance(plain, Runner) and plain(None, dets, CARDS).verdict.arbitrated_tools == ["cfa"] and calls == [1, 1]


def test_a_parent_family_scope_and_answer_credit_a_finer_true_family():
    """Issue 48 item 4: the benchmark's learned fills are `gan_inpaint`; a detector declaring `gen_inpaint` (the built-in
    inpaint_net) or `gan_inpaint` (TruFor) is in scope for them and its answer is credited; one declaring only
    `diffusion_inpaint` (RADAR) is not."""
    from forensicslab.triage.configs import build_config, offline_configs
    from forensicslab.triage.study import case_row, composite_table, fire_events
    img = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    fusion = next(c for c in offline_configs() if c.name == "fusion")
    s = Sample(id="fill", image="x.png", label=1, family="gan_inpaint")
    got = {}
    for scope in ("gen_inpaint", "gan_inpaint", "diffusion_inpaint"):
        cards = {"det": make_card("det", [scope], False)}
        d = {"det": Detection.from_score("det", 0.9)}
        row = case_row(s, build_config(fusion)(img, d, cards), cards, d)
        ct = composite_table({("fusion", "x"): [row]}, n_boot=0).set_index("part")
        got[scope] = (row["in_scope"], fire_events([row]).event.tolist(), ct.loc["single edit", "set_arbitration"])
    assert got == {"gen_inpaint": (True, ["in scope, manipulated"], 1.0), "gan_inpaint": (True, ["in scope, manipulated"], 1.0),
                   "diffusion_inpaint": (False, ["out of scope, manipulated"], 0.0)}


def test_the_learned_judge_names_a_detector_whose_scope_holds_its_finer_class():
    "A learned judge fitted on `gan_inpaint` cases makes the `gen_inpaint`-scoped detector decisive, not the highest-scoring other one."
    from forensicslab.triage.judge import LearnedJudge
    cards = {"fill": make_card("fill", ["gen_inpaint"], False), "cfa": make_card("cfa", ["splice"], False)}
    case = lambda f, c: ({"fill": Detection.from_score("fill", f), "cfa": Detection.from_score("cfa", c)}, None)
    cases = [(*case(0.9, 0.9), "gan_inpaint")] * 6 + [(*case(0.1, 0.9), "splice")] * 6 + [(*case(0.1, 0.1), "authentic")] * 6
    j = LearnedJudge.fit(cases, ["fill", "cfa"])
    dets, _ = case(0.85, 0.95)                    # both fire and cfa scores higher, but the class is the fill's
    v = j.judge(None, dets, cards, {})
    assert v.is_manipulated and v.arbitrated_tools[0] == "fill"
