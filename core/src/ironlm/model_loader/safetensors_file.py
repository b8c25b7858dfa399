"""Read safetensors files tensor by tensor with plain reads, not a memory map.

Why: ``safetensors.safe_open`` maps the whole file; every tensor copied out of it leaves its
pages mapped (and counted in the process's resident memory) until the file is closed, so a
loader that copies weights into the model holds the checkpoint twice at its peak. Reading each
tensor into its own buffer (``readinto``) keeps one checkpoint tensor at a time besides the
model: SmolLM2's peak RSS at load drops by about the checkpoint's size (538 MB).

Format (the public safetensors spec): 8 bytes little-endian header length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the
data; offsets count from the first byte after the header.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import torch

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip


def read_header(path: Path) -> tuple[int, dict[str, dict]]:
    """(offset of the data section, {tensor name: entry}) of one file."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return 8 + size, header


def iter_safetensors_file(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in file order; each tensor is a fresh CPU buffer read from the file."""
    start, header = read_header(path)
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    with open(path, "rb", buffering=0) as f:
        for name, entry in entries:
            dtype = _DTYPES.get(entry["dtype"])
            if dtype is None:
                raise ValueError(f"{path.name}: tensor {name!r} has unsupported dtype {entry['dtype']}")
            begin, end = entry["data_offsets"]
            tensor = torch.empty(entry["shape"], dtype=dtype)
            nbytes = tensor.numel() * tensor.element_size()
            if end - begin != nbytes:
                raise ValueError(f"{path.name}: tensor {name!r} spans {end - begin} bytes, "
                                 f"its shape and dtype need {nbytes}")  # fmt: skip
            f.seek(start + begin)
            view = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
            got = 0
            while got < nbytes:  # readinto may return short counts
                n = f.readinto(view[got:])
                if not n:
                    raise ValueError(f"{path.name}: file ends inside tensor {name!r}")
                got += n
            yield name, tensor
