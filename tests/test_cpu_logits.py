"""The cpu plugin's C logits reductions (logsumexp and argmax per row, ``logits_kernel``)
against torch's, on every build this CPU runs, and the sampler reading them through the
platform's ``LayerOps.logsumexp_argmax``; its categorical draw against the reference's
(``LayerOps.categorical``)."""

from __future__ import annotations

import pytest
import torch
from ironlm.interfaces.categorical import reference_categorical
from ironlm.interfaces.platform import LayerOps
from ironlm.sampling_params import SamplingParams
from ironlm.worker.sampler import Sampler, SamplingState
from ironlm_cpu.layer_ops import CpuLayerOps
from ironlm_cpu.logits_kernel import PARALLEL_ROWS, LogitsKernel
from guard_pages import row_beside_unreadable_pages
from test_cpu_fused import _runnable_targets

INF = float("inf")


@pytest.fixture(scope="module", params=_runnable_targets(), ids=lambda t: t.name)
def kernel(request: pytest.FixtureRequest) -> LogitsKernel:
    k = LogitsKernel(target=request.param)
    if not k.available:
        pytest.skip(k.reason)
    return k


def _check(kernel: LogitsKernel, x: torch.Tensor) -> None:
    assert kernel.fits(x)
    done = kernel(x)
    assert done is not None
    lse, arg = done
    assert lse is not None
    assert torch.equal(arg, x.argmax(dim=-1)), (arg, x.argmax(dim=-1))
    torch.testing.assert_close(lse, torch.logsumexp(x, dim=-1), rtol=2e-6, atol=2e-6)
    only = kernel(x, logsumexp=False)  # the argmax alone: the same indices
    assert only is not None and only[0] is None
    assert torch.equal(only[1], arg)


@pytest.mark.parametrize("rows", [1, 3, PARALLEL_ROWS + 1, 64])
@pytest.mark.parametrize("vocab", [5, 17, 1001, 49152])
def test_random_rows_match_torch(kernel: LogitsKernel, rows: int, vocab: int) -> None:
    gen = torch.Generator().manual_seed(rows * vocab)
    _check(kernel, torch.randn(rows, vocab, generator=gen) * 4)


def test_ties_take_the_first_index(kernel: LogitsKernel) -> None:
    x = torch.zeros(4, 300)
    x[0, [7, 8, 250]] = 3.0  # the same lane group and a later vector
    x[1, [16, 32, 48]] = 2.0  # the same lane of several vectors
    x[2, [299, 298]] = 1.0  # in the scalar tail
    x[3, [1, 17]] = 5.0  # different lanes: the lower index wins in the lane reduction
    _check(kernel, x)
    _check(kernel, torch.zeros(2, 64))  # all equal: index 0


def test_infinities_and_masked_rows(kernel: LogitsKernel) -> None:
    x = torch.randn(5, 1000)
    x[0] = -INF  # a fully masked row: logsumexp -inf, argmax 0
    x[1, :] = -INF
    x[1, [10, 900]] = torch.tensor([0.5, 2.0])  # a guided mask leaving two tokens
    x[2, 333] = INF  # +inf wins and logsumexp is +inf
    x[3, :995] = -INF  # only the tail is allowed
    _check(kernel, x)


def test_strided_rows(kernel: LogitsKernel) -> None:
    x = torch.randn(8, 3000)[:, 100:2100]  # row stride 3000, 2000 columns
    _check(kernel, x)


def test_nan_rows_are_left_to_torch(kernel: LogitsKernel) -> None:
    x = torch.randn(3, 500)
    x[1, 42] = float("nan")
    assert kernel(x) is None
    ops = CpuLayerOps(logits=kernel)
    lse, arg = ops.logsumexp_argmax(x)
    assert arg.tolist() == x.argmax(dim=-1).tolist() and arg[1] == 42  # torch: NaN is max
    torch.testing.assert_close(lse, torch.logsumexp(x, dim=-1), equal_nan=True)


def test_nan_rows_with_the_argmax_alone(kernel: LogitsKernel) -> None:
    x = torch.randn(3, 500)
    x[2, 7] = float("nan")
    assert kernel(x, logsumexp=False) is None
    lse, arg = CpuLayerOps(logits=kernel).logsumexp_argmax(x, logsumexp=False)
    assert lse is None and arg.tolist() == x.argmax(dim=-1).tolist() and arg[2] == 7


