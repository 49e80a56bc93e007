"""Issue 33 (and the chat items of issue 32): each server family's request builder against a wire-level server that
speaks that family's current format and refuses the old one (forensicslab.chat.testing), the finish states (length,
safety blocks, refusals, copied placeholders), rate limits that slow a run instead of failing it, total deadlines and
size caps on reply bodies, invalid UTF-8, the money rules and the per-role image controls."""
import base64
import io
import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from pydantic import BaseModel

from forensicslab.chat.backends import Blocked, ReplyTooLarge, prepare_messages
from forensicslab.chat.cache import ChatCache, default_cache_path
from forensicslab.chat.models import ModelControls, TruncatedReply, UnpricedModel, get_model
from forensicslab.chat.reliability import BackendError, RetryPolicy, read_trace
from forensicslab.chat.testing import Fault, chat_completion, gemini_response, gemini_server, openai_server
from forensicslab.core import ChatFailure, ChatMessage
from forensicslab.debate.records import Critique, DebateAnswer, DisambiguationAnswer
from forensicslab.net import Served
from forensicslab.triage.records import AuditVerdict, Verdict
from forensicslab.zoom.agents import turn_pattern
from forensicslab.zoom.records import JudgeVerdict, Rating, SplitItems

ROLE_SCHEMAS = [AuditVerdict, Verdict, Rating, JudgeVerdict, SplitItems, DebateAnswer, DisambiguationAnswer, Critique]
IMAGE = np.random.default_rng(1).integers(0, 255, (40, 56, 3), dtype=np.uint8)
FAST = RetryPolicy(max_attempts=3, base_delay=0.02, jitter=0.0)


class Answer(BaseModel):
    reasoning: str
    verdict: str


def controls(retry=FAST, **kw) -> ModelControls:
    c = ModelControls.of({"cache": "off", **{k: (str(v) if isinstance(v, Path) else v) for k, v in kw.items()}})
    c._retry = retry
    return c


def msgs(text="Is this image manipulated?"):
    return [ChatMessage.of("system", "You inspect images."), ChatMessage.of("user", text, IMAGE)]


# ---------------------------------------------------------------- one request builder per family
@pytest.mark.parametrize("family,spec", [("openai", "openai:gpt-4o"), ("openai", "openai:o3"), ("vllm", "vllm:{url}#m"),
                                         ("llamacpp", "llamacpp:{url}#m"), ("transformers", "tfserve:{url}#m")])
def test_every_role_schema_is_accepted_by_its_family_server(family, spec):
    "Each study role's schema and parameters, as each family's builder sends them, pass that family's server's checks."
    with openai_server(lambda req: "ok", family=family) as url:
        m = get_model(spec.format(url=url), controls(), base_url=str(url), api_key="sk-test-0123456789")
        for schema in ROLE_SCHEMAS:
            comp = m.backend.complete(prepare_messages(msgs()), schema, {"temperature": 0, "max_tokens": 300}, 10)
            assert comp.text == "ok"
        assert url.hits == len(ROLE_SCHEMAS)
        sent = url.calls[-1].json
    if family == "openai" and spec.endswith("o3"):
        assert "temperature" not in sent and sent["max_completion_tokens"] == 300
    if family == "vllm": assert "structured_outputs" in sent and not any(k.startswith("guided_") for k in sent)
    if family == "llamacpp": assert sent["response_format"]["type"] == "json_object" and "schema" in sent["response_format"]
    if family == "transformers": assert "response_format" not in sent and "JSON schema" in sent["messages"][0]["content"]


def test_gemini_server_accepts_every_role_and_refuses_system_images_and_empty_turns():
    with gemini_server(lambda req: "ok") as url:
        m = get_model("gemini:gemini-2.5-flash", controls(), base_url=url, api_key="g-test-0123456789")
        for schema in ROLE_SCHEMAS:
            assert m.backend.complete(prepare_messages(msgs()), schema, {"temperature": 0}, 10).text == "ok"
        # a system message with an image: the image travels at the head of the first user turn
        sysimg = [ChatMessage.of("system", "Judge this.", IMAGE), ChatMessage.of("user", "Is it fake?")]
        assert m.chat(sysimg).text == "ok"
        sent = url.calls[-1].json
        assert "inlineData" in sent["contents"][0]["parts"][0] and sent["systemInstruction"]["parts"] == [{"text": "Judge this."}]
        # what the old builder sent is refused by the same server
        old = {"contents": [{"role": "user", "parts": [{"text": "x"}]}, {"role": "model", "parts": [{"text": ""}]}]}
        r = httpx.post(f"{url}/v1beta/models/g:generateContent", json=old)
        assert r.status_code == 400 and "must not be empty" in r.text


