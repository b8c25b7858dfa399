"""Quantized linear layers and embeddings in C: int8 weight-only, w8a8, int4 group-wise, fp8, and
the GGUF block formats Q4_0, Q4_1, Q8_0, Q4_K, Q6_K kept quantized.

Why: decoding reads every weight once per token, so its speed is the bytes of weight read; an
int8 weight is a quarter of a float32 one and a 4-bit one about an eighth. The kernels stream
the packed weight once per call (``quant_packing`` lays it out at load) and compute from it in
registers, never materialising a float weight.

How (``csrc/``, one translation unit built by ``cbuild``):
  - float-activation formats (int8, int4, fp8): weights converted to float in registers and
    multiplied with FMAs; int4's zero points and fp8's rescaling are folded out of the loop.
  - w8a8: activations quantized per token exactly as the core's reference does, exact int32 dot
    products (AVX2 int16 madd; VNNI vpdpbusd where the build targets it; AMX tdpbssd where
    the build targets AMX and the process may use the tiles, on 16-row panels),
    the reference's double-precision rescale: same result as the reference up to float
    rounding of the output.
  - GGUF: activations quantized to int8 blocks (32 elements, or 256 for the K-quants) as
    llama.cpp does for these formats; u8 x s8 integer dot products per block (maddubs/madd,
    or vpdpbusd), scaled once per block. This differs from the float reference by the
    activations' rounding (about 0.4% of a dot's magnitude, as in llama.cpp).
Each call splits its work over torch's OpenMP threads (``quant_entry.c``). Every call goes
through ``KernelLibrary.call``, so decode graphs record and replay quantized models too.
"""

from __future__ import annotations

import ctypes
from importlib import resources

import torch

from ironlm_cpu.amx_tiles_src import AMX_TILES_SOURCE
from ironlm_cpu.cbuild import KernelLibrary, Signature
from ironlm_cpu.quant_packing import Format, features, packed_format

# C sources, concatenated in this order into one translation unit
SOURCES = (
    "quant_common.h", "quant_int8.c", "quant_w8a8.c", "quant_panel.c", "quant_int4.c",
    "quant_gguf.c", "quant_entry.c",
)
WEIGHT_TENSORS = ("w0", "w1", "w2", "w3")


_P, _I32, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
SIGNATURES: dict[str, Signature] = {
    # (fmt, x, ldx, m, n, k, group, w0, w1, w2, w3, bias, y, threads) -> 0 / error code
    "ironlm_quant_linear": ([_I32, _P, _I64, _I32, _I32, _I32, _I32] + [_P] * 6 + [_I32], _I32),
    # (fmt, ids, t, n, k, group, w0, w1, w2, w3, out) -> ids out of range
    "ironlm_quant_rows": ([_I32, _P, _I32, _I32, _I32, _I32] + [_P] * 5, _I32),
    "ironlm_quant_isa": ([], ctypes.c_char_p),
    "ironlm_quant_amx_int8": ([], _I32),
}


def quant_source() -> str:
    folder = resources.files("ironlm_cpu").joinpath("csrc")
    texts = [folder.joinpath(name).read_text() for name in SOURCES]
    return "\n".join(texts[:1] + [AMX_TILES_SOURCE] + texts[1:])  # the tiles after the header


class QuantKernels(KernelLibrary):
    """Loads (building if needed) the quantized kernels; ``available`` / ``reason`` say whether
    they run here, ``isa`` which instruction-set path the build compiled."""

    def __init__(self) -> None:
        super().__init__("cpu_quant", quant_source(), SIGNATURES, "quantized linear kernels")
        self.isa = "" if self.lib is None else self.lib.ironlm_quant_isa().decode()

    def amx_int8(self) -> bool:
        """Whether w8a8 runs on AMX tiles here (an AMX build, and the process may use the
        tiles): its weights then go on 16-row panels (``quant_packing.pack``)."""
        return self.lib is not None and bool(self.lib.ironlm_quant_amx_int8())

    def linear(
        self,
        fmt: Format,
        x: torch.Tensor,  # (T, K), any float dtype
        packed: dict[str, torch.Tensor],  # from quant_packing.pack
        group: int,  # int4: the group size (0 otherwise)
        bias: torch.Tensor | None,  # (N,)
    ) -> torch.Tensor:  # (T, N) in x.dtype
        assert self.lib is not None, self.reason
        fmt = packed_format(fmt, packed)
        n, k = features(fmt, packed)
        xf = x if x.dtype == torch.float32 else x.float()
        if xf.dim() != 2 or xf.shape[1] != k:
            raise ValueError(f"quantized linear: input {tuple(x.shape)} does not match K={k}")
        if xf.stride(1) != 1:
            xf = xf.contiguous()
        m = xf.shape[0]
        y = torch.empty(m, n, dtype=torch.float32)
        if m > 0:
            b = None if bias is None else bias.to(torch.float32).contiguous()
            rc = self.call(
                self.lib.ironlm_quant_linear, int(fmt), xf.data_ptr(), xf.stride(0), m, n, k,
                group, *self._pointers(packed), None if b is None else b.data_ptr(),
                y.data_ptr(), torch.get_num_threads(),
            )  # fmt: skip
            if rc != 0:
                raise MemoryError(f"quantized linear ({fmt.name}): scratch allocation failed")
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def rows(
        self, fmt: Format, ids: torch.Tensor, packed: dict[str, torch.Tensor], group: int
    ) -> torch.Tensor:  # (T, K) float32
        """Rows ``ids`` of the packed (N, K) weight as float32 (quantized embeddings)."""
        assert self.lib is not None, self.reason
        fmt = packed_format(fmt, packed)
        n, k = features(fmt, packed)
        flat = ids.reshape(-1)
        if flat.dtype != torch.int64 or not flat.is_contiguous():
            flat = flat.to(torch.int64).contiguous()
        out = torch.empty(flat.shape[0], k, dtype=torch.float32)
        bad = self.call(
            self.lib.ironlm_quant_rows, int(fmt), flat.data_ptr(), flat.shape[0], n, k, group,
            *self._pointers(packed), out.data_ptr(),
        )  # fmt: skip
        if bad:
            raise IndexError(f"{bad} token id(s) outside the table's [0, {n}) rows")
        return out

    @staticmethod
    def _pointers(packed: dict[str, torch.Tensor]) -> list[int | None]:
        return [packed[name].data_ptr() if name in packed else None for name in WEIGHT_TENSORS]
