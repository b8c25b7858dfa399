"""TritonLayerOps: the core's LayerOps with fused Triton kernels, for the cuda platform.

Same contracts as :class:`ironlm.interfaces.platform.LayerOps` (the pure-torch reference the
kernels are tested against). Triton is imported when the ops object is built, i.e. when the
platform hands it to the model, never at plugin import.
"""

from __future__ import annotations

import torch

from ironlm.interfaces.platform import Availability, LayerOps
from ironlm.interfaces.quant import FP8, GGUF, INT4, INT8, W8A8, QuantLayout, reference_embedding


class TritonLayerOps(LayerOps):
    """RMSNorm (+ residual add), neox rotary, SiLU-and-mul and GELU(tanh)-and-mul in Triton;
    quantized linears for the int8, w8a8, int4 and fp8 layouts (``kernels.quant_matmul``); the
    segmented LoRA matmul of mixed-adapter batches (``kernels.lora``)."""

    def __init__(self) -> None:
        from ironlm_cuda.kernels import quant_matmul
        from ironlm_cuda.kernels.activation import act_and_mul
        from ironlm_cuda.kernels.lora import lora_linear
        from ironlm_cuda.kernels.rms_norm import rms_norm
        from ironlm_cuda.kernels.rotary import rotary

        self._lora_linear = lora_linear
        self._act_and_mul = act_and_mul
        self._rms_norm = rms_norm
        self._rotary = rotary
        self._quant = quant_matmul

    # -- quantized weights --------------------------------------------------------------------
    def quantized_support(self, layout: QuantLayout) -> Availability:
        if layout.kind == GGUF:
            return Availability.no(
                f"the cuda plugin has no kernel for {layout.describe()} weights (Triton kernels: "
                "int8, w8a8, int4, fp8)"
            )
        return Availability.yes(f"Triton kernel for {layout.describe()}")

    def pack_quantized(
        self, layout: QuantLayout, tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Canonical tensors, contiguous, scales float32 (a per-tensor fp8 scale repeated per
        row, which the reference reads the same way)."""
        out = {name: t.contiguous() for name, t in tensors.items()}
        n = out["qweight"].shape[0]
        scale = out["scale"].to(torch.float32)
        out["scale"] = scale.reshape(-1).expand(n).contiguous() if scale.numel() == 1 else scale
        return out

    def quantized_linear(
        self, layout: QuantLayout, x: torch.Tensor, packed: dict[str, torch.Tensor],
        bias: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        q = self._quant
        w, scale = packed["qweight"], packed["scale"]
        if layout.kind == W8A8:
            return q.w8a8_matmul(x, w, scale, bias)
        if layout.kind == INT4:
            assert layout.group_size is not None
            zero = packed.get("zero") if layout.zero_points else None
            return q.weight_only_matmul(q.INT4, x, w, scale, zero, layout.group_size, bias)
        if layout.kind in (INT8, FP8):
            kind, bits = (q.INT8, w) if layout.kind == INT8 else (q.FP8, w.view(torch.uint8))
            return q.weight_only_matmul(kind, x, bits, scale, None, 0, bias)
        raise ValueError(f"the cuda plugin cannot run {layout.describe()} weights")

    def quantized_embedding(
        self, layout: QuantLayout, ids: torch.Tensor, packed: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        return reference_embedding(layout, ids, packed)  # a row gather and a scale: torch

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._rms_norm(x, weight, eps, residual)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._act_and_mul(gate_up, gelu_tanh=False)

    def gelu_tanh_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._act_and_mul(gate_up, gelu_tanh=True)

    def rotary(
        self,
        q: torch.Tensor,  # (T, H, D)
        k: torch.Tensor,  # (T, Hkv, D)
        cos: torch.Tensor,  # (T, D/2)
        sin: torch.Tensor,  # (T, D/2)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._rotary(q, k, cos, sin)

    def lora_linear(
        self,
        y: torch.Tensor,  # (T, N), updated in place
        x: torch.Tensor,  # (T, K)
        lora_a: torch.Tensor,  # (S, P * R, K)
        lora_b: torch.Tensor,  # (S, R, N)
        slices: tuple[int, ...],
        token_slots: torch.Tensor,  # (T,) int32
        slot_ranks: torch.Tensor,  # (S,) int32
    ) -> torch.Tensor:
        return self._lora_linear(y, x, lora_a, lora_b, slices, token_slots, slot_ranks)
