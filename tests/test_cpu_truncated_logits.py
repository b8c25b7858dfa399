"""The cpu plugin's C truncation of whole rows (``LayerOps.truncated_logits``: the logits
speculative decoding verifies drafts against) against the reference
(``ironlm.interfaces.truncation``), on every build this CPU runs. The sampler reaching it from
``final_logits``: test_cpu_truncated_draw.py; speculative sampling with top-k / min-p keeping
the target's distribution: test_spec_decode_engine.py; on SmolLM2: test_spec_decode_real.py."""

from __future__ import annotations

import pytest
import torch
from ironlm.interfaces.truncation import truncated_logits
from ironlm_cpu.layer_ops import CpuLayerOps
from ironlm_cpu.logits_kernel import LogitsKernel
from ironlm_cpu.truncated_draw import CAND_CAP
from guard_pages import row_beside_unreadable_pages
from test_cpu_logits import kernel  # noqa: F401 (the fixture: every ISA build this CPU runs)
from test_cpu_truncated_draw import LIMITS

INF = float("inf")


def _columns(rows: int, vocab: int, limits: list[tuple[int | None, float, float]]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top_k, top_p, min_p) (rows, 1) columns, ``limits`` cycled over the rows."""
    ks, ps, ms = zip(*(limits[i % len(limits)] for i in range(rows)))
    return (torch.tensor([vocab if k is None else k for k in ks]).unsqueeze(1),
            torch.tensor(ps).unsqueeze(1), torch.tensor(ms).unsqueeze(1))


@pytest.mark.parametrize("vocab", [5, 1003, 49152])
def test_rows_keep_the_reference_set_at_the_scaled_values(kernel: LogitsKernel,
                                                          vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab + 1)
    limits = LIMITS + [(None, 1.0, 0.0)]  # and rows without limits: scaled only
    rows = 30 * (8 if vocab == 49152 else 16)
    spread = torch.tensor([6.0, 3.0, 0.5]).repeat_interleave(10).repeat(rows // 30)
    x = torch.randn(rows, vocab, generator=gen) * spread.unsqueeze(1)  # peaked .. flat
    x[::4, vocab // 2:] = -INF  # tokens ruled out before (masks, bad words)
    top_k, top_p, min_p = _columns(rows, vocab, limits)
    scale = torch.rand(rows, 1, generator=gen) * 2 + 0.2
    got, left = kernel.truncated_logits(x, scale, top_k, top_p, min_p)
    want = truncated_logits(x, scale, top_k, top_p, min_p)
    # only top-p rows without top-k whose candidates outgrow the kernel's room are left
    for i in left.nonzero().squeeze(1).tolist():
        assert top_k[i, 0] >= vocab and top_p[i, 0] < 1.0, i
    if vocab == 49152:
        assert left.any(), "the flat top-p rows should exceed the kernel's candidates"
    done = ~left
    same_set = (torch.isinf(got) == torch.isinf(want)).all(dim=1) & done
    # a set differs only where a cut lands within rounding of a boundary
    assert int((done & ~same_set).sum()) <= max(2, rows // 256)
    assert torch.equal(got[same_set], want[same_set])  # the kept tokens at exactly x * s
    plain = (top_k.squeeze(1) >= vocab) & (top_p.squeeze(1) >= 1) & (min_p.squeeze(1) <= 0)
    assert plain.any() and torch.equal(got[plain], x[plain] * scale[plain])


def test_rows_without_a_finite_distribution_go_to_the_reference(kernel: LogitsKernel) -> None:
    v = 2 * CAND_CAP
    x = torch.randn(7, v, generator=torch.Generator().manual_seed(4))
    x[0, [7, 250]] = INF  # a point mass
    x[1] = -INF  # nothing allowed
    x[2, 5] = float("nan")
    x[3, 9] = float("nan")  # without limits: scaled as it is
    top_k = torch.tensor([[10], [10], [10], [v], [CAND_CAP + 1], [10], [v]])
    top_p = torch.tensor([[0.9], [0.9], [0.9], [1.0], [1.0], [0.9], [1.0]])
    min_p = torch.tensor([[0.0]] * 6 + [[0.2]])
    scale = torch.full((7, 1), 0.5)
    _, left = kernel.truncated_logits(x, scale, top_k, top_p, min_p)
    assert left.tolist() == [True, True, True, False, True, False, False]
    got = CpuLayerOps().truncated_logits(x, scale, top_k, top_p, min_p)
    want = truncated_logits(x, scale, top_k, top_p, min_p)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert int(torch.isfinite(got[4]).sum()) == CAND_CAP + 1  # the wide top-k, whole


@pytest.mark.parametrize("at", ["start", "end"])
def test_truncation_reads_nothing_outside_its_row(kernel: LogitsKernel, at: str) -> None:
    with row_beside_unreadable_pages(17, at) as row:
        row.copy_(torch.arange(17.0) * 0.3)
        for k, p, m in ((3, 1.0, 0.0), (17, 0.5, 0.0), (17, 1.0, 0.3), (17, 1.0, 0.0)):
            limits = (torch.tensor([[k]]), torch.tensor([[p]]), torch.tensor([[m]]))
            got, left = kernel.truncated_logits(row.view(1, 17), torch.ones(1, 1), *limits)
            want = truncated_logits(row.view(1, 17).clone(), torch.ones(1, 1), *limits)
            assert not left.any() and torch.equal(got, want), (k, p, m)
