"""vLLM's request ids on the real server: an ``X-Request-Id`` header (else the body's
``request_id``) names the request (its response id, the log line) and, with
``--enable-request-id-headers``, every response carries ``X-Request-Id``; one id twice in
flight: both run and answer under it (the engine's ids get random suffixes, vLLM's)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from server_utils import RemoteServer

pytestmark = pytest.mark.server

KEY = "k"


@pytest.fixture(scope="module")
def server(tiny_llama_dir: Path) -> Iterator[RemoteServer]:
    args = ["--max-model-len", "256", "--kv-cache-memory", "32MiB", "--served-model-name", "t",
            "--enable-request-id-headers", "--enable-log-requests"]  # fmt: skip
    with RemoteServer(tiny_llama_dir, args, api_key=KEY) as srv:
        yield srv


def post(server: RemoteServer, path: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(server.url(path), json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}", **headers})  # fmt: skip


def test_header_and_body_ids(server: RemoteServer) -> None:
    chat = {"model": "t", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    r = post(server, "/v1/chat/completions", chat, **{"X-Request-Id": "trace-17"})
    assert r.status_code == 200 and r.json()["id"] == "chatcmpl-trace-17"
    assert r.headers["x-request-id"] == "trace-17"
    # the header wins over the body's request_id; the body's counts without a header
    r = post(server, "/v1/completions", {"model": "t", "prompt": "a", "max_tokens": 1,
                                          "request_id": "from-body"})  # fmt: skip
    assert r.json()["id"] == "cmpl-from-body"
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])  # a new one
    r = post(server, "/v1/completions", {"model": "t", "prompt": "a", "max_tokens": 1,
                                          "request_id": "from-body"}, **{"X-Request-Id": "h"})
    assert r.json()["id"] == "cmpl-h"
    r = post(server, "/v1/embeddings", {"model": "t", "input": "a"}, **{"X-Request-Id": "e1"})
    assert r.json()["id"] == "embd-e1"
    # errors carry the header too, the key check's included
    r = httpx.post(server.url("/v1/completions"), json={}, headers={"X-Request-Id": "nokey"})
    assert r.status_code == 401 and r.headers["x-request-id"] == "nokey"
    assert "Received request chatcmpl-trace-17" in server.log_text()


def test_one_id_twice_in_flight(server: RemoteServer) -> None:
    # vLLM's: a caller's id may be in flight twice (a retry); both run, both answer under it
    body = {"model": "t", "prompt": "a", "max_tokens": 120, "ignore_eos": True, "stream": True}

    async def both() -> tuple[int, int, str, str]:
        headers = {"Authorization": f"Bearer {KEY}", "X-Request-Id": "same"}
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            async with client.stream("POST", "/v1/completions", json=body,
                                     headers=headers) as first:  # fmt: skip
                chunks = first.aiter_lines()
                head = await anext(chunks)  # the first is running
                second = await client.post("/v1/completions", json={**body, "stream": False},
                                           headers=headers)  # fmt: skip
                rest = [line async for line in chunks]
                return first.status_code, second.status_code, second.text, head + rest[-2]

    first, second, text, streamed = asyncio.run(both())
    assert (first, second) == (200, 200)
    reply = json.loads(text)
    assert reply["id"] == "cmpl-same" and reply["usage"]["completion_tokens"] == 120
    assert '"id":"cmpl-same"' in streamed.replace(" ", "") and "[DONE]" in streamed


def test_data_parallel_rank_header_on_one_engine(server: RemoteServer) -> None:
    """vLLM's X-data-parallel-rank: 0 is the one engine; another rank is a 400 naming the
    header; a value that is not an integer is ignored (vLLM's)."""
    chat = {"model": "t", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    completion = {"model": "t", "prompt": "Hi", "max_tokens": 2}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion),
                       ("/v1/embeddings", {"model": "t", "input": "Hi"})):
        assert post(server, path, body, **{"X-data-parallel-rank": "0"}).status_code == 200
        assert post(server, path, body, **{"X-data-parallel-rank": "x"}).status_code == 200
        r = post(server, path, body, **{"X-data-parallel-rank": "1"})
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["param"] == "X-data-parallel-rank"

