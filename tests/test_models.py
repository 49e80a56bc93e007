"""Wire-protocol tests of forensicslab.chat.models: the backends' own HTTP requests against the local servers of
forensicslab.chat.testing, with injected faults, schema repair, cache modes, concurrency, budgets and key redaction.
Run controls go through `ModelControls` (`gm` below), the one way to set them."""
import importlib.util
import json
import logging
import threading
import time
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel

from forensicslab.chat.cache import CacheMiss, ChatCache
from forensicslab.core import ChatFailure, ChatMessage, Reply
from forensicslab.chat.cache import template_hash
from forensicslab.chat.models import ModelControls, get_model
from forensicslab.chat.reliability import (BackendError, Budget, BudgetExceeded, MissingKeyError, RetryPolicy, read_trace)
from forensicslab.runs import Case, Run
from forensicslab.chat.testing import Delayed, Fault, gemini_server, openai_server

GOOD = '{"verdict": "manipulated", "confidence": 0.8}'
FAST = RetryPolicy(max_attempts=4, base_delay=0.02, jitter=0.0)


class Verdict(BaseModel):
    verdict: Literal["authentic", "manipulated"]
    confidence: float


def scripted(*steps):
    "A responder playing `steps` in order, then repeating the last one."
    steps, lock = list(steps), threading.Lock()
    def responder(req):
        with lock: return steps.pop(0) if len(steps) > 1 else steps[0]
    return responder


_RENAMED = {"trace_path": "trace", "max_attempts": "attempts"}


def gm(spec, controls=None, retry=None, budget=None, **kw):
    "`get_model` with run controls given flat, as `ModelControls` (cache off unless asked); the rest are backend options."
    fields = set(ModelControls.model_fields)
    flat = {_RENAMED.get(k, k): (str(v) if isinstance(v, Path) else v) for k, v in kw.items() if _RENAMED.get(k, k) in fields}
    opts = {k: v for k, v in kw.items() if _RENAMED.get(k, k) not in fields}
    base = ModelControls.of(controls).model_dump() if controls is not None else {"cache": "off"}
    c = ModelControls.of({**base, **{k: v for k, v in flat.items() if v is not None}})
    if isinstance(controls, ModelControls): c._budget, c._retry = controls._budget, controls._retry
    if retry is not None: c._retry = retry
    if budget is not None: c._budget = budget
    return get_model(spec, controls=c, **opts)


def oai(url, **kw):
    kw.setdefault("retry", FAST)
    return gm(f"openai-compatible:{url}#local-vlm", **kw)


def gem(url, **kw):
    kw.setdefault("retry", FAST)
    return gm("gemini:gemini-2.5-pro", base_url=url, api_key="test-gemini-key", **kw)


IMAGE = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
MSGS = [ChatMessage.of("system", "You inspect images for manipulation."),
        ChatMessage.of("user", "Is this image manipulated?", IMAGE)]


# ---------------------------------------------------------------- OpenAI protocol
def test_openai_roundtrip_with_image_and_schema():
    with openai_server(lambda req: GOOD) as url:
        r = oai(url).chat(MSGS, schema=Verdict, temperature=0, max_tokens=50)
        req = url.calls[0].json
    assert isinstance(r, Reply) and r.parsed == Verdict(verdict="manipulated", confidence=0.8)
    assert r.model_id == "openai-compatible:local-vlm" and r.input_tokens > 0 and r.output_tokens > 0
    assert r.attempts == 1 and not r.cached and r.latency_s > 0
    assert req["response_format"]["type"] == "json_schema" and req["max_tokens"] == 50
    img = req["messages"][1]["content"][1]["image_url"]["url"]
    assert img.startswith("data:image/png;base64,")


