"""Sleep mode, vLLM's ``enable_sleep_mode``: ``LLM.sleep(level)`` / ``wake_up(tags)`` and the
server's ``/sleep``, ``/wake_up``, ``/is_sleeping``, on SmolLM2 (float32).

The server's routes are vLLM's development ones (VLLM_SERVER_DEV_MODE=1), with
``POST /collective_rpc`` (a worker method, or one of ``--worker-extension-cls``) and
``/reset_prefix_cache``, so a level-2 sleep can reload its weights over HTTP; with --api-key
they need the key.

What is checked: the process's resident memory falls by the KV cache (level 1: the weights
are in host memory already and stay) and by the weights too (level 2); requests while asleep
are refused (the server: 503); after wake-up the greedy tokens and logprobs equal those from
before the sleep (level 2: once ``reload_weights`` loaded the checkpoint again; the weights
are zeros before); waking by tag; the refusals (no enable_sleep_mode, a bad level or tag,
requests running, asleep twice, level 2 on a quantized model).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from server_utils import RemoteServer
from weight_sync import greedy_logprobs

from ironlm import LLM, SamplingParams
from ironlm.engine.sleep_calls import EngineSleepingError

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=0)
KV_BYTES = 256 << 20
ARGS: dict[str, Any] = {"dtype": "float32", "max_model_len": 256, "kv_cache_memory": KV_BYTES,
                        "max_num_seqs": 4, "swap_space": 1}  # swap: freed, woken uncommitted
MIB = 1 << 20


def resident() -> int:
    """This process's resident memory, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def outputs(llm: LLM) -> list[tuple[list[int], list[float]]]:
    return greedy_logprobs(llm, PROMPTS, GREEDY)


def weight_sum(model: torch.nn.Module) -> float:
    """For ``apply_model``: the absolute sum of the model's strided parameters."""
    return float(sum(p.detach().float().abs().sum() for p in model.parameters()
                     if p.layout == torch.strided))


@pytest.fixture(scope="module")
def llm(smollm2_dir: Path) -> Iterator[LLM]:
    engine = LLM(str(smollm2_dir), enable_sleep_mode=True, **ARGS)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def before(llm: LLM) -> list[tuple[list[int], list[float]]]:
    return outputs(llm)


