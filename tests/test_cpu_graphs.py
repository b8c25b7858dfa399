"""Decode graphs on the cpu platform: recorded C kernel calls replayed on static inputs.

Checked against the eager path (same kernels, so the same tokens and logprobs), on the tiny
random Llama, SmolLM2 and Gemma 3; the capture guard's refusals; the engine's fallback to eager
steps when a capture fails; ``enforce_eager``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ironlm import LLM, SamplingParams
from ironlm.interfaces.graphs import GraphCaptureError
from ironlm_cpu.graphs import CpuGraphCapture
from ironlm_cpu.layer_ops import CpuLayerOps
from ironlm_cpu.linear_kernel import PackedLinearKernel
from ironlm_cpu.op_choice import BUCKETS, bucket_index

PROMPTS = ["The capital of France is", "def fib(n):", "Once upon a time", "1, 2, 3,", "Hi", "A"]


pytestmark = pytest.mark.usefixtures("c_decode_attention")  # conftest: graphs need it


@pytest.fixture(scope="module")
def ops() -> CpuLayerOps:
    layer_ops = CpuLayerOps()
    if not (layer_ops.kernel.available and layer_ops.fused.available):
        pytest.skip(layer_ops.kernel.reason or layer_ops.fused.reason)
    return layer_ops


def _runner(llm: LLM) -> Any:
    return llm.engine.executor.worker.model_runner


def _run(llm: LLM, prompts: list[str], n_tokens: int) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(max_tokens=n_tokens, temperature=0, ignore_eos=True, logprobs=0)
    outs = llm.generate(prompts, params, use_tqdm=False)
    result = []
    for o in outs:
        c = o.outputs[0]
        lps = [next(iter(p.values())).logprob for p in c.logprobs]
        result.append((list(c.token_ids), lps))
    return result


def _engine(model: Path, eager: bool, dtype: str = "float32") -> LLM:
    # float32 unless asked: the platform's auto dtype is bf16 on CPUs with avx512_bf16
    return LLM(str(model), device="cpu", max_model_len=256, kv_cache_memory=32 * 2**20,
               enforce_eager=eager, dtype=dtype)  # fmt: skip


@pytest.mark.parametrize("dtype, batch", [("float32", 1), ("float32", 3), ("float32", 5),
                                          ("bfloat16", 1), ("bfloat16", 3)])  # fmt: skip
def test_tiny_llama_graph_matches_eager(
    tiny_llama_dir: Path, ops: CpuLayerOps, dtype: str, batch: int
) -> None:
    """bf16 too: weights, activations and cache in bf16, every op of a decode step is a C call
    (the bf16 fused ops and decode kernel), so the capture succeeds and replays eager tokens."""
    graphs, eager = _engine(tiny_llama_dir, False, dtype), _engine(tiny_llama_dir, True, dtype)
    assert _runner(eager).graphs is None
    got = _run(graphs, PROMPTS[:batch], 40)  # contexts cross block boundaries (16)
    want = _run(eager, PROMPTS[:batch], 40)
    for (g_ids, g_lps), (w_ids, w_lps) in zip(got, want, strict=True):
        assert g_ids == w_ids
        assert g_lps == pytest.approx(w_lps, abs=1e-5)
    dg = _runner(graphs).graphs
    assert dg is not None and dg.disabled is None
    padded = {1: 1, 3: 4, 5: 8}[batch]  # batches are padded up to a captured size
    assert padded in dg.graphs
    assert len(dg.graphs[padded].graph) > 0


def _replay_matches_eager(model: Path, dtype: str, n_tokens: int) -> tuple[LLM, Any]:
    """Three prompts greedily with graphs and eagerly: the same tokens and logprobs, the
    4-row graph captured. Returns the graphs engine and its decode graphs."""
    graphs, eager = _engine(model, False, dtype), _engine(model, True, dtype)
    got, want = _run(graphs, PROMPTS[:3], n_tokens), _run(eager, PROMPTS[:3], n_tokens)
    for (g_ids, g_lps), (w_ids, w_lps) in zip(got, want, strict=True):
        assert g_ids == w_ids
        assert g_lps == pytest.approx(w_lps, abs=1e-4)
    dg = _runner(graphs).graphs
    assert dg is not None and dg.disabled is None and 4 in dg.graphs
    return graphs, dg


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_smollm2_graph_matches_eager(smollm2_dir: Path, dtype: str) -> None:
    graphs, dg = _replay_matches_eager(smollm2_dir, dtype, 24)
    # SmolLM2: 30 layers x 10 kernel calls, the embedding and rotary lookups, final norm, LM
    # head; bf16: plus the logits' conversion to float32 (recorded as a copy) unless the LM
    # head runs on the bf16 panel tile of an AVX-512 BF16 build, which writes them as float32
    # (the measured choice: on an AMX Xeon torch's oneDNN runs it at 4 rows)
    bf16 = torch.bfloat16
    direct = PackedLinearKernel().f32_out_fits(torch.zeros(1, 2, dtype=bf16),
                                               torch.zeros(1, 1, 16, 2, dtype=bf16))
    converts = False
    if dtype == "bfloat16":
        decisions = _runner(graphs).sampler.ops.tuner.decisions
        head = next(d for k, d in decisions.items() if k.startswith("linear|bfloat16|49152x"))
        converts = not direct or head["impls"][str(BUCKETS[bucket_index(4)])] != "c_bf16"
    assert len(dg.graphs[4].graph) == 30 * 10 + 3 + 2 + converts
    # every C call replays inside a C program, each run of them one Python step (the
    # measured kernel choice may pick torch ops, Python calls, for some shapes on some CPUs)
    graph = dg.graphs[4].graph
    assert all(c for (fn, _), c in zip(graph.calls, graph.in_c) if hasattr(fn, "argtypes"))
    runs = sum(c and (i == 0 or not graph.in_c[i - 1]) for i, c in enumerate(graph.in_c))
    assert graph.python_calls == runs + graph.in_c.count(False) < len(graph)


_ARGS_SOURCE = r"""
#include <stdint.h>
#include <stddef.h>
/* y[i] = a * x[i + off] + b (+ 1 when z is NULL); n may be negative: nothing written */
void args_probe(float *y, const float *x, const float *z, int n, int64_t off, float a,
                float b) {
    for (int i = 0; i < n; i++) y[i] = a * x[i + off] + b + (z == NULL ? 1.0f : z[i]);
}
"""


def test_c_replay_passes_every_argument_kind() -> None:
    """Pointers (NULL included), negative ints, int64 and float32 scalars reach the C function
    the same through a replay program's 64-bit slots as through ctypes."""
    import ctypes

    from ironlm_cpu.cbuild import KernelLibrary, Recording
    from ironlm_cpu.graphs import CpuStepGraph, ReplayLibrary

    ptr = ctypes.c_void_p
    lib = KernelLibrary("test_args_probe", _ARGS_SOURCE, {"args_probe": (
        [ptr, ptr, ptr, ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_float], None)},
        "argument probe")  # fmt: skip
    replay = ReplayLibrary()
    if not (lib.available and replay.available):
        pytest.skip(lib.reason or replay.reason)
    x, z = torch.randn(40), torch.randn(8)
    ys = [torch.zeros(8) for _ in range(3)]
    recording = Recording()
    lib.recorder = recording
    fn = lib.lib.args_probe
    lib.call(fn, ys[0].data_ptr(), x.data_ptr(), None, 8, 30, -1.5, 2.25)
    lib.call(fn, ys[1].data_ptr(), x.data_ptr(), z.data_ptr(), 8, 3, 1e-3, -7.0)
    lib.call(fn, ys[2].data_ptr(), x.data_ptr(), None, -4, 0, 1.0, 0.0)
    lib.recorder = None
    want = [y.clone() for y in ys]
    assert want[2].abs().sum() == 0 and torch.equal(want[0], -1.5 * x[30:38] + 2.25 + 1)
    graph = CpuStepGraph(recording.calls, [x, z, *ys], recording.thunks, replay)
    assert graph.python_calls == 1
    for y in ys:
        y.fill_(5.0)
    graph.replay()
    assert torch.equal(ys[0], want[0]) and torch.equal(ys[1], want[1])
    assert torch.equal(ys[2], torch.full((8,), 5.0))  # n = -4: untouched