def test_openai_official_spec_uses_env_key_and_base_url_override(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-official-123456")
    with openai_server(lambda req: "hello") as url:
        m = gm("openai:gpt-4o", base_url=url, retry=FAST)
        r = m.chat("hi", temperature=0, max_tokens=5)
        req, headers = url.calls[0].json, url.calls[0].headers
    assert r.text == "hello" and m.model_id == "openai:gpt-4o"
    assert headers["authorization"] == "Bearer sk-test-official-123456"
    assert req["max_completion_tokens"] == 5 and "max_tokens" not in req
    assert r.cost_usd > 0          # gpt-4o is priced in prices.yaml


def test_reasoning_models_get_their_default_sampling(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-reasoning-123456")
    with openai_server(lambda req: "a") as url:
        m = gm("openai:gpt-5", base_url=url, cache="rw", cache_path=tmp_path / "c.sqlite")
        m.chat("hi", temperature=0, max_tokens=9); m.chat("hi", temperature=0, max_tokens=9)
        req = url.calls[0].json
        assert "temperature" not in req and req["max_completion_tokens"] == 9
        assert url.hits == 2      # always sampled: a repeat is a new sample, not a cache hit


@pytest.mark.parametrize("fault", [Fault(500), Fault(503), Fault.malformed(), Fault.truncated()],
                         ids=["500", "503", "malformed-json", "truncated-body"])
def test_openai_transient_faults_are_retried(fault):
    with openai_server(scripted(fault, GOOD)) as url:
        r = oai(url).chat(MSGS, schema=Verdict)
        assert url.hits == 2
    assert r.attempts == 2 and r.parsed.verdict == "manipulated"


def test_openai_429_honours_retry_after():
    with openai_server(scripted(Fault.rate_limit(0.6), GOOD)) as url:
        t0 = time.perf_counter()
        r = oai(url).chat("hi", schema=Verdict)
        dt = time.perf_counter() - t0
    assert r.attempts == 2 and dt >= 0.6    # the backoff alone would have waited 0.02 s


def test_openai_timeout_is_retried_then_succeeds():
    late = '{"verdict": "authentic", "confidence": 0.1}'
    with openai_server(scripted(Delayed(3.0, late), GOOD)) as url:
        r = oai(url, timeout=10.0, attempt_timeout=0.5).chat("hi", schema=Verdict)
        assert url.hits == 2
    # the first attempt was abandoned at its deadline: the answer is the second attempt's, not the late one
    assert r.attempts == 2 and r.parsed.verdict == "manipulated"


def test_attempts_are_bounded():
    with openai_server(lambda req: Fault(500)) as url:
        with pytest.raises(BackendError, match="after 3 attempts") as ei:
            oai(url, retry=RetryPolicy(max_attempts=3, base_delay=0.01)).chat("hi")
        assert url.hits == 3
    assert isinstance(ei.value, ChatFailure) and ei.value.attempts == 3


def test_permanent_error_is_not_retried():
    with openai_server(lambda req: Fault(400)) as url:
        with pytest.raises(BackendError, match="HTTP 400"):
            oai(url).chat("hi")
        assert url.hits == 1


def test_unknown_parameter_is_refused():
    with openai_server() as url:
        with pytest.raises(ValueError, match="temprature"):
            oai(url).chat("hi", temprature=0)


# ---------------------------------------------------------------- Gemini protocol
def test_gemini_roundtrip_with_image_and_schema():
    with gemini_server(lambda req: GOOD) as url:
        r = gem(url).chat(MSGS, schema=Verdict, temperature=0, max_tokens=64)
        call = url.calls[0]
    assert r.parsed.verdict == "manipulated" and r.model_id == "gemini:gemini-2.5-pro" and r.cost_usd > 0
    assert "gemini-2.5-pro:generateContent" in call.path and call.headers["x-goog-api-key"] == "test-gemini-key"
    cfg = call.json["generationConfig"]
    assert cfg["responseMimeType"] == "application/json" and cfg["maxOutputTokens"] == 64 and cfg["temperature"] == 0
    blob = call.json["contents"][0]["parts"][1]["inlineData"]       # google-genai writes the blob's mime type snake_case
    assert blob.get("mimeType", blob.get("mime_type")) == "image/png"
    assert call.json["systemInstruction"]["parts"][0]["text"] == "You inspect images for manipulation."


@pytest.mark.parametrize("fault", [Fault.rate_limit(0.3), Fault(500), Fault.malformed(), Fault.truncated(),
                                   Delayed(1.5, GOOD)], ids=["429", "500", "malformed-json", "truncated-body", "timeout"])
def test_gemini_transient_faults_are_retried(fault):
    with gemini_server(scripted(fault, GOOD)) as url:
        r = gem(url, timeout=10.0, attempt_timeout=0.5).chat("hi", schema=Verdict)
        assert url.hits == 2
    assert r.attempts == 2 and r.parsed.confidence == 0.8


def test_gemini_key_from_env(monkeypatch):
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.setenv("GOOGLE_API_KEY", "google-key-abcdef")
    with gemini_server(lambda req: "ok") as url:
        gm("gemini:gemini-2.5-flash", base_url=url).chat("hi")
        assert url.calls[0].headers["x-goog-api-key"] == "google-key-abcdef"


@pytest.mark.parametrize("spec,var", [("openai:gpt-4o", "OPENAI_API_KEY"), ("gemini:gemini-2.5-pro", "GEMINI_API_KEY")])
def test_missing_key_names_the_variable(monkeypatch, spec, var):
    for v in ("OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"): monkeypatch.delenv(v, raising=False)
    with pytest.raises(MissingKeyError, match=var):
        gm(spec)


@pytest.mark.parametrize("mode", ["json_object", "prompt"])
def test_structured_modes_for_servers_without_json_schema(mode):
    with openai_server(lambda req: GOOD) as url:
        m = gm({"backend": "openai-compatible", "base_url": str(url), "model": "old-server", "structured": mode})
        assert m.chat(MSGS, schema=Verdict).parsed.verdict == "manipulated"
        req = url.calls[0].json
    assert req["messages"][0]["role"] == "system" and "JSON schema" in req["messages"][0]["content"]
    assert req.get("response_format") == ({"type": "json_object"} if mode == "json_object" else None)
    with gemini_server(lambda req: GOOD) as gurl:
        g = gm({"backend": "gemini", "model": "gemini-2.5-flash", "structured": mode}, base_url=gurl, api_key="k-123456")
        assert g.chat(MSGS, schema=Verdict).parsed.confidence == 0.8
        greq = gurl.calls[0].json
    assert "JSON schema" in greq["systemInstruction"]["parts"][-1]["text"]
    assert ("responseMimeType" in greq.get("generationConfig", {})) == (mode == "json_object")


def test_max_image_side_downscales_before_sending():
    big = np.zeros((600, 900, 3), np.uint8)
    with openai_server(lambda req: "x") as url:
        oai(url, max_image_side=300, trace_path=None).chat([ChatMessage.of("user", "look", big)])
        data_url = url.calls[0].json["messages"][0]["content"][1]["image_url"]["url"]
    import base64, io
    from PIL import Image
    assert Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1]))).size == (300, 200)


# ---------------------------------------------------------------- structured output
def test_schema_repair_needs_no_reask():
    damaged = "Here you go:\n```json\n{'verdict': 'authentic', 'confidence': 0.6,}\n```"
    with openai_server(lambda req: damaged) as url:
        r = oai(url).chat("hi", schema=Verdict)
        assert url.hits == 1
    assert r.parsed == Verdict(verdict="authentic", confidence=0.6)


def test_truncated_json_is_repaired():
    with openai_server(lambda req: '{"verdict": "authentic", "confidence": 0.6, "reason": "smooth noi') as url:
        assert oai(url).chat("hi", schema=Verdict).parsed.verdict == "authentic"


def test_schema_reask_with_validation_error():
    with openai_server(scripted('{"verdict": "looks fake", "confidence": 0.9}', GOOD)) as url:
        r = oai(url).chat(MSGS, schema=Verdict)
        reask = url.calls[1].json["messages"]
    assert url.hits == 2 and r.parsed.verdict == "manipulated"
    assert reask[-2] == {"role": "assistant", "content": '{"verdict": "looks fake", "confidence": 0.9}'}
    assert "verdict" in reask[-1]["content"] and "schema" in reask[-1]["content"]
    assert r.input_tokens > 0 and r.attempts == 2   # usage covers both exchanges


