"""TritonLayerOps: the core's LayerOps with fused Triton kernels, for the cuda platform.

Same contracts as :class:`ironlm.interfaces.platform.LayerOps` (the pure-torch reference the
kernels are tested against). Triton is imported when the ops object is built, i.e. when the
platform hands it to the model, never at plugin import.
"""

from __future__ import annotations

import torch

from ironlm.interfaces.platform import LayerOps


class TritonLayerOps(LayerOps):
    """RMSNorm (+ residual add), neox rotary, SiLU-and-mul and GELU(tanh)-and-mul, and the
    segmented LoRA matmul of mixed-adapter batches in Triton."""

    def __init__(self) -> None:
        from ironlm_cuda.kernels.activation import act_and_mul
        from ironlm_cuda.kernels.lora import lora_linear
        from ironlm_cuda.kernels.rms_norm import rms_norm
        from ironlm_cuda.kernels.rotary import rotary

        self._lora_linear = lora_linear
        self._act_and_mul = act_and_mul
        self._rms_norm = rms_norm
        self._rotary = rotary

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