def test_replay_recomputes_from_static_inputs(ops: CpuLayerOps) -> None:
    torch.manual_seed(0)
    weight = ops.pack_linear_weight(torch.randn(64, 32))
    norm_w = torch.rand(32)
    x = torch.zeros(3, 32)

    def forward() -> torch.Tensor:
        h, _ = ops.rms_norm(x, norm_w, 1e-6, None)
        return ops.silu_and_mul(ops.linear(h, weight, None))

    graph, out = CpuGraphCapture(ops.libraries()).capture(forward)
    assert len(graph) == 3
    for _ in range(2):
        x.copy_(torch.randn(3, 32))
        graph.replay()
        h, _ = ops.rms_norm(x, norm_w, 1e-6, None)
        want = ops.silu_and_mul(ops.linear(h, weight, None))
        torch.testing.assert_close(out, want)


def test_bfloat16_replay_recomputes_and_converts(ops: CpuLayerOps) -> None:
    """bf16 norm and activation replayed as C calls; the trailing ``.float()`` (as a bf16 LM
    head's logits take) is recorded as a copy into the converted tensor."""
    torch.manual_seed(0)
    norm_w = torch.rand(32).bfloat16()
    x = torch.zeros(3, 32, dtype=torch.bfloat16)

    def forward() -> torch.Tensor:
        h, _ = ops.rms_norm(x, norm_w, 1e-6, None)
        return ops.silu_and_mul(h).float()

    graph, out = CpuGraphCapture(ops.libraries()).capture(forward)
    assert len(graph) == 3 and out.dtype == torch.float32
    for _ in range(2):
        x.copy_(torch.randn(3, 32))
        graph.replay()
        want = ops.silu_and_mul(ops.rms_norm(x, norm_w, 1e-6, None)[0]).float()
        assert torch.equal(out, want)


