"""The reference categorical draw (``LayerOps.categorical``): one token per row of (B, V)
weights, by inverse CDF with one uniform per row.

An exponential race (argmax p / Exp(1), ``torch.multinomial``'s way) needs V random numbers a
row, ~90 ms at (64, 49152) on a 2-core x86 host; one uniform a row needs one running total.
That total is taken in two levels, so no (B, V) float64 tensor is made: the sums of
``BLOCK``-token blocks (one float32 pass over the rows), their running total in float64 to find
the block, then the block's own running total in float64 to find the token. Every token of
nonzero weight keeps a nonzero width; a token of weight 0 is never drawn.
"""

from __future__ import annotations

import torch

BLOCK = 256  # tokens per block of the two-level running total


def reference_categorical(
    logits: torch.Tensor, scale: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """(B, V) float32 logits, (B, 1) scale (the inverse temperature), (B, 1) float64 u in
    [0, 1) -> (B,) int64: one draw per row from softmax(logits * scale). A row without a
    finite distribution (a NaN or +inf logit, or every logit -inf) takes its logits' argmax
    (torch's: NaN counts as the maximum, the first of equal ones wins)."""
    probs = torch.softmax(logits * scale, dim=-1)  # such rows are NaN throughout
    tokens = pick(probs, u)
    broken = probs[:, 0].isnan()
    if bool(broken.any()):
        tokens = torch.where(broken, logits.argmax(dim=-1), tokens)
    return tokens


def pick(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(B, V) non-negative weights (rows not all 0), (B, 1) float64 u in [0, 1) -> (B,) int64:
    the first token whose running total of weight passes u times the row's total."""
    weights = weights.contiguous()
    B, V = weights.shape
    nb = V // BLOCK
    sums = weights.as_strided((B, nb, BLOCK), (V, BLOCK, 1)).sum(dim=-1)  # (B, nb)
    if V % BLOCK:
        sums = torch.cat([sums, weights[:, nb * BLOCK:].sum(dim=-1, keepdim=True)], dim=1)
    sums = sums.double()
    b, rest = _first_past(sums.cumsum(dim=-1), u)  # (B, 1) block, the target's offset in it
    cols = b * BLOCK + torch.arange(BLOCK, device=weights.device)  # (B, BLOCK)
    inside = cols < V  # the last block may be short
    vals = weights.gather(1, cols.clamp(max=V - 1)).double().masked_fill(~inside, 0.0)
    # the offset as a fraction of the block's float32 sum, applied to its float64 total
    j, _ = _first_past(vals.cumsum(dim=-1), rest / sums.gather(1, b))
    return (b * BLOCK + j).squeeze(1).clamp(max=V - 1)


def _first_past(cdf: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, n) running totals, (B, 1) u in [0, 1] -> (B, 1) the first index whose total passes
    u times the row's total, never past the last index of nonzero width (the offset inside a
    block is a ratio of two float64 sums and can reach 1), and how far past the previous
    index's total the target lies."""
    total = cdf[:, -1:].contiguous()
    target = u * total
    last = torch.searchsorted(cdf, total, right=False)
    # (a NaN row finds nothing: it still gets an index in range)
    i = torch.minimum(torch.searchsorted(cdf, target, right=True), last)
    i = i.clamp(max=cdf.shape[1] - 1)
    before = torch.where(i > 0, cdf.gather(1, (i - 1).clamp(min=0)), torch.zeros_like(target))
    return i, (target - before).clamp(min=0.0)
