"""One config style (issue 25): settings records that nothing changes after construction are frozen dataclasses, so a
run cannot alter a retry policy, a parsed model spec or a weights source that other code shares."""
import dataclasses

import pytest

from forensicslab.chat.models import ModelSpec, parse_spec
from forensicslab.detectors.weights import FileSpec, WeightsSource
from forensicslab.net import RetryPolicy

FROZEN = [RetryPolicy(), ModelSpec("openai", "gpt-4o"), FileSpec("w.pth"),
          WeightsSource("x", "X", [], "a layout", "https://example.org", "MIT", "MIT")]


@pytest.mark.parametrize("obj", FROZEN, ids=lambda o: type(o).__name__)
def test_settings_are_frozen_dataclasses(obj):
    field = dataclasses.fields(obj)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, field, getattr(obj, field))


def test_a_spec_keeps_its_own_copy_of_the_options():
    opts = {"server": "vllm"}
    spec = parse_spec({"backend": "openai-compatible", "model": "m", "base_url": "http://h/v1", **opts})
    direct = ModelSpec("openai", "gpt-4o", options=opts)
    opts["server"] = "changed"
    assert direct.options == {"server": "vllm"} and direct.options is not opts
    assert spec.options.get("server") == "vllm"
