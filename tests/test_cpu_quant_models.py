"""The cpu plugin's quantized kernels on real weights.

- Real GGUF tensors (SmolLM2's Q4_1 linears and Q8_0 token table, Gemma 3's Q4_K and Q6_K
  linears) against the core's reference, on real activations (token embeddings) where the width
  allows.
- SmolLM2 with its linears quantized into each canonical layout (tests/quant_test_helpers.py):
  greedy tokens and logits on the cpu layer ops equal the core's reference LayerOps.
- Decode graphs of quantized models replay to the eager tokens (the quantized kernels are
  recorded like every other C call).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ironlm import LLM, SamplingParams
from ironlm.attention.reference import ReferenceAttentionBackend
from ironlm.interfaces.model import ModelContext
from ironlm.interfaces.platform import LayerOps
from ironlm.interfaces.quant import QuantLayout, reference_embedding, reference_linear
from ironlm.model_loader import load_model, resolve_model
from ironlm.model_loader.downloads import ensure_test_gguf
from ironlm.model_loader.gguf_file import GGUFFile
from ironlm.plugin_manager import PluginManager

from ironlm_cpu.layer_ops import CpuLayerOps
from quant_test_helpers import RtnTestPlugin, greedy_tokens, rtn_method
from test_cpu_quant_kernels import emulate_q8
from test_models_helpers import ARCHITECTURES


@pytest.fixture(scope="module")
def ops() -> CpuLayerOps:
    layer_ops = CpuLayerOps()
    if not layer_ops.quant.available:
        pytest.skip(layer_ops.quant.reason)
    return layer_ops


def gguf_tensors(path: Path, names: list[str]) -> dict[str, tuple[QuantLayout, dict[str, torch.Tensor]]]:
    gguf = GGUFFile(path)
    found = {t.name: t for t in gguf.tensors if t.name in names}
    return {
        name: (QuantLayout("gguf", ggml_type=found[name].ggml_type),
               {"qweight": torch.from_numpy(np.array(gguf.raw(found[name])))})
        for name in names
    }  # fmt: skip


def check_gguf_linear(ops: CpuLayerOps, layout: QuantLayout, tensors: dict[str, torch.Tensor],
                      x: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Decode-sized x: kernel vs the activation-rounding emulation (tight) and the float
    reference (loose); prefill-sized x (float panels): vs the float reference (tight)."""
    from ironlm.interfaces.quant import dequantize

    packed = ops.pack_quantized(layout, tensors)
    got = ops.quantized_linear(layout, x, packed, None)
    if x.shape[0] > 8:
        want = reference_linear(layout, x, tensors, None)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())
        return got
    block = 256 if layout.ggml_type in (12, 14) else 32
    w = dequantize(layout, tensors).double()
    emulated = (emulate_q8(x, block).double() @ w.t()).float()
    torch.testing.assert_close(got, emulated, rtol=1e-5, atol=2e-5 * emulated.abs().max().item())
    want = reference_linear(layout, x, tensors, None)
    assert ((got - want).norm() / want.norm()).item() < 0.02, layout.describe()
    return got


def test_smollm2_gguf_tensors(ops: CpuLayerOps) -> None:
    names = ["token_embd.weight", "blk.0.ffn_gate.weight", "blk.0.attn_q.weight",
             "blk.7.ffn_down.weight"]  # fmt: skip
    tensors = gguf_tensors(ensure_test_gguf("smollm2"), names)
    emb_layout, emb = tensors["token_embd.weight"]
    assert emb_layout.describe() == "gguf (Q8_0)"
    ids = torch.tensor([1, 504, 3937, 28, 9690, 49151, 17])
    emb_packed = ops.pack_quantized(emb_layout, emb)
    x = ops.quantized_embedding(emb_layout, ids, emb_packed)  # real activations, (7, 576)
    assert torch.equal(x, reference_embedding(emb_layout, ids, emb))
    for name in names[1:3]:
        layout, t = tensors[name]
        assert layout.describe() == "gguf (Q4_1)"
        check_gguf_linear(ops, layout, t, x)
        check_gguf_linear(ops, layout, t, x[:1])
    layout, t = tensors["blk.7.ffn_down.weight"]  # K = 1536
    g = torch.Generator().manual_seed(0)
    check_gguf_linear(ops, layout, t, torch.randn(3, 1536, generator=g))
    check_gguf_linear(ops, layout, t, torch.randn(40, 1536, generator=g))  # prefill: float panels
    # the tied LM head: a (49152, 576) Q8_0 matmul picks the reference's top token
    logits = check_gguf_linear(ops, emb_layout, emb, x)
    want = reference_linear(emb_layout, x, emb, None)
    assert torch.equal(logits.argmax(-1), want.argmax(-1))


def test_gemma3_k_quant_tensors(ops: CpuLayerOps) -> None:
    names = ["blk.0.attn_output.weight", "blk.0.ffn_down.weight"]
    tensors = gguf_tensors(ensure_test_gguf("gemma3"), names)
    g = torch.Generator().manual_seed(0)
    for name, kind in zip(names, ("Q4_K", "Q6_K")):
        layout, t = tensors[name]
        assert layout.describe() == f"gguf ({kind})"
        k = 1024 if kind == "Q4_K" else 2048
        for rows in (1, 5, 20):
            check_gguf_linear(ops, layout, t, torch.randn(rows, k, generator=g))
        ids = torch.tensor([0, 639, 100])
        packed = ops.pack_quantized(layout, t)
        assert torch.equal(ops.quantized_embedding(layout, ids, packed),
                           reference_embedding(layout, ids, t))


