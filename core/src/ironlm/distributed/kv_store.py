"""The core's KV connector: vLLM's ``ExampleConnector`` (before late 2025
``SharedStorageConnector``), blocks kept as files in a folder that every engine can read (a
local disk for engines on one machine, a shared volume for pods).

``--kv-transfer-config '{"kv_connector": "ExampleConnector", "kv_role": "kv_both",
"kv_connector_extra_config": {"shared_storage_path": "local_storage"}}'``: one safetensors file
per block and rank, ``<path>/<key[:2]>/<key>.safetensors`` (tensors ``layer.0`` ...). A file is
written under a temporary name and renamed, so a reader sees a block whole or not at all. The
folder only grows: clear it when the model or the engines' settings change for good (keys of
another model or layout are never read, but they take room).
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ironlm.interfaces.kv_connector import KVConnector, KVTransferConfig

_KEY = re.compile(r"[0-9A-Za-z][0-9A-Za-z.\-]*")  # the core's keys: no path separators


class ExampleConnector(KVConnector):
    name = "ExampleConnector"

    def __init__(self, config: KVTransferConfig) -> None:
        super().__init__(config)
        # vLLM's key and default
        self.root = Path(config.get_from_extra_config("shared_storage_path", "/tmp"))

    def _path(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"KV block key {key!r} is not a file name")
        return self.root / key[:2] / f"{key}.safetensors"

    def contains(self, key: str) -> bool:
        return self._path(key).is_file()

    def put(self, key: str, tensors: list[torch.Tensor]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # several ranks and engines (pods, where process ids repeat) may write at once: each
        # under its own temporary name
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            save_file({f"layer.{i}": t.contiguous() for i, t in enumerate(tensors)}, str(tmp))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def get(self, key: str) -> list[torch.Tensor]:
        tensors = load_file(str(self._path(key)))
        return [tensors[f"layer.{i}"] for i in range(len(tensors))]


class SharedStorageConnector(ExampleConnector):
    """The same connector under vLLM's older name."""

    name = "SharedStorageConnector"
