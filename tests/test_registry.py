"""One registry shape (issue 25): every table a user-given name picks from is a `forensicslab.core.Registry`, and an
unknown name is one line, of the registry's own error class, listing the registered names."""
import pytest
from typer.testing import CliRunner

from forensicslab.core import FAMILIES, ForensicsLabError, Registry, UnknownName
from forensicslab.chat.cli import CHECK_ROLES, check_model
from forensicslab.chat.models import BACKENDS
from forensicslab.debate.agents import STRATEGY_RUNNERS
from forensicslab.debate.records import STRATEGIES
from forensicslab.debate.data import FETCH, LOADERS, DatasetError, FetchError, fetch_dataset, load_ooc
from forensicslab.detectors import pool as D
from forensicslab.detectors.weights import SOURCES, WeightsError, get_source
from forensicslab.runs import PROGRESS_NOTES
from forensicslab.detectors.paper.pool import paper_sources
from forensicslab.data import photos
from forensicslab.data.cli import FETCHERS, data_app
from forensicslab.data.datasets import DATASET_KINDS, DatasetSpec
from forensicslab.data.datasets import DatasetError as SpecError
from forensicslab.debate import cli as _debate_cli  # noqa: F401  (imported to register the debate datasets' downloads in FETCHERS)
from forensicslab.triage.trust import TRUST_CONFIGS, TrustError, TrustStore, trust_runner
from forensicslab.zoom.data import RENDERERS
from forensicslab.zoom.records import ZoomConfigError, ZoomInputError
from forensicslab.zoom.rules import TOOL_SETS, tool_views

D.discover()      # the built-in detectors register on discovery
paper_sources()   # and the paper adapters their weights sources

REGISTRIES = {"FAMILIES": FAMILIES, "CHECK_ROLES": CHECK_ROLES, "debate FETCH": FETCH, "debate LOADERS": LOADERS,
              "detectors": D._FACTORIES, "NORMALISERS": D.NORMALISERS, "SOURCES": SOURCES,
              "PROGRESS_NOTES": PROGRESS_NOTES, "FETCHERS": FETCHERS, "DATASET_KINDS": DATASET_KINDS,
              "zoom TOOL_SETS": TOOL_SETS, "zoom RENDERERS": RENDERERS, "TRUST_CONFIGS": TRUST_CONFIGS,
              "PHOTOS": photos.PHOTOS, "chat BACKENDS": BACKENDS, "debate STRATEGIES": STRATEGIES,
              "debate STRATEGY_RUNNERS": STRATEGY_RUNNERS}


@pytest.mark.parametrize("name", REGISTRIES)
def test_each_registry_has_the_one_shape(name):
    reg = REGISTRIES[name]
    assert isinstance(reg, Registry) and reg.names() == sorted(reg) and reg.names()
    with pytest.raises(ForensicsLabError) as e:
        reg.get("no-such-name")
    msg = str(e.value)
    assert "\n" not in msg and f"named 'no-such-name'; registered: {', '.join(reg.names())}" in msg, msg
    assert isinstance(e.value, reg.error) and isinstance(e.value, (UnknownName, ValueError, RuntimeError))


def test_public_lookups_raise_their_registry_error_with_the_names():
    with pytest.raises(D.DetectorNotFound, match="no detector named 'nope'; registered: "):
        D.get_detector("nope")
    with pytest.raises(KeyError):                       # DetectorNotFound stays a KeyError for callers that catch one
        D.get_detector("nope")
    with pytest.raises(WeightsError, match="no weights source named 'nope'"):
        get_source("nope")
    with pytest.raises(DatasetError, match="no out-of-context dataset named 'cosmos'; registered: mmfakebench, newsclippings"):
        load_ooc("cosmos")
    with pytest.raises(FetchError, match="no dataset download named 'mmfakebench'.*MMFakeBench"):   # the download hint stays
        fetch_dataset("mmfakebench")
    with pytest.raises(UnknownName, match="no check role named 'nope'; registered: .*probe-free-text"):
        check_model("openai:gpt-4o", None, roles=["nope"])


def test_register_and_replace_rules():
    reg = Registry("widget")
    assert reg.register("a", 1) == 1 and reg.register("b")(str) is str   # a value, or a decorator
    reg.register("a", 2)                                                  # replacing is the default (re-imported modules)
    with pytest.raises(ForensicsLabError, match="already registered as 'a'"):
        reg.register("a", 3, replace=False)
    assert (reg["a"], reg.get("zzz", None), reg.names()) == (2, None, ["a", "b"])
    reg.unregister("a"); reg.unregister("a")
    assert reg.names() == ["b"]


def test_the_moved_tables_keep_their_errors_and_lookups():
    # each table raises its own error class, and a name lookup still returns the entry it returned as a dict
    for reg, err in [(DATASET_KINDS, SpecError), (TOOL_SETS, ZoomConfigError), (RENDERERS, ZoomInputError),
                     (TRUST_CONFIGS, TrustError), (photos.PHOTOS, photos.PhotoError), (FETCHERS, UnknownName)]:
        with pytest.raises(err):
            reg["no-such-name"]
    assert TOOL_SETS["forensic"] == ("residual", "ela", "copymove", "cues") and tool_views("forensic_pool")[-1] == "pool"
    assert list(DATASET_KINDS)[:3] == ["bench", "folder", "casia2"] and DATASET_KINDS["manifest"][1] == "a CSV manifest"
    assert [*TRUST_CONFIGS] == ["trust-lr", "trust-ds"] and TRUST_CONFIGS["trust-ds"].kind == "ds"
    assert [*RENDERERS] == ["text", "distorted", "repeat", "lighting", "impossible"]
    assert [*photos.PHOTOS][:2] == ["astronaut", "grace_hopper"] and photos.PHOTOS["coins"].category == "object"


def test_the_moved_tables_public_lookups_keep_or_gain_one_line_messages():
    with pytest.raises(KeyError, match=r"unknown photograph 'nope'; known: \['astronaut', "):   # the pinned message stays
        photos.photo("nope")
    with pytest.raises(ZoomConfigError, match="unknown tool set 'crop\\+xray'"):                   # a spec parser: its own message
        tool_views("crop+xray")
    with pytest.raises(SpecError, match="is not kind:argument with kind one of bench, folder, casia2, "):
        DatasetSpec.parse("imagenet:/data/x")
    with pytest.raises(TrustError, match="^no trust configuration named 'trust-x'; registered: trust-ds, trust-lr$"):
        trust_runner(TrustStore(), "trust-x")
    r = CliRunner().invoke(data_app, ["fetch", "imagenet"])
    assert r.exit_code == 2 and f"no dataset download named 'imagenet'; registered: {', '.join(sorted(FETCHERS))}" in r.output, r.output
