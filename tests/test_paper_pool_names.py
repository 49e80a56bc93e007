"""Issue 48, item 3: one name, one detector. A third-party entry point cannot take the name of a built-in or of a paper
adapter (even one not imported yet): it is skipped with a one-line warning naming both, the lab's detector keeps the
name; IMDL-BenCo's TruFor wrapper registers under its own name, opt-in, and never replaces the paper's `trufor`."""
from __future__ import annotations

import warnings
from importlib.metadata import EntryPoint

import pytest

from forensicslab.detectors import pool as P
from forensicslab.detectors.paper.pool import paper_sources
from forensicslab.detectors.paper.trufor import TruFor

PLUGIN = '''
from forensicslab.core import ToolCard
class Fake:
    card = ToolCard(id="{id}", name="a plug-in's {id}", scope=["splice"], native_metric="p", normalisation="identity",
                    score_reading="p")
    def detect(self, image): raise RuntimeError("never run")
'''


@pytest.fixture
def fake_plugins(tmp_path, monkeypatch):
    "Entry points of a fake installed package: `trufor` and `adq` (the lab's names) and `fakedet` (a free one)."
    eps = []
    for name in ("trufor", "adq", "fakedet"):
        (tmp_path / f"fakepkg_{name}.py").write_text(PLUGIN.format(id=name))
        eps.append(EntryPoint(name=name, value=f"fakepkg_{name}:Fake", group=P.ENTRY_POINT_GROUP))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(P, "entry_points", lambda group: [e for e in eps if e.group == group])
    saved = dict(P._FACTORIES), set(P.OPT_IN)
    for k in ("trufor", "fakedet"): P._FACTORIES.pop(k, None)   # as in a fresh process: the paper adapter not yet imported
    yield
    P._FACTORIES.clear(); P._FACTORIES.update(saved[0])
    P.OPT_IN.clear(); P.OPT_IN.update(saved[1])
    for k in ("trufor", "adq", "fakedet"): P._INSTANCES.pop(k, None)
    for k in list(P._ERRORS):
        if k.startswith("entry point "): P._ERRORS.pop(k)


def test_a_plugin_cannot_take_a_lab_name(fake_plugins):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        P.discover(force=True)
    msgs = [str(x.message) for x in w if "skipped" in str(x.message)]
    assert len(msgs) == 2 and all("\n" not in m for m in msgs)
    tru = next(m for m in msgs if "'trufor'" in m)
    assert "fakepkg_trufor:Fake" in tru and "paper adapter (detectors/paper/trufor.yaml)" in tru
    assert any("fakepkg_adq:Fake" in m and "built-in detector" in m for m in msgs)
    assert "paper adapter" in P.discovery_errors()["entry point trufor"]
    assert "trufor" not in P._FACTORIES                                   # the plug-in did not take it
    assert P._FACTORIES["adq"].__module__ == "forensicslab.detectors.builtin.adq"
    assert P._FACTORIES["fakedet"].__module__ == "fakepkg_fakedet"        # a free name loads as before
    assert "trufor" not in P.list_detectors(include_opt_in=True)           # so the adapter's import registers it


def test_imdl_wrapper_has_its_own_name():
    "Where IMDL-BenCo is importable the wrapper registers as trufor-imdlbenco, opt-in; `trufor` stays the adapter."
    from forensicslab.detectors import imdl
    paper_sources()
    assert P._FACTORIES["trufor"] is TruFor
    imdl.register_imdl_trufor()
    try:
        assert imdl.IMDL_NAME == "trufor-imdlbenco" and "trufor-imdlbenco" in P.OPT_IN
        assert P._FACTORIES["trufor"] is TruFor and "trufor-imdlbenco" not in P.list_detectors()
        with pytest.raises(ValueError, match="already registered as 'trufor'"): imdl.register_imdl_trufor("trufor")
        assert P._FACTORIES["trufor"] is TruFor
    finally: P.unregister("trufor-imdlbenco")


def test_a_remote_card_may_add_a_family_checked(monkeypatch):
    """Issue 48, item 4 (the part that changes no committed number): a detector server's card may bring a family
    (Firefly's edits under diffusion_inpaint), checked first; a clash with a known family's parent, a parent nobody
    declares or a non-text description is refused in one line and registers nothing."""
    from forensicslab.core import FAMILIES, FAMILY_PARENTS
    from forensicslab.detectors import remote as R
    base = dict(id="srv", name="served", native_metric="p", normalisation="identity", score_reading="p", threshold=0.5)
    answers = {}

    def fake_call(self, method, path, model=None):
        if path == "/v1/health": return R.Health(status="ok", protocol=R.PROTOCOL, detector="srv", version="1")
        return answers["card"]
    monkeypatch.setattr(R.RemoteDetector, "_call", fake_call)
    added = ["h5_firefly", "h5_firefly_fill", "h5_orphan", "h5_bad"]
    try:
        answers["card"] = dict(base, scope=["h5_firefly_fill"], families={
            "h5_firefly_fill": {"description": "Firefly generative fill", "parent": "h5_firefly"},   # child first
            "h5_firefly": {"description": "Adobe Firefly edits", "parent": "diffusion_inpaint"}})
        card = R.RemoteDetector("http://127.0.0.1:1").card
        from forensicslab.core import ToolCard
        radar_like = ToolCard(**dict(base, id="r", scope=["diffusion_inpaint"]))
        assert card.in_scope("h5_firefly_fill") and radar_like.in_scope("h5_firefly_fill")   # counted as diffusion inpainting
        assert FAMILY_PARENTS["h5_firefly"] == "diffusion_inpaint"
        for fams, why in [({"gan_inpaint": {"description": "x", "parent": "splice"}}, "already known under 'gen_inpaint'"),
                          ({"h5_orphan": {"description": "x", "parent": "h5_nowhere"}}, "neither known nor declared"),
                          ({"h5_bad": 5}, "must be text"), ({"h5_bad": {"description": "x", "colour": "red"}}, "unknown fields")]:
            answers["card"] = dict(base, scope=["splice"], families=fams)
            with pytest.raises(R.RemoteError, match=why) as e: R.RemoteDetector("http://127.0.0.1:1")
            assert "\n" not in str(e.value) and "/v1/card" in str(e.value)
        assert "h5_orphan" not in FAMILIES and "h5_bad" not in FAMILIES and FAMILY_PARENTS["gan_inpaint"] == "gen_inpaint"
    finally:
        for f in added: FAMILIES.pop(f, None); FAMILY_PARENTS.pop(f, None)
