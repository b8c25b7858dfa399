"""Top-k, top-p and min-p: the reference truncation of (B, V) scaled logits, and the
reference of ``LayerOps.truncated_categorical`` (truncate, then the categorical draw).

Definitions (vLLM's order, top-k before top-p): top-k keeps a row's k largest logits; top-p
then keeps each token whose mass strictly above it, under the softmax of what top-k kept, is at
most p (the smallest prefix that reaches p, plus the token that crosses it); min-p keeps the
tokens whose probability is at least min_p times the row's largest. Dropped tokens become -inf.

Why not sort every row: a (64, 49152) float32 sort costs ~130 ms on a 2-core x86 host, more
than a decode step of a 135M model at batch 64. Both filters need only a row's head: top-k its
k largest, top-p far fewer than the vocabulary (SmolLM2 answering chat prompts at temperature
0.7, top-p 0.9: 2 tokens kept at the median, 63 at the 99th percentile, 154 at most; random
token prompts: 44 / 747 / 1214). So a row is first resolved within its ``CANDIDATES`` largest
logits (``torch.topk``, sorted): a top-p row is resolved there when a candidate is already
dropped (every token below it is dropped too); the rows that are not try ``WIDEN`` times as
many, then the full sort, so the result is the full sort's up to rounding (a cut within an ulp
of a top-p boundary can fall on the other side, and which path a row takes depends on the
batch's other rows); ties at a top-k or top-p cut keep as many tokens as the sort did, not
necessarily the same ones (a prefix of an unspecified order among equal values, as before;
vLLM's top-k keeps every token equal to the k-th).
"""

from __future__ import annotations

import torch

from ironlm.interfaces.categorical import reference_categorical

_NEG_INF = float("-inf")
CANDIDATES = 128  # tokens a top-p row is first resolved within (see the module docstring)
WIDEN = 8  # how many times more the rows it does not settle try next


def reference_truncated_categorical(
    logits: torch.Tensor, scale: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
    min_p: torch.Tensor, u: torch.Tensor,
) -> torch.Tensor:
    """(B, V) float32 logits, (B, 1) scale, top_k (B, 1) int64 (V or more: none), top_p and
    min_p (B, 1) float32 (1 and 0: none), (B, 1) float64 u -> (B,) int64: the categorical
    draw (``reference_categorical``) from ``truncated_logits``."""
    x = truncated_logits(logits, scale, top_k, top_p, min_p)
    return reference_categorical(x, torch.ones_like(scale), u)


def truncated_logits(
    logits: torch.Tensor, scale: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """``truncate(logits * scale, ...)`` with the limits as ``LayerOps.truncated_categorical``
    takes them ((B, 1) tensors)."""
    return truncate(logits * scale, top_k.reshape(-1).tolist(), top_p.reshape(-1).tolist(),
                    min_p.reshape(-1).tolist())


def truncate(
    x: torch.Tensor, top_k: list[int], top_p: list[float], min_p: list[float]
) -> torch.Tensor:
    """(B, V) scaled logits and each row's limits (top_k V or more, or below 1: none; top_p 1:
    none; min_p 0: none) -> the same with every token outside each row's top-k / top-p /
    min-p set at -inf (``x`` itself when no row truncates)."""
    V = x.shape[1]
    ks = [k if 0 < k < V else V for k in top_k]
    if any(k < V for k in ks) or any(p < 1.0 for p in top_p):
        # a row of top-k only needs its k largest; a top-p row first tries CANDIDATES
        need = max([k for k in ks if k < V]
                   + [min(k, CANDIDATES) for k, p in zip(ks, top_p) if p < 1.0])
        x = _head(x, ks, top_p, need if 4 * need <= V else V)  # V: the full sort
    if any(m > 0 for m in min_p):
        # p_i < min_p * p_max  <=>  x_i < x_max + log(min_p): no softmax needed (rows
        # without min-p: log(0) = -inf drops nothing)
        floor = torch.tensor(min_p, device=x.device, dtype=torch.float64).log().to(x.dtype)
        x = x.masked_fill(x < x.amax(dim=-1, keepdim=True) + floor.unsqueeze(1), _NEG_INF)
    return x


def _head(x: torch.Tensor, ks: list[int], ps: list[float], n: int) -> torch.Tensor:
    """Top-k / top-p within each row's n largest logits (n = V: every row sorted whole);
    rows it cannot settle: a wider head, then the whole row."""
    V = x.shape[1]
    vals, ids = x.topk(n, dim=-1)  # (B, n), descending
    k = torch.tensor(ks, device=x.device).unsqueeze(1)  # (B, 1); V where a row has no top-k
    p = torch.tensor(ps, device=x.device, dtype=x.dtype).unsqueeze(1)
    pos = torch.arange(n, device=x.device).unsqueeze(0)
    vals = vals.masked_fill(pos >= k, _NEG_INF)
    # top-p's masses are under the softmax of what top-k kept: the head where top-k cut the
    # row (k <= n), else the whole row
    in_head = k <= n
    log_norm = torch.logsumexp(vals, -1, keepdim=True)
    if not bool(in_head.all()):
        log_norm = torch.where(in_head, log_norm, torch.logsumexp(x, -1, keepdim=True))
    probs = torch.exp(vals - log_norm)
    before = probs.cumsum(dim=-1) - probs  # mass strictly above each candidate
    # top-p 1.0 keeps all (a float32 cumsum can exceed 1.0 in its last places)
    drop = (before > p) & (p < 1.0)
    vals = vals.masked_fill(drop, _NEG_INF)
    out = torch.full_like(x, _NEG_INF).scatter(1, ids, vals)
    untouched = ~in_head & (p >= 1.0)  # no top-k, no top-p: the row as it was
    unsettled = ~in_head & (p < 1.0) & ~drop.any(dim=-1, keepdim=True)  # nucleus wider than n
    keep = untouched.squeeze(1)
    if bool(keep.any()):
        out[keep] = x[keep]
    rest = unsettled.squeeze(1).nonzero().squeeze(1).tolist()
    if rest:
        sub, sub_k, sub_p = x[rest], [ks[i] for i in rest], [ps[i] for i in rest]
        wider = n * WIDEN
        out[rest] = _head(sub, sub_k, sub_p, wider if 4 * wider <= V else V)
    return out