def test_schema_failure_raises_after_one_reask_and_never_substring_matches():
    # the text contains the word 'manipulated' but is not a valid object: no verdict may be read out of it
    with openai_server(lambda req: "It is clearly manipulated, confidence high.") as url:
        with pytest.raises(ChatFailure) as ei:
            oai(url).chat("hi", schema=Verdict, case="c7")
        assert url.hits == 2
    assert ei.value.raw_text == "It is clearly manipulated, confidence high." and "c7" in str(ei.value)


# ---------------------------------------------------------------- cache
def test_cache_rw_then_replay_makes_no_network_call(tmp_path):
    db = tmp_path / "chat.sqlite"
    with openai_server(scripted(Fault(500), '{"verdict": "authentic", "confidence": 0.1}')) as url:
        spec = f"openai-compatible:{url}#local-vlm"
        m = gm(spec, cache="rw", cache_path=db, retry=FAST)
        first = [m.chat(MSGS, schema=Verdict, temperature=0, case=f"c{i}", max_tokens=10 + i) for i in range(3)]
        hits_after_record = url.hits
        warm = gm(spec, cache="rw", cache_path=db, retry=FAST)
        again = [warm.chat(MSGS, schema=Verdict, temperature=0, case=f"c{i}", max_tokens=10 + i) for i in range(3)]
        assert url.hits == hits_after_record == 4           # 3 calls + 1 retried fault; warm re-run: none
    # replay-only with the server gone: identical outputs
    rep = gm(spec, cache="replay", cache_path=db)
    replayed = [rep.chat(MSGS, schema=Verdict, temperature=0, case=f"c{i}", max_tokens=10 + i) for i in range(3)]
    for a, b, c in zip(first, again, replayed):
        assert a.text == b.text == c.text and a.parsed == b.parsed == c.parsed
        assert (a.input_tokens, a.output_tokens, a.cost_usd) == (c.input_tokens, c.output_tokens, c.cost_usd)
        assert not a.cached and b.cached and c.cached
    assert rep.stats["network"] == 0


def test_replay_miss_names_the_case(tmp_path):
    with openai_server() as url:
        m = gm(f"openai-compatible:{url}#local-vlm", cache="replay", cache_path=tmp_path / "c.sqlite")
        with pytest.raises(CacheMiss, match="img-042") as ei:
            m.chat("never recorded", case="img-042", role="judge")
        assert url.hits == 0
    assert "judge" in str(ei.value) and "cache='rw'" in str(ei.value)


def test_cache_off_always_calls(tmp_path):
    with openai_server() as url:
        m = oai(url)
        m.chat("same", temperature=0); m.chat("same", temperature=0)
        assert url.hits == 2


def test_cache_key_covers_images_params_and_template(tmp_path):
    with openai_server(lambda req: "x") as url:
        m = oai(url, cache="rw", cache_path=tmp_path / "c.sqlite")
        tmpl = template_hash("Look for {what}.")
        m.chat(MSGS, temperature=0, template=tmpl)
        m.chat(MSGS, temperature=0, template=tmpl)                                    # hit
        m.chat([MSGS[0], ChatMessage.of("user", "Is this image manipulated?", IMAGE.copy())], temperature=0,
               template=tmpl)                                                          # same pixels: hit
        m.chat([MSGS[0], ChatMessage.of("user", "Is this image manipulated?", 255 - IMAGE)], temperature=0,
               template=tmpl)                                                          # other pixels: miss
        m.chat(MSGS, temperature=0, max_tokens=7, template=tmpl)                       # other params: miss
        m.chat(MSGS, temperature=0, template=template_hash("Look for {what} now."))    # edited template: miss
        assert url.hits == 4


def test_same_pixels_from_other_files_hit_the_cache(tmp_path):
    from PIL import Image
    for name in ("a.png", "b.png"):
        Image.fromarray(IMAGE).save(tmp_path / name)
    Image.fromarray(IMAGE).save(tmp_path / "c.jpg", quality=95)
    with openai_server(lambda req: "x") as url:
        m = oai(url, cache="rw", cache_path=tmp_path / "c.sqlite")
        replies = [m.chat([ChatMessage.of("user", "Edited?", tmp_path / n)], temperature=0) for n in ("a.png", "b.png", "c.jpg")]
        assert [r.cached for r in replies] == [False, True, False] and url.hits == 2   # the JPEG's pixels differ
        m.chat([ChatMessage.of("user", "Edited?", IMAGE)], temperature=0)
        assert url.hits == 2


def test_sampled_calls_stay_distinct_and_replay_in_order(tmp_path):
    counter = iter(range(100))
    with openai_server(lambda req: f"sample {next(counter)}") as url:
        spec = f"openai-compatible:{url}#local-vlm"
        m = gm(spec, cache="rw", cache_path=tmp_path / "c.sqlite")
        texts = [m.chat("Argue your side.", temperature=0.8).text for _ in range(3)]
        assert texts == ["sample 0", "sample 1", "sample 2"] and url.hits == 3
        greedy = [m.chat("Argue your side.", temperature=0).text for _ in range(2)]
        assert greedy[0] == greedy[1] and url.hits == 4
    rep = gm(spec, cache="replay", cache_path=tmp_path / "c.sqlite")
    assert [rep.chat("Argue your side.", temperature=0.8).text for _ in range(3)] == texts
    assert rep.chat("Argue your side.", temperature=0.8, sample=1).text == "sample 1"
    with pytest.raises(CacheMiss):
        rep.chat("Argue your side.", temperature=0.8)      # a 4th sample was never recorded


_WRITER = """
import sys
from forensicslab.chat.cache import ChatCache
c = ChatCache(sys.argv[1]); start = int(sys.argv[2])
for i in range(start, start + 40):
    c.put(f"k{i}", "m", {"i": i}, {"text": str(i)})
    assert c.get(f"k{i}")["text"] == str(i)
"""