def test_old_formats_are_refused_by_the_family_servers():
    "The servers can fail: what the previous builders sent is a 400 there (so the tests above are not vacuous)."
    with openai_server(lambda req: "ok", family="vllm") as v, openai_server(lambda req: "ok", family="llamacpp") as l, \
            openai_server(lambda req: "ok", family="openai") as o:
        r = httpx.post(f"{v}/chat/completions", json={"model": "m", "messages": [], "guided_json": {"type": "object"}})
        assert r.status_code == 400 and "no longer supported" in r.text
        r = httpx.post(f"{l}/chat/completions", json={"model": "m", "messages": [], "response_format": {"type": "json_schema"}})
        assert r.status_code == 400
        closed = {**Rating.model_json_schema(), "additionalProperties": False, "required": ["reason", "rating"]}
        plain = {"type": "json_schema", "json_schema": {"name": "Rating", "strict": True, "schema": closed}}
        r = httpx.post(f"{o}/chat/completions", json={"model": "gpt-4o", "messages": [], "response_format": plain})
        assert r.status_code == 400 and "'default' is not permitted" in r.text   # the zoom Rating as the SDK made it strict
        r = httpx.post(f"{o}/chat/completions", json={"model": "o3", "messages": [], "max_tokens": 160})
        assert r.status_code == 400 and "max_completion_tokens" in r.text


def test_vllm_enforces_the_verdict_cases_and_the_zoom_turn_pattern():
    with openai_server(lambda req: "ok", family="vllm") as url:
        m = get_model(f"vllm:{url}#m", controls())
        m.backend.complete(prepare_messages("x"), Verdict, {}, 10)
        m.backend.complete(prepare_messages("x"), None, {"regex": turn_pattern()}, 10)
        m.backend.complete(prepare_messages("x"), None, {"choice": ["real", "fake"]}, 10)
        verdict, turn, choice = (c.json["structured_outputs"] for c in url.calls)
    assert len(verdict["json"]["anyOf"]) == len(Verdict.grammar_cases)          # the cross-field cases, enforced
    assert turn == {"regex": turn_pattern()} and choice == {"choice": ["real", "fake"]}


def test_openai_temperature_follows_the_model_table_with_override():
    with openai_server(lambda req: "ok", family="openai") as url:
        for model, opts, takes in [("gpt-4o", {}, True), ("gpt-5", {}, False), ("gpt-5-chat-latest", {}, True),
                                   ("my-new-model", {}, True), ("o3", {}, False)]:
            m = get_model(f"openai:{model}", controls(), base_url=str(url), api_key="sk-test-0123456789", **opts)
            m.chat("x", temperature=0)                      # the openai-format server refuses a temperature o3/gpt-5 refuse
            assert ("temperature" in url.calls[-1].json) == takes, model
            assert m.backend.is_sampled({"temperature": 0}) == (not takes)     # and the cache knows those calls sample
    forced = get_model("openai:gpt-5", controls(), base_url="http://127.0.0.1:9/v1", api_key="sk-test-0123456789",
                       accepts_temperature=True)
    assert forced.backend.request(prepare_messages("x"), None, {"temperature": 0})["temperature"] == 0


# ---------------------------------------------------------------- finish states
def test_length_with_empty_content_is_one_line_and_never_reasked(tmp_path):
    with openai_server(lambda req: chat_completion("", finish_reason="length", completion_tokens=160), family="openai") as url:
        m = get_model("openai:o3", controls(cache="rw", cache_path=tmp_path / "c.sqlite", trace=tmp_path / "t.jsonl"),
                      base_url=str(url), api_key="sk-test-0123456789")
        with pytest.raises(TruncatedReply, match="raise max_tokens") as e:
            m.chat("Rate it.", schema=Rating, max_tokens=160)
        assert url.hits == 1 and "\n" not in str(e.value)
    assert e.value.output_tokens == 160 and e.value.cost_usd > 0                 # charged what it cost
    assert len(ChatCache(tmp_path / "c.sqlite")) == 0 and read_trace(tmp_path / "t.jsonl")[0]["status"] == "error"


