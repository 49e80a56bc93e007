"""Issue #49 hardening: the judge's reply cache, the detector server's header deadline and per-client cap, the remote
heatmap's size check before decoding, the retrieval cache keyed on the index, and the remote card's threshold."""
import json

import pytest
from skimage import data as skdata

from forensicslab.core import ChatFailure, Detection
from forensicslab.imageio import load_image


# ---------------------------------------------------------------- defect 1: a judge reply naming a foreign tool
def _judge_case():
    from forensicslab.triage.all import make_card
    from forensicslab.triage.records import AuditVerdict
    img = load_image(skdata.coffee()[:96, :96])
    cards = {k: make_card(k, ["splice"]) for k in ("noise", "adq")}
    dets = {k: Detection.from_score(k, 0.9) for k in cards}
    audits = {k: AuditVerdict(reasoning="ok", tool_id=k, audit_verdict="valid") for k in cards}
    return img, dets, cards, audits

def _verdict(tool):
    return json.dumps({"reasoning": "STEP 1: looked.", "is_manipulated": True, "locality": "local", "region": "top",
                       "arbitrated_tools": [tool], "decision_path": ["looked"]})

def test_judge_reply_naming_a_foreign_tool_is_not_cached(tmp_path):
    "A reply naming a tool outside the pool fails the case without being stored: a rerun asks the model again."
    from forensicslab.chat.models import get_model
    from forensicslab.chat.testing import openai_server
    from forensicslab.triage.agents import LLMJudge
    img, dets, cards, audits = _judge_case()
    tool = {"name": "trufor"}
    with openai_server(lambda req: _verdict(tool["name"])) as url:
        model = lambda: get_model(f"openai-compatible:{url}#j", {"cache": "rw", "cache_path": str(tmp_path / "c.sqlite")})
        with pytest.raises(ChatFailure, match="trufor"):
            LLMJudge(model()).judge(img, dets, cards, audits)
        first = url.hits
        assert first == 2                                              # the answer and one re-ask naming the allowed ids
        tool["name"] = "noise"                                         # the model now answers within the pool
        v = LLMJudge(model()).judge(img, dets, cards, audits)
        assert url.hits > first, "the rerun was answered from the cache: the bad reply had been stored"
        assert v.arbitrated_tools == ["noise"]
