"""KV transfer (vLLM's ``--kv-transfer-config``): engines share the KV of prompt blocks through a
store they can all reach, so a prefill instance computes a prompt and a decode instance (or any
later engine) loads its KV instead of computing it again (disaggregated prefill).

The core does the paging: it names each full block of a prompt by a chained content hash (the
block's tokens, every block before it, the model and the KV layout), asks the store which of a
new request's blocks it holds, copies those into the request's KV blocks before the step that
needs them, and hands the store each prompt block a step completes. A ``KVConnector`` plugin
is only the store: ``contains`` / ``put`` / ``get`` of one block of one rank, the tensors of
every attention layer that rank holds, in its attention backend's cache layout
(``kv_cache_shape`` with one block). Registered through ``register_kv_connectors``; selected by
``kv_connector`` (or, vLLM's way, a class ``kv_connector`` in ``kv_connector_module_path``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import torch

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
LOAD_FAILURE_POLICIES = ("fail", "recompute")


@dataclass
class KVTransferConfig:
    """vLLM's KVTransferConfig: its fields, names and defaults (offline
    ``LLM(..., kv_transfer_config=KVTransferConfig(...))`` or a dict; the server's
    ``--kv-transfer-config JSON``)."""

    kv_connector: str | None = None  # the connector's registered name
    # kv_producer saves the prompts it computes, kv_consumer loads, kv_both does both
    kv_role: str | None = None
    # what to do when a block the store listed cannot be loaded: fail the request (vLLM's
    # default), or compute the request's prompt instead
    kv_load_failure_policy: str = "fail"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    # vLLM's: a module holding a class named kv_connector (a connector no plugin registers)
    kv_connector_module_path: str | None = None
    # vLLM's fields for network connectors, kept for a connector that reads them
    engine_id: str | None = None
    kv_buffer_device: str = "cuda"
    kv_buffer_size: float = 1e9
    kv_rank: int | None = None
    kv_parallel_size: int = 1
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    enable_permute_local_kv: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.kv_connector, str) or not self.kv_connector:
            raise ValueError(f"kv_transfer_config needs kv_connector, a connector's name; got "
                             f"{self.kv_connector!r}")
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_transfer_config kv_role must be one of {list(KV_ROLES)} when "
                             f"kv_connector is set; got {self.kv_role!r}")
        if self.kv_load_failure_policy not in LOAD_FAILURE_POLICIES:
            raise ValueError(f"kv_transfer_config kv_load_failure_policy must be one of "
                             f"{list(LOAD_FAILURE_POLICIES)}; got "
                             f"{self.kv_load_failure_policy!r}")
        if not isinstance(self.kv_connector_extra_config, dict):
            raise ValueError("kv_transfer_config kv_connector_extra_config must be a JSON "
                             f"object; got {self.kv_connector_extra_config!r}")

    @classmethod
    def of(cls, value: KVTransferConfig | dict[str, Any]) -> KVTransferConfig:
        """The config from a dict (a JSON flag); ValueError naming unknown keys."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"kv_transfer_config must be a JSON object, got {value!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"kv_transfer_config keys {unknown} are not known; vLLM's keys: "
                             f"{sorted(known)}")
        return cls(**value)

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        """vLLM's accessor of ``kv_connector_extra_config``."""
        return self.kv_connector_extra_config.get(key, default)

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")


class KVConnector(ABC):
    """A store of KV blocks shared by engines.

    Built as ``Connector(config)`` in the engine process (``contains``, to plan loads) and in
    every worker (``contains`` / ``put`` / ``get`` of that rank's part). A key names one block
    of one rank (hex digits, dots and dashes; the core makes it); the same key always means
    the same contents, so a ``put`` of a key already stored may be skipped. Methods may be
    called from the engine thread and the workers at once: a ``put`` must become visible
    whole (``contains`` true only once ``get`` can read every tensor).
    """

    name: ClassVar[str]

    def __init__(self, config: KVTransferConfig) -> None:
        self.config = config

    @abstractmethod
    def contains(self, key: str) -> bool:
        """Whether the store holds the block ``key``."""

    @abstractmethod
    def put(self, key: str, tensors: list[torch.Tensor]) -> None:
        """Store one block: one host tensor per attention layer of the rank, in layer order
        (each of the backend's ``kv_cache_shape`` with one block, in the cache dtype)."""

    @abstractmethod
    def get(self, key: str) -> list[torch.Tensor]:
        """The tensors ``put`` stored under ``key``, in order. Raises (any exception, naming
        what failed) when the block is gone or unreadable: the core then applies the
        config's ``kv_load_failure_policy``."""