def test_a_reply_cut_at_max_tokens_is_not_reasked_and_replays_as_the_same_failure(tmp_path):
    """A reply cut at the cap before its JSON closed fails at once, saying to raise max_tokens: a re-ask would get the
    same cap (the real-model check's prompt-only servers spent half their time on such re-asks); a replay reproduces
    the failure with no call."""
    cut = '{"reason": "The left edge repeats the right edge and the'
    c = dict(cache_path=tmp_path / "c.sqlite", trace=tmp_path / "t.jsonl")
    with openai_server(lambda req: chat_completion(cut, finish_reason="length", completion_tokens=16), family="openai") as url:
        m = get_model("openai:gpt-4o", controls(cache="rw", **c), base_url=str(url), api_key="sk-test-0123456789")
        with pytest.raises(ChatFailure, match="cut at max_tokens=16 .*raise max_tokens") as e:
            m.chat("Rate it.", schema=Rating, max_tokens=16)
        assert url.hits == 1 and "\n" not in str(e.value) and e.value.output_tokens == 16
        again = get_model("openai:gpt-4o", controls(cache="replay", **c), base_url=str(url), api_key="sk-test-0123456789")
        with pytest.raises(ChatFailure, match="cut at max_tokens=16"): again.chat("Rate it.", schema=Rating, max_tokens=16)
        assert url.hits == 1
    with openai_server(lambda req: chat_completion(cut, finish_reason="stop"), family="openai") as url:   # a natural stop is re-asked
        m = get_model("openai:gpt-4o", controls(), base_url=str(url), api_key="sk-test-0123456789")
        with pytest.raises(ChatFailure, match="after repair and one re-ask"): m.chat("Rate it.", schema=Rating, max_tokens=16)
        assert url.hits == 2


@pytest.mark.parametrize("reply,reason", [(gemini_response(finish_reason="SAFETY", blocked_category="HARM_CATEGORY_DANGEROUS_CONTENT"),
                                           "SAFETY: HARM_CATEGORY_DANGEROUS_CONTENT"),
                                          (gemini_response(block_reason="PROHIBITED_CONTENT"), "PROHIBITED_CONTENT")],
                         ids=["reply-blocked", "prompt-blocked"])
@pytest.mark.parametrize("schema", [Answer, None], ids=["schema-role", "free-text-role"])
def test_gemini_safety_block_is_typed_never_cached_never_reasked(tmp_path, reply, reason, schema):
    with gemini_server(lambda req: reply) as url:
        m = get_model("gemini:gemini-2.5-flash", controls(cache="rw", cache_path=tmp_path / "c.sqlite", trace=tmp_path / "t.jsonl"),
                      base_url=url, api_key="g-test-0123456789")
        with pytest.raises(Blocked) as e:
            m.chat(msgs(), schema=schema, temperature=0)
        assert url.hits == 1                                                   # no re-ask with an empty model turn
        with pytest.raises(Blocked): m.chat(msgs(), schema=schema, temperature=0)
        assert url.hits == 2                                                   # nothing cached: asked again
    assert e.value.reason == reason and isinstance(e.value, ChatFailure)
    assert len(ChatCache(tmp_path / "c.sqlite")) == 0
    rec = read_trace(tmp_path / "t.jsonl")[0]
    assert rec["status"] == "blocked" and rec["blocked_reason"] == reason


def test_openai_refusal_and_content_filter_are_blocked():
    for reply in (chat_completion(None, refusal="I can't help with that."), chat_completion("", finish_reason="content_filter")):
        with openai_server(lambda req: reply, family="openai") as url:
            m = get_model("openai:gpt-4o", controls(), base_url=str(url), api_key="sk-test-0123456789")
            with pytest.raises(Blocked): m.chat("x", schema=Answer)
            assert url.hits == 1


def test_gemini_thinking_that_eats_the_cap_is_a_truncated_reply():
    with gemini_server(lambda req: gemini_response(finish_reason="MAX_TOKENS", candidates_tokens=0, thoughts_tokens=64)) as url:
        m = get_model("gemini:gemini-2.5-pro", controls(), base_url=url, api_key="g-test-0123456789")
        with pytest.raises(TruncatedReply) as e: m.chat("x", schema=Answer, max_tokens=64)
    assert e.value.output_tokens == 64 and url.hits == 1


