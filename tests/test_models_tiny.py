"""Our Llama-family and Gemma 3 models against HF transformers on tiny random configs: the same
state dict, one prefill plus decode steps through the paged KV cache (reference attention), and
a mixed batch with chunked prefill next to decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_models_helpers import (
    PagedRunner,
    assert_logits_close,
    hf_logits,
    load_ours,
    run_prefill_then_decode,
)
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
)

VOCAB = 96
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
)


def _configs() -> dict[str, PretrainedConfig]:
    return {
        "llama": LlamaConfig(**COMMON, architectures=["LlamaForCausalLM"]),
        "llama-linear-rope": LlamaConfig(
            **COMMON,
            architectures=["LlamaForCausalLM"],
            rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 5000.0},
            attention_bias=True,
            mlp_bias=True,
        ),
        "llama3-rope": LlamaConfig(
            **{**COMMON, "max_position_embeddings": 256},
            architectures=["LlamaForCausalLM"],
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            tie_word_embeddings=True,
        ),
        "mistral-sliding": MistralConfig(
            **COMMON, architectures=["MistralForCausalLM"], sliding_window=7
        ),
        "qwen2": Qwen2Config(
            **COMMON, architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True
        ),
        "qwen3": Qwen3Config(
            **COMMON, architectures=["Qwen3ForCausalLM"], head_dim=24, tie_word_embeddings=False
        ),
        "gemma3": Gemma3TextConfig(
            **{**COMMON, "num_hidden_layers": 4, "num_key_value_heads": 1},
            architectures=["Gemma3ForCausalLM"],
            head_dim=32,
            query_pre_attn_scalar=24,
            sliding_window=6,
            layer_types=[
                "sliding_attention",
                "sliding_attention",
                "full_attention",
                "sliding_attention",
            ],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            },
            # HF's Gemma 3 keeps attn_logit_softcapping in its config but never applies it
            # (the released configs set it to null), so the comparison leaves it off
            attn_logit_softcapping=None,
            final_logit_softcapping=15.0,
            pad_token_id=0,
        ),
    }


def _save_random_hf(config: PretrainedConfig, folder: Path, seed: int = 0) -> Any:
    """An HF model with random weights (norms and biases perturbed too), saved as safetensors."""
    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=list(_configs()))
def tiny_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp(request.param)
    hf = _save_random_hf(_configs()[request.param], folder)
    return request.param, hf, load_ours(folder)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_prefill_then_decode_matches_hf(tiny_pair) -> None:  # type: ignore[no-untyped-def]
    name, hf, ours = tiny_pair
    tokens = _tokens(21, seed=1)  # longer than the sliding windows (7 / 6)
    assert_logits_close(run_prefill_then_decode(ours, tokens, num_decode=5), hf_logits(hf, tokens))


def test_mixed_batch_matches_hf(tiny_pair) -> None:  # type: ignore[no-untyped-def]
    """Two sequences share steps: chunked prefill of one next to decode of the other."""
    name, hf, ours = tiny_pair
    a, b = _tokens(17, seed=2), _tokens(11, seed=3)
    runner = PagedRunner(ours, num_blocks=16, block_size=4)
    sa, sb = runner.add_sequence(len(a)), runner.add_sequence(len(b))
    out_a: list[torch.Tensor] = []
    out_b: list[torch.Tensor] = []
    for chunk_a, chunk_b in [((0, 6), (0, 9)), ((6, 13), (9, 10)), ((13, 14), (10, 11))]:
        la, lb = runner.step({sa: a[slice(*chunk_a)], sb: b[slice(*chunk_b)]})
        out_a.append(la)
        out_b.append(lb)
    for t in a[14:]:
        out_a += runner.step({sa: [t]})
    assert_logits_close(torch.cat(out_a), hf_logits(hf, a))
    assert_logits_close(torch.cat(out_b), hf_logits(hf, b))


def test_attention_specs(tiny_pair) -> None:  # type: ignore[no-untyped-def]
    name, hf, ours = tiny_pair
    specs = ours.attention_layers()
    assert [s.layer_index for s in specs] == list(range(hf.config.num_hidden_layers))
    windows = [s.sliding_window for s in specs]
    if name == "gemma3":
        assert windows == [6, 6, None, 6]
        assert specs[0].scale == pytest.approx(24**-0.5)
        assert specs[0].logits_soft_cap is None
    elif name == "mistral-sliding":
        assert windows == [7, 7, 7]
    else:
        assert windows == [None] * 3
    if name == "qwen3":
        assert specs[0].head_dim == 24


def test_merged_projections(tiny_pair) -> None:  # type: ignore[no-untyped-def]
    """q/k/v and gate/up live in one weight each (one matmul instead of three / two)."""
    name, hf, ours = tiny_pair
    layer = ours.model.layers[0]
    cfg = hf.config
    head_dim = specs_head_dim = ours.attention_layers()[0].head_dim
    qkv_rows = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * specs_head_dim
    assert layer.self_attn.qkv_proj.weight.shape == (qkv_rows, cfg.hidden_size)
    assert layer.mlp.gate_up_proj.weight.shape == (2 * cfg.intermediate_size, cfg.hidden_size)
    assert head_dim > 0
