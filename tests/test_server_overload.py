"""An overloaded server answers 503 with an OpenAI error body, keeps the requests it accepted,
and serves again once the queue drains."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from server_utils import RemoteServer

pytestmark = [pytest.mark.server, pytest.mark.real_model]


def test_overload_is_503_and_the_server_recovers(smollm2_dir: Path) -> None:
    args = ["--max-model-len", "512", "--kv-cache-memory", "64MiB", "--max-num-seqs", "1",
            "--max-waiting-requests", "1", "--served-model-name", "m"]
    body = {"model": "m", "prompt": "Count slowly:", "max_tokens": 24, "ignore_eos": True}

    async def burst(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            first = asyncio.create_task(c.post(url, json=body))
            await asyncio.sleep(1.0)  # the first request is running; later ones queue up
            rest = [asyncio.create_task(c.post(url, json=body)) for _ in range(5)]
            await asyncio.sleep(0.3)
            return [await first] + [await t for t in rest]

    with RemoteServer(smollm2_dir, args) as srv:
        responses = asyncio.run(burst(srv.url("/v1/completions")))
        codes = [r.status_code for r in responses]
        assert codes[0] == 200
        assert 503 in codes and set(codes) <= {200, 503}
        err = next(r for r in responses if r.status_code == 503).json()["error"]
        assert "overloaded" in err["message"] and err["type"]
        ok = [r.json() for r in responses if r.status_code == 200]
        assert all(len(o["choices"][0]["text"]) > 0 for o in ok)
        again = httpx.post(srv.url("/v1/completions"), json=body, timeout=120)
        assert again.status_code == 200