def test_a_reply_copying_the_prompt_placeholder_is_invalid_and_reasked(tmp_path):
    prompt = 'Reply as {"reasoning": "<at most 200 words, following the cues>", "verdict": "<authentic or manipulated>"}'
    copied = '{"reasoning": "<at most 200 words, following", "verdict": "authentic"}'
    good = '{"reasoning": "Two light sources disagree.", "verdict": "manipulated"}'
    steps = [copied, good]
    with openai_server(lambda req: steps.pop(0)) as url:
        m = get_model(f"openai-compatible:{url}#m", controls(cache="rw", cache_path=tmp_path / "c.sqlite"))
        r = m.chat(prompt, schema=Answer, temperature=0)
        assert url.hits == 2 and "placeholder" in url.calls[1].json["messages"][-1]["content"]
    assert r.parsed.verdict == "manipulated"


def test_post_validation_runs_before_the_cache(tmp_path):
    "Issue 32 item 13: a reply naming a tool not in the pool is re-asked and never cached; a replay serves the valid one."
    pool = {"noise", "jpeg"}
    def tools_in_pool(v):
        if v.verdict not in pool: raise ValueError(f"verdict names tool {v.verdict!r}, not in the pool {sorted(pool)}")
    steps = ['{"reasoning": "r", "verdict": "made-up-tool"}', '{"reasoning": "r", "verdict": "noise"}']
    db = tmp_path / "c.sqlite"
    with openai_server(lambda req: steps.pop(0) if len(steps) > 1 else steps[0]) as url:
        m = get_model(f"openai-compatible:{url}#m", controls(cache="rw", cache_path=db))
        assert m.chat("which tool?", schema=Answer, temperature=0, validate=tools_in_pool).parsed.verdict == "noise"
        assert url.hits == 2 and "not in the pool" in url.calls[1].json["messages"][-1]["content"]
    rep = get_model("openai-compatible:http://127.0.0.1:9/v1#m", controls(cache="replay", cache_path=db))
    assert rep.chat("which tool?", schema=Answer, temperature=0, validate=tools_in_pool).parsed.verdict == "noise"


# ---------------------------------------------------------------- transport: UTF-8, deadlines, size caps
def test_invalid_utf8_is_retried_traced_and_a_failure_if_it_persists(tmp_path):
    with openai_server(lambda req: Fault.bad_utf8() if len(url.calls) < 2 else "fine") as url:
        r = get_model(f"openai-compatible:{url}#m", controls()).chat("x")
    assert r.text == "fine" and r.attempts == 2
    with openai_server(lambda req: Fault.bad_utf8()) as url:
        m = get_model(f"openai-compatible:{url}#m", controls(trace=tmp_path / "t.jsonl"))
        with pytest.raises(BackendError, match="UTF-8") as e: m.chat("x", case="img-3")
    assert isinstance(e.value, ChatFailure) and e.value.attempts == 3          # a failed case the run records and resumes
    assert "UTF-8" in read_trace(tmp_path / "t.jsonl")[0]["error"]


def test_invalid_utf8_from_gemini_is_retried_not_replaced():
    "The google-genai client would decode a stray byte as U+FFFD; the transport refuses it, so the policy retries."
    bad = Fault(200, body=json.dumps(gemini_response("caf_")).encode().replace(b"caf_", b"caf\xe9"))
    with gemini_server(lambda req: bad if len(url.calls) < 2 else gemini_response("fine")) as url:
        r = get_model("gemini:gemini-2.5-flash", controls(), base_url=url, api_key="g-test-0123456789").chat("x")
    assert r.text == "fine" and r.attempts == 2


async def _drip(scope, receive, send):
    "A chat reply sent one byte every 0.2 s (a per-read timeout never fires)."
    if scope["type"] != "http": return
    import asyncio
    while (await receive()).get("more_body"): pass
    body = json.dumps(chat_completion("x" * 200)).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
    for i in range(len(body)):
        await send({"type": "http.response.body", "body": body[i:i + 1], "more_body": i < len(body) - 1})
        await asyncio.sleep(0.2)


