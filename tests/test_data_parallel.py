"""Data parallelism (vLLM's ``-dp N``, internal load balancing): flags and refusals, the
stats merge, the futures gather, a two-engine group on the tiny model in this process (the
same greedy outputs as one engine, requests spread over both engines, each engine's worker in
a child process on its share of the cores, calls on every engine), and ``ironlm serve -dp 2``
with SmolLM2 through the openai client: one engine's greedy text (streaming included), summed
metrics, an adapter loaded and unloaded on every engine, the dev routes, requests pinned to an
engine by vLLM's X-data-parallel-rank header, a /sleep refused by one busy engine leaving the
other awake, and a killed worker of one engine ending the server
with no process left behind. (The ``ray`` backend: test_parallel_ray.py.)"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from concurrent.futures import CancelledError, Future
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from lora_adapters import MAX_TOKENS as LORA_MAX_TOKENS
from lora_adapters import PROMPTS as LORA_PROMPTS
from parallel_utils import (
    ENGINE_ARGS,
    MAX_TOKENS,
    PROMPTS,
    alive,
    assert_server_exited_after_worker_death,
    greedy_outputs,
    running_requests,
    worker_facts,
    worker_pids,
)
from server_utils import RemoteServer

from ironlm import LLM, SamplingParams
from ironlm.config import EngineConfig
from ironlm.engine.data_parallel import DataParallelEngine, merge_stats
from ironlm.engine.futures import gather
from ironlm.engine.iteration_tokens import IterationTokens
from ironlm.engine.speculation import SpecDecodeStats
from ironlm.entrypoints.openai.api_server import make_engine_client
from ironlm.entrypoints.openai.cli_args import engine_config_from_args, make_parser
from ironlm.plugin_manager import PluginManager

SERVE_ARGS = ["--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "32MiB",
              "--enforce-eager"]


# -- flags and refusals ----------------------------------------------------------------------
def test_flags_config_and_refusals() -> None:
    parser = make_parser("ironlm serve")
    config = engine_config_from_args(parser.parse_args(["m", "-dp", "2"]))
    assert (config.data_parallel_size, config.data_parallel_backend) == (2, "mp")
    assert config.distributed_executor_backend == "mp"  # every engine's workers out of process
    config = engine_config_from_args(parser.parse_args(
        ["m", "--data-parallel-size", "3", "-dpb", "ray", "-tp", "2"]))
    assert (config.data_parallel_size, config.distributed_executor_backend) == (3, "ray")
    assert EngineConfig(model="m").distributed_executor_backend == "uni"
    with pytest.raises(SystemExit):  # set by the server for each engine, not a flag
        parser.parse_args(["m", "--data-parallel-rank", "1"])
    with pytest.raises(SystemExit):
        parser.parse_args(["m", "-dpb", "nccl"])
    with pytest.raises(ValueError, match="contradicts it"):
        EngineConfig(model="m", data_parallel_size=2, data_parallel_backend="ray",
                     distributed_executor_backend="mp")
    with pytest.raises(ValueError, match="distributed_executor_backend 'uni'"):
        EngineConfig(model="m", data_parallel_size=2, distributed_executor_backend="uni")
    with pytest.raises(ValueError, match="data_parallel_rank must be in"):
        EngineConfig(model="m", data_parallel_size=2, data_parallel_rank=2)
    with pytest.raises(ValueError, match="data_parallel_size must be at least 1"):
        EngineConfig(model="m", data_parallel_size=0)
    with pytest.raises(ValueError, match=r"ironlm serve MODEL -dp N"):
        LLM("no-such-model", data_parallel_size=2)  # refused before anything loads (vLLM's)


# -- the pieces ------------------------------------------------------------------------------
def test_gather_waits_for_every_call_and_raises_the_first_error() -> None:
    a, b, c = Future(), Future(), Future()
    out = gather([a, b, c])
    b.set_result(2)
    a.set_exception(ValueError("rank 0 refused"))
    assert not out.done()  # rank 2 is still in its call
    c.set_result(3)
    with pytest.raises(ValueError, match="rank 0 refused"):
        out.result(timeout=1)
    d, e = Future(), Future()
    out = gather([d, e])
    e.set_result("x")
    d.set_result("y")
    assert out.result(timeout=1) == ["y", "x"]  # in rank order
    f, g = Future(), Future()
    out = gather([f, g])
    assert g.set_running_or_notify_cancel()  # an engine thread took g
    assert out.cancel()  # the caller gave up: f, not started, is cancelled; g runs on
    assert f.cancelled() and not g.cancelled()
    g.set_result(1)
    with pytest.raises(CancelledError):
        out.result(timeout=1)
    assert gather([]).result(timeout=1) == []


def _stats(running: int, used: int, blocks: int, queries: int, tokens: list[int],
           spec: tuple[int, int, int, int], loras: list[str]) -> dict[str, Any]:
    hist = IterationTokens()
    for n in tokens:
        hist.observe(n)
    drafts, drafted, accepted, emitted = spec
    return {
        "num_running": running, "num_waiting": 1, "kv_usage": used / blocks,
        "num_kv_blocks": blocks, "num_used_blocks": used, "prefix_cache_queries": queries,
        "prefix_cache_hits": queries // 2, "num_preemptions": 1, "num_swap_outs": 0,
        "num_swapped": 0, "swap_usage": 0.0, "num_swap_blocks": 0, "time": 10.0 + running,
        "iteration_tokens": hist.to_dict(),
        **SpecDecodeStats(drafts, drafted, accepted, emitted, 0.5, 1.5).to_dict(),
        "max_lora": 2, "running_lora_adapters": loras, "waiting_lora_adapters": [],
    }


def test_merge_stats_sums_engines_and_derives_rates_again() -> None:
    one = _stats(3, 10, 100, 40, [1, 64], (4, 12, 6, 10), ["pirate"])
    two = _stats(5, 50, 100, 60, [2000], (2, 6, 6, 8), ["french", "pirate"])
    merged = merge_stats([one, two])
    assert merged["num_running"] == 8 and merged["num_waiting"] == 2
    assert merged["num_kv_blocks"] == 200 and merged["kv_usage"] == pytest.approx(0.3)
    assert (merged["prefix_cache_queries"], merged["prefix_cache_hits"]) == (100, 50)
    assert merged["num_preemptions"] == 2 and merged["time"] == 15.0
    assert merged["iteration_tokens"]["count"] == 3
    assert merged["iteration_tokens"]["sum"] == 2065
    assert merged["iteration_tokens"]["buckets"][0] == [1, 1]  # one step of one token
    assert merged["iteration_tokens"]["buckets"][-1][1] == 3  # +Inf: every step
    # (6 + 6) / (12 + 6) drafts kept, (10 + 8) / (4 + 2) tokens per verification
    assert merged["spec_decode_draft_acceptance_rate"] == pytest.approx(12 / 18)
    assert merged["spec_decode_mean_accepted_length"] == pytest.approx(3.0)
    assert merged["spec_decode_draft_time_seconds"] == pytest.approx(1.0)
    assert merged["running_lora_adapters"] == ["french", "pirate"]
    assert merge_stats([one]) is one


# -- a two-engine group in this process --------------------------------------------------------
def test_two_engines_match_one_and_share_the_requests(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), **ENGINE_ARGS)
    try:
        expected = greedy_outputs(llm)[0] * 2
    finally:
        llm.shutdown()
    config = EngineConfig(model=str(tiny_llama_dir), data_parallel_size=2, **ENGINE_ARGS)
    group = make_engine_client(config, PluginManager(), 16, lambda exc: None)
    assert isinstance(group, DataParallelEngine)
    group.start()
    pids: list[int] = []
    try:
        facts = group.call_all(lambda e: e.executor.collective_rpc(worker_facts)).result(60)
        pids = [pid for (pid, *_), in facts]
        assert len(set(pids)) == 2 and os.getpid() not in pids  # rank 0 in a child, each
        assert [local for (_, local, _, _), in facts] == [0, 1]  # devices after engine 0's
        cores = len(os.sched_getaffinity(0))
        for (_, _, sharing, threads), in facts:  # the machine's cores split over 2 ranks
            assert sharing == 2 and threads == max(1, cores // 2)
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

        async def one(i: int, prompt: str) -> list[int]:
            last = None
            async for out in group.generate(f"req-{i}", prompt, params):
                last = out
            assert last is not None and last.finished
            return list(last.outputs[0].token_ids)

        async def burst() -> list[list[int]]:
            return await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS * 2)))

        assert asyncio.run(burst()) == expected
        per_engine = [r.engine.stats()["prefix_cache_queries"] for r in group.ranks]
        tokens = [len(llm_prompt) for llm_prompt in
                  group.engine.tokenizer(PROMPTS * 2)["input_ids"]]
        assert sum(per_engine) == sum(tokens)
        assert all(q > 0 for q in per_engine), per_engine  # both engines took requests
        assert group.num_in_flight == 0
        assert merge_stats(group.call_all(lambda e: e.stats()).result(10))[
            "prefix_cache_queries"] == sum(tokens)
    finally:
        group.shutdown()
    assert not any(alive(p) for p in pids)


# -- ironlm serve -dp 2 ---------------------------------------------------------------------
def _prefix_queries(server: RemoteServer) -> float:
    text = httpx.get(server.url("/metrics"), timeout=30).text
    line = next(x for x in text.splitlines() if x.startswith("vllm:prefix_cache_queries_total"))
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.server
@pytest.mark.real_model
def test_dp2_server_matches_one_engine(smollm2_dir: Path, smollm2_loras: Any) -> None:
    llm = LLM(str(smollm2_dir), **ENGINE_ARGS)
    try:
        expected = greedy_outputs(llm)[1]
        prompt_tokens = sum(len(ids) for ids in llm.get_tokenizer()(PROMPTS)["input_ids"])
    finally:
        llm.shutdown()
    model = str(smollm2_dir)
    args = [*SERVE_ARGS, "-dp", "2", "--enable-lora", "--enable-sleep-mode",
            "--enable-prompt-tokens-details"]
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}
    with RemoteServer(smollm2_dir, args, env=env) as server:
        assert len(worker_pids(server.proc.pid)) == 2  # one per engine; none in the server
        client = server.openai_client()
        batch = client.completions.create(model=model, prompt=PROMPTS, max_tokens=MAX_TOKENS,
                                          temperature=0, extra_body={"ignore_eos": True})
        assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == expected
        # the four prompts went to the two engines; the metric sums both engines' lookups
        assert _prefix_queries(server) == prompt_tokens
        stream = client.completions.create(model=model, prompt=PROMPTS[3], max_tokens=MAX_TOKENS,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        assert "".join(c.choices[0].text for c in stream) == expected[3]
        # an adapter loaded at run time is loaded on every engine: requests on both give
        # HF + peft's greedy text
        path = smollm2_loras.paths["pirate"]
        loaded = httpx.post(server.url("/v1/load_lora_adapter"), timeout=120,
                            json={"lora_name": "pirate", "lora_path": str(path)})
        assert loaded.status_code == 200, loaded.text
        adapted = client.completions.create(
            model="pirate", prompt=LORA_PROMPTS * 2, temperature=0, max_tokens=LORA_MAX_TOKENS,
            logprobs=0, extra_body={"return_tokens_as_token_ids": True})
        ids = [[int(t.split(":")[1]) for t in c.logprobs.tokens]
               for c in sorted(adapted.choices, key=lambda c: c.index)]
        assert ids == [smollm2_loras.reference[("pirate", i)] for i in (0, 1, 0, 1)]
        unloaded = httpx.post(server.url("/v1/unload_lora_adapter"), timeout=60,
                              json={"lora_name": "pirate"})
        assert unloaded.status_code == 200, unloaded.text
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="pirate", prompt=PROMPTS[0], max_tokens=2)
        rpc = httpx.post(server.url("/collective_rpc"), json={"method": "check_health"},
                         timeout=60)
        assert rpc.json() == {"results": [None, None]}  # one per worker: both engines'
        assert httpx.post(server.url("/reset_prefix_cache"), timeout=60).status_code == 200
        _pinned_requests(server, model)
        _sleep_with_one_engine_busy(server, client, model, expected)
        assert httpx.get(server.url("/health")).status_code == 200


def _pinned_requests(server: RemoteServer, model: str) -> None:
    """vLLM's X-data-parallel-rank header pins a request to an engine: each engine's prefix
    cache sees only its own requests (a prompt cached on engine 0 is new to engine 1)."""
    prompt = "A long prompt that fills a few KV blocks: " + " ".join(PROMPTS) * 2

    def cached(rank: str) -> int:
        r = httpx.post(server.url("/v1/completions"), timeout=60,
                       headers={"X-data-parallel-rank": rank},
                       json={"model": model, "prompt": prompt, "max_tokens": 1})
        assert r.status_code == 200, r.text
        return int((r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0))

    assert [cached("0"), cached("0") > 0, cached("1"), cached("1") > 0] == [0, True, 0, True]
    assert cached("a") > 0  # not an integer: ignored, as vLLM (the least loaded engine)
    bad = httpx.post(server.url("/v1/completions"), timeout=60,
                     headers={"X-data-parallel-rank": "2"},
                     json={"model": model, "prompt": prompt, "max_tokens": 1})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "X-data-parallel-rank"
    assert "out of range [0, 2)" in bad.json()["error"]["message"]


def _sleep_with_one_engine_busy(server: RemoteServer, client: Any, model: str,
                                expected: list[str]) -> None:
    """/sleep while one engine runs a request: 400, and the idle engine, which slept, wakes
    again (else the next requests it takes fail); once both are idle, both sleep and wake."""
    busy = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=200,
                                     stream=True, extra_body={"ignore_eos": True})
    next(iter(busy))  # running on one engine now
    refused = httpx.post(server.url("/sleep"), timeout=60)
    assert refused.status_code == 400, refused.text
    assert httpx.get(server.url("/is_sleeping")).json() == {"is_sleeping": False}
    busy.close()  # the server aborts it
    deadline = time.monotonic() + 60
    while running_requests(server) > 0:
        assert time.monotonic() < deadline, "the aborted request kept running"
        time.sleep(0.1)
    batch = client.completions.create(model=model, prompt=PROMPTS[:2], max_tokens=MAX_TOKENS,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == expected[:2]
    assert httpx.post(server.url("/sleep"), timeout=60).status_code == 200
    assert httpx.get(server.url("/is_sleeping")).json() == {"is_sleeping": True}
    assert httpx.post(server.url("/wake_up"), timeout=60).status_code == 200
    assert httpx.get(server.url("/is_sleeping")).json() == {"is_sleeping": False}
    again = client.completions.create(model=model, prompt=PROMPTS[:2], max_tokens=MAX_TOKENS,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert [c.text for c in sorted(again.choices, key=lambda c: c.index)] == expected[:2]


@pytest.mark.server
@pytest.mark.real_model
def test_dp2_killed_worker_fails_requests_and_exits_the_server(smollm2_dir: Path) -> None:
    server = RemoteServer(smollm2_dir, [*SERVE_ARGS, "-dp", "2"])
    try:
        workers = worker_pids(server.proc.pid)
        assert len(workers) == 2
        codes: list[int] = []

        def long_request() -> None:
            r = httpx.post(server.url("/v1/completions"), timeout=300, json={
                "model": str(smollm2_dir), "prompt": PROMPTS[0], "max_tokens": 240,
                "ignore_eos": True, "temperature": 0})
            codes.append(r.status_code)

        threads = [threading.Thread(target=long_request) for _ in range(2)]  # one per engine
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while running_requests(server) < 2:
            assert time.monotonic() < deadline, "the requests did not start"
            time.sleep(0.2)
        os.kill(workers[1], signal.SIGKILL)  # one engine's worker
        for t in threads:
            t.join(timeout=120)
        assert 500 in codes, codes  # the dead engine's request fails
        assert_server_exited_after_worker_death(server, workers)
    finally:
        server.close()