def test_cache_is_safe_with_concurrent_processes(tmp_path):
    import subprocess, sys
    db = tmp_path / "shared.sqlite"
    ChatCache(db)
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(db), str(s)]) for s in (0, 40, 80, 120)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    c = ChatCache(db)
    assert len(c) == 160 and c.get("k137")["text"] == "137"
    assert c._conn().execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# ---------------------------------------------------------------- concurrency and budget
def _peak_counting_responder(delay: float):
    "A responder that answers 'ok' after `delay` s and records the peak number of requests in flight."
    state = {"now": 0, "peak": 0}
    lock = threading.Lock()
    def responder(req):
        with lock:
            state["now"] += 1; state["peak"] = max(state["peak"], state["now"])
        time.sleep(delay)
        with lock: state["now"] -= 1
        return "ok"
    return responder, state


def test_concurrency_limit_bounds_in_flight_calls():
    responder, state = _peak_counting_responder(0.1)
    with openai_server(responder) as url:
        m = oai(url, concurrency=3)
        t0 = time.perf_counter()
        out = m.chat_many([{"messages": f"q{i}", "temperature": 0} for i in range(12)], workers=12)
        dt = time.perf_counter() - t0
    assert all(r.text == "ok" for r in out) and state["peak"] == 3
    assert dt >= 0.38           # 12 calls / 3 at a time x 0.1 s = 0.4 s at the least


def test_models_of_the_same_endpoint_share_the_limit():
    responder, state = _peak_counting_responder(0.05)
    with openai_server(responder) as url:
        agents = [oai(url, concurrency=2) for _ in range(3)]      # three agents, one server, limit 2
        threads = [threading.Thread(target=a.chat_many, args=([{"messages": f"q{i}"} for i in range(6)],),
                                    kwargs={"workers": 6}) for a in agents]
        for t in threads: t.start()
        for t in threads: t.join()
        assert url.hits == 18
    assert state["peak"] == 2


def test_budget_stops_a_run_cleanly_and_keeps_rows(tmp_path):
    budget = Budget(max_tokens=60)
    with openai_server(lambda req: "a short answer of some twenty tokens or so, to spend the budget") as url:
        m = oai(url, budget=budget)
        run = Run(tmp_path / "run", config={"t": 1})
        cases = [Case(f"c{i}", f"question number {i}") for i in range(10)]
        with pytest.raises(BudgetExceeded, match="token budget"):
            run.execute(cases, lambda q: {"answer": m.chat(q, temperature=0).text}, workers=1, progress=False)
        hits = url.hits
    rows = run.rows()
    assert 1 <= len(rows) < 10 and all(r["status"] == "ok" for r in rows) and hits == len(rows)
    assert budget.spent_tokens >= 60
    # cache hits are free: a warm replay of the finished rows spends nothing


def test_budget_in_usd_uses_the_price_table(tmp_path):
    budget = Budget(max_usd=1e-5)
    prices = {"openai-compatible": {"local-vlm": {"input": 1.0, "output": 100.0}}}
    with openai_server(lambda req: "x" * 400) as url:   # ~100 output tokens = $1e-5
        m = oai(url, budget=budget, prices=prices)
        r = m.chat("hi")
        assert r.cost_usd == pytest.approx((r.input_tokens * 1.0 + r.output_tokens * 100.0) / 1e6)
        with pytest.raises(BudgetExceeded, match="cost budget"):
            m.chat("again")
        assert url.hits == 1


# ---------------------------------------------------------------- traces and secrets
def test_trace_records_each_exchange_without_image_bytes(tmp_path):
    with openai_server(scripted('{"verdict": 3}', GOOD)) as url:
        m = oai(url, trace_path=tmp_path / "t.jsonl", run="r1")
        m.chat(MSGS, schema=Verdict, case="c1", role="auditor:noise", template="abc123")
    recs = read_trace(tmp_path / "t.jsonl")
    assert [r["step"] for r in recs] == ["answer", "reask"] and [r["status"] for r in recs] == ["invalid", "ok"]
    r = recs[1]
    assert (r["run"], r["case"], r["role"], r["template"], r["backend"]) == ("r1", "c1", "auditor:noise", "abc123",
                                                                           "openai-compatible:local-vlm")
    assert r["usage"]["input_tokens"] > 0 and r["attempts"] == 1 and r["latency_s"] > 0 and r["reply"] == GOOD
    assert r["messages"][1]["content"][1]["size"] == [64, 48]
    text = (tmp_path / "t.jsonl").read_text()
    assert "base64" not in text and len(text) < 20000


def test_planted_key_never_appears_in_traces_logs_or_errors(tmp_path, monkeypatch, caplog):
    key = "sk-planted-SECRET-0123456789abcdef"
    gkey = "AIzaPlantedGeminiSecret0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.setenv("GEMINI_API_KEY", gkey)
    caplog.set_level(logging.DEBUG)
    leak = Fault(401, body={"error": {"message": f"Incorrect API key provided: {key} / {gkey}",
                                            "type": "invalid_request_error"}})
    errors = []
    with openai_server(scripted(Fault.rate_limit(0.01), GOOD, leak)) as url:
        m = gm("openai:gpt-4o", base_url=url, trace_path=tmp_path / "t.jsonl", retry=FAST)
        m.chat(MSGS, schema=Verdict, case="ok")
        with pytest.raises(BackendError) as ei: m.chat(MSGS, case="leaky")
        errors.append(ei.value)
        assert url.calls[0].headers["authorization"] == f"Bearer {key}"      # the key did reach the server
    with gemini_server(scripted(Fault(500), GOOD, leak)) as gurl:
        g = gm("gemini:gemini-2.5-pro", base_url=gurl, trace_path=tmp_path / "t.jsonl", retry=FAST)
        g.chat(MSGS, schema=Verdict)
        with pytest.raises(BackendError) as ei: g.chat("x", case="leaky")
        errors.append(ei.value)
    assert len(errors) == 2
    blob = "\n".join([(tmp_path / "t.jsonl").read_text(), caplog.text, *map(str, errors), *map(repr, errors)])
    assert "Incorrect API key provided" in blob or "[REDACTED]" in blob
    assert key not in blob and gkey not in blob and "SECRET" not in blob


