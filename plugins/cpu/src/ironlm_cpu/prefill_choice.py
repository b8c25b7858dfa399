"""Prefill attention: the fused C kernel, one row per new token, or the torch path (gather +
SDPA), by measurement, up to which sequence length.

Why: the C decode kernel reads a row's keys straight from the paged cache, so a prefill token
can be a row of its own over its causal prefix (``attention_metadata._token_rows``); for short
prompts that beats gathering the blocks and one padded SDPA call (no gather, no float32 copies,
no padding), and for long ones SDPA's blocked matmuls win. Where the crossover lies depends on
the CPU, the dtype and the heads. On the 2-core Zen 5 (SmolLM2's 9 / 3 heads of 64, per layer):
bf16 32 x 64 tokens 1.28 vs 4.33 ms, 4 x 512 6.5 vs 16.6 ms, 1 x 2048 24.5 vs 37.7 ms; float32
32 x 64 1.64 vs 6.60 ms but 1 x 2048 40.6 vs 36.6 ms. With the bf16 tiles (2026-11-26) bf16 won
1 x 4096 too (46.5 vs 128.4 ms), so that length is measured as well: before, every prompt row
past 2048 keys went to torch, and a 3000-token prompt's second chunk (952 rows over up to 3000
keys) took 1.58 s of its 2.47 s first token; on the C rows 0.66 of 1.52 s. Float32 tiles
(2026-11-27, ``prefill_f32_src``) made the kernel win every length in float32 too on the Zen
4 (1 x 2048: 63.4 -> 29.7 ms against SDPA's ~40).

Timed once per (dtype, heads, KV heads, head_dim, threads) on fresh prompts of growing length
(``BUCKETS``: sequences x tokens), both paths checked against each other first; measuring stops
at the first length torch wins. The decision, ``max_keys``, is the longest measured length the
kernel won at and every shorter one (0: torch for every prefill), cached with the other kernel
choices (``tuner``); sequences longer than that run on torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from ironlm.interfaces.attention import AttentionBatch, AttentionLayerSpec

from ironlm_cpu.tuner import VERSION, KernelTuner

BUCKETS: tuple[tuple[int, int], ...] = ((32, 64), (4, 512), (1, 2048), (1, 4096))  # (seqs, tokens)
_BLOCK = 16


def synthetic_prefill_batch(num_seqs: int, tokens: int, block_size: int = _BLOCK) -> AttentionBatch:
    """``num_seqs`` fresh prompts of ``tokens`` tokens, each in its own consecutive blocks."""
    per_seq = -(-tokens // block_size)
    tables = torch.arange(num_seqs * per_seq, dtype=torch.int32).view(num_seqs, per_seq)
    pos = torch.arange(tokens)
    slots = (tables[:, pos // block_size].long() * block_size + pos % block_size).reshape(-1)
    lens = [tokens] * num_seqs
    return AttentionBatch(
        query_start_loc=torch.arange(num_seqs + 1, dtype=torch.int32) * tokens,
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        context_lens=torch.zeros(num_seqs, dtype=torch.int32),
        block_tables=tables.contiguous(), slot_mapping=slots, block_size=block_size,
        max_query_len=tokens, max_seq_len=tokens, query_lens_cpu=lens, seq_lens_cpu=lens,
    )  # fmt: skip


def choose_prefill_rows(
    tuner: KernelTuner,
    layer: AttentionLayerSpec,
    dtype: torch.dtype,
    prepare: Callable[[int, AttentionBatch, torch.Tensor, torch.Tensor],
                      Callable[[], torch.Tensor]],
) -> dict[str, Any]:  # fmt: skip
    """The decision (``max_keys``, with timings and why). ``prepare(row_keys, batch, q, kv)``
    returns a call that runs one layer of the backend on ``batch`` with prefill rows on the C
    kernel up to ``row_keys`` keys per sequence (0: none), ``kv`` serving as the new keys and
    values; what a step pays once (metadata, a cache) is prepared outside the timed call."""
    threads = torch.get_num_threads()
    name = str(dtype).removeprefix("torch.")
    key = (f"prefill_attention|{name}|h{layer.num_heads}kv{layer.num_kv_heads}"
           f"d{layer.head_dim}|t{threads}|v{VERSION}")  # fmt: skip
    longest = BUCKETS[-1][1]
    # forced c: every prompt up to the longest bucket; the default: the torch path, as before
    # this choice existed
    preset = tuner.preset(
        "prefill_attention", key, {"impl": "torch", "max_keys": 0},
        lambda impl: {"max_keys": longest if impl == "c" else 0},
    )  # fmt: skip
    if preset is not None:
        return preset
    max_keys, us, rejected = 0, {}, {}
    rtol, atol = (1e-3, 1e-4) if dtype == torch.float32 else (1.6e-2, 1e-3)
    gen = torch.Generator().manual_seed(layer.num_heads * 89 + layer.head_dim)
    for seqs, tokens in BUCKETS:
        batch = synthetic_prefill_batch(seqs, tokens)
        t = seqs * tokens
        q = torch.randn(t, layer.num_heads, layer.head_dim, generator=gen).to(dtype)
        kv = torch.randn(t, layer.num_kv_heads, layer.head_dim, generator=gen).to(dtype)
        meas = tuner.measure(
            {"c": prepare(tokens, batch, q, kv), "torch": prepare(0, batch, q, kv)}, "torch",
            rtol=rtol, atol=atol,
        )  # fmt: skip
        label = f"{seqs}x{tokens}"
        us[label] = meas.us
        rejected.update({f"{label} {c}": r for c, r in meas.rejected.items()})
        if meas.fastest() != "c":
            break
        max_keys = tokens
    times = "; ".join(f"{b}: " + ", ".join(f"{k} {v:.0f}us" for k, v in t.items())
                      for b, t in us.items())  # fmt: skip
    why = (f"C kernel rows for prompts up to {max_keys} keys" if max_keys else
           "torch for every prefill") + f" ({times})"
    if rejected:
        why += "; rejected: " + "; ".join(f"{c} ({r})" for c, r in rejected.items())
    decision = {"op": "prefill_attention", "impl": "c" if max_keys else "torch",
                "max_keys": max_keys, "us": us, "rejected": rejected, "why": why,
                "threads": threads, "source": "measured"}  # fmt: skip
    tuner.record(key, decision)
    return decision