@pytest.mark.parametrize(
    "body, message",
    [
        (lambda x, y: y + 1, "add"),
        (lambda x, y: y.add_(1), "in-place"),
        (lambda x, y: y[: int(y[0, 0])], "reads tensor data"),
        (lambda x, y: y[: round(y[0, 0].item())], "reads tensor data"),
        (lambda x, y: (y.__setitem__((0, 0), 2.0), y)[1], "in-place torch op __setitem__"),
        (lambda x, y: torch.add(y, 1, out=torch.empty_like(y)), "out="),
    ],
)
def test_capture_refuses_ops_a_replay_would_skip(ops: CpuLayerOps, body: Any, message: str) -> None:
    x, w = torch.randn(2, 16), torch.ones(16)

    def forward() -> torch.Tensor:
        y, _ = ops.rms_norm(x, w, 1e-6, None)
        return body(x, y)

    libs = ops.libraries()
    with pytest.raises(GraphCaptureError, match=message):
        CpuGraphCapture(libs).capture(forward)
    assert all(lib.recorder is None for lib in libs)  # recording is off again


def test_capture_needs_a_kernel_call(ops: CpuLayerOps) -> None:
    x = torch.randn(2, 4)
    with pytest.raises(GraphCaptureError, match="none of the cpu plugin"):
        CpuGraphCapture(ops.libraries()).capture(lambda: x[:1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemma3_graph_matches_eager(gemma3_dir: Path, dtype: str) -> None:
    """Gemma 3's embedding scale (in the row lookup) and per-head q/k norms (on views of the
    qkv output) are C calls too, so its decode steps replay: same tokens and logprobs."""
    _replay_matches_eager(gemma3_dir, dtype, 12)


def test_failed_capture_falls_back_to_eager(
    tmp_path: Path, smollm2_dir: Path, ops: CpuLayerOps
) -> None:
    """A Gemma 3 with a final logit soft cap (torch ops after the LM head): the capture
    refuses its first op, graphs turn off with the reason, and generation gives the eager
    tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
        sliding_window=8, final_logit_softcapping=15.0, architectures=["Gemma3ForCausalLM"],
        eos_token_id=2, bos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(tmp_path)
    graphs, eager = _engine(tmp_path, False), _engine(tmp_path, True)
    got, want = _run(graphs, PROMPTS[:2], 8), _run(eager, PROMPTS[:2], 8)
    assert [g[0] for g in got] == [w[0] for w in want]
    dg = _runner(graphs).graphs
    assert dg is not None and dg.disabled is not None and "torch op div" in dg.disabled
    assert not dg.graphs


def test_other_steps_stay_eager(tiny_llama_dir: Path, ops: CpuLayerOps) -> None:
    """Prompt logprobs, embeddings and prefill chunks are not decode-graph steps."""
    llm = _engine(tiny_llama_dir, False)
    params = SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=1)
    out = llm.generate(["Hello there"], params, use_tqdm=False)[0]
    assert out.prompt_logprobs is not None and len(out.outputs[0].token_ids) == 3
    emb = llm.encode(["Hello there"], use_tqdm=False)[0]
    assert emb.outputs.data.shape == (64,)  # tiny Llama hidden size