@pytest.mark.parametrize("logsumexp", [True, False])
def test_rows_are_not_read_past_their_end(kernel: LogitsKernel, logsumexp: bool) -> None:
    """A row of 17 logits that ends where an unreadable page begins: the partial last vector
    is read masked (a plain 16-lane load there would fault)."""
    with row_beside_unreadable_pages(17, "end") as row:
        row.copy_(torch.arange(17, dtype=torch.float32))
        done = kernel(row.view(1, 17), logsumexp=logsumexp)
        assert done is not None and done[1].tolist() == [16]
        if logsumexp:
            assert done[0] is not None
            torch.testing.assert_close(done[0], torch.logsumexp(row.view(1, 17), dim=-1))


@pytest.mark.parametrize("vocab", [5, 1003, 49152])
def test_draws_take_the_reference_token_for_the_same_uniform(kernel: LogitsKernel,
                                                             vocab: int) -> None:
    # sums in another order: a u within rounding of a boundary may pick the neighbour
    gen = torch.Generator().manual_seed(vocab)
    rows = 512
    x = torch.randn(rows, vocab, generator=gen) * 4
    x[::3, vocab // 2:] = -INF  # ruled-out tokens (top-k / top-p / masks)
    scale = torch.rand(rows, 1, generator=gen) * 2 + 0.2  # temperatures 0.45-5
    u = torch.rand(rows, 1, dtype=torch.float64, generator=gen)
    got = kernel.categorical(x, scale, u)
    want = reference_categorical(x, scale, u)
    assert int((got != want).sum()) <= 2, (got != want).nonzero()
    assert torch.isfinite(x.gather(1, got.unsqueeze(1))).all()


def test_draws_follow_the_distribution_and_never_take_ruled_out_tokens(
        kernel: LogitsKernel) -> None:
    vocab = 700  # two whole blocks of 256 and a short one
    x = torch.full((vocab,), -INF)
    ids = torch.tensor([3, 200, 255, 256, 400, 511, 512, 600, 690])
    x[ids] = torch.tensor([2.0, -25.0, 1.0, 0.3, 1.5, 1.0, 1.0, 1.2, 0.8])
    draws = 100_000
    u = torch.rand(draws, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    u[:100] = 1.0 - 2.0**-53  # the top of [0, 1): still a token of nonzero weight
    got = kernel.categorical(x.expand(draws, vocab), torch.full((draws, 1), 1.25), u)
    counts = torch.bincount(got, minlength=vocab).double()
    assert counts[torch.isinf(x)].sum() == 0
    p = torch.softmax(x.double() * 1.25, 0)
    sigma = (draws * p * (1 - p)).sqrt()
    big = p > 1e-3
    assert ((counts[big] - draws * p[big]).abs() <= 5 * sigma[big]).all(), counts[big] / draws


def test_rows_without_a_finite_distribution_take_the_argmax(kernel: LogitsKernel) -> None:
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(4))
    x[0, [7, 250]] = INF  # a point mass: the first +inf
    x[1] = -INF  # nothing allowed: index 0
    x[2, 5] = float("nan")  # the kernel leaves it to the reference: -1
    u = torch.rand(4, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    got = kernel.categorical(x, torch.ones(4, 1), u)
    assert got[:3].tolist() == [7, 0, -1]
    assert got[3] == reference_categorical(x[3:], torch.ones(1, 1), u[3:])[0]
    # the reference: the logits' argmax for each (NaN counts as the maximum)
    assert reference_categorical(x, torch.ones(4, 1), u)[:3].tolist() == [7, 0, 5]
    # the layer ops send the NaN row alone to the reference
    assert CpuLayerOps().categorical(x, torch.ones(4, 1), u).tolist() == [7, 0, 5, int(got[3])]


@pytest.mark.parametrize("at", ["start", "end"])
def test_draw_reads_nothing_outside_its_row(kernel: LogitsKernel, at: str) -> None:
    """A 17-token row next to an unreadable page, before or after it: the vector loops stay
    within the row and the +inf scan stops at the row's own +inf."""
    with row_beside_unreadable_pages(17, at) as row:
        for values, want in ((torch.arange(17.0), None), (torch.full((17,), -INF), [0])):
            row.copy_(values)
            got = kernel.categorical(row.view(1, 17), torch.ones(1, 1),
                                     torch.full((1, 1), 0.999, dtype=torch.float64))
            assert want is None or got.tolist() == want
            if want is None:
                assert got.tolist() == [16]  # 0.999 of the mass: the heaviest, last token
        row.fill_(-INF)
        row[16 if at == "start" else 0] = INF
        got = kernel.categorical(row.view(1, 17), torch.ones(1, 1),
                                 torch.zeros(1, 1, dtype=torch.float64))
        assert got.tolist() == [16 if at == "start" else 0]


def test_layer_ops_fall_back_for_other_inputs() -> None:
    ops = CpuLayerOps()
    x = torch.randn(4, 100, dtype=torch.float64)  # not float32: torch's ops
    assert not ops.logits.fits(x)
    lse, arg = ops.logsumexp_argmax(x)
    assert lse.dtype == torch.float64 and torch.equal(arg, x.argmax(dim=-1))


class _CountingOps(LayerOps):
    def __init__(self, inner: LayerOps) -> None:
        self.inner, self.calls, self.asked = inner, 0, []

    def logsumexp_argmax(
        self, logits: torch.Tensor, argmax: bool = True, logsumexp: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        self.calls += 1
        self.asked.append((argmax, logsumexp))
        return self.inner.logsumexp_argmax(logits, argmax, logsumexp)


class _LastIndexOps(LayerOps):
    """Reports the last index as every row's argmax: whatever the sampler takes from it shows."""

    def logsumexp_argmax(
        self, logits: torch.Tensor, argmax: bool = True, logsumexp: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        last = torch.full((logits.shape[0],), logits.shape[1] - 1, dtype=torch.int64)
        return torch.logsumexp(logits, dim=-1) if logsumexp else None, last


def _states(params: list[SamplingParams], vocab: int) -> list[SamplingState]:
    return [SamplingState.create(p, 0, [1, 2, 3], vocab, torch.device("cpu")) for p in params]


@pytest.mark.parametrize("reporting", [False, True])
@pytest.mark.parametrize("mixed", [False, True])
def test_sampler_reads_the_platform_reductions(mixed: bool, reporting: bool) -> None:
    """Greedy rows take the kernel's argmax, and rows whose requests report log-probabilities
    (here best_of ranks by them) the logsumexp: the same tokens and log-probabilities as the
    reference ops (seeded random rows too). Without such a request no logsumexp is asked for
    and tokens carry no log-probability (vLLM's outputs then carry none either)."""
    vocab = 4000
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(1)) * 3
    extra = {"n": 1, "best_of": 2} if reporting else {}
    params = [SamplingParams(temperature=0.0, **extra) for _ in range(6)]
    if mixed:
        params[2] = SamplingParams(temperature=0.8, seed=5, **extra)
        params[4] = SamplingParams(temperature=0.0, logit_bias={7: 100.0}, **extra)
    assert all(p.reports_logprobs == reporting for p in params)
    counting = _CountingOps(CpuLayerOps())
    got = Sampler(counting)(logits, _states(params, vocab))
    want = Sampler()(logits, _states(params, vocab))
    # a raw argmax only when no rule changed the logits; no call when neither is wanted
    assert counting.asked == ([] if mixed and not reporting else [(not mixed, reporting)])
    assert [t.token_id for t in got] == [t.token_id for t in want]
    assert got[0].token_id == int(logits[0].argmax())
    if mixed:
        assert got[4].token_id == 7  # the bias applies: the processed logits' argmax
    ref = torch.log_softmax(logits, dim=-1)
    for row, (g, w) in enumerate(zip(got, want)):
        if reporting:
            assert g.logprob == pytest.approx(w.logprob, abs=1e-5)
            assert g.logprob == pytest.approx(float(ref[row, g.token_id]), abs=1e-4)
        else:
            assert g.logprob is None and w.logprob is None
    # a request for top logprobs takes the full log-softmax path instead
    counting.calls = 0
    Sampler(counting)(logits, _states([SamplingParams(temperature=0.0, logprobs=2)] * 6, vocab))
    assert counting.calls == 0


def test_greedy_unprocessed_rows_take_the_platform_argmax() -> None:
    logits = torch.randn(3, 50)
    states = _states([SamplingParams(temperature=0.0)] * 3, 50)
    assert [t.token_id for t in Sampler(_LastIndexOps())(logits, states)] == [49, 49, 49]
    # a processor changed the logits: the sampler's own argmax of the processed rows
    states = _states([SamplingParams(temperature=0.0, logit_bias={3: 1e4})] * 3, 50)
    assert [t.token_id for t in Sampler(_LastIndexOps())(logits, states)] == [3, 3, 3]
