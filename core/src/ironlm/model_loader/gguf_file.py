"""A lean GGUF reader: header, metadata and tensor directory parsed with ``struct`` over a
memory map, tensor data as zero-copy numpy views.

gguf-py's GGUFReader builds numpy views for every element of every metadata array (a 262k-entry
vocabulary costs minutes on a busy CPU); this reader walks the same layout in one pass and
decodes string arrays directly. Dequantisation stays with gguf-py (``gguf.dequantize``).

Layout (little endian, GGUF v2/v3): magic "GGUF", u32 version, u64 tensor count, u64 metadata
count; metadata entries (string key, u32 type, value); tensor infos (string name, u32 n_dims,
u64 dims innermost first, u32 ggml type, u64 offset); tensor data from the next multiple of
``general.alignment`` (default 32).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# metadata value type -> struct format of one scalar
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_NUMPY: dict[int, str] = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    ggml_type: int  # gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # numpy order (outermost first)
    offset: int  # absolute byte offset of the data in the file
    n_bytes: int


class GGUFFile:
    """Metadata (``metadata``: key -> value) and tensors (``tensors``) of one GGUF file."""

    def __init__(self, path: Path) -> None:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        self.path = Path(path)
        with open(self.path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        buf = self._map
        if buf[:4] != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        self.version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        pos = 24
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key, pos = _read_string(buf, pos)
            (value_type,) = struct.unpack_from("<I", buf, pos)
            self.metadata[key], pos = _read_value(buf, pos + 4, value_type)
        infos: list[tuple[str, int, tuple[int, ...], int]] = []
        for _ in range(n_tensors):
            name, pos = _read_string(buf, pos)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            pos += 4 + 8 * n_dims
            ggml_type, offset = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            infos.append((name, ggml_type, tuple(reversed(dims)), offset))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-pos // alignment) * alignment
        self.tensors: list[GGUFTensorInfo] = []
        for name, ggml_type, shape, offset in infos:
            block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
            n_bytes = int(np.prod(shape)) * type_size // block_size
            self.tensors.append(
                GGUFTensorInfo(name, ggml_type, shape, data_start + offset, n_bytes)
            )

    def type_names(self) -> list[str]:
        """The GGMLQuantizationType names of the file's tensors, sorted (e.g. ["F32", "Q4_1"])."""
        from gguf import GGMLQuantizationType

        return sorted({GGMLQuantizationType(t.ggml_type).name for t in self.tensors})

    def raw(self, info: GGUFTensorInfo) -> np.ndarray:
        """The tensor's stored data as gguf.dequantize expects it: plain float/int types in
        their numpy dtype and shape; quantized types as uint8 rows of packed blocks."""
        from gguf import GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape

        qtype = GGMLQuantizationType(info.ggml_type)
        plain = {
            GGMLQuantizationType.F32: np.float32,
            GGMLQuantizationType.F16: np.float16,
            GGMLQuantizationType.F64: np.float64,
            GGMLQuantizationType.I8: np.int8,
            GGMLQuantizationType.I16: np.int16,
            GGMLQuantizationType.I32: np.int32,
            GGMLQuantizationType.I64: np.int64,
        }
        if qtype in plain:
            dtype, shape = np.dtype(plain[qtype]), info.shape
        else:
            dtype, shape = np.dtype(np.uint8), quant_shape_to_byte_shape(info.shape, qtype)
        count = info.n_bytes // dtype.itemsize
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=info.offset).reshape(shape)


def _read_string(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buf, pos)
    start = pos + 8
    return buf[start : start + length].decode("utf-8", errors="replace"), start + length


def _read_value(buf: mmap.mmap, pos: int, value_type: int) -> tuple[Any, int]:
    if value_type == _STRING:
        return _read_string(buf, pos)
    if value_type in _SCALARS:
        fmt = _SCALARS[value_type]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if value_type == _ARRAY:
        item_type, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item_type in _NUMPY:  # numeric arrays in one read
            dtype = np.dtype(_NUMPY[item_type])
            values = np.frombuffer(buf, dtype=dtype, count=count, offset=pos).tolist()
            return values, pos + count * dtype.itemsize
        items = []
        for _ in range(count):
            item, pos = _read_value(buf, pos, item_type)
            items.append(item)
        return items, pos
    raise ValueError(f"unknown GGUF metadata type {value_type}")
