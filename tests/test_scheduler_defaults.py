"""Scheduler limits the user leaves unset (``max_num_batched_tokens``, ``max_num_seqs``) come
from the platform, per usage as in vLLM: the cpu platform gives the offline ``LLM`` 4096 tokens
and 256 sequences a step, the server 2048 and 128, times the ranks; the cuda platform vLLM's GPU
values by device memory and name; platforms that set none 2048 / 256.
The server side on the real model: tests/test_parallel_server.py (a 3-rank server's limit)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from ironlm import LLM, SamplingParams
from ironlm.config import EngineConfig
from ironlm.engine.llm_engine import LLMEngine
from ironlm.interfaces.platform import Platform
from ironlm_cpu.platform import CpuPlatform


def test_unset_limits_take_the_defaults_and_set_ones_stay() -> None:
    unset = EngineConfig(model="m").with_scheduler_limits(4096, 256, max_model_len=512)
    assert (unset.max_num_batched_tokens, unset.max_num_seqs) == (4096, 256)
    mine = EngineConfig(model="m", max_num_batched_tokens=64, max_num_seqs=3)
    mine = mine.with_scheduler_limits(4096, 256, max_model_len=512)
    assert (mine.max_num_batched_tokens, mine.max_num_seqs) == (64, 3)


def test_without_chunked_prefill_the_default_budget_holds_a_whole_prompt() -> None:
    config = EngineConfig(model="m", enable_chunked_prefill=False)
    assert config.with_scheduler_limits(2048, 256, 8192).max_num_batched_tokens == 8192
    assert config.with_scheduler_limits(2048, 256, 512).max_num_batched_tokens == 2048


def test_platform_defaults_per_usage_and_world_size() -> None:
    cpu = CpuPlatform()
    assert cpu.scheduler_defaults(serving=False, world_size=1) == (4096, 256)
    assert cpu.scheduler_defaults(serving=True, world_size=1) == (2048, 128)
    assert cpu.scheduler_defaults(serving=True, world_size=3) == (6144, 384)
    # the contract's default, for platforms that set none (npu)
    assert Platform.scheduler_defaults(cpu, serving=False, world_size=2) == (2048, 256)


@pytest.mark.parametrize(("memory_gib", "name", "serving", "limits"), [
    (80, "NVIDIA H100 80GB HBM3", False, (16384, 1024)),
    (80, "NVIDIA H100 80GB HBM3", True, (8192, 1024)),
    (141, "NVIDIA H200", True, (8192, 1024)),
    (80, "NVIDIA A100-SXM4-80GB", False, (8192, 256)),  # vLLM keeps the A100 on the smaller
    (80, "NVIDIA A100-SXM4-80GB", True, (2048, 256)),
    (24, "NVIDIA L4", False, (8192, 256)),
    (69.9, "NVIDIA H100 NVL", True, (2048, 256)),  # below vLLM's 70 GiB line
])
def test_cuda_takes_vllms_gpu_defaults_by_device_memory(
    memory_gib: float, name: str, serving: bool, limits: tuple[int, int]
) -> None:
    from ironlm_cuda.platform import batch_defaults

    assert batch_defaults(int(memory_gib * 2**30), name, serving) == limits


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_without_a_device_in_this_process_takes_the_smaller_defaults() -> None:
    from ironlm_cuda.platform import CudaPlatform

    assert CudaPlatform().scheduler_defaults(serving=True, world_size=1) == (2048, 256)
    assert CudaPlatform().scheduler_defaults(serving=False, world_size=4) == (8192, 256)


@pytest.mark.parametrize(("serving", "limits"), [(False, (4096, 256)), (True, (2048, 128))])
def test_the_engine_resolves_the_limits_before_its_workers_start(
    tiny_llama_dir: Path, serving: bool, limits: tuple[int, int]
) -> None:
    config = EngineConfig(model=str(tiny_llama_dir), device="cpu", max_model_len=256,
                          kv_cache_memory=8 << 20, enforce_eager=True)
    engine = LLMEngine(config, serving=serving)
    try:
        assert (engine.config.max_num_batched_tokens, engine.config.max_num_seqs) == limits
        assert (engine.scheduler.max_num_batched_tokens, engine.scheduler.max_num_seqs) == limits
    finally:
        engine.shutdown()


@pytest.mark.real_model
def test_offline_llm_prefills_4096_tokens_in_one_step(smollm2_dir: Path) -> None:
    # 40 prompts of 64 tokens (2560; their KV 118 MB in float32): one step at the offline
    # default, two at 2048
    llm = LLM(str(smollm2_dir), dtype="float32", max_model_len=256, kv_cache_memory=160 << 20,
              enforce_eager=True)
    try:
        engine = llm.engine
        assert engine.config.max_num_batched_tokens == 4096
        rng = random.Random(0)
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        for i in range(40):
            engine.add_request(str(i), {"prompt_token_ids": [rng.randrange(1000, 20000)
                                                             for _ in range(64)]}, params)
        first = engine.step()
        assert len(first) == 40
        assert all(len(o.outputs[0].token_ids) == 1 for o in first)
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        llm.shutdown()


def test_a_budget_below_max_model_len_without_chunked_prefill_is_refused_first(
    tiny_llama_dir: Path,
) -> None:
    # one KV block would be refused too, once the workers measured the cache: the budget's
    # error comes before any worker starts
    config = EngineConfig(model=str(tiny_llama_dir), device="cpu", max_model_len=256,
                          enable_chunked_prefill=False, max_num_batched_tokens=64,
                          num_kv_blocks=1, enforce_eager=True)
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(64\) is smaller"):
        LLMEngine(config)
