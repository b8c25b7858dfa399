"""torch's oneDNN linear over a weight reordered once: the library candidate with its own layout.

Why: ``torch.nn.functional.linear`` (the ``torch`` candidate) hands oneDNN / MKL the
checkpoint's row-major weight on every call, and for bf16 oneDNN reorders it into its blocked
format each time. ``torch.ops.mkldnn._reorder_linear_weight`` does that reorder once, at load
time, into an opaque oneDNN tensor that ``torch.ops.mkldnn._linear_pointwise`` multiplies by
(the prepacked path torch's own compiler emits for CPU linears). On the 2-core Zen 5, bf16,
3072 x 576, us at 1 / 8 / 64 / 512 rows: ``F.linear`` 108 / 139 / 376 / 2178, reordered once
35 / 51 / 241 / 1760, our panel tile 22 / 35 / 221 / 1709; float32 (MKL's AVX2 code on AMD)
93 / 317 / 1117 / 8281 against 53 / 84 / 444 / 3452 and ours 37 / 66 / 432 / 3648. Where
oneDNN has AMX (Intel Xeon 4th generation on) it may beat every other candidate; the kernel
choice (``op_choice``) measures it beside the others and keeps whichever layout wins.

The reordered weight is opaque: no data pointer, no row lookups. So it is never the layout of
a weight that embedding lookups read too (a tied LM head: ``CpuLayerOps.pack_tied_weight``),
and each call writes into a preallocated output (a copy of oneDNN's result) so that a
decode-graph capture records it like the other torch candidates (``torch_kernels``).
"""

from __future__ import annotations

import torch

from ironlm_cpu.cbuild import Recordable


def _linear_into(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor
) -> None:
    # contiguous here, inside the recorded call: a strided input's copy is part of the replay
    b = None if bias is None else bias.contiguous()
    y.copy_(torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, b, "none", [], ""))


class OneDnnLinear(Recordable):
    """Reorders weights for oneDNN (``pack``) and runs x @ W^T (+ bias) on them."""

    def __init__(self) -> None:
        super().__init__()
        self.available = torch.backends.mkldnn.is_available() and all(
            hasattr(torch.ops.mkldnn, op) for op in ("_linear_pointwise", "_reorder_linear_weight")
        )
        # oneDNN's bf16 path needs avx512bw/vl/dq or avx_ne_convert (the reorder raises
        # without them: AVX2-only CPUs, or ONEDNN_MAX_CPU_ISA=AVX2)
        self.bf16 = (
            self.available and hasattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported")
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        )  # fmt: skip

    def supports(self, dtype: torch.dtype) -> bool:
        """Whether weights of ``dtype`` can be reordered and multiplied here."""
        if dtype == torch.bfloat16:
            return self.bf16
        return self.available and dtype == torch.float32

    @staticmethod
    def pack(weight: torch.Tensor) -> torch.Tensor:
        """(N, K) float32 / bf16 -> oneDNN's blocked layout for any number of rows (an opaque
        tensor of shape (N, K): ``layout`` is ``torch._mkldnn``)."""
        return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)

    @staticmethod
    def is_packed(weight: torch.Tensor) -> bool:
        return weight.layout == torch._mkldnn

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """(M, K) in the weight's dtype -> (M, N), over a ``pack`` result."""
        y = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
        if x.shape[0]:
            self.call(_linear_into, x, weight, bias, y)
        return y
