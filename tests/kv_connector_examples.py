"""KV connectors written as a third party would (tests of test_kv_transfer.py; named by
``kv_connector_module_path: "kv_connector_examples"``, vLLM's way to a class no plugin
registers).

- ``UnreadableConnector``: the core's file store whose ``get`` always fails: every block it
  lists fails to load (the ``kv_load_failure_policy`` paths).
- ``SecondGetFailsConnector``: the file store whose every ``get`` after the first fails.
- ``MemoryConnector``: blocks in a dict the test hands in through ``kv_connector_extra_config``
  (``{"blocks": dict}``; only in one process): a store written with the interface alone.
"""

from __future__ import annotations

import torch
from ironlm.distributed.kv_store import ExampleConnector
from ironlm.interfaces.kv_connector import KVConnector, KVTransferConfig


class UnreadableConnector(ExampleConnector):
    name = "UnreadableConnector"

    def get(self, key: str) -> list[torch.Tensor]:
        raise OSError(f"block {key} is unreadable (test connector)")


class SecondGetFailsConnector(ExampleConnector):
    name = "SecondGetFailsConnector"

    def __init__(self, config: KVTransferConfig) -> None:
        super().__init__(config)
        self.gets = 0

    def get(self, key: str) -> list[torch.Tensor]:
        self.gets += 1
        if self.gets > 1:
            raise OSError(f"block {key} is unreadable (test connector, get {self.gets})")
        return super().get(key)


class MemoryConnector(KVConnector):
    name = "MemoryConnector"

    def __init__(self, config: KVTransferConfig) -> None:
        super().__init__(config)
        self.blocks: dict[str, list[torch.Tensor]] = config.kv_connector_extra_config["blocks"]

    def contains(self, key: str) -> bool:
        return key in self.blocks

    def put(self, key: str, tensors: list[torch.Tensor]) -> None:
        self.blocks[key] = [t.clone() for t in tensors]

    def get(self, key: str) -> list[torch.Tensor]:
        return self.blocks[key]
