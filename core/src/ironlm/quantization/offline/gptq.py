"""GPTQ (Frantar et al., 2022): quantize a weight column by column, pushing each column's
rounding error onto the columns not yet quantized, weighted by the inverse Hessian of the
layer's reconstruction error.

For a linear with calibration inputs X (T, K): H = 2 X^T X / T. With H^-1 = U^T U (U upper
triangular, the Cholesky factor of the inverse), column k is rounded to q_k and the remaining
columns j > k move by -(w_k - q_k) / U[k, k] * U[k, j]: the optimal update of the columns still
free, from the paper's one-column-at-a-time solution. Work proceeds in blocks of columns with
lazy updates of the rest. Damping adds ``damp`` times the mean diagonal to H's diagonal;
input features never active (zero diagonal) get weight 0. Rows are independent given H, so
linears sharing an input (q/k/v, gate/up) are solved as one stacked weight.

Groups: each run of ``group_size`` columns, in processing order, gets its scale (and zero) from
its columns as they are when the run starts (already corrected for earlier errors). Act-order
processes columns by decreasing H diagonal (the most active inputs first), so groups collect
scattered input features, which ``g_idx`` records (``shards`` keeps each tensor-parallel shard's
columns together).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ironlm.quantization.rtn import int4_params

BLOCK = 128
# default strength of the asymmetric calibration: on SmolLM2 (group 64, sym) 0.25 and 0.5 gave
# +10.6-12.2% / +10.1-10.8% perplexity, 1.0 (the exact fit to 3300 calibration tokens)
# +13.4-14.1%, 0 (plain GPTQ) +16.3% (docs/quantization.md)
V2_ALPHA = 0.25


@dataclass
class GPTQResult:
    codes: torch.Tensor  # (N, K) uint8, input features in checkpoint order
    scale: torch.Tensor  # (N, K // G) float32, groups in processing order
    zero: torch.Tensor  # (N, K // G) float32 (8 when symmetric)
    g_idx: torch.Tensor  # (K,) int32: the group of each input feature
    dequantized: torch.Tensor  # (N, K) float32 the codes stand for


def hessian(x: torch.Tensor) -> torch.Tensor:
    """(T, K) inputs -> (K, K) float32 2 X^T X / T."""
    xf = x.float()
    return 2.0 * xf.t() @ xf / max(1, x.shape[0])


def asymmetric_target(
    weight: torch.Tensor, h: torch.Tensor, x_quant: torch.Tensor, x_float: torch.Tensor,
    damp: float, alpha: float,
) -> torch.Tensor:
    """GPTQ v2's asymmetric calibration (Li et al., 2025): the (N, K) weight whose outputs on
    the quantized model's inputs X~ (T, K) come closest to the float model's outputs W X, so
    GPTQ also undoes the error the layers before it left in X~. ``h`` is X~'s Hessian
    (``hessian(x_quant)``, 2 X~^T X~ / T). Least squares:
    W* = W + alpha * W D (H + lambda I)^-1 with D = 2 (X - X~)^T X~ / T; alpha 1 is the exact
    minimizer, 0 plain GPTQ (equal inputs give W back). Since X - X~ is orthogonal to W* X~'s
    residual, GPTQ on W* with X~'s Hessian minimizes ||Q X~ - W X|| as a whole."""
    xq, xf = x_quant.float(), x_float.float()
    hd = h + damp * torch.mean(torch.diag(h)).clamp(min=1e-8) * torch.eye(h.shape[0])
    d = 2.0 * (xf - xq).t() @ xq / max(1, xq.shape[0])  # (K, K), scaled as h
    wd = weight.float() @ d  # (N, K) W D
    return weight.float() + alpha * torch.linalg.solve(hd, wd.t()).t()  # hd symmetric