def test_level1_frees_the_kv_cache_and_wakes_with_the_same_outputs(
    llm: LLM, before: list[tuple[list[int], list[float]]]
) -> None:
    awake = resident()
    llm.sleep(level=1)
    asleep = resident()
    assert llm.llm_engine.is_sleeping()
    assert awake - asleep > 0.8 * KV_BYTES, (awake / MIB, asleep / MIB)
    with pytest.raises(EngineSleepingError, match="call wake_up"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.sleep(1)  # asleep already: nothing happens (vLLM's)
    with pytest.raises(ValueError, match="weights are asleep"):  # offloaded, on a device
        llm.apply_model(weight_sum)
    llm.wake_up()
    assert not llm.llm_engine.is_sleeping()
    assert outputs(llm) == before


def test_level2_discards_the_weights_until_reloaded(
    llm: LLM, before: list[tuple[list[int], list[float]]]
) -> None:
    awake = resident()
    weight_bytes = sum(p.numel() * p.element_size()  # oneDNN's opaque layout is not freed
                       for p in llm.llm_engine.executor.worker.get_model().parameters()
                       if p.layout == torch.strided)
    llm.sleep(level=2)
    asleep = resident()
    for call in (lambda: llm.apply_model(weight_sum), lambda: llm.collective_rpc("reload_weights")):
        with pytest.raises(ValueError, match="weights are asleep"):  # empty storages
            call()
    assert awake - asleep > 0.8 * (KV_BYTES + weight_bytes), (awake / MIB, asleep / MIB)
    llm.wake_up(tags=["weights"])  # vLLM's order: weights first, load, then the cache
    assert llm.llm_engine.is_sleeping()  # the KV cache still sleeps
    with pytest.raises(EngineSleepingError):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.apply_model(weight_sum) == [0.0]
    llm.collective_rpc("reload_weights")
    llm.wake_up(tags=["kv_cache"])
    assert not llm.llm_engine.is_sleeping()
    assert outputs(llm) == before


def test_refusals(llm: LLM, tiny_llama_dir: Path) -> None:
    with pytest.raises(ValueError, match="sleep level must be 1 or 2, got 3"):
        llm.sleep(3)
    with pytest.raises(ValueError, match=r"unknown tags \['cache'\]"):
        llm.wake_up(["cache"])
    llm.llm_engine.add_request("running", PROMPTS[0], GREEDY)
    with pytest.raises(ValueError, match="requests are running"):
        llm.sleep(1)
    llm.abort("running")
    assert not llm.llm_engine.is_sleeping()
    plain = LLM(str(tiny_llama_dir), **ARGS)
    with pytest.raises(ValueError, match="sleep mode is not enabled"):
        plain.sleep()
    plain.shutdown()
    quantized = LLM(str(tiny_llama_dir), quantization="weight_only_int8",
                    enable_sleep_mode=True, **{**ARGS, "dtype": "auto"})
    with pytest.raises(ValueError, match="'weight_only_int8' cannot load new ones; use level 1"):
        quantized.sleep(2)
    assert not quantized.llm_engine.is_sleeping()
    quantized.sleep(1)  # the KV cache only
    quantized.wake_up()
    quantized.shutdown()


@pytest.fixture(scope="module")
def server(smollm2_dir: Path) -> Iterator[RemoteServer]:
    args = ["--max-model-len", "256", "--kv-cache-memory", "64MiB", "--dtype", "float32",
            "--served-model-name", "s", "--enable-sleep-mode",
            "--worker-extension-cls", "weight_sync.WeightSyncExtension"]
    with RemoteServer(smollm2_dir, args, env={"VLLM_SERVER_DEV_MODE": "1"},
                      api_key="sleepy") as srv:
        yield srv


def test_server_sleep_routes(server: RemoteServer) -> None:
    client = server.openai_client()
    http = httpx.Client(base_url=server.base_url, timeout=60, headers=server.headers())
    # longer than a KV block (16 tokens): a prefix computed with zero weights would be cached
    prompt = "Write one sentence about the history of the city of Paris, its river and bridges:"

    def complete() -> str:
        r = client.completions.create(model="s", prompt=prompt, max_tokens=8, temperature=0)
        return r.choices[0].text

    # the development routes need the key, where vLLM's do not
    assert httpx.post(server.url("/sleep"), timeout=30).status_code == 401

    first = complete()
    assert http.get("/is_sleeping").json() == {"is_sleeping": False}
    assert http.post("/sleep", params={"level": "2"}).status_code == 200
    assert http.get("/is_sleeping").json() == {"is_sleeping": True}
    assert http.get("/health").status_code == 200  # asleep, not dead
    with pytest.raises(openai.APIStatusError) as err:
        complete()
    assert err.value.status_code == 503 and "wake_up" in str(err.value)
    stream = http.post("/v1/completions", json={"model": "s", "prompt": "Hi", "stream": True})
    assert stream.status_code == 503
    assert stream.json()["error"]["code"] == "sleeping"
    bad = http.post("/wake_up", params={"tags": "cache"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tags"
    assert http.post("/wake_up", params={"tags": "weights"}).status_code == 200
    assert http.get("/is_sleeping").json() == {"is_sleeping": True}
    assert http.post("/wake_up").status_code == 200
    assert http.get("/is_sleeping").json() == {"is_sleeping": False}
    assert complete() != first  # level 2 left zeros
    # VLLM_SERVER_DEV_MODE=1: /collective_rpc, a worker method and an extension's
    rpc = http.post("/collective_rpc", json={"method": "reload_weights"})
    assert rpc.status_code == 200 and rpc.json() == {"results": [None]}, rpc.text
    assert http.post("/reset_prefix_cache").status_code == 200
    assert complete() == first
    rpc = http.post("/collective_rpc", json={"method": "rank_and_world"})
    assert rpc.json() == {"results": ["(0, 1)"]}  # not JSON-shaped: str, as vLLM's
    for body, param in (({"method": "nope"}, "method"), ({}, "method"),
                        ({"method": "update_weight", "args": ["x"]}, "args"),
                        ({"method": "reload_weights", "args": {}}, "args"),
                        ({"method": "reload_weights", "timeout": 5}, "timeout")):
        r = http.post("/collective_rpc", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert http.post("/sleep", params={"level": "1"}).status_code == 200
    assert http.post("/wake_up").status_code == 200
    assert complete() == first
    for level in ("3", "x"):
        r = http.post("/sleep", params={"level": level})
        assert r.status_code == 400 and r.json()["error"]["param"] == "level", r.text


def test_server_without_dev_mode_has_no_sleep_or_rpc_routes(smollm2_dir: Path) -> None:
    args = ["--max-model-len", "256", "--kv-cache-memory", "32MiB", "--dtype", "float32",
            "--enable-sleep-mode"]  # vLLM's: the routes need VLLM_SERVER_DEV_MODE=1 too
    with RemoteServer(smollm2_dir, args) as srv:
        assert httpx.post(srv.url("/sleep"), timeout=30).status_code == 404
        rpc = httpx.post(srv.url("/collective_rpc"), json={"method": "reload_weights"},
                         timeout=30)
        assert rpc.status_code == 404  # only with VLLM_SERVER_DEV_MODE=1
