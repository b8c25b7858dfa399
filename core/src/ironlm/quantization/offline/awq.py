"""AWQ (Lin et al., 2023): activation-aware per-channel scales, then clipping, then 4-bit.

Input channels that carry large activations matter most; scaling such a channel's weights up by
s (and the producer of its input down by s, so the float function is unchanged) gives it finer
quantization steps. Per linear group of a decoder layer the scales are searched on a grid:
    s = mean|x| ^ r / mean|w~| ^ (1 - r),  r in {0, 1/20, ..., 19/20}, normalised to
    sqrt(max s * min s) = 1  (w~: weights normalised by their group's max; unscaled s = 1 is a
    candidate too), keeping the s whose block output under fake-quantized weights is closest
    (mean squared error) to the float output on the calibration activations:
    input_layernorm -> q/k/v (block: the attention with o_proj)
    v_proj -> o_proj (only without grouped KV heads, where shapes match)
    post_attention_layernorm -> gate/up (block: the MLP)
    up_proj -> down_proj (block: down_proj)
Then each linear but q/k searches a per-group clipping range, max |w| * (1 - i/20) for
i < 10, minimising the error of every group's output contribution. Layer inputs are the float
model's (the scaled layer computes the same function).
"""

from __future__ import annotations

from typing import Callable

import torch

from ironlm.quantization.offline.llama_block import (
    ATTN_O,
    ATTN_QKV,
    MLP_DOWN,
    MLP_GATE_UP,
    DecoderLayer,
)
from ironlm.quantization.rtn import fake_int4, int4_params

GRID = 20
MAX_SHRINK = 0.5
CLIP_TOKENS = 256  # tokens of the clip search (the per-group outputs are tokens x rows x groups)

Block = Callable[[dict[str, torch.Tensor]], torch.Tensor]


def fake_quant(w: torch.Tensor, group_size: int, zero_points: bool) -> torch.Tensor:
    scale, zero = int4_params(w, group_size, zero_points)
    return fake_int4(w, scale, zero, group_size)


def awq_layer(
    layer: DecoderLayer,
    x: torch.Tensor,  # (T, hidden) the layer's input
    lengths: list[int],
    group_size: int,
    zero_points: bool,
    search_tokens: int,
) -> None:
    """Search and fold the scales, then clip, in ``layer``'s float tensors (in place). The
    activation statistics use every calibration token; the block losses the first
    ``search_tokens`` (a causal prefix of the first sequences)."""
    shape = layer.shape
    keep, n = [], 0  # the loss's sequences: whole ones, the last cut short
    for length in lengths:
        take = min(length, search_tokens - n)
        if take <= 0:
            break
        keep.append(take)
        n += take
    xs = _prefixes(x, lengths, keep)

    def search(inp: torch.Tensor, names: tuple[str, ...], block: Block) -> torch.Tensor:
        return _search(inp, layer, names, block, group_size, zero_points)

    h, hs = layer.attn_input(x), layer.attn_input(xs)
    s = search(h, ATTN_QKV, lambda w: layer.attn_block(hs, keep, w))
    _fold_into_norm(layer, "input_layernorm", ATTN_QKV, s)
    h, hs = layer.attn_input(x), layer.attn_input(xs)
    if shape.num_heads == shape.num_kv_heads:
        o_in, o_s = layer.attention(h, lengths), layer.attention(hs, keep)
        s = search(o_in, (ATTN_O,), lambda w: layer.linear(ATTN_O, o_s, w.get(ATTN_O)))
        _fold_into_rows(layer, ATTN_QKV[2], (ATTN_O,), s)
    o_in = layer.attention(h, lengths)
    h2 = layer.mlp_input(x + layer.linear(ATTN_O, o_in))
    h2s = _prefixes(h2, lengths, keep)
    s = search(h2, MLP_GATE_UP, lambda w: layer.mlp_block(h2s, w))
    _fold_into_norm(layer, "post_attention_layernorm", MLP_GATE_UP, s)
    h2 = layer.mlp_input(x + layer.linear(ATTN_O, o_in))
    m = layer.down_input(h2)
    ms = _prefixes(m, lengths, keep)
    s = search(m, (MLP_DOWN,), lambda w: layer.linear(MLP_DOWN, ms, w.get(MLP_DOWN)))
    _fold_into_rows(layer, MLP_GATE_UP[1], (MLP_DOWN,), s)
    m = layer.down_input(h2)

    inputs = {ATTN_QKV[2]: h, ATTN_O: o_in, MLP_GATE_UP[0]: h2, MLP_GATE_UP[1]: h2, MLP_DOWN: m}
    for name, inp in inputs.items():
        w = layer.weight(name)
        layer.t[f"{name}.weight"] = clip_search(w, inp, group_size, zero_points)


