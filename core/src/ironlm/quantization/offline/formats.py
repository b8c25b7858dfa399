"""The checkpoint tensors and ``quantization_config`` each ``--quant-type`` writes (the
formats the loaders in ``ironlm.quantization`` read; AWQ and GPTQ in their public layouts)."""

from __future__ import annotations

from typing import Any

import torch

from ironlm.interfaces.quant import pack_int4
from ironlm.quantization.packing import awq_pack, gptq_pack_cols, gptq_pack_rows
from ironlm.quantization.rtn import quantize_fp8, quantize_int8


def int8_tensors(name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """weight_only_int8 / smooth_quant: ``weight`` int8 (N, K), ``weight_scale`` (N,) float32."""
    q, scale = quantize_int8(weight)
    return {f"{name}.weight": q, f"{name}.weight_scale": scale}


def fp8_tensors(name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """vLLM's fp8: ``weight`` float8_e4m3fn (N, K), ``weight_scale`` () float32 per tensor."""
    q, scale = quantize_fp8(weight, per_channel=False)
    return {f"{name}.weight": q, f"{name}.weight_scale": scale.reshape(())}


def int4_tensors(
    name: str, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, zero_points: bool
) -> dict[str, torch.Tensor]:
    """weight_only_int4: the int4 layout's canonical tensors."""
    out = {f"{name}.qweight": pack_int4(codes), f"{name}.scale": scale.float()}
    if zero_points:
        out[f"{name}.zero"] = zero.to(torch.uint8)
    return out


def awq_tensors(
    name: str, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor
) -> dict[str, torch.Tensor]:
    """AutoAWQ GEMM: (in, out) tensors, eight output columns per int32 in AWQ order."""
    return {
        f"{name}.qweight": awq_pack(codes.t().contiguous()),  # (K, N / 8)
        f"{name}.qzeros": awq_pack(zero.t().contiguous()),  # (K / G, N / 8)
        f"{name}.scales": scale.t().contiguous().half(),  # (K / G, N)
    }


def gptq_tensors(
    name: str, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, g_idx: torch.Tensor
) -> dict[str, torch.Tensor]:
    """GPTQ (checkpoint_format "gptq"): zeros stored minus one (4-bit wrap-around)."""
    return {
        f"{name}.qweight": gptq_pack_rows(codes.t().contiguous()),  # (K / 8, N)
        f"{name}.qzeros": gptq_pack_cols((zero.to(torch.int64) - 1).t().contiguous()),
        f"{name}.scales": scale.t().contiguous().half(),  # (K / G, N)
        f"{name}.g_idx": g_idx.to(torch.int32),
    }


def quantization_config(
    quant_type: str, group_size: int | None, zero_points: bool, alpha: float, desc_act: bool,
    damp: float, lm_head: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """The ``quantization_config`` entry of config.json (``lm_head``: GPTQ's key, for an int8
    LM head)."""
    if quant_type in ("weight_only_int8", "smooth_quant"):
        config: dict[str, Any] = {"quant_method": quant_type, "bits": 8}
        if quant_type == "smooth_quant":
            config["smoothquant_alpha"] = alpha
        if lm_head:
            config["lm_head"] = True
        return config
    if quant_type == "fp8":
        return {"quant_method": "fp8", "activation_scheme": "dynamic"}
    if quant_type == "weight_only_int4":
        return {"quant_method": quant_type, "bits": 4, "group_size": group_size,
                "zero_point": zero_points}  # fmt: skip
    if quant_type == "awq":  # AutoAWQ's keys (transformers' AwqConfig reads them too)
        return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": None}  # fmt: skip
    return {  # gptq: AutoGPTQ / GPTQModel / transformers' GPTQConfig keys
        "quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": desc_act,
        "sym": not zero_points, "damp_percent": damp, "true_sequential": True,
        "static_groups": False, "lm_head": False, "checkpoint_format": "gptq",
    }  # fmt: skip
