"""Debate retrieval through the one capped-HTTP helper (`forensicslab.net.request_capped`): a search API that
trickles its reply or answers with an oversized one is cut off by a total deadline and a size cap, as page fetches
already were (issue 25). Before, the search calls used a plain per-read httpx timeout: a server sending one byte
every 0.1 s held a search for the whole reply, and a reply of any size was read whole into memory."""
import asyncio
import json
import time

import httpx
import pytest

from forensicslab.debate.data import FetchError, fetch_dataset
from forensicslab.debate.retrieval import (MAX_SEARCH_REPLY_BYTES, BingVisualSearch, GoogleVisionWeb, RetrievalError,
                                           Retriever, fetch_page)
from forensicslab.net import Served

HIT = {"url": "https://a.example/full", "pageTitle": "A", "fullMatchingImages": [{"url": "y"}]}


def _reply(pad: int = 0) -> bytes:
    "A valid web-detection answer with one page, padded with `pad` bytes of an ignored field."
    return json.dumps({"responses": [{"webDetection": {"pagesWithMatchingImages": [HIT]}}], "pad": "x" * pad}).encode()


async def app(scope, receive, send):
    "/slow: a JSON reply that announces 2,000 bytes and sends one every 0.1 s; /big: an oversized valid one; /ok; /bin."
    if scope["type"] != "http": return
    while (await receive()).get("more_body"): pass
    path = scope["path"]
    if path == "/slow" or path.startswith("/trickle/"):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"2000")]})
        for _ in range(2000):
            await send({"type": "http.response.body", "body": b" ", "more_body": True})
            await asyncio.sleep(0.1)
        return
    if path == "/bin":   # a download that is not a page, trickled: a page fetch must not wait for it
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/octet-stream")]})
        for _ in range(2000):
            await send({"type": "http.response.body", "body": b"\0" * 1000, "more_body": True})
            await asyncio.sleep(0.1)
        return
    body = _reply(MAX_SEARCH_REPLY_BYTES + 1_000_000) if path in ("/big", "/big-chunked") else _reply()
    headers = [(b"content-type", b"application/json")]
    if path == "/big-chunked":   # no Content-Length: the cap must stop the reading itself
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i in range(0, len(body), 1_000_000):
            await send({"type": "http.response.body", "body": body[i:i + 1_000_000], "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200, "headers": headers + [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def server():
    with Served(app) as srv:
        yield srv.url


def test_a_trickling_search_api_is_cut_at_its_total_deadline(server):
    t0 = time.monotonic()
    with pytest.raises(RetrievalError, match="deadline") as e:
        GoogleVisionWeb("SECRETKEY", endpoint=f"{server}/slow", timeout=1.0).search(b"img")
    took = time.monotonic() - t0
    assert 0.9 < took < 3.0, took          # every byte arrives within a per-read timeout: only a total deadline stops it
    assert "SECRETKEY" not in str(e.value)   # the endpoint is named without its query
    with pytest.raises(RetrievalError, match="deadline"):
        BingVisualSearch("k", endpoint=f"{server}/slow", timeout=1.0).search(b"img")
    assert time.monotonic() - t0 < 6.0


@pytest.mark.parametrize("path,says", [("/big", "declared"), ("/big-chunked", "reading stopped")])
def test_an_oversized_search_reply_is_refused_at_the_cap(server, path, says):
    with pytest.raises(RetrievalError, match=f"cap.*{says}|{says}.*cap") as e:
        GoogleVisionWeb("SECRETKEY", endpoint=f"{server}{path}").search(b"img")
    assert f"{MAX_SEARCH_REPLY_BYTES}-byte cap" in str(e.value) and "SECRETKEY" not in str(e.value)
    # the control: the same answer under the cap is read, and a larger cap admits the oversized one
    assert [h.url for h in GoogleVisionWeb("k", endpoint=f"{server}/ok").search(b"img")] == [HIT["url"]]
    roomy = GoogleVisionWeb("k", endpoint=f"{server}{path}", max_reply_bytes=2 * MAX_SEARCH_REPLY_BYTES)
    assert [h.url for h in roomy.search(b"img")] == [HIT["url"]]


def test_retriever_records_a_slow_search_as_a_failure_not_cached(server, tmp_path):
    r = Retriever(GoogleVisionWeb("k", endpoint=f"{server}/slow", timeout=0.5), cache_dir=tmp_path)
    res = r.retrieve(b"img")
    assert "deadline" in res.error and not res.pages and res.elapsed_s < 2.5 and not list(tmp_path.glob("*.json"))


def test_a_page_fetch_does_not_read_a_download_that_is_not_a_page(server):
    "The body of a non-HTML reply is never read (`read_if`), so a trickled download costs nothing of the deadline."
    t0 = time.monotonic()
    assert fetch_page(f"{server}/bin", httpx.Client(), deadline_s=5.0, allow_private=True) == ("", "", None)
    assert time.monotonic() - t0 < 1.5


def test_a_trickling_dataset_download_is_cut_at_its_deadline(server, tmp_path):
    "A dataset file that arrives one byte every 0.1 s is abandoned at the total deadline: no part file, no empty folder."
    t0 = time.monotonic()
    with pytest.raises(FetchError, match=r"VERITE.csv: not complete within 1 s"):
        fetch_dataset("verite", tmp_path / "verite", base_url=f"{server}/trickle", deadline_s=1.0, timeout=5.0, log=lambda m: None)
    assert time.monotonic() - t0 < 4          # before: the whole 2,000-byte reply, 200 s
    assert not (tmp_path / "verite").exists()
