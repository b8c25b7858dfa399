"""The triton backend and fused ops on a real GPU: model-sized shapes against the reference,
CUDA-graph capture and replay of a decode step, and decode bandwidth. Skipped without a GPU."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from ironlm.attention.batch import build_attention_batch
from ironlm.attention.reference import ReferenceAttentionBackend
from ironlm.interfaces.attention import AttentionBatch, AttentionLayerSpec
from ironlm.interfaces.platform import LayerOps
from ironlm_cuda.triton_attention import TritonAttentionBackend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BLOCK_SIZE = 16
LLAMA3_8B = (32, 8, 128)  # (num_heads, num_kv_heads, head_dim)


def paged_batch(
    context_lens: list[int], query_lens: list[int], spare_tokens: int = 0, seed: int = 0
) -> tuple[AttentionBatch, list[list[int]], int]:
    """A batch over randomly placed blocks, each sequence with room for ``spare_tokens`` more."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-(c + q + spare_tokens) // BLOCK_SIZE) for c, q in zip(context_lens, query_lens)]
    num_blocks = sum(need) + 4
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(perm[at : at + n])
        at += n
    batch = build_attention_batch(context_lens, query_lens, tables, BLOCK_SIZE, "cuda")
    return batch, tables, num_blocks


def qkv(
    tokens: int, heads: tuple[int, int, int], dtype: torch.dtype, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    num_heads, num_kv_heads, head_dim = heads
    q, k, v = (
        torch.randn(tokens, n, head_dim, generator=gen, device="cuda", dtype=dtype)
        for n in (num_heads, num_kv_heads, num_kv_heads)
    )
    return q, k, v


@pytest.mark.parametrize(
    "options,window,cap,tol",
    [
        ({}, None, None, 2e-2),
        ({}, 512, None, 2e-2),
        ({}, None, 30.0, 2e-2),
        ({"kv_cache_dtype": "fp8"}, None, None, 2e-2),
    ],
    ids=["plain", "window", "softcap", "fp8"],
)
def test_llama3_8b_shapes_mixed_batch(options: dict, window: int | None, cap: float | None,
                                      tol: float) -> None:
    context_lens, query_lens = [0, 1500, 300, 4000, 77, 2047], [700, 1, 129, 1, 50, 1]
    batch, _, num_blocks = paged_batch(context_lens, query_lens)
    layer = AttentionLayerSpec(0, *LLAMA3_8B, LLAMA3_8B[2] ** -0.5, window, cap)
    backend = TritonAttentionBackend(**options)
    cache_dtype = backend.cache_dtype(torch.bfloat16)
    shape = backend.kv_cache_shape(num_blocks, BLOCK_SIZE, *LLAMA3_8B[1:])
    cache = torch.randn(shape, device="cuda").to(cache_dtype)
    q, k, v = qkv(sum(query_lens), LLAMA3_8B, torch.bfloat16)
    out = backend.forward(layer, q, k, v, cache, backend.build_metadata(batch))
    # reference over the cache as written (dequantised for fp8), in float32
    ref_cache = cache.float()
    flat = ref_cache.view(2, -1, *LLAMA3_8B[1:])
    slots = batch.slot_mapping
    ref = ReferenceAttentionBackend().forward(
        layer, q.float(), flat[0, slots], flat[1, slots], ref_cache, batch
    )
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def test_decode_cuda_graph_capture_and_replay() -> None:
    context_lens = [100, 517, 1023, 2000]
    n = len(context_lens)
    batch, tables, num_blocks = paged_batch(context_lens, [1] * n, spare_tokens=1)
    layer = AttentionLayerSpec(0, *LLAMA3_8B, LLAMA3_8B[2] ** -0.5)
    backend = TritonAttentionBackend()
    meta = backend.build_metadata(batch)
    assert meta.decode_seq_ids is None  # a pure decode step builds no per-step tensors
    cache = torch.randn(backend.kv_cache_shape(num_blocks, BLOCK_SIZE, *LLAMA3_8B[1:]),
                        device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv(n, LLAMA3_8B, torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile the kernels outside the capture
        backend.forward(layer, q, k, v, cache, meta)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(layer, q, k, v, cache, meta)

    # the next step: one more token per sequence, new q/k/v, copied into the captured tensors
    next_lens = [c + 1 for c in context_lens]
    step2 = build_attention_batch(next_lens, [1] * n, tables, BLOCK_SIZE, "cuda")
    for name in ("query_start_loc", "seq_lens", "context_lens", "block_tables", "slot_mapping"):
        getattr(batch, name).copy_(getattr(step2, name))
    new_q, new_k, new_v = qkv(n, LLAMA3_8B, torch.bfloat16, seed=2)
    for static, new in zip((q, k, v), (new_q, new_k, new_v)):
        static.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    ref = ReferenceAttentionBackend().forward(layer, q, k, v, cache.clone(), step2)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def test_layer_ops_at_llama_sizes() -> None:
    from ironlm_cuda.triton_layer_ops import TritonLayerOps

    ops, ref = TritonLayerOps(), LayerOps()
    x = torch.randn(257, 4096, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(x)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    (a, ar), (b, br) = ops.rms_norm(x, w, 1e-5, res), ref.rms_norm(x, w, 1e-5, res)
    torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ar, br)
    gate_up = torch.randn(257, 2 * 14336, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(ops.silu_and_mul(gate_up), ref.silu_and_mul(gate_up),
                               atol=2e-2, rtol=2e-2)
    q, k, _ = qkv(257, LLAMA3_8B, torch.bfloat16)
    angles = torch.rand(257, 64, device="cuda") * 100
    for got, want in zip(ops.rotary(q, k, angles.cos(), angles.sin()),
                         ref.rotary(q, k, angles.cos(), angles.sin())):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def _time_ms(fn: Callable[[], object], iters: int = 50) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def test_decode_attention_bandwidth() -> None:
    """Batch-32 decode over 2048-token contexts reads the KV cache near memory bandwidth."""
    context_lens = [2048] * 32
    batch, _, num_blocks = paged_batch(context_lens, [1] * 32)
    layer = AttentionLayerSpec(0, *LLAMA3_8B, LLAMA3_8B[2] ** -0.5)
    backend = TritonAttentionBackend()
    meta = backend.build_metadata(batch)
    cache = torch.randn(backend.kv_cache_shape(num_blocks, BLOCK_SIZE, *LLAMA3_8B[1:]),
                        device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv(32, LLAMA3_8B, torch.bfloat16)
    ms = _time_ms(lambda: backend.forward(layer, q, k, v, cache, meta))
    kv_bytes = 2 * sum(c + 1 for c in context_lens) * LLAMA3_8B[1] * LLAMA3_8B[2] * 2
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = _time_ms(lambda: dst.copy_(src), iters=20)
    copy_bw = 2 * src.numel() / copy_ms / 1e6  # GB/s, read + write
    bw = kv_bytes / ms / 1e6
    print(f"\ndecode attention: {ms * 1e3:.1f} us, {bw:.0f} GB/s = {bw / copy_bw:.0%} of the "
          f"device-to-device copy bandwidth ({copy_bw:.0f} GB/s)")
    assert bw / copy_bw > 0.2


def test_engine_decode_graphs_match_eager(tiny_llama_dir) -> None:  # type: ignore[no-untyped-def]
    """The engine on cuda: pure decode steps replay CUDA graphs (3 sequences padded to the
    captured size 4, split-K partitions of 32 keys over the whole 256-token limit) and give
    the eager engine's greedy tokens (float32; eager splits by each step's own lengths)."""
    import gc

    from ironlm import LLM, SamplingParams

    prompts = ["The capital of France is", "def fib(n):", "Once upon a time"]
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)

    def run(eager: bool) -> tuple[list[list[int]], str | None, list[int]]:
        llm = LLM(str(tiny_llama_dir), device="cuda", dtype="float32", max_model_len=256,
                  gpu_memory_utilization=0.3, enforce_eager=eager,
                  attention_backend_options={"decode_partition_size": 32})  # fmt: skip
        outs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
        graphs = llm.engine.executor.worker.model_runner.graphs
        state = (None, []) if graphs is None else (graphs.disabled, sorted(graphs.graphs))
        del llm, graphs
        gc.collect()
        torch.cuda.empty_cache()
        return outs, *state

    want, _, eager_sizes = run(True)
    got, disabled, sizes = run(False)
    assert eager_sizes == []
    assert disabled is None and 4 in sizes
    assert got == want
