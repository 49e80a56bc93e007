"""One registry shape (issue 25): every table a user-given name picks from is a `forensicslab.core.Registry`, and an
unknown name is one line, of the registry's own error class, listing the registered names."""
import pytest

from forensicslab.core import FAMILIES, ForensicsLabError, Registry, UnknownName
from forensicslab.chat.cli import CHECK_ROLES, check_model
from forensicslab.debate.data import FETCH, LOADERS, DatasetError, FetchError, fetch_dataset, load_ooc
from forensicslab.detectors import pool as D
from forensicslab.detectors.weights import SOURCES, WeightsError, get_source
from forensicslab.runs import PROGRESS_NOTES
from forensicslab.detectors.paper.pool import paper_sources

D.discover()      # the built-in detectors register on discovery
paper_sources()   # and the paper adapters their weights sources

REGISTRIES = {"FAMILIES": FAMILIES, "CHECK_ROLES": CHECK_ROLES, "debate FETCH": FETCH, "debate LOADERS": LOADERS,
              "detectors": D._FACTORIES, "NORMALISERS": D.NORMALISERS, "SOURCES": SOURCES,
              "PROGRESS_NOTES": PROGRESS_NOTES}


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
