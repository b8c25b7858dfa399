"""The cpu plugin's C draw within top-k / top-p / min-p (``truncated_draw``) against the
reference (``ironlm.interfaces.truncation``), on every build this CPU runs, and the sampler
reaching it through ``LayerOps.truncated_categorical``."""

from __future__ import annotations

import pytest
import torch
from ironlm.interfaces.platform import LayerOps
from ironlm.interfaces.truncation import reference_truncated_categorical, truncate
from ironlm.sampling_params import SamplingParams
from ironlm.worker.sampler import Sampler, SamplingState
from ironlm_cpu.layer_ops import CpuLayerOps
from ironlm_cpu.logits_kernel import LogitsKernel
from ironlm_cpu.truncated_draw import CAND_CAP
from guard_pages import row_beside_unreadable_pages
from test_cpu_logits import kernel  # noqa: F401 (the fixture: every ISA build this CPU runs)

INF = float("inf")


def _limits(rows: int, vocab: int, k: int | None = None, p: float = 1.0, m: float = 0.0
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.full((rows, 1), vocab if k is None else k, dtype=torch.int64),
            torch.full((rows, 1), p), torch.full((rows, 1), m))


# (top_k or None, top_p, min_p) cycled over the rows
LIMITS = [(None, 0.9, 0.0), (50, 1.0, 0.0), (40, 0.8, 0.0), (None, 1.0, 0.05),
          (None, 0.95, 0.02), (1, 1.0, 0.0), (1000, 0.9, 0.0), (5, 0.5, 0.3), (None, 0.3, 0.0)]


