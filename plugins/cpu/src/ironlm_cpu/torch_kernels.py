"""The torch implementations the kernel choice (``tuner``) can pick, as recordable calls.

Each writes into an output allocated with ``torch.empty`` through ``Recordable.call``, so a
decode-graph capture records it like a C call (the recording keeps its input and output tensors
alive; a replay runs the same torch op on them again). Without a capture the cost is that of the
plain op: ``torch.mm(..., out=y)`` is the matmul ``F.linear`` runs (MKL / oneDNN).
"""

from __future__ import annotations

import torch
from ironlm.interfaces.platform import LayerOps

from ironlm_cpu.cbuild import Recordable


def _linear_into(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor
) -> None:
    if bias is None:
        torch.mm(x, w.t(), out=y)
    else:
        torch.addmm(bias, x, w.t(), out=y)


def _rms_norm_into(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
    out: torch.Tensor, res_out: torch.Tensor | None,
) -> None:  # fmt: skip
    normed, new_res = LayerOps.rms_norm(_REFERENCE, x, weight, eps, residual)
    out.copy_(normed)
    if res_out is not None and new_res is not None:
        res_out.copy_(new_res)


_REFERENCE = LayerOps()


class TorchKernels(Recordable):
    """torch's matmul and the core's reference RMSNorm, recordable."""

    available = True

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """(M, K) @ (N, K)^T (+ bias) -> (M, N) in x's dtype."""
        y = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
        self.call(_linear_into, x, weight, bias, y)
        return y

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = torch.empty_like(x)
        res_out = None if residual is None else torch.empty_like(x)
        self.call(_rms_norm_into, x, weight, eps, residual, out, res_out)
        return out, res_out
