"""The int32 packings of the public 4-bit checkpoint formats, to and from plain 0..15 codes.

AutoAWQ, GEMM version (``WQLinear_GEMM``): tensors are stored (in_features, out_features):
  qweight (K, N / 8) int32, qzeros (K / G, N / 8) int32, scales (K / G, N) float16.
  Eight output columns share one int32; nibble i (bits 4i..4i+3) holds column 8c + AWQ_ORDER[i]
  with AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7). Zeros are stored as they are.
  W[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n].

GPTQ (AutoGPTQ / GPTQModel, ``checkpoint_format`` "gptq"):
  qweight (K / 8, N) int32: eight consecutive input rows share one int32, row 8r + i in nibble i.
  qzeros (K / G, N / 8) int32: eight consecutive output columns, column 8c + i in nibble i,
  each stored as zero - 1 (format "gptq"; "gptq_v2" stores the zero itself).
  scales (K / G, N) float16; g_idx (K,) int32: the group of each input row (act-order
  checkpoints number groups in quantization order, so g_idx is not monotonic there).
  W[k, n] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n].
"""

from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i holds column AWQ_ORDER[i] of its eight
AWQ_REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)  # column j sits in nibble AWQ_REVERSE[j]
_SHIFTS = torch.arange(8, dtype=torch.int64) * 4


def pack_nibbles(values: torch.Tensor) -> torch.Tensor:
    """(..., 8) codes 0..15 -> (...,) int32, element i in bits 4i..4i+3."""
    v = values.to(torch.int64) & 0xF
    word = (v << _SHIFTS.to(v.device)).sum(dim=-1)  # 0 .. 2^32 - 1
    word = torch.where(word >= 2**31, word - 2**32, word)  # the same bits as a signed int32
    return word.to(torch.int32)


def unpack_nibbles(words: torch.Tensor) -> torch.Tensor:
    """(...,) int32 -> (..., 8) uint8 codes (inverse of ``pack_nibbles``)."""
    if words.dtype != torch.int32:
        raise ValueError(f"packed 4-bit tensors are int32, got {words.dtype}")
    w = words.to(torch.int64) & 0xFFFFFFFF
    return ((w.unsqueeze(-1) >> _SHIFTS.to(w.device)) & 0xF).to(torch.uint8)


# -- AutoAWQ GEMM ------------------------------------------------------------------------------
def awq_pack(values: torch.Tensor) -> torch.Tensor:
    """(R, C) codes, C a multiple of 8 -> (R, C / 8) int32 in AutoAWQ's column order."""
    rows, cols = values.shape
    grouped = values.reshape(rows, cols // 8, 8)[..., list(AWQ_ORDER)]
    return pack_nibbles(grouped)


def awq_unpack(words: torch.Tensor) -> torch.Tensor:
    """(R, C / 8) int32 -> (R, C) uint8 codes in natural column order."""
    nibbles = unpack_nibbles(words)  # (R, C / 8, 8) in AWQ_ORDER
    return nibbles[..., list(AWQ_REVERSE)].reshape(words.shape[0], -1)


# -- GPTQ --------------------------------------------------------------------------------------
def gptq_pack_rows(values: torch.Tensor) -> torch.Tensor:
    """(K, N) codes, K a multiple of 8 -> (K / 8, N) int32 (qweight)."""
    k, n = values.shape
    return pack_nibbles(values.reshape(k // 8, 8, n).transpose(1, 2))


def gptq_unpack_rows(words: torch.Tensor) -> torch.Tensor:
    """(K / 8, N) int32 -> (K, N) uint8 codes."""
    nibbles = unpack_nibbles(words)  # (K / 8, N, 8)
    return nibbles.transpose(1, 2).reshape(-1, words.shape[1])


def gptq_pack_cols(values: torch.Tensor) -> torch.Tensor:
    """(R, N) codes, N a multiple of 8 -> (R, N / 8) int32 (qzeros)."""
    rows, cols = values.shape
    return pack_nibbles(values.reshape(rows, cols // 8, 8))


def gptq_unpack_cols(words: torch.Tensor) -> torch.Tensor:
    """(R, N / 8) int32 -> (R, N) uint8 codes."""
    return unpack_nibbles(words).reshape(words.shape[0], -1)
