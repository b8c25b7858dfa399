"""The canonical quantized tensors (``ironlm.interfaces.quant``) repacked for the cpu plugin's C
kernels (``csrc/quant_*.c``), once at load.

A packed weight is a dict of the tensors the C code reads, ``w0`` .. ``w3`` (their meaning per
format is in the C sources' headers). What changes against the canonical layout, and why:
  int8, fp8        nothing but dtype/contiguity (scales float32 per row; a per-tensor fp8 scale
                   repeated per row)
  w8a8             panels of 8 rows with the weights of every 4 inputs side by side (one
                   broadcast activation quad advances 8 rows), plus the int32 row sums of q (the
                   VNNI path's offset); k must be a multiple of 4. Where the kernels run w8a8 on
                   AMX tiles (``amx_int8``), n % 16 == 0 and k % 64 == 0: panels of 16 rows,
                   (n / 16, k / 4, 64), whose 16 quads at a time are the tile unit's B operand
  int4             the nibbles of every 32 elements reordered so that low nibbles are elements
                   0..15 and high nibbles 16..31 (two masks and a shift unpack them in order)
  int8, fp8, int4  with n a multiple of 16: 16-row panels instead, (n / 16, k, 16) (int4: per
                   input pair, and per group each row's scale and scale * zero), for the
                   register-tiled kernels of quant_panel.c
  gguf             each row's blocks split into per-row arrays (the half-float scales of a row
                   contiguous, for 8-at-once conversion; Q4_K's 6-bit scales unpacked to bytes):
                   the same bytes as the file, plus 4 per Q4_K super-block
Layouts the kernels do not take (int4 groups that are not a multiple of 32, other GGML types)
and w8a8 weights with k % 4 != 0 stay canonical and run on the core's pure-torch reference.
"""

from __future__ import annotations

from enum import IntEnum

import torch

from ironlm.interfaces.quant import FP8, GGUF, INT4, INT8, W8A8, QuantLayout, unpack_int4


class Format(IntEnum):
    """The C kernels' weight formats (quant_common.h's FMT_* numbers)."""

    INT8 = 0
    W8A8 = 1
    INT4 = 2
    FP8 = 3
    Q4_0 = 4
    Q4_1 = 5
    Q8_0 = 6
    Q4_K = 7
    Q6_K = 8
    INT8P = 9  # INT8 / FP8 / INT4 on 16-row panels (output features a multiple of 16)
    FP8P = 10
    INT4P = 11
    W8A8P = 12  # W8A8 on 16-row panels (the AMX tile's B layout)


# GGMLQuantizationType value -> (format, elements per block, bytes per block)
GGML_FORMATS: dict[int, tuple[Format, int, int]] = {
    2: (Format.Q4_0, 32, 18),
    3: (Format.Q4_1, 32, 20),
    8: (Format.Q8_0, 32, 34),
    12: (Format.Q4_K, 256, 144),
    14: (Format.Q6_K, 256, 210),
}
# formats whose w0 holds two elements per byte
_NIBBLE_FORMATS = (Format.INT4, Format.Q4_0, Format.Q4_1, Format.Q4_K, Format.Q6_K, Format.INT4P)
# row formats with a 16-row panel variant
_PANELS = {Format.INT8: Format.INT8P, Format.FP8: Format.FP8P, Format.INT4: Format.INT4P}


def kernel_format(layout: QuantLayout) -> tuple[Format | None, str]:
    """The C format that runs ``layout``, or None with the reason it stays on the reference."""
    if layout.kind == INT8:
        return Format.INT8, ""
    if layout.kind == W8A8:
        return Format.W8A8, ""
    if layout.kind == FP8:
        return Format.FP8, ""
    if layout.kind == INT4:
        assert layout.group_size is not None
        if layout.group_size % 32 != 0:
            return None, f"int4 group size {layout.group_size} is not a multiple of 32"
        return Format.INT4, ""
    if layout.kind == GGUF and layout.ggml_type in GGML_FORMATS:
        return GGML_FORMATS[layout.ggml_type][0], ""
    names = "Q4_0, Q4_1, Q8_0, Q4_K, Q6_K"
    return None, f"no cpu kernel for {layout.describe()} (kernels: {names})"


