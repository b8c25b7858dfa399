"""Time the cpu plugin's paged attention against the core's reference backend.

SmolLM2-135M shapes (9 query heads, 3 KV heads, head_dim 64, block 16, float32) on decode batches
of 1/16/64 sequences at context 128 and 1024, of 1/2 at 4096, and a prefill of 64 sequences x 64
tokens.
Prints milliseconds per layer call (``forward``) for the reference and for ``cpu_paged`` with its
fused C decode kernel (``native``) and without it (``torch``: gather + SDPA only), the speed-up
ratios ``reference / cpu_paged``, and ``build_metadata`` per step (shared by all layers).

    python benchmarks/attention_cpu.py [--repeats N] [--dtype float32|bfloat16] [--threads N]
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import torch

from ironlm.attention.batch import random_paged_batch
from ironlm.attention.reference import ReferenceAttentionBackend
from ironlm.interfaces.attention import AttentionBackend, AttentionLayerSpec
from ironlm_cpu.attention import CpuPagedAttentionBackend

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16


def best_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Minimum wall time of ``fn`` over ``repeats`` runs after one warm-up (ms)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def time_backend(
    backend: AttentionBackend,
    context_lens: list[int],
    query_lens: list[int],
    dtype: torch.dtype,
    repeats: int,
    window: int | None = None,
) -> tuple[float, float]:
    """(forward ms per layer, build_metadata ms per step) for one scheduled batch."""
    gen = torch.Generator().manual_seed(0)
    num_blocks = sum(-(-(c + q) // BLOCK) for c, q in zip(context_lens, query_lens)) + 8
    batch = random_paged_batch(context_lens, query_lens, BLOCK, num_blocks, gen)
    layer = AttentionLayerSpec(0, HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, window)
    cache = torch.randn(2, num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    t = batch.num_tokens
    q = torch.randn(t, HEADS, HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(t, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    v = torch.randn(t, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    meta_ms = best_ms(lambda: backend.build_metadata(batch), repeats)
    meta = backend.build_metadata(batch)
    fwd_ms = best_ms(lambda: backend.forward(layer, q, k, v, cache, meta), repeats)
    return fwd_ms, meta_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--window", type=int, default=None, help="sliding window (default: none)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (default: as configured; 1 is steadier on a busy box)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    cases: list[tuple[str, list[int], list[int]]] = []
    for ctx in (128, 1024):
        for n in (1, 16, 64):
            cases.append((f"decode b={n:<2} ctx={ctx:<4}", [ctx - 1] * n, [1] * n))
    for n in (1, 2):  # few long rows: split along the context (decode_split_src)
        cases.append((f"decode b={n:<2} ctx=4096", [4095] * n, [1] * n))
    cases.append(("prefill 64 x 64 tokens", [0] * 64, [64] * 64))
    cases.append(("mixed 48 decode + 2x128 prefill chunks",
                  [200 + 4 * i for i in range(48)] + [0, 256], [1] * 48 + [128, 128]))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, "
          f"H={HEADS} Hkv={KV_HEADS} D={HEAD_DIM} block={BLOCK}, best of {args.repeats}")
    print(f"{'case':<40} {'ref':>9} {'native':>9} {'torch':>9} {'ref/nat':>8} {'ref/tor':>8} "
          f"{'meta/step':>10}")
    ref = ReferenceAttentionBackend()
    native = CpuPagedAttentionBackend()
    plain = CpuPagedAttentionBackend(native_decode=False)
    for label, ctx_lens, q_lens in cases:
        ref_ms, _ = time_backend(ref, ctx_lens, q_lens, dtype, args.repeats, args.window)
        nat_ms, meta_ms = time_backend(native, ctx_lens, q_lens, dtype, args.repeats, args.window)
        tor_ms, _ = time_backend(plain, ctx_lens, q_lens, dtype, args.repeats, args.window)
        print(f"{label:<40} {ref_ms:7.2f}ms {nat_ms:7.2f}ms {tor_ms:7.2f}ms "
              f"{ref_ms / nat_ms:7.1f}x {ref_ms / tor_ms:7.1f}x {meta_ms:8.2f}ms")
    print(f"decode path of cpu_paged here: {native.decode_path}")
    print(f"prefill path of cpu_paged here: {native.prefill_path}")


if __name__ == "__main__":
    main()
