"""TEST FAKE: pure-torch references of torch_npu's int8 quantization operators (see __init__).

Rounding: the docs give the formulas without a rounding mode; the fake rounds half to even
(torch.round) and saturates to the output type's range."""

from __future__ import annotations

import torch

_QUANT_OUT = {
    torch.qint8: (torch.int8, -128, 127),
    torch.quint8: (torch.uint8, 0, 255),
    torch.int32: (torch.int32, -(2**31), 2**31 - 1),
}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(f"[torch_npu test fake] {message}")


def _along(t: torch.Tensor, size: int, dims: int, axis: int) -> torch.Tensor:
    """A 1-D per-axis tensor (length ``size`` or 1) shaped to broadcast along ``axis``."""
    _require(t.dim() == 1 and t.shape[0] in (1, size), f"expected ({size},) or (1,), got {t.shape}")
    shape = [1] * dims
    shape[axis] = t.shape[0]
    return t.reshape(shape)


def npu_quantize(
    input: torch.Tensor,  # noqa: A002 - the documented parameter name
    scales: torch.Tensor,
    zero_points: torch.Tensor | None,
    dtype: torch.dtype,
    axis: int = 1,
    div_mode: bool = True,
) -> torch.Tensor:
    """Documented: torch_npu.npu_quantize(input, scales, zero_points, dtype, axis=1,
    div_mode=True) -> Tensor.  div_mode=True: input / scales + zero_points;
    div_mode=False: input * scales + zero_points, where axis > -2 means the last axis, -2 the
    second last, and zero_points must share the scales' shape and dtype. Output shape = input."""
    _require(input.dtype in (torch.float32, torch.float16, torch.bfloat16), "input dtype")
    if dtype not in _QUANT_OUT:
        raise NotImplementedError(f"[torch_npu test fake] npu_quantize dtype {dtype}")
    out_dtype, low, high = _QUANT_OUT[dtype]
    if div_mode:
        dim = axis % input.dim()
    else:
        _require(axis >= -2, "div_mode=False needs axis >= -2")
        _require(dtype == torch.qint8, "div_mode=False supports qint8 (quint4x2 not modelled)")
        _require(scales.dtype in (torch.float32, torch.float16, torch.bfloat16), "scales dtype")
        if zero_points is not None:
            _require(zero_points.dtype == scales.dtype, "zero_points dtype must equal scales'")
            _require(zero_points.shape == scales.shape, "zero_points shape must equal scales'")
        dim = input.dim() - 2 if axis == -2 else input.dim() - 1
    size, dims = input.shape[dim], input.dim()
    scale = _along(scales.float(), size, dims, dim)
    zero = 0.0 if zero_points is None else _along(zero_points.float(), size, dims, dim)
    value = input.float() / scale if div_mode else input.float() * scale
    return torch.round(value + zero).clamp(low, high).to(out_dtype)