# ---------------------------------------------------------------- local transformers
@pytest.fixture(scope="module")
def tiny_vlm_dir(tmp_path_factory):
    torch = pytest.importorskip("torch")
    tv = pytest.importorskip("forensicslab.zoom.tinyvlm")
    torch.set_num_threads(1)
    net, proc = tv.build_tiny_vlm()
    return tv.save_vlm(net, proc, tmp_path_factory.mktemp("tiny") / "tiny-qwen3-vl")


def test_hf_backend_generates_with_image_and_caches(tiny_vlm_dir, tmp_path):
    m = gm(f"hf:{tiny_vlm_dir}", device="cpu", cache="rw", cache_path=tmp_path / "c.sqlite",
                  trace_path=tmp_path / "t.jsonl")
    assert m.concurrency == 1 and m.model_id == "hf:tiny-qwen3-vl"
    r1 = m.chat([ChatMessage.of("user", "Is it fake?", IMAGE)], temperature=0, max_tokens=6)
    r2 = m.chat([ChatMessage.of("user", "Is it fake?", IMAGE)], temperature=0, max_tokens=6)
    assert r1.input_tokens > 5 and 0 < r1.output_tokens <= 6 and r1.cost_usd == 0
    assert r2.cached and r2.text == r1.text and m.stats["network"] == 1
    s1 = m.chat("Tell me.", temperature=1.0, max_tokens=6, seed=1)
    s2 = m.chat("Tell me.", temperature=1.0, max_tokens=6, seed=1)
    assert not s1.cached and not s2.cached and m.stats["network"] == 3     # sample 1 is a new call even with the same seed


def test_hf_backend_schema_failure_is_typed(tiny_vlm_dir):
    m = gm(f"hf:{tiny_vlm_dir}", device="cpu")
    with pytest.raises(ChatFailure):       # random weights never write a valid Verdict
        m.chat("Verdict?", schema=Verdict, temperature=0, max_tokens=4)


# ---------------------------------------------------------------- hardening (issue 17) and run controls (issue 13)
def _usage_reply(text, prompt_tokens, completion_tokens):
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "local-vlm",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def test_invalid_replies_are_not_cached_and_a_rerun_retries(tmp_path):
    with openai_server(scripted("no json here", "still none", GOOD)) as url:
        m = oai(url, cache="rw", cache_path=tmp_path / "c.sqlite")
        with pytest.raises(ChatFailure):
            m.chat("Edited?", schema=Verdict, temperature=0)
        stored = [json.loads(r[0]) for r in ChatCache(tmp_path / "c.sqlite")._conn().execute("SELECT reply FROM replies")]
        assert all("text" not in r for r in stored)                  # neither reply was stored (only a failure note)
        with pytest.raises(ChatFailure, match="after repair and one re-ask"):   # a replay reproduces the failure...
            gm(f"openai-compatible:{url}#local-vlm", cache="replay", cache_path=tmp_path / "c.sqlite").chat(
                "Edited?", schema=Verdict, temperature=0)
        assert url.hits == 2                                         # ...with no call
        r = m.chat("Edited?", schema=Verdict, temperature=0)       # the re-run reaches the server again
        assert url.hits == 3 and r.parsed.verdict == "manipulated" and not r.cached
        again = m.chat("Edited?", schema=Verdict, temperature=0)
        assert again.cached and url.hits == 3


def test_a_reply_validated_by_the_reask_replays_without_calls(tmp_path):
    with openai_server(scripted("not json", GOOD)) as url:
        oai(url, cache="rw", cache_path=tmp_path / "c.sqlite").chat("Edited?", schema=Verdict, temperature=0)
        assert url.hits == 2
    r = gm("openai-compatible:http://127.0.0.1:9/v1#local-vlm", cache="replay",
                  cache_path=tmp_path / "c.sqlite").chat("Edited?", schema=Verdict, temperature=0)
    assert r.cached and r.parsed.verdict == "manipulated" and r.calls == 0


def test_reply_size_cap_is_a_typed_failure_and_nothing_is_stored(tmp_path):
    from forensicslab.chat.models import ModelControls, ReplyTooLarge
    c = ModelControls.of({"max_reply_chars": 1000, "cache": "rw", "cache_path": str(tmp_path / "c.sqlite"),
                          "trace": str(tmp_path / "t.jsonl"), "attempts": 1})
    with openai_server(lambda req: "A" * 50_000) as url:
        with pytest.raises(ReplyTooLarge, match="max_reply_chars=1000"):
            gm(f"openai-compatible:{url}#local-vlm", controls=c).chat("hi", temperature=0)
        assert url.hits == 1                                       # no re-ask sent the huge text back
    assert len(ChatCache(tmp_path / "c.sqlite")) == 0
    assert "AAAAAAAAAA" not in (tmp_path / "t.jsonl").read_text()


def test_negative_usage_is_clamped_and_counted_as_unknown():
    budget = Budget(max_tokens=100)
    with openai_server(lambda req: _usage_reply("ok", -1_000_000, -5)) as url:
        m = oai(url, budget=budget)
        r = m.chat("hi", temperature=0)
        assert (r.input_tokens, r.output_tokens, r.usage_unknown) == (0, 0, True)
        assert budget.spent_tokens == 0 and r.cost_usd >= 0


def test_failed_calls_carry_the_usage_of_every_attempt():
    budget = Budget()
    with openai_server(lambda req: _usage_reply("no json", 40, 7)) as url:
        with pytest.raises(ChatFailure) as ei:
            oai(url, budget=budget).chat("Edited?", schema=Verdict, temperature=0)
    e = ei.value
    assert (e.calls, e.input_tokens, e.output_tokens) == (2, 80, 14)   # the answer and the re-ask
    assert budget.spent_tokens == 94 and budget.calls == 2