@pytest.mark.parametrize("vocab", [5, 1003, 49152])
def test_draws_take_the_reference_token_for_the_same_uniform(kernel: LogitsKernel,
                                                             vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    rows = 27 * 8 if vocab == 49152 else 27 * 16
    spread = torch.tensor([6.0, 3.0, 0.5]).repeat_interleave(9).repeat(rows // 27)
    x = torch.randn(rows, vocab, generator=gen) * spread.unsqueeze(1)  # peaked .. flat
    x[::4, vocab // 2:] = -INF  # tokens ruled out before (masks, bad words)
    ks, ps, ms = zip(*(LIMITS[i % len(LIMITS)] for i in range(rows)))
    top_k = torch.tensor([vocab if k is None else k for k in ks]).unsqueeze(1)
    top_p, min_p = torch.tensor(ps).unsqueeze(1), torch.tensor(ms).unsqueeze(1)
    scale = torch.rand(rows, 1, generator=gen) * 2 + 0.2
    u = torch.rand(rows, 1, dtype=torch.float64, generator=gen)
    got = kernel.truncated_categorical(x, scale, top_k, top_p, min_p, u)
    want = reference_truncated_categorical(x, scale, top_k, top_p, min_p, u)
    done = got >= 0
    left = (~done).nonzero().squeeze(1).tolist()
    # only top-p rows without top-k whose candidates outgrow the kernel's room are left
    for i in left:
        assert got[i] == -2 and top_k[i, 0] >= vocab and top_p[i, 0] < 1.0, i
    differ = (got[done] != want[done]).sum()
    assert int(differ) <= max(2, rows // 256), (got != want).nonzero()
    kept_sets = truncate(x * scale, top_k.squeeze(1).tolist(), top_p.squeeze(1).tolist(),
                         min_p.squeeze(1).tolist())
    inside = torch.isfinite(kept_sets[done].gather(1, got[done].unsqueeze(1)))
    assert int((~inside).sum()) <= int(differ)  # a token outside the set: only at a cut's edge
    ops = CpuLayerOps()  # the layer ops send the rows left over to the reference
    if vocab == 49152:
        assert left, "the flat top-p rows should exceed the kernel's candidates"
        full = ops.truncated_categorical(x, scale, top_k, top_p, min_p, u)
        # (the reference truncation, then the plugin's C categorical: its rounding)
        assert int((full[left] != want[left]).sum()) <= 2


def test_rows_whose_tail_holds_weight_are_settled_in_the_kernel(kernel: LogitsKernel) -> None:
    # real rows (SmolLM2 on random-token prompts, top-p 0.95: nuclei up to ~1900 tokens) are
    # not settled by the tokens of weight >= 2^-10: their many small tokens hold more than
    # 1 - p, or more than CAND_CAP tokens pass 2^-10; the kernel then bins the weights
    vocab, rows = 49152, 32
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(rows, vocab, generator=gen)  # the tail
    heads = torch.randperm(vocab, generator=gen)[:600]
    x[:16, heads[:30]] = 10 + 0.1 * torch.randn(16, 30, generator=gen)  # tail holds > 1 - p
    x[16:, heads] = 5 + 0.1 * torch.randn(16, 600, generator=gen)  # most tokens pass 2^-10
    top_p = torch.tensor([0.9] * 16 + [0.5] * 16).unsqueeze(1)
    top_k, min_p = torch.full((rows, 1), vocab), torch.zeros(rows, 1)
    u = torch.rand(rows, 1, dtype=torch.float64, generator=gen)
    got = kernel.truncated_categorical(x, torch.ones(rows, 1), top_k, top_p, min_p, u)
    assert (got >= 0).all(), got
    want = reference_truncated_categorical(x, torch.ones(rows, 1), top_k, top_p, min_p, u)
    assert int((got != want).sum()) <= 1


def test_draws_follow_the_truncated_distribution(kernel: LogitsKernel) -> None:
    vocab = 700
    x = torch.full((vocab,), -INF)
    ids = torch.tensor([3, 200, 255, 256, 400, 511, 512, 600, 690])
    x[ids] = torch.tensor([2.0, -25.0, 1.05, 0.3, 1.5, 0.9, 1.0, 1.2, 0.8])  # no ties
    draws = 60_000
    u = torch.rand(draws, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    u[:100] = 1.0 - 2.0**-53
    for k, p, m in ((5, 1.0, 0.0), (vocab, 0.6, 0.0), (6, 0.7, 0.0), (vocab, 1.0, 0.5)):
        got = kernel.truncated_categorical(x.expand(draws, vocab), torch.full((draws, 1), 1.25),
                                           *_limits(draws, vocab, k, p, m), u)
        counts = torch.bincount(got, minlength=vocab).double()
        kept = truncate(x.unsqueeze(0) * 1.25, [k], [p], [m])[0]
        assert counts[torch.isinf(kept)].sum() == 0, (k, p, m)
        q = torch.softmax(kept.double(), 0)
        sigma = (draws * q * (1 - q)).sqrt()
        big = q > 1e-3
        assert ((counts[big] - draws * q[big]).abs() <= 5 * sigma[big]).all(), (k, p, m)


def test_a_top_k_below_one_means_none(kernel: LogitsKernel) -> None:
    # SamplingParams' -1 (and 0) reach the op from other callers than the sampler: no top-k,
    # as in the reference
    x = torch.randn(6, 300, generator=torch.Generator().manual_seed(9)) * 3
    u = torch.rand(6, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    top_k = torch.tensor([[-1], [0], [-1], [0], [300], [301]])
    top_p = torch.tensor([[1.0], [1.0], [0.8], [0.8], [0.8], [0.8]])
    min_p = torch.zeros(6, 1)
    got = kernel.truncated_categorical(x, torch.ones(6, 1), top_k, top_p, min_p, u)
    want = reference_truncated_categorical(x, torch.ones(6, 1), top_k, top_p, min_p, u)
    assert got.tolist() == want.tolist()


def test_ties_at_the_top_k_cut_keep_the_lower_indices(kernel: LogitsKernel) -> None:
    x = torch.zeros(4000, 300)  # every token alike
    u = torch.rand(4000, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    got = kernel.truncated_categorical(x, torch.ones(4000, 1), *_limits(4000, 300, 3), u)
    assert set(got.tolist()) == {0, 1, 2}


def test_rows_without_a_finite_distribution_and_wide_top_k(kernel: LogitsKernel) -> None:
    x = torch.randn(5, 2 * CAND_CAP, generator=torch.Generator().manual_seed(4))
    x[0, [7, 250]] = INF  # a point mass: the first +inf
    x[1] = -INF  # nothing allowed: index 0
    x[2, 5] = float("nan")  # left to the reference: -1
    u = torch.rand(5, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    top_k = torch.tensor([[10], [10], [10], [CAND_CAP + 1], [10]])
    top_p, min_p = torch.full((5, 1), 0.9), torch.zeros(5, 1)
    got = kernel.truncated_categorical(x, torch.ones(5, 1), top_k, top_p, min_p, u)
    assert got[:4].tolist() == [7, 0, -1, -2]  # a top-k wider than the kernel holds: -2
    want = reference_truncated_categorical(x, torch.ones(5, 1), top_k, top_p, min_p, u)
    assert got[4] == want[4] and want[:3].tolist() == [7, 0, 5]
    full = CpuLayerOps().truncated_categorical(x, torch.ones(5, 1), top_k, top_p, min_p, u)
    assert full.tolist() == want.tolist()


@pytest.mark.parametrize("at", ["start", "end"])
def test_truncated_draw_reads_nothing_outside_its_row(kernel: LogitsKernel, at: str) -> None:
    with row_beside_unreadable_pages(17, at) as row:
        row.copy_(torch.arange(17.0) * 3)
        u = torch.full((1, 1), 0.999, dtype=torch.float64)
        for k, p, m in ((3, 1.0, 0.0), (17, 0.5, 0.0), (17, 1.0, 0.01)):  # heap, top-p, floor
            got = kernel.truncated_categorical(row.view(1, 17), torch.ones(1, 1),
                                               *_limits(1, 17, k, p, m), u)
            assert got.tolist() == [16], (k, p, m)  # 0.999 of the mass: the heaviest
        # the weight bins: 16 tokens below 2^-10 hold more than 1 - p
        row.copy_(-7.5 - 0.01 * torch.arange(17.0))  # no ties
        row[8] = 0.0
        limits = _limits(1, 17, None, 0.995, 0.0)
        u = torch.full((1, 1), 1e-4, dtype=torch.float64)  # the first kept: a tail token
        got = kernel.truncated_categorical(row.view(1, 17), torch.ones(1, 1), *limits, u)
        want = reference_truncated_categorical(row.view(1, 17).clone(), torch.ones(1, 1),
                                               *limits, u)
        assert got.tolist() == want.tolist() == [0]


class _Recording(LayerOps):
    """The reference ops, noting which truncating op was called with what."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[torch.Tensor, ...]]] = []

    def truncated_categorical(self, logits: torch.Tensor, scale: torch.Tensor,
                              top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                              u: torch.Tensor) -> torch.Tensor:
        self.seen.append(("draw", (scale, top_k, top_p, min_p)))
        return super().truncated_categorical(logits, scale, top_k, top_p, min_p, u)

    def truncated_logits(self, logits: torch.Tensor, scale: torch.Tensor, top_k: torch.Tensor,
                         top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
        self.seen.append(("logits", (scale, top_k, top_p, min_p)))
        return super().truncated_logits(logits, scale, top_k, top_p, min_p)


def test_the_sampler_hands_each_rows_limits_to_the_platform() -> None:
    # the draw (plain sampling) and the whole rows (speculative decoding's final_logits)
    vocab = 500
    params = [SamplingParams(temperature=0.5, top_k=7), SamplingParams(temperature=2.0),
              SamplingParams(temperature=1.0, top_p=0.9, min_p=0.1), SamplingParams(temperature=0)]
    states = [SamplingState.create(p, 0, [1], vocab, torch.device("cpu")) for p in params]
    x = torch.randn(4, vocab)
    # (the default draw truncates through the platform's truncated_logits)
    for ops_called, call in ((["draw", "logits"], lambda s: Sampler(s)(x, states)),
                             (["logits"], lambda s: Sampler(s).final_logits(x, states, None))):
        ops = _Recording()
        got = call(ops)
        assert [name for name, _ in ops.seen] == ops_called
        scale, top_k, top_p, min_p = ops.seen[0][1]
        assert scale.squeeze(1).tolist() == [2.0, 0.5, 1.0, 1.0]  # greedy rows: 1
        assert top_k.squeeze(1).tolist() == [7, vocab, vocab, vocab]
        assert top_p.squeeze(1).tolist() == pytest.approx([1.0, 1.0, 0.9, 1.0])
        assert min_p.squeeze(1).tolist() == pytest.approx([0.0, 0.0, 0.1, 0.0])
    assert int(torch.isfinite(got[0]).sum()) == 7
    ops = _Recording()  # no row truncates: the plain draw, the scaled rows
    Sampler(ops)(x[1:2], states[1:2])
    assert torch.equal(Sampler(ops).final_logits(x[1:2], states[1:2], None), x[1:2] * 0.5)
    assert ops.seen == []
