"""The cpu default KV budget: vLLM's 4 GiB a rank, at most a quarter of RAM shared by the
ranks of the machine (each rank allocates its own cache)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ironlm.config import EngineConfig
from ironlm.worker.kv_cache import CPU_DEFAULT_KV_BYTES, KVCache

GIB = 1024**3


@pytest.mark.parametrize(("ram_gib", "tp", "pp", "want"), [
    (64, 1, 1, CPU_DEFAULT_KV_BYTES),  # 4 GiB: vLLM's default
    (8, 1, 1, 2 * GIB),  # a quarter of RAM
    (24, 3, 2, GIB),  # six ranks share 6 GiB (4 GiB each had the workers killed)
])
def test_cpu_default_budget_is_shared_by_the_ranks(ram_gib: int, tp: int, pp: int,
                                                   want: int) -> None:
    config = EngineConfig(model="m", tensor_parallel_size=tp, pipeline_parallel_size=pp)
    platform = SimpleNamespace(device_type="cpu", memory_info=lambda *a: (0, ram_gib * GIB))
    attention = SimpleNamespace(cache_dtype=lambda d: d)
    cache = KVCache(config, platform, attention, [], torch.float32,  # type: ignore[arg-type]
                    torch.device("cpu"), 0)
    assert cache.budget_bytes() == want
    config.kv_cache_memory = 5 * GIB  # given: each rank's, as vLLM's VLLM_CPU_KVCACHE_SPACE
    assert cache.budget_bytes() == 5 * GIB
