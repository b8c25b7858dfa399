"""Reading a float HF folder one tensor at a time, and writing the quantized folder.

The output is written into a temporary folder next to ``OUT`` and renamed into place at the end,
so ``OUT`` is never half-written: it either does not exist or holds the whole checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import safe_open
from safetensors.torch import save_file

SHARD_BYTES = 2 << 30  # start a new safetensors shard beyond this
# files of the input folder that are not copied (weights and the config are rewritten)
_SKIPPED_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
_SKIPPED_NAMES = ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")


class FloatCheckpoint:
    """The safetensors tensors of an HF folder, read on demand (memory-mapped files)."""

    def __init__(self, folder: Path) -> None:
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted({folder / name for name in weight_map.values()})
        else:
            files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ValueError(f"{folder} holds no safetensors weights (ironlm quantize reads them)")
        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where: dict[str, Any] = {}
        for handle in self._handles:
            for name in handle.keys():
                self._where[name] = handle

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        """The tensor as float32 (a copy)."""
        if name not in self._where:
            raise ValueError(f"the checkpoint has no tensor {name!r}")
        return self._where[name].get_tensor(name).float()


class ShardedWriter:
    """Collects output tensors and writes them as safetensors shards (with an index when
    there is more than one) into ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._shards: list[dict[str, torch.Tensor] | Path] = []
        self._weight_map: dict[str, int] = {}
        self._count = 0

    def add(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, tensor in tensors.items():
            self._pending[name] = tensor.contiguous()
            self._pending_bytes += tensor.numel() * tensor.element_size()
        if self._pending_bytes >= SHARD_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        self._count += 1
        path = self.folder / f"part-{self._count:05d}.safetensors"
        save_file(self._pending, str(path), metadata={"format": "pt"})
        for name in self._pending:
            self._weight_map[name] = self._count
        self._pending, self._pending_bytes = {}, 0

    def finish(self) -> None:
        """Name the shards as HF does (model.safetensors, or model-0000i-of-0000n with an
        index)."""
        self._flush()
        total = self._count
        names = {
            i: "model.safetensors" if total == 1 else f"model-{i:05d}-of-{total:05d}.safetensors"
            for i in range(1, total + 1)
        }
        for i, name in names.items():
            os.replace(self.folder / f"part-{i:05d}.safetensors", self.folder / name)
        if total > 1:
            index = {
                "metadata": {},
                "weight_map": {t: names[i] for t, i in sorted(self._weight_map.items())},
            }
            (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


@contextlib.contextmanager
def atomic_folder(out: Path) -> Iterator[Path]:
    """A temporary folder beside ``out`` that becomes ``out`` when the block succeeds and is
    removed when it fails."""
    if out.exists():
        raise ValueError(f"output folder {out} already exists; remove it or choose another")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield tmp
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def copy_side_files(src: Path, dst: Path) -> None:
    """Tokenizer, chat template, generation config, ...: every file but weights and config."""
    for path in src.iterdir():
        if not path.is_file() or path.name in _SKIPPED_NAMES or path.suffix in _SKIPPED_SUFFIXES:
            continue
        shutil.copy2(path, dst / path.name)