def gptq_quantize(
    weight: torch.Tensor,
    h: torch.Tensor,
    group_size: int,
    zero_points: bool,
    damp: float = 0.01,
    act_order: bool = False,
    shards: int = 1,
    mse: float = 0.0,
) -> GPTQResult:
    """GPTQ on one (N, K) weight with the (K, K) Hessian of its inputs. Scales are rounded to
    float16 as they are found, since that is what the checkpoint stores."""
    n, k = weight.shape
    h = h.clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    perm = _order(torch.diag(h), act_order, shards)
    h = h[perm][:, perm]
    h += damp * torch.mean(torch.diag(h)) * torch.eye(k, dtype=h.dtype)
    u = inverse_cholesky(h.float())
    w = weight.float().clone()
    w[:, dead] = 0.0
    w = w[:, perm]

    block = max(group_size, BLOCK // group_size * group_size)  # groups never straddle blocks
    codes = torch.zeros(n, k)
    scales, zeros = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny vector ops: threading costs more than it gives
    try:
        for b0 in range(0, k, block):
            b1 = min(b0 + block, k)
            w1 = w[:, b0:b1].clone()
            err1 = torch.zeros_like(w1)
            u1 = u[b0:b1, b0:b1]
            for i in range(b1 - b0):
                if i % group_size == 0:
                    g_scale, g_zero = group_params(w1[:, i : i + group_size], zero_points, mse)
                    g_scale = g_scale.half().float()[:, 0]  # (N,), as stored
                    g_zero = g_zero[:, 0]
                    scales.append(g_scale)
                    zeros.append(g_zero)
                col = w1[:, i]
                q = torch.clamp(torch.round(col / g_scale) + g_zero, 0, 15)
                e = (col - (q - g_zero) * g_scale) / u1[i, i]
                w1[:, i:].addr_(e, u1[i, i:], alpha=-1.0)  # push the error onto the rest
                codes[:, b0 + i] = q
                err1[:, i] = e
            w[:, b1:] -= err1 @ u[b0:b1, b1:]
    finally:
        torch.set_num_threads(threads)
    scale = torch.stack(scales, dim=1)  # (N, K // G) in processing order
    zero = torch.stack(zeros, dim=1)
    group = torch.arange(k) // group_size  # group of each processed column
    deq = (codes - zero[:, group]) * scale[:, group]
    inverse = torch.argsort(perm)
    return GPTQResult(
        codes=codes[:, inverse].to(torch.uint8),
        scale=scale,
        zero=zero,
        g_idx=group[inverse].to(torch.int32),
        dequantized=deq[:, inverse],
    )


MSE_GRID = 100  # clipping search: shrink factors 1.0, 0.99, ... down to 1 - MAX_SHRINK
MAX_SHRINK = 0.8


def group_params(
    w: torch.Tensor, zero_points: bool, mse: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero), each (N, 1), of one (N, G) group. With ``mse`` > 0 (a norm p), the range
    is clipped per row by the shrink factor that minimizes sum |w - dequant(w)|^p (the GPTQ
    reference quantizer's grid search); otherwise the full min / max range (round to nearest)."""
    if mse < 0:
        raise ValueError(f"--mse must be 0 (off) or a positive norm, got {mse}")
    g = w.shape[1]
    scale, zero = int4_params(w, g, zero_points)
    if mse <= 0:
        return scale, zero
    best = torch.full((w.shape[0], 1), float("inf"))
    for i in range(int(MAX_SHRINK * MSE_GRID)):
        shrink = 1.0 - i / MSE_GRID
        s1, z1 = int4_params(w * shrink, g, zero_points)  # the range of the shrunk group
        q = torch.clamp(torch.round(w / s1) + z1, 0, 15)
        err = ((q - z1) * s1 - w).abs_().pow_(mse).sum(dim=1, keepdim=True)
        better = err < best
        best = torch.where(better, err, best)
        scale, zero = torch.where(better, s1, scale), torch.where(better, z1, zero)
    return scale, zero


def inverse_cholesky(h: torch.Tensor) -> torch.Tensor:
    """U upper triangular with U^T U = h^-1 (through triangular solves: torch's
    cholesky_inverse is an order of magnitude slower on CPU)."""
    lower = torch.linalg.cholesky(h)
    eye = torch.eye(h.shape[0], dtype=h.dtype)
    lower_inv = torch.linalg.solve_triangular(lower, eye, upper=False)
    return torch.linalg.cholesky(lower_inv.t() @ lower_inv, upper=True)


def _order(diag: torch.Tensor, act_order: bool, shards: int) -> torch.Tensor:
    """Column processing order: checkpoint order, or by decreasing activity within each of
    ``shards`` equal slices of the input features (a row-parallel rank's share)."""
    k = diag.numel()
    if not act_order:
        return torch.arange(k)
    size = k // shards
    parts = [
        s * size + torch.argsort(diag[s * size : (s + 1) * size], descending=True, stable=True)
        for s in range(shards)
    ]
    return torch.cat(parts)
