"""The cpu platform's layer ops: float32 linears on panel-packed weights (``linear_kernel``),
RMSNorm, rotary, the gated MLP activations and row lookups as single C calls
(``fused_kernels``), the segmented LoRA matmul of mixed-adapter batches (``lora_kernel``).

Weights the kernel cannot take (not float32, output size not a multiple of 16) stay row-major
and use the core's torch reference; so do inputs the fused ops do not fit, and everything when
the C code cannot be built here.
"""

from __future__ import annotations

import torch

from ironlm.interfaces.platform import LayerOps
from ironlm_cpu.cbuild import KernelLibrary
from ironlm_cpu.fused_kernels import FusedKernels
from ironlm_cpu.linear_kernel import PANEL, PackedLinearKernel
from ironlm_cpu.lora_kernel import LoRAKernel


class CpuLayerOps(LayerOps):
    def __init__(
        self,
        kernel: PackedLinearKernel | None = None,
        fused: FusedKernels | None = None,
        lora: LoRAKernel | None = None,
    ) -> None:
        self.kernel = kernel if kernel is not None else PackedLinearKernel()
        self.fused = fused if fused is not None else FusedKernels()
        self.lora = lora if lora is not None else LoRAKernel()

    def libraries(self) -> list[KernelLibrary]:
        """The C libraries these ops call (what a decode-graph capture records)."""
        return [lib for lib in (self.kernel, self.fused, self.lora) if lib.available]

    def lora_linear(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        slices: tuple[int, ...],
        token_slots: torch.Tensor,
        slot_ranks: torch.Tensor,
    ) -> torch.Tensor:
        if self.lora.fits(y, x, lora_a, lora_b, slices, token_slots, slot_ranks):
            return self.lora(y, x, lora_a, lora_b, slices, token_slots, slot_ranks)
        return super().lora_linear(y, x, lora_a, lora_b, slices, token_slots, slot_ranks)

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
