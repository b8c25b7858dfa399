"""The worker's side of KV transfer (vLLM's ``--kv-transfer-config``; the engine's side is
``ironlm.engine.kv_transfer``), mixed into ``Worker`` and reached through ``collective_rpc``.

The engine sends (KV block id, block key) pairs; this rank stores or loads its part of each
block under ``<key>.r<rank>``: one host tensor per attention layer, the attention backend's
cache layout with one block, copied with the backend's own ``swap_blocks`` (the same copy that
swap preemption makes), so any backend's layout travels as it is.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from ironlm.interfaces.kv_connector import KVConnector, KVTransferConfig

if TYPE_CHECKING:
    from ironlm.config import EngineConfig
    from ironlm.interfaces.platform import Platform
    from ironlm.plugin_manager import PluginManager
    from ironlm.worker.kv_cache import KVCache
    from ironlm.worker.model_runner import ModelRunner

log = logging.getLogger("ironlm.worker")


def build_kv_connector(plugins: PluginManager, config: KVTransferConfig) -> KVConnector:
    """The connector kv_transfer_config names, built (engine and workers alike)."""
    assert config.kv_connector is not None  # KVTransferConfig checks it
    cls = plugins.select_kv_connector(config.kv_connector, config.kv_connector_module_path)
    return cls(config)


def rank_key(key: str, rank: int) -> str:
    """The store key of one rank's part of the block ``key``."""
    return f"{key}.r{rank}"


class KVTransferCalls:
    config: EngineConfig
    rank: int
    kv_connector: KVConnector | None
    model_runner: ModelRunner  # the worker's properties
    kv_cache: KVCache
    platform: Platform

    def kv_transfer_layout(self) -> str:
        """What this rank's blocks hold, for the engine's keys: engines whose layouts differ
        (backend, cache dtype, block size, heads, parallel layout) never read each other's."""
        kv = self.kv_cache
        bs = self.config.block_size
        shapes = [(s.layer_index, kv.attention.kv_cache_shape(1, bs, s.num_kv_heads, s.head_dim))
                  for s in kv.layers]
        return (f"rank {self.rank} of tp {self.config.tensor_parallel_size} x pp "
                f"{self.config.pipeline_parallel_size}: {kv.attention.name} {kv.dtype} {shapes}")

    def _one_block(self) -> list[torch.Tensor]:
        """Host tensors of one block, one per attention layer (the cache layout)."""
        kv = self.kv_cache
        return kv.allocate_swap(1) if kv.layers else []

    def save_kv_blocks(self, saves: list[tuple[int, str]]) -> int:
        """Store this rank's part of each (block id, key) the store does not hold yet; the
        number stored. A failing store is logged, not raised: the request goes on."""
        connector = self._connector()
        runner = self.model_runner
        stored = 0
        for block_id, key in saves:
            name = rank_key(key, self.rank)
            try:
                if connector.contains(name):
                    continue
                tensors = self._one_block()
                for cache, host in zip(runner.kv_caches, tensors):
                    runner.attention.swap_blocks(cache, host, [block_id], [0])
                self.platform.synchronize()  # a device's copies are done before the store reads
                connector.put(name, tensors)
                stored += 1
            except Exception as exc:  # the store's failure: the engine goes on
                log.warning("KV connector %s: storing block %s failed: %s: %s",
                            connector.name, name, type(exc).__name__, exc)
        return stored

    def load_kv_blocks(self, loads: list[tuple[int, str]]) -> list[int]:
        """Copy each (block id, key) from the store into that KV block; the block ids that
        could not be loaded (missing, unreadable, or of another layout)."""
        connector = self._connector()
        runner = self.model_runner
        expected = self._one_block()
        failed = []
        for block_id, key in loads:
            name = rank_key(key, self.rank)
            try:
                tensors = connector.get(name)
                _check_block(tensors, expected)
                for host, cache in zip(tensors, runner.kv_caches):
                    runner.attention.swap_blocks(host, cache, [0], [block_id])
            except Exception as exc:  # any failure is the block's: the engine decides
                log.warning("KV connector %s: loading block %s failed: %s: %s",
                            connector.name, name, type(exc).__name__, exc)
                failed.append(block_id)
        return failed

    def _connector(self) -> KVConnector:
        if self.kv_connector is None:
            raise RuntimeError("this engine has no kv_transfer_config")
        return self.kv_connector


def _check_block(tensors: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    """ValueError unless ``tensors`` has ``expected``'s count, shapes and dtypes."""
    if len(tensors) != len(expected):
        raise ValueError(f"{len(tensors)} layers stored, this rank has {len(expected)}")
    for i, (got, want) in enumerate(zip(tensors, expected)):
        if got.shape != want.shape or got.dtype != want.dtype:
            raise ValueError(f"layer {i}: stored {tuple(got.shape)} {got.dtype}, the cache "
                             f"holds {tuple(want.shape)} {want.dtype}")
