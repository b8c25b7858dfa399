"""Decode attention: the fused C kernel or the torch path (gather + SDPA), by measurement.

Timed once per (dtype: float32 or bfloat16, heads, KV heads, head_dim, threads) on a synthetic
paged batch: 16 sequences of 256 cached tokens each, one new token each, blocks of 16 (what a
batch decode step reads); both paths are checked against each other's result first. The
decision is cached with the other kernel choices (``tuner``). The C path is the only one decode
graphs can record: when torch wins, the backend offers no graph metadata and decode steps run
eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from ironlm.interfaces.attention import AttentionBatch, AttentionLayerSpec

from ironlm_cpu.tuner import VERSION, KernelTuner

_SEQS, _CONTEXT, _BLOCK = 16, 256, 16


def synthetic_decode_batch(num_seqs: int = _SEQS, context: int = _CONTEXT,
                           block_size: int = _BLOCK) -> AttentionBatch:  # fmt: skip
    """``num_seqs`` sequences of ``context`` cached tokens plus one new token each, every
    sequence in its own consecutive blocks."""
    per_seq = -(-(context + 1) // block_size)
    tables = torch.arange(num_seqs * per_seq, dtype=torch.int32).view(num_seqs, per_seq)
    slots = tables[:, context // block_size].long() * block_size + context % block_size
    lens = [context + 1] * num_seqs
    return AttentionBatch(
        query_start_loc=torch.arange(num_seqs + 1, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        context_lens=torch.full((num_seqs,), context, dtype=torch.int32),
        block_tables=tables.contiguous(), slot_mapping=slots, block_size=block_size,
        max_query_len=1, max_seq_len=context + 1, query_lens_cpu=[1] * num_seqs,
        seq_lens_cpu=lens,
    )  # fmt: skip


def choose_decode_path(
    tuner: KernelTuner,
    layer: AttentionLayerSpec,
    dtype: torch.dtype,
    run: Callable[[bool, AttentionBatch, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
) -> dict[str, Any]:
    """The decision (``impl`` "c" or "torch", with timings and why). ``run(native, batch, q,
    kv, cache)`` runs one decode step of the backend on the C kernel (native) or torch."""
    threads = torch.get_num_threads()
    name = str(dtype).removeprefix("torch.")
    key = (f"decode_attention|{name}|h{layer.num_heads}kv{layer.num_kv_heads}"
           f"d{layer.head_dim}|t{threads}|v{VERSION}")  # fmt: skip
    preset = tuner.preset("decode_attention", key, {"impl": "c"})
    if preset is not None:
        return preset
    batch = synthetic_decode_batch()
    gen = torch.Generator().manual_seed(layer.num_heads * 97 + layer.head_dim)
    blocks = int(batch.block_tables.numel())
    cache = torch.randn(2, blocks, _BLOCK, layer.num_kv_heads, layer.head_dim, generator=gen)
    cache = cache.to(dtype)
    q = torch.randn(_SEQS, layer.num_heads, layer.head_dim, generator=gen).to(dtype)
    kv = torch.randn(_SEQS, layer.num_kv_heads, layer.head_dim, generator=gen).to(dtype)
    reference = run(False, batch, q, kv, cache.clone())
    # bf16: both paths compute in float32 and round the output once; allow about two roundings
    rtol, atol = (1e-3, 1e-4) if dtype == torch.float32 else (1.6e-2, 1e-3)
    meas = tuner.measure(
        {"c": lambda: run(True, batch, q, kv, cache),
         "torch": lambda: run(False, batch, q, kv, cache)},
        reference, rtol=rtol, atol=atol,
    )  # fmt: skip
    impl = meas.fastest() or "torch"
    times = ", ".join(f"{k} {v:.0f}us" for k, v in meas.us.items())
    why = f"fastest on {_SEQS} x {_CONTEXT} cached tokens ({times})"
    if meas.rejected:
        why += "; rejected: " + "; ".join(f"{c} ({r})" for c, r in meas.rejected.items())
    decision = {"op": "decode_attention", "impl": impl, "layout": "paged",
                "impls": {str(_SEQS): impl}, "us": {str(_SEQS): meas.us},
                "rejected": meas.rejected, "why": why, "threads": threads,
                "source": "measured"}  # fmt: skip
    tuner.record(key, decision)
    return decision