def test_a_trickling_reply_meets_the_total_deadline():
    "Issue 32 item 3: `timeout` bounds the whole exchange and `attempt_timeout` each attempt, across the whole body."
    with Served(_drip) as srv:
        m = get_model(f"openai-compatible:{srv.url}/v1#m", controls(timeout=2.5, attempt_timeout=1.0))
        t0 = time.monotonic()
        with pytest.raises(BackendError, match="deadline"): m.chat("x")
        took = time.monotonic() - t0
    assert took < 4.0, took                 # the body alone would take 60 s


def test_an_oversized_reply_is_refused_without_reading_it_whole():
    "Issue 32 item 11: a declared length over the cap is refused before reading; an undeclared one stops at the cap."
    big = json.dumps(chat_completion("y" * 3_000_000))
    with openai_server(lambda req: Fault(200, body=big)) as url:
        m = get_model(f"openai-compatible:{url}#m", controls(max_reply_chars=10_000))
        with pytest.raises(ReplyTooLarge, match="cap"): m.chat("x")
        assert url.hits == 1                                                     # not retried


async def _gemini_drip(scope, receive, send):
    "A Gemini reply sent one byte every 0.2 s."
    if scope["type"] != "http": return
    import asyncio
    while (await receive()).get("more_body"): pass
    body = json.dumps(gemini_response("x" * 200)).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]})
    for i in range(len(body)):
        await send({"type": "http.response.body", "body": body[i:i + 1], "more_body": i < len(body) - 1})
        await asyncio.sleep(0.2)


def test_the_deadline_and_size_cap_hold_under_the_gemini_client():
    "The official google-genai client reads through the same capped transport: a trickle meets the deadline, a big body the cap."
    with Served(_gemini_drip) as srv:
        m = get_model("gemini:gemini-2.5-flash", controls(timeout=2.5, attempt_timeout=1.0), base_url=srv.url, api_key="g-test-0123456789")
        t0 = time.monotonic()
        with pytest.raises(BackendError, match="deadline"): m.chat("x")
        assert time.monotonic() - t0 < 4.0
    big = json.dumps(gemini_response("y" * 3_000_000))
    with gemini_server(lambda req: Fault(200, body=big)) as url:
        m = get_model("gemini:gemini-2.5-flash", controls(max_reply_chars=10_000), base_url=url, api_key="g-test-0123456789")
        with pytest.raises(ReplyTooLarge, match="cap"): m.chat("x")
        assert url.hits == 1


# ---------------------------------------------------------------- rate limits
def _storm(seconds: float, retry_after: float):
    "A responder that answers 429 with `Retry-After` to every request for `seconds`, then answers."
    t0 = [None]
    lock = threading.Lock()
    def responder(req):
        with lock:
            if t0[0] is None: t0[0] = time.monotonic()
        if time.monotonic() - t0[0] < seconds: return Fault.rate_limit(retry_after)
        return '{"reasoning": "r", "verdict": "ok"}'
    return responder


@pytest.mark.parametrize("retry_after", [1, pytest.param(5, marks=pytest.mark.slow)])
def test_a_429_storm_slows_a_20_case_run_and_every_case_finishes(retry_after):
    with openai_server(_storm(1.5 * retry_after, retry_after)) as url:
        m = get_model(f"openai-compatible:{url}#storm-{retry_after}", controls(retry=None, attempts=2, concurrency=8))
        t0 = time.monotonic()
        out = m.chat_many([{"messages": f"case {i}", "schema": Answer, "temperature": 0} for i in range(20)])
        took = time.monotonic() - t0
        limit_after = m._slots.limit
    failed = [o for o in out if isinstance(o, Exception)]
    assert not failed, failed[:2]
    assert took >= 1.5 * retry_after and url.hits > 20                          # slower, none failed
    assert 1 <= limit_after < 8 and m._slots.ceiling == 8                        # halved by the storm, creeping back


def test_gemini_retry_info_in_the_body_is_honoured_and_does_not_spend_attempts():
    steps = [Fault.gemini_quota(1), Fault.gemini_quota(1), '{"reasoning": "r", "verdict": "ok"}']
    with gemini_server(lambda req: steps.pop(0)) as url:
        m = get_model("gemini:gemini-2.5-flash", controls(retry=None, attempts=1), base_url=url, api_key="g-test-0123456789")
        t0 = time.monotonic()
        r = m.chat("x", schema=Answer)
        took = time.monotonic() - t0
    assert r.attempts == 3 and took >= 2.0                                       # waited 1 s twice, as the body asked


