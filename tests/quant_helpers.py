"""Shared helpers of the quantization tests (no tests here): independent readers of the public
4-bit formats, written from their published descriptions with explicit bit loops (nothing from
``ironlm.quantization``), tiny checkpoints, and our model's logits under a quantization."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from test_models_helpers import ARCHITECTURES, reference_context, run_prefill_then_decode

from ironlm.interfaces.model import ModelArchitecture
from ironlm.model_loader import load_model, resolve_model
from ironlm.plugin_manager import PluginManager

IDS_TINY = [1, 504, 3216, 314, 253, 1345, 28, 9110, 30, 2]  # token ids for the tiny models
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip


# -- the formats, read the slow obvious way -----------------------------------------------------
def nibble(words: np.ndarray, i: int) -> np.ndarray:
    """Bits 4i..4i+3 of int32 words (as unsigned)."""
    return (words.astype(np.int64) & 0xFFFFFFFF) >> (4 * i) & 0xF


def awq_codes(packed: torch.Tensor) -> np.ndarray:
    """AutoAWQ GEMM: (R, C/8) int32 -> (R, C); nibble i of word c holds column 8c + order[i],
    order = 0, 2, 4, 6, 1, 3, 5, 7."""
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    words = packed.numpy()
    out = np.zeros((words.shape[0], words.shape[1] * 8), dtype=np.int64)
    for c in range(words.shape[1]):
        for i in range(8):
            out[:, 8 * c + order[i]] = nibble(words[:, c], i)
    return out


def gptq_row_codes(packed: torch.Tensor) -> np.ndarray:
    """GPTQ qweight: (K/8, N) int32 -> (K, N); word r nibble i holds input row 8r + i."""
    words = packed.numpy()
    out = np.zeros((words.shape[0] * 8, words.shape[1]), dtype=np.int64)
    for r in range(words.shape[0]):
        for i in range(8):
            out[8 * r + i] = nibble(words[r], i)
    return out


def gptq_col_codes(packed: torch.Tensor) -> np.ndarray:
    """GPTQ qzeros: (R, N/8) int32 -> (R, N); word c nibble i holds column 8c + i."""
    words = packed.numpy()
    out = np.zeros((words.shape[0], words.shape[1] * 8), dtype=np.int64)
    for c in range(words.shape[1]):
        for i in range(8):
            out[:, 8 * c + i] = nibble(words[:, c], i)
    return out


def to_int32(words: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.where(words >= 2**31, words - 2**32, words).astype(np.int32))


def awq_pack_reference(codes: np.ndarray) -> torch.Tensor:
    """(R, C) codes -> AutoAWQ (R, C/8) int32, the inverse of ``awq_codes``."""
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    words = np.zeros((codes.shape[0], codes.shape[1] // 8), dtype=np.int64)
    for c in range(words.shape[1]):
        for i in range(8):
            words[:, c] |= codes[:, 8 * c + order[i]].astype(np.int64) << (4 * i)
    return to_int32(words)


def gptq_pack_rows_reference(codes: np.ndarray) -> torch.Tensor:
    words = np.zeros((codes.shape[0] // 8, codes.shape[1]), dtype=np.int64)
    for r in range(words.shape[0]):
        for i in range(8):
            words[r] |= codes[8 * r + i].astype(np.int64) << (4 * i)
    return to_int32(words)


def gptq_pack_cols_reference(codes: np.ndarray) -> torch.Tensor:
    words = np.zeros((codes.shape[0], codes.shape[1] // 8), dtype=np.int64)
    for c in range(words.shape[1]):
        for i in range(8):
            words[:, c] |= (codes[:, 8 * c + i].astype(np.int64) & 0xF) << (4 * i)
    return to_int32(words)


def dequantize_awq(tensors: dict[str, torch.Tensor], name: str, group: int) -> torch.Tensor:
    """W (N, K) of an AutoAWQ GEMM linear: (q - z) * s per group of input rows."""
    q = awq_codes(tensors[f"{name}.qweight"])  # (K, N)
    z = awq_codes(tensors[f"{name}.qzeros"])  # (K/G, N)
    s = tensors[f"{name}.scales"].float().numpy()  # (K/G, N)
    g = np.arange(q.shape[0]) // group
    return torch.from_numpy(((q - z[g]) * s[g]).T.astype(np.float32))


def dequantize_gptq(tensors: dict[str, torch.Tensor], name: str, zeros_minus_one: bool = True
                    ) -> torch.Tensor:  # fmt: skip
    """W (N, K) of a GPTQ linear: (q - z[g_idx]) * s[g_idx]; format "gptq" stores z - 1."""
    q = gptq_row_codes(tensors[f"{name}.qweight"])  # (K, N)
    z = gptq_col_codes(tensors[f"{name}.qzeros"])  # (K/G, N)
    if zeros_minus_one:
        z = (z + 1) & 0xF
    s = tensors[f"{name}.scales"].float().numpy()
    g = tensors[f"{name}.g_idx"].long().numpy()
    return torch.from_numpy(((q - z[g]) * s[g]).T.astype(np.float32))


# -- checkpoints ------------------------------------------------------------------------------
def write_variant(src: Path, dst: Path, tensors: dict[str, torch.Tensor],
                  quantization_config: dict[str, Any] | None) -> Path:  # fmt: skip
    """A copy of the HF folder ``src`` with ``tensors`` as its weights and the given
    quantization_config (None: none)."""
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        f.unlink()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    config = json.loads((dst / "config.json").read_text())
    config.pop("quantization_config", None)
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def float_tensors(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}


# -- our model -------------------------------------------------------------------------------
def our_logits(folder: Path, token_ids: list[int], flag: str | None = None) -> torch.Tensor:
    """Logits of our Llama (reference kernels) for ``folder``, its quantization method chosen
    as the engine chooses it (the flag, else the checkpoint's quantization_config)."""
    return run_prefill_then_decode(load(folder, flag), token_ids, num_decode=2)


def load(folder: Path, flag: str | None = None) -> ModelArchitecture:
    """Our model (reference kernels) for ``folder`` (an HF folder or a .gguf file)."""
    source = resolve_model(str(folder))
    pm = PluginManager()
    name = pm.resolve_quantization(flag, source.quantization_config)
    ctx = reference_context()
    if name is not None:
        cls = pm.registries.quantization_methods.get(name)
        ctx.quantization = cls.from_config(source.quantization_config)
    return load_model(source, ARCHITECTURES[source.architectures[0]], ctx)