def _smollm2(smollm2_dir: Path, layer_ops: LayerOps, suffix: str) -> Any:
    source = resolve_model(str(smollm2_dir))
    ctx = ModelContext(attention=ReferenceAttentionBackend(), layer_ops=layer_ops,
                       quantization=rtn_method(suffix)(), dtype=torch.float32,
                       device=torch.device("cpu"))  # fmt: skip
    return load_model(source, ARCHITECTURES[source.architectures[0]], ctx, "auto", 0)


def test_smollm2_int4_greedy_tokens_match_reference_ops(
    smollm2_dir: Path, smollm2_tokenizer: Any, ops: CpuLayerOps
) -> None:
    """int4 group 32 with zero points: the kernel differs from the reference by summation
    order only, so greedy decoding (prefill, then one token per step) picks the same tokens."""
    prompt = smollm2_tokenizer("The quick brown fox jumps over the lazy dog. Then")["input_ids"]
    cpu_tokens, cpu_first = greedy_tokens(_smollm2(smollm2_dir, ops, "int4"), prompt, 4)
    ref_tokens, ref_first = greedy_tokens(_smollm2(smollm2_dir, LayerOps(), "int4"), prompt, 4)
    assert cpu_tokens == ref_tokens
    assert (cpu_first - ref_first).abs().max().item() <= 1e-3 * ref_first.abs().max().item()


# layout -> tolerated relative L2 distance of the prompt's logits from the reference ops'
LOGIT_TOLERANCE = {
    "int8": 1e-4, "fp8": 1e-4,  # float activations: summation order only
    "w8a8": 0.01,  # the reference's integers; other ops' float rounding can flip an activation's
                   # int8 rounding, which later layers carry
    "q4_1": 0.1,  # GGUF: activations rounded to int8 per 32 elements as llama.cpp does; over 30
                  # layers that moves SmolLM2's logits by ~5% (measured), not its top tokens
}  # fmt: skip


@pytest.mark.parametrize("suffix", list(LOGIT_TOLERANCE))
def test_smollm2_quantized_logits_match_reference_ops(
    smollm2_dir: Path, smollm2_tokenizer: Any, ops: CpuLayerOps, suffix: str
) -> None:
    prompt = smollm2_tokenizer("The capital of France is")["input_ids"]
    _, cpu = greedy_tokens(_smollm2(smollm2_dir, ops, suffix), prompt, 0)
    _, ref = greedy_tokens(_smollm2(smollm2_dir, LayerOps(), suffix), prompt, 0)
    # each side's top 3 among the other's top 5 (SmolLM2's 5th to 7th logits here lie within
    # 0.1 of each other, and q4_1 moves logits by ~4%: the 5th place may swap on another CPU)
    top5 = set(cpu.topk(5).indices.tolist()), set(ref.topk(5).indices.tolist())
    assert set(cpu.topk(3).indices.tolist()) <= top5[1]
    assert set(ref.topk(3).indices.tolist()) <= top5[0]
    assert int(cpu.argmax()) == int(ref.argmax())
    assert ((cpu - ref).norm() / ref.norm()).item() < LOGIT_TOLERANCE[suffix]


def _run(llm: LLM, prompts: list[str], n: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("suffix, model", [("int4", "tiny"), ("w8a8", "tiny"), ("q8_0", "tiny"),
                                           ("int4sym", "smollm2")])  # fmt: skip
def test_quantized_decode_graphs_replay_eager_tokens(
    tiny_llama_dir: Path, smollm2_dir: Path, ops: CpuLayerOps, suffix: str, model: str,
    c_decode_attention: None,  # conftest: the graphs need the C decode kernel
) -> None:
    pm = PluginManager()
    pm.register(RtnTestPlugin(), "test-rtn")
    path = str(tiny_llama_dir if model == "tiny" else smollm2_dir)
    # 32 MiB: three 128-token blocks of SmolLM2's float32 KV, one per prompt (a batch of 3)
    kwargs: dict[str, Any] = dict(device="cpu", max_model_len=128, kv_cache_memory=32 * 2**20,
                                  quantization=f"test_rtn_{suffix}", plugin_manager=pm,
                                  dtype="float32")  # fmt: skip
    graphs, eager = LLM(path, enforce_eager=False, **kwargs), LLM(path, enforce_eager=True, **kwargs)
    prompts = ["The capital of France is", "def fib(n):", "Once upon a time"]
    assert _run(graphs, prompts, 12) == _run(eager, prompts, 12)
    dg = graphs.engine.executor.worker.model_runner.graphs
    assert dg is not None and dg.disabled is None and 4 in dg.graphs
    # the recorded calls include the quantized linears (one C entry point, same address in
    # every ctypes handle of the library)
    entry = ctypes.cast(ops.quant.lib.ironlm_quant_linear, ctypes.c_void_p).value
    calls = [ctypes.cast(fn, ctypes.c_void_p).value for fn, _ in dg.graphs[4].graph.calls]
    assert calls.count(entry) == 4 * (2 if model == "tiny" else 30)
