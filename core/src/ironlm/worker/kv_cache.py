"""KV cache of one worker: how many blocks fit the budget, and the per-layer tensors.

The budget is decided once, here, from the engine config: ``num_kv_blocks`` (exact), else
``kv_cache_memory`` bytes (each rank's), else the platform's default (cpu: 4 GiB like vLLM's
VLLM_CPU_KVCACHE_SPACE, at most a quarter of RAM shared by the ranks; devices:
``gpu_memory_utilization`` of the device's memory minus what is already used).
"""

from __future__ import annotations

import torch

from ironlm.config import EngineConfig
from ironlm.interfaces.attention import AttentionBackend, AttentionLayerSpec
from ironlm.interfaces.platform import Platform

CPU_DEFAULT_KV_BYTES = 4 * 1024**3  # like vLLM's VLLM_CPU_KVCACHE_SPACE default


class KVCache:
    def __init__(
        self,
        config: EngineConfig,
        platform: Platform,
        attention: AttentionBackend,
        layers: list[AttentionLayerSpec],  # this rank's attention layers
        model_dtype: torch.dtype,
        device: torch.device,
        device_index: int,
    ) -> None:
        self.config = config
        self.platform = platform
        self.attention = attention
        self.layers = layers
        self.dtype = attention.cache_dtype(model_dtype)
        self.device = device
        self.device_index = device_index
        self.tensors: list[torch.Tensor] = []  # one per layer, kv_cache_shape(...)

    def bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        bs = self.config.block_size
        return sum(2 * bs * spec.num_kv_heads * spec.head_dim * elem for spec in self.layers)

    def budget_bytes(self) -> int:
        cfg = self.config
        if cfg.kv_cache_memory is not None:
            return cfg.kv_cache_memory
        if self.platform.device_type == "cpu":
            # every rank allocates its own: the ranks of one machine share its quarter of RAM
            # (six ranks of 4 GiB killed a 24 GiB host's workers)
            _, total = self.platform.memory_info()
            return min(CPU_DEFAULT_KV_BYTES, total // (4 * cfg.world_size))
        self.platform.synchronize()
        free, total = self.platform.memory_info(self.device_index)
        return int(total * cfg.gpu_memory_utilization) - (total - free)

    def num_blocks_that_fit(self, extra_bytes_per_block: int = 0) -> int:
        """Blocks the budget holds; ``extra_bytes_per_block``: another cache laid out in the
        same blocks (a draft model's) shares the budget."""
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        budget = self.budget_bytes()
        per_block = self.bytes_per_block() + extra_bytes_per_block
        num_kv_blocks = budget // per_block if self.layers else 0
        if num_kv_blocks < 1:
            raise ValueError(
                f"no memory left for the KV cache (budget {budget} bytes); lower the model "
                "size or raise kv_cache_memory / gpu_memory_utilization"
            )
        return int(num_kv_blocks)

    def num_swap_blocks(self) -> int:
        """Blocks of this rank's layers that fit ``swap_space`` GiB of host memory."""
        if not self.layers or self.config.swap_space <= 0:
            return 0
        return int(self.config.swap_space * 1024**3) // self.bytes_per_block()

    def allocate_swap(self, num_blocks: int) -> list[torch.Tensor]:
        """The host swap space: one tensor per layer, the device cache's shape and dtype with
        ``num_blocks`` blocks, in host memory. ``torch.empty``: pages are committed only when
        a preemption first writes them."""
        return [
            torch.empty(
                self.attention.kv_cache_shape(
                    num_blocks, self.config.block_size, spec.num_kv_heads, spec.head_dim
                ),
                dtype=self.dtype,
                device="cpu",
            )
            for spec in self.layers
        ] if num_blocks > 0 else []

    def allocate(self, num_kv_blocks: int) -> list[torch.Tensor]:
        """Every layer's cache, zero-filled, once, at the size asked for."""
        self.tensors = [
            torch.zeros(
                self.attention.kv_cache_shape(
                    num_kv_blocks, self.config.block_size, spec.num_kv_heads, spec.head_dim
                ),
                dtype=self.dtype,
                device=self.device,
            )
            for spec in self.layers
        ]
        return self.tensors
