"""``ironlm serve`` with the ``mp`` executor: SmolLM2 at tp=3 answers the openai client with
the greedy text of one rank (streaming included); a worker killed mid-request fails the
requests in flight with HTTP 500, /health answers 503, and the server exits non-zero with no
process left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from parallel_utils import (
    ENGINE_ARGS,
    MAX_TOKENS,
    PROMPTS,
    assert_server_exited_after_worker_death,
    greedy_outputs,
    running_requests,
    worker_pids,
)
from server_utils import RemoteServer

from ironlm import LLM

SERVE_ARGS = ["--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "32MiB",
              "--enforce-eager"]


def test_tp3_server_matches_one_rank_streaming_included(smollm2_dir: Path) -> None:
    llm = LLM(str(smollm2_dir), **ENGINE_ARGS)
    try:
        expected = greedy_outputs(llm)[1]
    finally:
        llm.shutdown()
    model = str(smollm2_dir)
    with RemoteServer(smollm2_dir, [*SERVE_ARGS, "-tp", "3",
                                    "--distributed-executor-backend", "mp"]) as server:
        assert len(worker_pids(server.proc.pid)) == 2  # ranks 1 and 2; rank 0 is the server
        client = server.openai_client()
        batch = client.completions.create(model=model, prompt=PROMPTS[:2], max_tokens=MAX_TOKENS,
                                          temperature=0, extra_body={"ignore_eos": True})
        assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == expected[:2]
        stream = client.completions.create(model=model, prompt=PROMPTS[3], max_tokens=MAX_TOKENS,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        assert "".join(c.choices[0].text for c in stream) == expected[3]
        assert httpx.get(server.url("/health")).status_code == 200
        # the cpu platform's server default, 128 sequences a rank, plus 1024 waiting
        too_many = httpx.post(server.url("/v1/completions"), timeout=60, json={
            "model": model, "prompt": PROMPTS[0], "max_tokens": 1, "n": 1409})
        assert too_many.status_code == 400
        assert "n must be at most 1408" in too_many.json()["error"]["message"]


def test_killed_worker_fails_requests_and_exits_the_server(smollm2_dir: Path) -> None:
    server = RemoteServer(smollm2_dir, [*SERVE_ARGS, "-pp", "2",
                                       "--distributed-executor-backend", "mp"])
    try:
        workers = worker_pids(server.proc.pid)
        assert len(workers) == 1
        status: dict[str, Any] = {}

        def long_request() -> None:
            r = httpx.post(server.url("/v1/completions"), timeout=300, json={
                "model": str(smollm2_dir), "prompt": PROMPTS[0], "max_tokens": 240,
                "ignore_eos": True, "temperature": 0})
            status["code"], status["body"] = r.status_code, r.json()

        thread = threading.Thread(target=long_request)
        thread.start()
        _wait_for(lambda: running_requests(server) >= 1, "the request to start running")
        os.kill(workers[0], signal.SIGKILL)
        thread.join(timeout=120)
        assert status["code"] == 500, status
        assert "rank 1" in status["body"]["error"]["message"]
        assert_server_exited_after_worker_death(server, workers)
    finally:
        server.close()


def _wait_for(condition: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.2)


def test_dead_worker_makes_health_503(tiny_llama_dir: Path) -> None:
    """In process: the engine's thread notices the dead worker while idle, /health turns 503
    and the server's on_dead hook fires (it makes ``ironlm serve`` exit)."""
    from ironlm.config import EngineConfig
    from ironlm.engine.async_engine import AsyncEngine
    from ironlm.engine.llm_engine import LLMEngine
    from ironlm.entrypoints.openai.api_server import build_app
    from ironlm.entrypoints.openai.cli_args import make_parser

    config = EngineConfig(model=str(tiny_llama_dir), tensor_parallel_size=2,
                          distributed_executor_backend="mp", max_model_len=128,
                          kv_cache_memory=8 * 1024**2, enforce_eager=True)
    died: list[BaseException] = []
    engine = AsyncEngine(lambda: LLMEngine(config), on_dead=died.append)
    engine.start()
    try:
        app = build_app(engine, make_parser().parse_args([str(tiny_llama_dir),
                                                          "--disable-log-stats"]))

        async def health() -> int:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return (await client.get("/health")).status_code

        assert asyncio.run(health()) == 200
        (worker,) = worker_pids(os.getpid())
        os.kill(worker, signal.SIGKILL)
        _wait_for(lambda: not engine.is_alive, "the engine loop to stop")
        assert asyncio.run(health()) == 503
        assert len(died) == 1 and "rank 1" in str(died[0])
    finally:
        engine.shutdown()
    assert worker_pids(os.getpid()) == []


@pytest.fixture(autouse=True)
def _no_workers_left() -> Any:
    yield
    assert worker_pids(os.getpid()) == []
