"""The cpu platform's layer ops: float32 linears on panel-packed weights (``linear_kernel``).

Weights the kernel cannot take (not float32, output size not a multiple of 16) stay row-major
and use the core's torch reference, as does everything when the kernel cannot be built here.
"""

from __future__ import annotations

import torch

from ironlm.interfaces.platform import LayerOps
from ironlm_cpu.linear_kernel import PANEL, PackedLinearKernel


class CpuLayerOps(LayerOps):
    def __init__(self, kernel: PackedLinearKernel | None = None) -> None:
        self.kernel = kernel if kernel is not None else PackedLinearKernel()

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
        if weight.dim() == 3:
            # row v of the (vocab, hidden) matrix is column v % 16 of panel v // 16
            return weight[ids // PANEL, :, ids % PANEL]  # (T, hidden)
        return super().embedding(ids, weight)