def test_one_redaction_before_cache_trace_and_reply(tmp_path):
    secret = "sk-live-echoed-0123456789abcdef"
    with openai_server(lambda req: '{"verdict": "authentic", "confidence": 0.5, "x": "%s"}' % secret) as url:
        m = gm(f"openai-compatible:{url}#local-vlm", api_key=secret, cache="rw",
                      cache_path=tmp_path / "c.sqlite", trace_path=tmp_path / "t.jsonl", retry=FAST)
        r = m.chat("hi", temperature=0)
    stored = ChatCache(tmp_path / "c.sqlite")._conn().execute("SELECT reply FROM replies").fetchone()[0]
    assert secret not in r.text and secret not in stored and secret not in (tmp_path / "t.jsonl").read_text()
    assert json.loads(stored)["text"] == r.text                      # the same redacted text everywhere


def test_unsafe_bin_checkpoint_is_refused_in_one_line(tmp_path):
    from typer.testing import CliRunner
    from forensicslab.chat.cli import models_app
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04 not loaded")
    res = CliRunner().invoke(models_app, ["ask", f"hf:{tmp_path}", "hi"])
    assert res.exit_code == 2 and "only safetensors" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_retries_never_outlive_the_time_budget():
    with openai_server(lambda req: Delayed(0.8, GOOD)) as url:
        m = oai(url, timeout=1.5, attempt_timeout=0.5, retry=RetryPolicy(max_attempts=10, base_delay=0.01))
        with pytest.raises(BackendError, match="time budget") as ei:
            m.chat("hi")
        assert url.hits < 10 and ei.value.attempts == url.hits      # stopped by the budget, not the attempt limit


def test_compatible_servers_get_the_format_instruction_and_structured_outputs():
    with openai_server(lambda req: GOOD) as url:
        oai(url).chat("Edited?", schema=Verdict)
        oai(url, structured="constrained").chat("Edited?", schema=Verdict)
        oai(url, structured="prompt").chat("Edited?", schema=Verdict)
        auto, guided, prompt = (c.json for c in url.calls)
    assert auto["response_format"]["type"] == "json_schema" and "single JSON object" in auto["messages"][0]["content"]
    # constrained decoding on an unnamed server: vLLM's current keys, never the removed guided_json
    assert guided["structured_outputs"]["json"]["title"] == "Verdict" and "guided_json" not in guided
    assert "response_format" not in prompt and '"verdict"' in prompt["messages"][0]["content"]


def test_text_only_server_gets_a_note_instead_of_images():
    spec = {"backend": "openai-compatible", "base_url": None, "model": "local-llm", "vision": False}
    with openai_server(lambda req: GOOD) as url:
        r = gm({**spec, "base_url": url}, retry=FAST).chat(MSGS, schema=Verdict, temperature=0)
        sent = url.calls[0].json["messages"][1]["content"]
    assert isinstance(sent, str) and "omitted" in sent and r.dropped_images == 1 and "text only" in r.notes[0]


def test_controls_reach_every_call_and_traces_name_case_and_role(tmp_path):
    from forensicslab.chat.models import ModelControls, chat_context
    c = ModelControls.of({"max_tokens": 33, "temperature": 0.0, "trace": str(tmp_path / "t.jsonl"), "cache": "off",
                          "structured": "prompt", "budget_tokens": 10_000})
    with openai_server(lambda req: GOOD) as url:
        m = c.model("judge", f"openai-compatible:{url}#local-vlm")
        assert c.model("judge", f"openai-compatible:{url}#local-vlm") is m and m.budget is c.budget  # once per role and spec
        assert c.model("auditor", f"openai-compatible:{url}#local-vlm") is not m
        with chat_context(case="img-9"):
            m.chat("Edited?", schema=Verdict, max_tokens=999, temperature=1.0)
        req = url.calls[0].json
    assert req["max_tokens"] == 33 and req["temperature"] == 0.0 and "response_format" not in req
    rec = read_trace(tmp_path / "t.jsonl")[0]
    assert (rec["case"], rec["role"], rec["structured"]) == ("img-9", "judge", "prompt")
    assert c.budget.spent_tokens > 0