def npu_dynamic_quant(
    x: torch.Tensor,
    *,
    smooth_scales: torch.Tensor | None = None,
    group_index: torch.Tensor | None = None,
    dst_type: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Documented: npu_dynamic_quant(Tensor x, *, Tensor? smooth_scales=None,
    Tensor? group_index=None, ScalarType? dst_type=None) -> (Tensor, Tensor).

    Per-token symmetric dynamic quantization: input = x (* smooth_scales),
    scale = row_max(abs(input)) / 127, y = round(input / scale); y int8 of x's shape, scale
    float32 of x's shape without the last dim. x float16/bfloat16 with more than one dim;
    smooth_scales 1-D over the last dim in x's dtype. Modelled: int8 output without group_index
    (MoE groups and quint4x2 output are not). All-zero rows are not covered by the documents:
    the fake returns scale 0 and zeros."""
    _require(x.dtype in (torch.float16, torch.bfloat16), "x dtype must be float16/bfloat16")
    _require(x.dim() > 1, "x must have more than one dim")
    if group_index is not None:
        raise NotImplementedError("[torch_npu test fake] npu_dynamic_quant group_index")
    if dst_type not in (None, torch.int8):
        raise NotImplementedError(f"[torch_npu test fake] npu_dynamic_quant dst_type {dst_type}")
    value = x.float()
    if smooth_scales is not None:
        _require(smooth_scales.dim() == 1 and smooth_scales.shape[0] == x.shape[-1],
                 "smooth_scales must be (x.shape[-1],)")
        _require(smooth_scales.dtype == x.dtype, "smooth_scales dtype must equal x's")
        value = value * smooth_scales.float()
    scale = value.abs().amax(dim=-1) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale)).unsqueeze(-1)
    y = torch.round(value / safe).clamp(-128, 127).to(torch.int8)
    return y, scale


def npu_quant_matmul(
    x1: torch.Tensor,
    x2: torch.Tensor,
    scale: torch.Tensor,
    *,
    offset: torch.Tensor | None = None,
    pertoken_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    output_dtype: torch.dtype | None = None,
    group_sizes: list[int] | None = None,
) -> torch.Tensor:
    """Documented: npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None,
    bias=None, output_dtype=None, group_sizes=None) -> Tensor.

    int32 or no bias: out = (x1 @ x2 + bias) * scale [* pertoken_scale] + offset;
    bfloat16/float32 bias: out = x1 @ x2 * scale [* pertoken_scale] + bias.
    Modelled: int8 x int8 with a float32/bfloat16 scale of shape (1,) or (n,) (int64 scales from
    npu_trans_quant_param, int4, group_sizes and int32 output are not)."""
    _require(x1.dtype == torch.int8 and x2.dtype == torch.int8, "x1/x2 must be int8 (int4 n/m)")
    _require(2 <= x1.dim() <= 6 and 2 <= x2.dim() <= 6, "x1/x2 must have 2..6 dims")
    k, n = x2.shape[-2], x2.shape[-1]
    _require(x1.shape[-1] == k, f"x1 (..., {x1.shape[-1]}) @ x2 ({k}, {n}) mismatch")
    _require(x1.shape[-1] <= 65535 and n <= 65535, "last dims must not exceed 65535")
    if scale.dtype == torch.int64 or group_sizes is not None:
        raise NotImplementedError("[torch_npu test fake] int64 scale / group_sizes")
    _require(scale.dtype in (torch.float32, torch.bfloat16), "scale dtype float32/bfloat16")
    _require(scale.dim() == 1 and scale.shape[0] in (1, n), "scale must be (1,) or (n,)")
    out_dtype = torch.int8 if output_dtype is None else output_dtype
    if out_dtype not in (torch.int8, torch.float16, torch.bfloat16):
        raise NotImplementedError(f"[torch_npu test fake] output_dtype {out_dtype}")
    float_bias = bias is not None and bias.dtype in (torch.bfloat16, torch.float32)
    if bias is not None:
        _require(bias.dtype == torch.int32 or float_bias, "bias dtype int32/bfloat16/float32")
        _require(bias.shape[-1] == n, "bias must be (n,) or (batch, 1, n)")
    if offset is not None:
        _require(out_dtype == torch.int8 and not float_bias, "offset only for int8 output")
        _require(offset.dtype == torch.float32, "offset dtype float32")
    if out_dtype == torch.float16 and pertoken_scale is None:
        _require(scale.dtype == torch.float32 and not float_bias, "fp16 output combination")
    if out_dtype == torch.float16 and pertoken_scale is not None:
        _require(scale.dtype == torch.float32, "fp16 output with pertoken_scale needs a float32 scale")
    if pertoken_scale is not None:
        _require(pertoken_scale.dtype == torch.float32, "pertoken_scale dtype float32")
        _require(pertoken_scale.shape == (x1.shape[-2],), "pertoken_scale must be (m,)")
    acc = x1.double() @ x2.double()  # exact for int8 products with k <= 65535
    if bias is not None and not float_bias:
        acc = acc + bias.double()
    acc = acc * scale.double()
    if pertoken_scale is not None:
        acc = acc * pertoken_scale.double().unsqueeze(-1)
    if float_bias:
        acc = acc + bias.double()
    if offset is not None:
        acc = acc + offset.double()
    if out_dtype == torch.int8:
        return torch.round(acc).clamp(-128, 127).to(torch.int8)
    return acc.to(out_dtype)
