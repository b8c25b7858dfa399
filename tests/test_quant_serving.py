"""Every quantization method serves on the real SmolLM2: ``LLM(..., quantization=NAME)`` for
each registered method (online on the float folder, from the tool's checkpoints, the GGUF file),
``ironlm serve`` on a quantized folder with the official openai client, and GGUF files kept
quantized in memory (SmolLM2's Q4_1; Gemma 3's Q4_K_M mix, whose merged layers hold parts of
different block types)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Callable

import pytest
import torch
from quant_helpers import load
from server_utils import RemoteServer
from test_models_helpers import load_ours, run_prefill_then_decode

from ironlm import LLM, SamplingParams
from ironlm.model_loader.downloads import ensure_test_gguf

pytestmark = pytest.mark.real_model

PROMPT = "The capital of France is"
GREEDY = SamplingParams(temperature=0, max_tokens=8)


def _generate(model: Path, quantization: str | None) -> str:
    llm = LLM(str(model), quantization=quantization, max_model_len=256,
              kv_cache_memory=64 << 20, dtype="float32")  # fmt: skip  (as the server below)
    try:
        return llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].text
    finally:
        del llm
        gc.collect()


@pytest.mark.parametrize("name", [
    "weight_only_int8", "smooth_quant", "weight_only_int4", "fp8",  # online, on the float folder
    "awq", "gptq",  # the tool's checkpoints, named explicitly
    "gguf",  # the GGUF file
])
def test_llm_serves_every_method_by_name(
    name: str, smollm2_dir: Path, quantized_smollm2: Callable[[str], Path]
) -> None:
    """8-bit methods keep the float model's greedy answer; for 4-bit ones (+12% to +41%
    perplexity) " Paris" stays among the two likeliest next tokens (the GPTQ checkpoint's
    greedy answer flips between " Paris" and " the" with the calibration's float summation
    order: rank 2 at -1.42 against -0.86 in one CI run)."""
    model = {"awq": lambda: quantized_smollm2("awq"), "gptq": lambda: quantized_smollm2("gptq"),
             "gguf": lambda: ensure_test_gguf("smollm2")}.get(name,
                                                              lambda: smollm2_dir)()  # fmt: skip
    llm = LLM(str(model), quantization=name, max_model_len=256, kv_cache_memory=64 << 20)
    try:
        params = SamplingParams(temperature=0, max_tokens=8, logprobs=2)
        out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    finally:
        del llm
        gc.collect()
    assert out.text.strip()
    if name in ("weight_only_int8", "smooth_quant", "fp8"):
        assert "Paris" in out.text
    else:
        top = sorted(out.logprobs[0].values(), key=lambda lp: lp.rank)[:2]
        assert " Paris" in [lp.decoded_token for lp in top], top


def test_serve_quantized_folder_with_openai_client(
    quantized_smollm2: Callable[[str], Path]
) -> None:
    """``ironlm serve OUT`` on the tool's GPTQ folder, no flag: completions and chat through the
    openai client agree with the offline API on the same checkpoint."""
    folder = quantized_smollm2("gptq")
    offline = _generate(folder, None)
    args = ["--max-model-len", "256", "--kv-cache-memory", "64MiB", "--served-model-name", "q",
            "--dtype", "float32"]
    with RemoteServer(folder, args) as server:
        client = server.openai_client()
        assert [m.id for m in client.models.list().data] == ["q"]
        completion = client.completions.create(model="q", prompt=PROMPT, max_tokens=8,
                                               temperature=0)  # fmt: skip
        assert completion.choices[0].text == offline
        chat = client.chat.completions.create(
            model="q", messages=[{"role": "user", "content": "Name the capital of France."}],
            max_tokens=16, temperature=0,
        )
        assert "Paris" in (chat.choices[0].message.content or "")


def _kept(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes of GGML block rows kept, bytes of float weights) in the model's layers."""
    kept = floats = 0
    for module in model.modules():
        for layout, tensors in getattr(module, "gguf_segments", []):
            size = sum(t.numel() * t.element_size() for t in tensors.values())
            kept, floats = (kept + size, floats) if layout is not None else (kept, floats + size)
    embed = model.model.embed_tokens
    if embed.quant_packed is not None:
        kept += sum(t.numel() * t.element_size() for t in embed.quant_packed.values())
    return kept, floats


def test_smollm2_gguf_stays_quantized_and_matches_the_float_folder(smollm2_dir: Path) -> None:
    ids = [1, 504, 3216, 314, 253, 1345, 28, 9110, 30]
    gguf = load(ensure_test_gguf("smollm2"))  # no flag: the file's quantization_config
    layer = gguf.model.layers[0]
    assert [layout.describe() for layout, _ in layer.self_attn.qkv_proj.gguf_segments] == [
        "gguf (Q4_1)"]  # fmt: skip
    embed = gguf.model.embed_tokens
    assert embed.quant_layout is not None and embed.quant_layout.describe() == "gguf (Q8_0)"
    assert gguf.lm_head.quant_packed is embed.quant_packed  # the tied head shares the table
    kept, floats = _kept(gguf)
    assert floats == 0 and kept < 0.3 * 134_515_008 * 4  # SmolLM2's float32 bytes
    torch.testing.assert_close(run_prefill_then_decode(gguf, ids, num_decode=1),
                               run_prefill_then_decode(load_ours(smollm2_dir), ids, num_decode=1),
                               rtol=0, atol=1e-4)  # fmt: skip


def test_gemma3_q4_k_m_mixes_block_types_within_merged_layers(gemma3_dir: Path) -> None:
    """Gemma 3's file stores q/k in Q5_0 (dequantized at load: not a kept type), v in Q8_0 in
    half the layers, down_proj in Q4_K or Q6_K, the embedding in Q8_0."""
    gguf = load(ensure_test_gguf("gemma3"))
    kinds = {
        tuple(layout.describe() if layout else "float" for layout, _ in lin.gguf_segments)
        for layer in gguf.model.layers for lin in (layer.self_attn.qkv_proj, layer.mlp.down_proj)
    }  # fmt: skip
    assert ("float", "gguf (Q8_0)") in kinds  # q, k dequantized + v kept, one layer
    assert ("gguf (Q4_K)",) in kinds and ("gguf (Q6_K)",) in kinds
    method = gguf.model.layers[0].mlp.down_proj.quant_method
    assert {layout.describe() for layout in method.layouts()} == {
        "gguf (Q8_0)", "gguf (Q4_K)", "gguf (Q6_K)"}  # the kept types the file uses  # fmt: skip
    ids = [2, 818, 5279, 529, 7001, 563]
    torch.testing.assert_close(run_prefill_then_decode(gguf, ids, num_decode=1),
                               run_prefill_then_decode(load_ours(gemma3_dir), ids, num_decode=1),
                               rtol=0, atol=2e-3)  # fmt: skip
