"""AscendLayerOps: the core's LayerOps on NPUs, with the w8a8 layout on torch_npu's int8 ops.

w8a8 (``ironlm.interfaces.quant``): int8 weights with per-channel scales, activations quantized
per token at run time. On an NPU that is two documented torch_npu operators:
  xq, sx = npu_dynamic_quant(x)                    sx = max |x| / 127 per row, xq = round(x / sx)
  y = npu_quant_matmul(xq, qweight.t(), scale, pertoken_scale=sx, output_dtype=x.dtype)
    = (xq @ qweight.t()) * scale * sx              (int32 sums, then the two rescales)
which is the reference's formula. npu_dynamic_quant takes float16 / bfloat16 activations only
(the platform's default dtypes). Other layouts have no NPU kernel here: ``quantized_support``
says so and the method is refused at start-up.
"""

from __future__ import annotations

from types import ModuleType

import torch

from ironlm.interfaces.platform import Availability, LayerOps
from ironlm.interfaces.quant import W8A8, QuantLayout
from ironlm_ascend.npu_ops import import_torch_npu, torch_npu_availability

W8A8_OPS = ("npu_dynamic_quant", "npu_quant_matmul")
ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)


class AscendLayerOps(LayerOps):
    def __init__(self) -> None:
        self._npu: ModuleType | None = None  # torch_npu, resolved on first use

    def quantized_support(self, layout: QuantLayout) -> Availability:
        if layout.kind != W8A8:
            return Availability.no(
                f"ironlm-ascend has no NPU kernel for {layout.describe()} weights (it runs the "
                "w8a8 layout, through torch_npu.npu_dynamic_quant + npu_quant_matmul)"
            )
        status = torch_npu_availability(W8A8_OPS)
        if not status.available:
            return status
        return Availability.yes(f"{status.reason}: npu_dynamic_quant + npu_quant_matmul")

    def pack_quantized(
        self, layout: QuantLayout, tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        if layout.kind != W8A8:
            raise ValueError(f"ironlm-ascend cannot run {layout.describe()} weights")
        return {
            "qweight": tensors["qweight"].to(torch.int8).contiguous(),  # (n, k)
            "scale": tensors["scale"].to(torch.float32).reshape(-1).contiguous(),  # (n,)
        }

    def quantized_linear(
        self, layout: QuantLayout, x: torch.Tensor, packed: dict[str, torch.Tensor],
        bias: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        if layout.kind != W8A8:
            raise ValueError(f"ironlm-ascend cannot run {layout.describe()} weights")
        if x.dtype not in ACTIVATION_DTYPES:
            raise ValueError(
                f"w8a8 on the npu computes in float16 or bfloat16 (npu_dynamic_quant's input "
                f"dtypes); got activations in {x.dtype}: run the model with dtype float16 or "
                "bfloat16"
            )
        npu = self._torch_npu()
        xq, sx = npu.npu_dynamic_quant(x)  # (T, K) int8, (T,) float32
        # x2 as the transpose of the (n, k) weight, as the npu_quant_matmul doc's examples pass
        # it; a float32 scale is what a float16 output with pertoken_scale requires
        out = npu.npu_quant_matmul(
            xq, packed["qweight"].t(), packed["scale"], pertoken_scale=sx, output_dtype=x.dtype
        )
        return out if bias is None else out + bias.to(out.dtype)

    def _torch_npu(self) -> ModuleType:
        if self._npu is None:
            self._npu = import_torch_npu()
        return self._npu