def _tiny_text_llm(folder: Path, byte_level: bool = False) -> Path:
    """A tiny Llama (random weights) with a character-level tokenizer and a chat template that only accepts string
    content; `byte_level`: a byte-level BPE tokenizer without merges (the kind of GPT-2, Llama 3, Qwen, SmolLM2)."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    chars = pre_tokenizers.ByteLevel.alphabet() if byte_level else [chr(c) for c in range(32, 127)]
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<pad>"] + sorted(chars))}
    if byte_level:
        tok = Tokenizer(models.BPE(vocab, merges=[], unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
    else:
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
        tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    hf.chat_template = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '</s>' }}{% endfor %}"
                        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=3)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    hf.save_pretrained(folder)
    return folder


def test_hf_text_only_causal_lm_loads_and_renders_string_content(tmp_path):
    folder = _tiny_text_llm(tmp_path / "tiny-llm")
    m = gm(f"hf:{folder}", device="cpu", structured="prompt")
    assert not m.capabilities.vision and m.capabilities.context_length == 4096
    r = m.chat([ChatMessage.of("user", "is this photo edited", IMAGE)], temperature=0, max_tokens=4)
    assert r.input_tokens > 5 and 0 < r.output_tokens <= 4 and r.dropped_images == 1


def test_hf_prompt_over_the_context_is_reported_before_the_call(tmp_path):
    from forensicslab.chat.models import ContextTooLong
    folder = _tiny_text_llm(tmp_path / "tiny-llm")
    m = gm(f"hf:{folder}", device="cpu", structured="prompt")
    with pytest.raises(ContextTooLong, match="context of 4096"):
        m.chat("the image " * 500, max_tokens=8)


@pytest.mark.skipif(importlib.util.find_spec("lmformatenforcer") is None, reason="needs lm-format-enforcer (forensicslab[tiny-llm])")
def test_hf_constrained_decoding_gives_schema_valid_json_from_a_random_model(tmp_path):
    folder = _tiny_text_llm(tmp_path / "tiny-llm")
    m = gm(f"hf:{folder}", device="cpu", structured="constrained")
    r = m.chat("is this photo edited", schema=Verdict, temperature=0, max_tokens=120)  # the grammar-valid reply takes 81
    assert isinstance(r.parsed, Verdict)      # random weights: only the grammar can make this valid


@pytest.mark.skipif(importlib.util.find_spec("lmformatenforcer") is None or importlib.util.find_spec("llguidance") is None,
                    reason="needs lm-format-enforcer and llguidance (forensicslab[train])")
@pytest.mark.parametrize("byte_level,engine", [(True, "_llg_prefix_fn"), (False, "_prefix_fn")])
def test_hf_constrained_triage_verdicts_pass_the_cross_field_rules(tmp_path, byte_level, engine):
    """Issue 13: the triage verdict's cross-field rules (a manipulated verdict names a decisive tool, an
    authentic one none; locality n/a exactly when authentic) and its allowed detector ids are in the grammar,
    so even random weights give verdicts that pass pydantic validation, not just JSON-schema-shaped ones. Under
    both grammar engines: llguidance for the tokenizers it reads (byte-level BPE), lm-format-enforcer for the rest."""
    from transformers import AutoTokenizer
    from forensicslab.chat.backends import json_prefix_fn
    from forensicslab.triage.agents import Verdict as TriageVerdict, verdict_schema
    folder = _tiny_text_llm(tmp_path / "tiny-llm", byte_level=byte_level)
    m = gm(f"hf:{folder}", device="cpu", structured="constrained")
    schema, seen = verdict_schema(("adq", "noise")), set()
    assert json_prefix_fn(AutoTokenizer.from_pretrained(folder), schema, 600).__qualname__.startswith(engine)
    for seed in range(4):          # sampled: several random paths through the grammar
        r = m.chat(f"case {seed}: is this photo edited", schema=schema, temperature=1.0, seed=seed, max_tokens=600)
        v = r.parsed
        assert isinstance(v, TriageVerdict) and set(v.arbitrated_tools) <= {"adq", "noise"}
        assert v.is_manipulated == bool(v.arbitrated_tools) == (v.locality != "n/a")
        seen.add(v.is_manipulated)
    assert r.output_tokens <= 600


@pytest.mark.skipif(importlib.util.find_spec("llguidance") is None, reason="needs llguidance (forensicslab[train])")
def test_hf_regex_constrained_zoom_turns_are_well_formed(tmp_path):
    """Issue 13: a zoom turn is tagged free text, so the policy sends `turn_pattern` as the `regex` parameter;
    under hf: constrained decoding even random weights write a turn that parses (think, then one crop call or
    one answer in canonical JSON). Only what a pattern cannot say (x2 > x1) may still be wrong."""
    from forensicslab.zoom.agents import parse_action, turn_pattern
    byte_level = _tiny_text_llm(tmp_path / "byte-level", byte_level=True)    # llguidance's matcher reads this tokenizer
    for seed in range(3):
        r = gm(f"hf:{byte_level}", device="cpu", structured="constrained").chat(
            f"turn {seed}", regex=turn_pattern(think_chars=100, text_chars=40, key_items=1), temperature=1.0, seed=seed,
            max_tokens=1200)   # at most 4 tokens a character (bytes)
        a = parse_action(r.text)
        assert a.kind != "invalid" or "must satisfy x2 > x1" in a.error, (r.text, a.error)
    folder = _tiny_text_llm(tmp_path / "tiny-llm")     # a decoder llguidance cannot read: lm-format-enforcer's parser
    m = gm(f"hf:{folder}", device="cpu", structured="constrained")
    for seed in range(3):
        r = m.chat(f"turn {seed}", regex=turn_pattern(think_chars=40, text_chars=30, key_items=1), temperature=1.0, seed=seed,
                   max_tokens=400)
        a = parse_action(r.text)
        assert a.kind != "invalid" or "must satisfy x2 > x1" in a.error, (r.text, a.error)
    free = gm(f"hf:{folder}", device="cpu", structured="prompt")   # no grammar: the same weights write no turn
    assert parse_action(free.chat("turn 0", regex=turn_pattern(), temperature=1.0, seed=0, max_tokens=60).text).kind == "invalid"


def test_one_pooled_client_per_endpoint():
    """Issue 25: each endpoint has one official client over one HTTP client (one connection pool), whatever the
    per-call timeout (the Gemini backend used to build a client per timeout, i.e. nearly one per call under a time budget)."""
    from forensicslab.chat.backends import close_clients
    with openai_server(scripted(GOOD)) as url, gemini_server(scripted(GOOD)) as gurl:
        a, b = oai(url, timeout=7.0), oai(url, timeout=3.0)
        g1, g2 = gem(gurl, timeout=9.0), gem(gurl, timeout=2.5)
        for m in (a, b, g1, g2): assert m.chat("hi", schema=Verdict).parsed.verdict == "manipulated"
        assert a.backend.client() is b.backend.client() and g1.backend.client() is g2.backend.client()
        assert type(a.backend.client()).__module__.startswith("openai") and type(g1.backend.client()).__module__.startswith("google.genai")
        first = g1.backend.http_client()
        assert gem(gurl, timeout=1.2).chat("hi", schema=Verdict).parsed and g1.backend.http_client() is first
        assert a.backend.http_client() is not first                 # one pool per endpoint
        close_clients()
        assert g1.backend.http_client() is not first and first.is_closed     # a closed client is never handed out again
        assert oai(url).chat("again", schema=Verdict).parsed.verdict == "manipulated"


def test_hf_checkpoint_without_a_chat_template_says_so_in_one_line_and_takes_a_named_one(tmp_path):
    "Issue 33 item 5: a base checkpoint without a template (Gemma 3 270M's GGUF) is one line, fixed by `chat_template=`."
    from forensicslab.chat.backends import CHAT_TEMPLATES
    from forensicslab.core import ForensicsLabError
    folder = _tiny_text_llm(tmp_path / "no-template")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    for f in folder.glob("chat_template.*"): f.unlink()
    with pytest.raises(ForensicsLabError, match="no chat template") as e:
        gm(f"hf:{folder}", device="cpu", structured="prompt").chat("hi", max_tokens=2)
    assert "\n" not in str(e.value) and "gemma" in str(e.value)
    r = gm({"backend": "hf", "model": str(folder), "chat_template": "chatml", "device": "cpu", "structured": "prompt"}).chat("hi", max_tokens=3)
    assert r.output_tokens <= 3 and set(CHAT_TEMPLATES) >= {"gemma", "chatml"}
    with pytest.raises(ForensicsLabError, match="neither"):
        gm({"backend": "hf", "model": str(folder), "chat_template": "nonesuch"})


def test_hf_reply_cut_by_its_time_limit_is_not_a_natural_stop(tmp_path):
    "Issue 33 item 5: `max_time` cutting a reply short is finish 'time', apart from 'length' (the token cap)."
    from forensicslab.chat.backends import prepare_messages
    folder = _tiny_text_llm(tmp_path / "tiny-llm")
    m = gm(f"hf:{folder}", device="cpu", structured="prompt")
    cut = m.backend.complete(prepare_messages("hi"), None, {"max_tokens": 400}, timeout=1e-4)
    capped = m.backend.complete(prepare_messages("hi"), None, {"max_tokens": 3}, timeout=60)
    assert cut.finish_reason == "time" and cut.output_tokens < 400
    assert capped.finish_reason in ("length", "stop") and capped.output_tokens <= 3


@pytest.mark.skipif(importlib.util.find_spec("lmformatenforcer") is None, reason="needs lm-format-enforcer (forensicslab[train])")
def test_judged_debaters_keep_their_side_under_a_constrained_backend(tmp_path):
    """Issue 33: a judged debater's answer schema fixes `misinformation` to its assigned side when the backend decodes
    under the schema, so even random weights argue their side, the debate reaches agent 2 and the judge, and no call
    is spent on a stance reminder; a prompt-only backend gets the plain answer schema (and the reminder)."""
    from PIL import Image
    from forensicslab.core import Sample
    from forensicslab.debate.agents import _answer_schema
    from forensicslab.debate.all import DebateConfig, DebateInput, run_debate
    from forensicslab.debate.records import DebateAnswer
    folder = _tiny_text_llm(tmp_path / "tiny-llm")
    m = gm(f"hf:{folder}", device="cpu", structured="constrained", max_tokens=160)
    Image.new("RGB", (32, 32), (90, 120, 150)).save(tmp_path / "p.png")
    sample = Sample(id="s", image=str(tmp_path / "p.png"), caption="A flood in Dresden, 2002.", label=1, family="out_of_context")
    res = run_debate(DebateInput(sample, None, tmp_path), [m, m], DebateConfig(strategy="judged", retrieval=False, max_rounds=0,
                                                                              params={"temperature": 0}))
    assert res.status == "ok", (res.failure_kind, res.failure)
    said = {t.agent: t.answer for t in res.turns}
    assert said["agent1"] is True and said["agent2"] is False and "judge" in said and res.stance_reasks == 0
    assert _answer_schema(gm(f"hf:{folder}", device="cpu", structured="prompt"), True) is DebateAnswer


@pytest.mark.skipif(importlib.util.find_spec("llguidance") is None, reason="needs llguidance (forensicslab[train])")
def test_grammar_allows_no_invented_field_after_the_last_one(tmp_path):
    """Issue 33: under llguidance a schema without `additionalProperties: false` let SmolLM2 open an invented key after
    the last field and write until max_tokens (the reply then needed repair); the grammar closes the object instead."""
    import torch
    from pydantic import BaseModel
    from transformers import AutoTokenizer
    from forensicslab.chat.backends import json_prefix_fn

    class Two(BaseModel):
        a: str
        b: bool

    tok = AutoTokenizer.from_pretrained(_tiny_text_llm(tmp_path / "byte-level", byte_level=True))
    fn = json_prefix_fn(tok, Two, 200)
    prompt = tok.encode("assistant: ")
    fn(0, torch.tensor(prompt))                                       # the first call sees the prompt only
    allowed = set(fn(0, torch.tensor(prompt + tok.encode('{"a":"x","b":true', add_special_tokens=False))))
    close, comma = tok.encode("}", add_special_tokens=False), tok.encode(",", add_special_tokens=False)
    assert len(close) == len(comma) == 1 and close[0] in allowed and comma[0] not in allowed


def test_grammar_bounds_the_zoom_judges_rating(tmp_path):
    """Issue 33: the zoom judge's `Rating` had its 1-10 range only in a validator, so under the grammar Gemma 3 wrote
    `10` followed by 150 zeros until max_tokens (real-model check); the bounds are in the schema now, and the grammar
    closes the number after `10`."""
    import torch
    from transformers import AutoTokenizer
    from forensicslab.chat.backends import json_prefix_fn
    from forensicslab.zoom.records import Rating

    tok = AutoTokenizer.from_pretrained(_tiny_text_llm(tmp_path / "byte-level", byte_level=True))
    fn = json_prefix_fn(tok, Rating, 200)
    prompt = tok.encode("assistant: ")
    fn(0, torch.tensor(prompt))
    allowed = set(fn(0, torch.tensor(prompt + tok.encode('{"reason":"x","rating":10', add_special_tokens=False))))
    zero, close = tok.encode("0", add_special_tokens=False), tok.encode("}", add_special_tokens=False)
    assert len(zero) == len(close) == 1 and zero[0] not in allowed and close[0] in allowed