# ---------------------------------------------------------------- money and the cache folder
def test_unpriced_model_with_a_cost_budget_is_refused_unless_priced():
    with pytest.raises(UnpricedModel, match="no price"):
        get_model("openai-compatible:http://127.0.0.1:9/v1#my-model", controls(budget_usd=0.01))
    priced = controls(budget_usd=0.01, prices={"openai-compatible": {"my-model": {"input": 1.0, "output": 2.0}}})
    with openai_server(lambda req: "fine") as url:
        m = get_model(f"openai-compatible:{url}#my-model", priced)
        assert m.chat("x").cost_usd > 0
        r = get_model(f"openai-compatible:{url}#other", controls()).chat("x")
    assert any(n.startswith("cost unknown") for n in r.notes)                    # unpriced: said so, not a silent $0


def test_the_chat_cache_defaults_to_the_user_cache_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("FORENSICSLAB_CACHE", raising=False)
    monkeypatch.delenv("FORENSICSLAB_CACHE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    p = default_cache_path().resolve()
    assert not str(p).startswith(str(tmp_path.resolve())) and not str(p).startswith(str(Path(__file__).resolve().parents[1]))


# ---------------------------------------------------------------- images per role
def test_image_detail_and_max_image_side_per_role():
    c = controls(image_detail={"judge": "low", "*": "high"}, max_image_side={"judge": 20})
    big = np.zeros((60, 90, 3), np.uint8)
    with openai_server(lambda req: "ok") as url:
        for role in ("judge", "auditor"):
            get_model(f"openai-compatible:{url}#m", c, role=role).chat([ChatMessage.of("user", "look", big)])
        judge, auditor = (x.json["messages"][0]["content"][1]["image_url"] for x in url.calls)
    assert (judge["detail"], auditor["detail"]) == ("low", "high")
    size = lambda u: Image.open(io.BytesIO(base64.b64decode(u["url"].split(",", 1)[1]))).size
    assert size(judge) == (20, 13) and size(auditor) == (90, 60)


def test_models_check_covers_every_study_role():
    "The top-level CLI registers each study's roles with `models check`; a server that answers garbage fails each one, named."
    from typer.testing import CliRunner
    from forensicslab.cli import app
    with openai_server(lambda req: "not json at all") as url:
        res = CliRunner().invoke(app, ["models", "check", f"openai-compatible:{url}#m", "--check-tokens", "64"])
    assert res.exit_code == 1, res.output
    rows = {line.split()[0]: line for line in res.output.splitlines()[1:] if line.strip()}
    for role in ("triage.auditor", "triage.judge", "debate.agent", "zoom.policy", "zoom.judge"):
        assert role in rows and " NO " in rows[role], res.output


def test_system_role_off_moves_the_system_text_into_the_first_user_turn():
    """llama-cpp-python's `gemma` chat format drops system messages without a word; `system_role=False` sends the
    system text (and any system image) at the head of the first user turn instead, and nothing is lost."""
    sysimg = [ChatMessage.of("system", "You inspect images.", IMAGE), ChatMessage.of("user", "Is it fake?"),
              ChatMessage.of("assistant", "Maybe."), ChatMessage.of("user", "Decide.")]
    with openai_server(lambda req: "ok", family="llamacpp") as url:
        m = get_model({"backend": "llamacpp", "base_url": str(url), "model": "m", "system_role": False}, controls())
        assert m.backend.complete(prepare_messages(sysimg), Rating, {}, 10).text == "ok"   # accepted by the llama.cpp server
        sent = url.calls[-1].json["messages"]
    assert [w["role"] for w in sent] == ["user", "assistant", "user"]
    texts = [p["text"] for p in sent[0]["content"] if p["type"] == "text"]
    assert "You inspect images." in texts and any("JSON schema" in t for t in texts) and texts[-1] == "Is it fake?"
    assert [p["type"] for p in sent[0]["content"]].count("image_url") == 1 and sent[2]["content"] == "Decide."
    with openai_server(lambda req: "ok", family="llamacpp") as url:   # the default keeps the system role
        get_model({"backend": "llamacpp", "base_url": str(url), "model": "m"}, controls()).chat(msgs())
        assert url.calls[-1].json["messages"][0]["role"] == "system"
