"""The cpu platform's layer ops: float32 linears on panel-packed weights (``linear_kernel``),
quantized linears and embeddings on packed int8 / int4 / fp8 / GGUF weights (``quant_kernels``),
RMSNorm, rotary, the gated MLP activations and row lookups as single C calls
(``fused_kernels``).

Weights the kernel cannot take (not float32, output size not a multiple of 16) stay row-major
and use the core's torch reference; so do quantized layouts without a C kernel (say so in
``quantized_support``), inputs the fused ops do not fit, and everything when the C code cannot
be built here.
"""

from __future__ import annotations

import torch

from ironlm.interfaces.platform import Availability, LayerOps
from ironlm.interfaces.quant import QuantLayout
from ironlm_cpu.cbuild import KernelLibrary
from ironlm_cpu.fused_kernels import FusedKernels
from ironlm_cpu.linear_kernel import PANEL, PackedLinearKernel
from ironlm_cpu.quant_kernels import QuantKernels
from ironlm_cpu.quant_packing import fits, is_packed, kernel_format, pack


class CpuLayerOps(LayerOps):
    def __init__(
        self, kernel: PackedLinearKernel | None = None, fused: FusedKernels | None = None,
        quant: QuantKernels | None = None,
    ) -> None:  # fmt: skip
        self.kernel = kernel if kernel is not None else PackedLinearKernel()
        self.fused = fused if fused is not None else FusedKernels()
        self.quant = quant if quant is not None else QuantKernels()

    def libraries(self) -> list[KernelLibrary]:
        """The C libraries these ops call (what a decode-graph capture records)."""
        return [lib for lib in (self.kernel, self.fused, self.quant) if lib.available]

    # -- quantized weights --------------------------------------------------------------------
    def quantized_support(self, layout: QuantLayout) -> Availability:
        fmt, why = kernel_format(layout)
        if not self.quant.available:
            return Availability.yes(f"pure-torch reference ({self.quant.reason})")
        if fmt is None:
            return Availability.yes(f"pure-torch reference: {why}")
        return Availability.yes(f"C kernel {fmt.name} ({self.quant.isa})")

    def pack_quantized(
        self, layout: QuantLayout, tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        fmt, _ = kernel_format(layout)
        if fmt is None or not self.quant.available or not fits(fmt, tensors):
            return tensors  # the reference reads the canonical tensors
        return pack(fmt, layout, tensors)

    def quantized_linear(
        self, layout: QuantLayout, x: torch.Tensor, packed: dict[str, torch.Tensor],
        bias: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        if is_packed(packed):
            fmt, _ = kernel_format(layout)
            assert fmt is not None
            return self.quant.linear(fmt, x, packed, layout.group_size or 0, bias)
        return super().quantized_linear(layout, x, packed, bias)

    def quantized_embedding(
        self, layout: QuantLayout, ids: torch.Tensor, packed: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        if is_packed(packed):
            fmt, _ = kernel_format(layout)
            assert fmt is not None
            return self.quant.rows(fmt, ids, packed, layout.group_size or 0)
        return super().quantized_embedding(layout, ids, packed)

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.fused.rms_norm_fits(x, residual):
            return self.fused.rms_norm(x, weight, eps, residual)
        return super().rms_norm(x, weight, eps, residual)

    def rotary(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused.rotary_fits(q, k, cos):
            return self.fused.rotary(q, k, cos, sin)
        return super().rotary(q, k, cos, sin)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.fused.gated_act_fits(gate_up):
            return self.fused.gated_act(gate_up, gelu=False)
        return super().silu_and_mul(gate_up)

    def gelu_tanh_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.fused.gated_act_fits(gate_up):
            return self.fused.gated_act(gate_up, gelu=True)
        return super().gelu_tanh_and_mul(gate_up)

    def pack_linear_weight(self, weight: torch.Tensor) -> torch.Tensor:
        if self.kernel.available and self.kernel.can_pack(weight):
            return self.kernel.pack(weight)  # (out / 16, in, 16)
        return weight

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if weight.dim() == 3:
            return self.kernel(x, weight, bias)
        return super().linear(x, weight, bias)

    def embedding(self, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.fused.gather_fits(ids, weight):
            return self.fused.gather_rows(ids, weight)  # (T, hidden), packed or row-major
        if weight.dim() == 3:
            # row v of the (vocab, hidden) matrix is column v % 16 of panel v // 16
            return weight[ids // PANEL, :, ids % PANEL]  # (T, hidden)
        return super().embedding(ids, weight)
