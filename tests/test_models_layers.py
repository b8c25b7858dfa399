"""The model layers on their own: RMSNorm (fused residual, Gemma's 1 + w), rotary frequencies
against transformers' rope functions, and tensor-parallel sharding of the linear layers,
simulated rank by rank (each rank's load and matmul; the collective is a plain sum here)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ironlm.attention.reference import ReferenceAttentionBackend
from ironlm.interfaces.model import ModelContext
from ironlm.interfaces.platform import LayerOps
from ironlm.interfaces.quantization import QuantizationMethod, UnquantizedMethod
from ironlm.layers.layernorm import RMSNorm
from ironlm.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from ironlm.layers.rotary_embedding import RotaryEmbedding, inverse_frequencies, rope_parameters


def _ctx(
    tp_rank: int = 0, tp_size: int = 1, quant: QuantizationMethod | None = None
) -> ModelContext:
    return ModelContext(
        attention=ReferenceAttentionBackend(),
        layer_ops=LayerOps(),
        quantization=quant or UnquantizedMethod(),
        dtype=torch.float32,
        device=torch.device("cpu"),
        tp_rank=tp_rank,
        tp_size=tp_size,
    )


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_rms_norm_fused_residual_and_gemma_offset() -> None:
    x, r = _rand(5, 16, seed=0), _rand(5, 16, seed=1)
    w = _rand(16, seed=2)
    norm = RMSNorm(16, 1e-6, _ctx())
    norm.load_weight("weight", w)
    out, new_residual = norm(x, r)
    s = x + r
    expected = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(new_residual, s)
    gemma = RMSNorm(16, 1e-6, _ctx(), weight_offset=1.0)
    gemma.load_weight("weight", w)
    torch.testing.assert_close(gemma.weight, w + 1)  # the offset is folded in once, at load
    with pytest.raises(ValueError, match="does not fit"):
        gemma.load_weight("weight", torch.zeros(3))


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ],
)
def test_rotary_frequencies_match_transformers(rope: dict[str, Any]) -> None:
    config = LlamaConfig(
        hidden_size=512, num_attention_heads=4, max_position_embeddings=131072, rope_parameters=rope
    )
    params = rope_parameters(config)
    ours = inverse_frequencies(128, params)
    if rope["rope_type"] == "default":
        ref = 1.0 / (10000.0 ** (torch.arange(0, 128, 2).float() / 128))
    else:
        ref, scaling = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, torch.device("cpu"))
        assert scaling == 1.0
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0)


def test_rotary_errors_and_lookup() -> None:
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        inverse_frequencies(8, {"rope_type": "yarn", "rope_theta": 1.0, "factor": 2.0})
    per_type = LlamaConfig(hidden_size=64, num_attention_heads=4)
    per_type.rope_parameters = {"full_attention": {"rope_theta": 1.0}, "sliding_attention": {}}
    with pytest.raises(ValueError, match="name the layer type"):
        rope_parameters(per_type)
    rotary = RotaryEmbedding(8, 32, {"rope_type": "default", "rope_theta": 100.0}, _ctx())
    cos, sin = rotary.lookup(torch.tensor([0, 31]))
    assert (
        cos.shape == (2, 4)
        and torch.equal(cos[0], torch.ones(4))
        and torch.equal(sin[0], torch.zeros(4))
    )


def test_column_and_row_parallel_shards_compose() -> None:
    """tp=2: the column shards concatenate to the full output, the row shards sum to it."""
    x = _rand(3, 8, seed=3)
    w_col, b_col, w_row = _rand(6, 8, seed=4), _rand(6, seed=5), _rand(8, 6, seed=6)
    full_col = x @ w_col.T + b_col
    cols, partials = [], []
    for rank in range(2):
        col = ColumnParallelLinear(8, 6, _ctx(rank, 2), bias=True)
        col.load_weight("weight", w_col)
        col.load_weight("bias", b_col)
        cols.append(col(x))
        row = RowParallelLinear(6, 8, _ctx(rank, 2))
        row.load_weight("weight", w_row)
        # the all-reduce's input on this rank: its input slice times its weight slice
        partials.append(row.quant_method.apply(row, full_col[:, rank * 3 : rank * 3 + 3], None))
    torch.testing.assert_close(torch.cat(cols, -1), full_col)
    torch.testing.assert_close(sum(partials), full_col @ w_row.T)


@pytest.mark.parametrize("num_kv_heads", [4, 1])  # split KV heads / one KV head replicated
def test_qkv_shards(num_kv_heads: int) -> None:
    head_dim, heads, hidden = 2, 4, 8
    wq = _rand(heads * head_dim, hidden, seed=7)
    wk = _rand(num_kv_heads * head_dim, hidden, seed=8)
    wv = _rand(num_kv_heads * head_dim, hidden, seed=9)
    x = _rand(3, hidden, seed=10)
    q_full, k_full, v_full = x @ wq.T, x @ wk.T, x @ wv.T
    one = QKVParallelLinear(hidden, head_dim, heads, num_kv_heads, _ctx())
    for shard, w in (("q", wq), ("k", wk), ("v", wv)):
        one.load_weight("weight", w, shard)
    torch.testing.assert_close(one(x), torch.cat([q_full, k_full, v_full], -1))
    qs = []
    for rank in range(2):
        layer = QKVParallelLinear(hidden, head_dim, heads, num_kv_heads, _ctx(rank, 2))
        for shard, w in (("q", wq), ("k", wk), ("v", wv)):
            layer.load_weight("weight", w, shard)
        q, k, v = layer(x).split([layer.q_size, layer.kv_size, layer.kv_size], -1)
        qs.append(q)
        kv_heads = layer.num_kv_heads * head_dim
        kv_start = 0 if num_kv_heads == 1 else rank * kv_heads
        torch.testing.assert_close(k, k_full[:, kv_start : kv_start + kv_heads])
        torch.testing.assert_close(v, v_full[:, kv_start : kv_start + kv_heads])
    torch.testing.assert_close(torch.cat(qs, -1), q_full)


def test_merged_gate_up_shards() -> None:
    gate, up, x = _rand(6, 4, seed=11), _rand(6, 4, seed=12), _rand(2, 4, seed=13)
    for tp in (1, 2):
        outs = []
        for rank in range(tp):
            layer = MergedColumnParallelLinear(4, [6, 6], _ctx(rank, tp))
            layer.load_weight("weight", gate, 0)
            layer.load_weight("weight", up, 1)
            g, u = layer(x).chunk(2, -1)  # [gate_r | up_r]
            outs.append((g, u))
        torch.testing.assert_close(torch.cat([g for g, _ in outs], -1), x @ gate.T)
        torch.testing.assert_close(torch.cat([u for _, u in outs], -1), x @ up.T)
    with pytest.raises(ValueError, match="part index"):
        layer.load_weight("weight", gate, "q")


class _PerTensorScaleMethod(UnquantizedMethod):
    """Float weights plus a per-row and a per-tensor scale, as int8 schemes register them."""

    name = "test-scales"

    def create_weights(
        self, layer: torch.nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        super().create_weights(layer, in_features, out_features, dtype)
        layer.weight_scale = torch.nn.Parameter(torch.empty(out_features, 1), requires_grad=False)
        layer.input_scale = torch.nn.Parameter(torch.empty(1), requires_grad=False)


def test_merged_per_tensor_params_must_agree() -> None:
    layer = QKVParallelLinear(8, 2, 4, 2, _ctx(quant=_PerTensorScaleMethod()))
    for shard, rows in (("k", 4), ("q", 8), ("v", 4)):
        layer.load_weight("weight_scale", torch.full((rows, 1), float(rows)), shard)
        layer.load_weight("input_scale", torch.tensor([0.5]), shard)
    assert layer.weight_scale.flatten().tolist() == [8.0] * 8 + [4.0] * 8
    assert layer.input_scale.item() == 0.5
    with pytest.raises(ValueError, match="differs between the merged"):
        layer.load_weight("input_scale", torch.tensor([0.25]), "v")