def _prefixes(x: torch.Tensor, lengths: list[int], keep: list[int]) -> torch.Tensor:
    """The first ``keep[i]`` rows of each of the first sequences of a flat batch."""
    starts = [sum(lengths[:i]) for i in range(len(keep))]
    return torch.cat([x[s : s + k] for s, k in zip(starts, keep)])


def _search(
    x: torch.Tensor,
    layer: DecoderLayer,
    names: tuple[str, ...],
    block: Block,
    group_size: int,
    zero_points: bool,
) -> torch.Tensor:
    """The best per-input-channel scales (C,) for the linears ``names`` reading ``x`` (all
    calibration tokens: the statistics), judged by ``block`` (the loss's tokens)."""
    with torch.no_grad():
        target = block({})
        weights = [layer.weight(n) for n in names]
        x_mean = x.abs().mean(dim=0)  # (C,)
        stacked = torch.cat(weights)  # (rows, C)
        rows, cols = stacked.shape
        grouped = stacked.abs().view(rows, cols // group_size, group_size)
        w_norm = grouped / grouped.amax(dim=-1, keepdim=True).clamp(min=1e-8)
        w_mean = w_norm.view(rows, cols).mean(dim=0)  # (C,)
        best_s, best_loss = torch.ones_like(x_mean), _loss(block, names, weights, None,
                                                           target, group_size, zero_points)
        for i in range(GRID):
            r = i / GRID
            s = (x_mean.pow(r) / (w_mean.pow(1.0 - r) + 1e-4)).clamp(min=1e-4)
            s = s / (s.max() * s.min()).sqrt()
            loss = _loss(block, names, weights, s, target, group_size, zero_points)
            if loss < best_loss:
                best_s, best_loss = s, loss
        return best_s


def _loss(
    block: Block,
    names: tuple[str, ...],
    weights: list[torch.Tensor],
    s: torch.Tensor | None,
    target: torch.Tensor,
    group_size: int,
    zero_points: bool,
) -> float:
    trial = {}
    for name, w in zip(names, weights):
        if s is None:
            trial[name] = fake_quant(w, group_size, zero_points)
        else:
            trial[name] = fake_quant(w * s, group_size, zero_points) / s
    return float((block(trial) - target).pow(2).mean())


def _fold_into_norm(
    layer: DecoderLayer, norm: str, consumers: tuple[str, ...], s: torch.Tensor
) -> None:
    layer.t[f"{norm}.weight"] = layer.t[f"{norm}.weight"] / s
    for c in consumers:
        layer.t[f"{c}.weight"] = layer.t[f"{c}.weight"] * s


def _fold_into_rows(
    layer: DecoderLayer, producer: str, consumers: tuple[str, ...], s: torch.Tensor
) -> None:
    layer.t[f"{producer}.weight"] = layer.t[f"{producer}.weight"] / s.unsqueeze(1)
    if f"{producer}.bias" in layer.t:
        layer.t[f"{producer}.bias"] = layer.t[f"{producer}.bias"] / s
    for c in consumers:
        layer.t[f"{c}.weight"] = layer.t[f"{c}.weight"] * s


def clip_search(
    w: torch.Tensor, x: torch.Tensor, group_size: int, zero_points: bool
) -> torch.Tensor:
    """``w`` (N, K) clamped per (row, group) to the range whose fake-quantized group output
    on ``x`` (T, K) is closest to the unclipped float one."""
    n, k = w.shape
    groups = k // group_size
    step = max(1, x.shape[0] // CLIP_TOKENS)
    xs = x[::step][:CLIP_TOKENS].view(-1, groups, group_size)  # (t, g, G)
    wg = w.view(n, groups, group_size)
    target = torch.einsum("tgj,ngj->tng", xs, wg)
    org_max = wg.abs().amax(dim=-1, keepdim=True)  # (N, g, 1)
    best_max = org_max.clone()
    best_err = torch.full((n, groups, 1), float("inf"))
    for i in range(int(MAX_SHRINK * GRID)):
        max_val = org_max * (1.0 - i / GRID)
        clipped = torch.maximum(torch.minimum(wg, max_val), -max_val).reshape(n, k)
        q = fake_quant(clipped, group_size, zero_points).view(n, groups, group_size)
        err = (torch.einsum("tgj,ngj->tng", xs, q) - target).pow(2).mean(dim=0).unsqueeze(-1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_max = torch.where(better, max_val, best_max)
    return torch.maximum(torch.minimum(wg, best_max), -best_max).reshape(n, k)