def is_packed(tensors: dict[str, torch.Tensor]) -> bool:
    """Whether ``tensors`` is a ``pack`` result (else: canonical tensors for the reference)."""
    return "w0" in tensors


def packed_format(layout_format: Format, packed: dict[str, torch.Tensor]) -> Format:
    """The format a ``pack`` result is in: the layout's, or its 16-row panel variant."""
    if layout_format in _PANELS and packed["w0"].dim() == 3:
        return _PANELS[layout_format]
    if layout_format == Format.W8A8 and packed["w0"].dim() == 3:
        return Format.W8A8P
    return layout_format


def features(fmt: Format, packed: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(output features n, input features k) of a packed weight (``fmt``: packed_format's)."""
    w0 = packed["w0"]
    if fmt == Format.W8A8:  # panels of 8 rows, n padded
        return packed["w1"].shape[0], w0.shape[1] // 8
    if fmt == Format.W8A8P:  # (n / 16, k / 4, 64)
        return packed["w1"].shape[0], w0.shape[1] * 4
    if fmt in (Format.INT8P, Format.FP8P, Format.INT4P):  # (n / 16, k or k / 2, 16)
        return w0.shape[0] * 16, w0.shape[1] * (2 if fmt == Format.INT4P else 1)
    return w0.shape[0], w0.shape[1] * (2 if fmt in _NIBBLE_FORMATS else 1)


def fits(fmt: Format, tensors: dict[str, torch.Tensor]) -> bool:
    """Whether the kernels take this weight's shape: w8a8 panels need k % 4 == 0 (others run
    the reference)."""
    return fmt != Format.W8A8 or tensors["qweight"].shape[1] % 4 == 0


def pack(
    fmt: Format, layout: QuantLayout, tensors: dict[str, torch.Tensor], amx_int8: bool = False
) -> dict[str, torch.Tensor]:
    """Canonical tensors of ``layout`` -> the dict of ``w0`` .. ``w3`` the C kernels read.
    ``amx_int8``: the kernels run w8a8 on AMX tiles here (``QuantKernels.amx_int8``)."""
    q = tensors["qweight"]
    panel = q.shape[0] % 16 == 0
    if fmt in (Format.INT8, Format.FP8):
        data = q.contiguous().view(torch.int8 if fmt == Format.INT8 else torch.uint8)
        if panel:  # (n / 16, k, 16): per input, the panel's 16 rows
            n, k = data.shape
            data = data.reshape(n // 16, 16, k).transpose(1, 2).contiguous()
        return {"w0": data, "w1": _row_scale(tensors["scale"], q.shape[0])}
    if fmt == Format.W8A8:
        n, k = q.shape
        rows = 16 if amx_int8 and n % 16 == 0 and k % 64 == 0 else 8
        return _pack_w8a8(q.to(torch.int8), _row_scale(tensors["scale"], n), rows)
    if fmt == Format.INT4:
        return _pack_int4_panels(layout, tensors) if panel else _pack_int4(layout, tensors)
    return _pack_gguf(fmt, layout, q)


def _pack_w8a8(q: torch.Tensor, scale: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    """(n, k) int8 -> panels of ``rows`` rows, per panel and quad of inputs the rows' 4
    weights side by side (n padded with zero rows): 8 rows (n8 / 8, k / 4, 8, 4) flattened to
    (n8 / 8, k * 8); 16 rows (n / 16, k / 4, 16, 4) kept as (n / 16, k / 4, 64)."""
    n, k = q.shape
    n_pad = -(-n // rows) * rows
    padded = torch.zeros(n_pad, k, dtype=torch.int8)
    padded[:n] = q
    panels = padded.reshape(n_pad // rows, rows, k // 4, 4).permute(0, 2, 1, 3)
    panels = panels.reshape(n_pad // 8, k * 8) if rows == 8 else panels.reshape(n // 16, k // 4, 64)
    return {
        "w0": panels.contiguous(), "w1": scale,
        "w2": q.sum(dim=1, dtype=torch.int32),  # (n,) the VNNI path's offset term
    }  # fmt: skip


def _row_scale(scale: torch.Tensor, n: int) -> torch.Tensor:
    """(n,) float32 per-row scales from a per-row or per-tensor (0-dim / single) scale."""
    s = scale.to(torch.float32).reshape(-1)
    return (s.expand(n) if s.numel() == 1 else s).contiguous()


def _pack_int4(layout: QuantLayout, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    values = unpack_int4(tensors["qweight"])  # (n, k) 0..15
    n, k = values.shape
    blocks = values.reshape(n, k // 32, 2, 16)  # halves of every 32 elements
    packed = {
        "w0": (blocks[:, :, 0, :] | (blocks[:, :, 1, :] << 4)).reshape(n, k // 2).contiguous(),
        "w1": tensors["scale"].to(torch.float32).contiguous(),  # (n, k / group)
    }
    if layout.zero_points:
        packed["w2"] = tensors["zero"].to(torch.uint8).contiguous()  # (n, k / group)
    return packed


def _pack_int4_panels(layout: QuantLayout, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """(n / 16, k / 2, 16) bytes (per input pair, the panel's 16 rows: low nibble the even
    input), and per group the rows' scale and scale * zero, (n / 16, k / g, 16) float32."""
    values = unpack_int4(tensors["qweight"])  # (n, k) 0..15
    n, k = values.shape
    pairs = values.reshape(n, k // 2, 2)
    rows = (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)  # (n, k / 2)
    scale = tensors["scale"].to(torch.float32)  # (n, k / g)
    zero = tensors["zero"].to(torch.float32) if layout.zero_points else torch.full_like(scale, 8.0)

    def panels(t: torch.Tensor) -> torch.Tensor:  # (n, c) -> (n / 16, c, 16)
        return t.reshape(n // 16, 16, t.shape[1]).transpose(1, 2).contiguous()

    return {"w0": panels(rows), "w1": panels(scale), "w2": panels(scale * zero)}


def _halves(field: torch.Tensor) -> torch.Tensor:
    """(n, blocks, 2) bytes of little-endian half floats -> (n, blocks) float16."""
    return field.contiguous().view(torch.float16).reshape(field.shape[0], field.shape[1])


def _pack_gguf(fmt: Format, layout: QuantLayout, raw: torch.Tensor) -> dict[str, torch.Tensor]:
    assert layout.ggml_type is not None
    _, elements, size = GGML_FORMATS[layout.ggml_type]
    n, row_bytes = raw.shape
    if row_bytes % size != 0:
        raise ValueError(
            f"{layout.describe()} rows of {row_bytes} bytes are not whole {size}-byte blocks"
        )
    b = raw.to(torch.uint8).reshape(n, row_bytes // size, size)  # (n, blocks, block bytes)

    def flat(field: torch.Tensor) -> torch.Tensor:
        return field.contiguous().reshape(n, -1)

    if fmt == Format.Q4_0:
        return {"w0": flat(b[:, :, 2:]), "w1": _halves(b[:, :, 0:2])}
    if fmt == Format.Q4_1:
        return {"w0": flat(b[:, :, 4:]), "w1": _halves(b[:, :, 0:2]), "w2": _halves(b[:, :, 2:4])}
    if fmt == Format.Q8_0:
        return {"w0": flat(b[:, :, 2:]).view(torch.int8), "w1": _halves(b[:, :, 0:2])}
    if fmt == Format.Q4_K:
        s = b[:, :, 4:16].to(torch.int32)  # 12 bytes: the 6-bit scales and mins of 8 sub-blocks
        lo_sc, lo_mn, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
        sc = torch.cat((lo_sc & 63, (hi & 15) | ((lo_sc >> 6) << 4)), dim=-1)
        mn = torch.cat((lo_mn & 63, (hi >> 4) | ((lo_mn >> 6) << 4)), dim=-1)
        return {
            "w0": flat(b[:, :, 16:]), "w1": _halves(b[:, :, 0:2]), "w2": _halves(b[:, :, 2:4]),
            "w3": flat(torch.cat((sc, mn), dim=-1).to(torch.uint8)),
        }  # fmt: skip
    assert fmt == Format.Q6_K, fmt
    return {
        "w0": flat(b[:, :, 0:128]), "w2": flat(b[:, :, 128:192]),
        "w3": flat(b[:, :, 192:208]).view(torch.int8), "w1": _halves(b[:, :, 208:210]),
    }  # fmt: skip
