"""The batched sampler against straightforward per-row reference definitions."""

from __future__ import annotations

import math

import pytest
import torch

from ironlm.worker.sampler import Sampler, SamplingState
from ironlm.sampling_params import RequestOutputKind, SamplingParams
from ironlm.interfaces import categorical
from ironlm.interfaces import truncation

V = 50


def _state(params: SamplingParams, prompt: list[int] | None = None, outs: list[int] | None = None,
           eos: int | None = 0) -> SamplingState:
    st = SamplingState.create(params, eos, prompt or [3, 4, 5], V, torch.device("cpu"))
    for t in outs or []:
        st.record(t)
    return st


def _ref_final(logits: torch.Tensor, p: SamplingParams, prompt: list[int], outs: list[int],
               eos: int | None) -> torch.Tensor:
    """One row, each parameter exactly as its definition reads, in vLLM's order."""
    x = logits.clone().double()
    n = x.shape[0]
    if len(outs) < p.min_tokens:
        for t in list(p.stop_token_ids or []) + ([eos] if eos is not None else []):
            x[t] = -math.inf
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    if p.allowed_token_ids is not None:
        keep = torch.zeros(n, dtype=torch.bool)
        keep[p.allowed_token_ids] = True
        x[~keep] = -math.inf
    for t in range(n):
        if t in prompt or t in outs:
            if p.repetition_penalty != 1.0 and math.isfinite(x[t]):
                x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        c = outs.count(t)
        x[t] -= p.frequency_penalty * c + p.presence_penalty * (c > 0)
    if p.temperature < 1e-5:
        return x
    x = x / p.temperature
    order = torch.argsort(x, descending=True)
    if p.top_k != -1:
        x[order[p.top_k:]] = -math.inf
    if p.top_p < 1.0:
        probs = torch.softmax(x, dim=0)
        mass = 0.0
        for rank, t in enumerate(order.tolist()):
            if mass > p.top_p:
                x[t] = -math.inf
            mass += float(probs[t])
    if p.min_p > 0:
        probs = torch.softmax(x, dim=0)
        x[probs < p.min_p * probs.max()] = -math.inf
    return x


CASES = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.3, top_k=5),
    SamplingParams(temperature=1.0, top_p=0.6),
    SamplingParams(temperature=1.0, min_p=0.1),
    SamplingParams(temperature=0.9, top_k=10, top_p=0.8, min_p=0.05),
    SamplingParams(temperature=1.0, presence_penalty=1.5),
    SamplingParams(temperature=1.0, frequency_penalty=-0.7),
    SamplingParams(temperature=1.0, repetition_penalty=1.8),
    SamplingParams(temperature=1.0, logit_bias={7: 5.0, 9: -100.0}),
    SamplingParams(temperature=1.0, allowed_token_ids=[1, 2, 3, 30]),
    SamplingParams(temperature=1.0, min_tokens=5, stop_token_ids=[11]),
]


def test_batched_processing_equals_the_reference_row_by_row() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(len(CASES), V, generator=g) * 3
    outs = [[7, 7, 12, 3], [], [1], [5, 5, 5], [2], [8, 9], [7, 7, 12], [7, 7, 12, 40],
            [3, 20], [1], [2], [4]]
    states = [_state(p.clone(), outs=o) for p, o in zip(CASES, outs)]
    got = Sampler().final_logits(logits, states, None)
    for i, p in enumerate(CASES):
        ref = _ref_final(logits[i], p, [3, 4, 5], outs[i], 0)
        assert torch.equal(torch.isinf(got[i]), torch.isinf(ref)), f"case {i}: {p}"
        fin = torch.isfinite(ref)
        torch.testing.assert_close(got[i][fin].double(), ref[fin], rtol=1e-5, atol=1e-5)


def test_draws_follow_the_final_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0] + [-30.0] * (V - 5)])
    p = SamplingParams(temperature=0.8, top_k=4, seed=123)
    expect = torch.softmax(Sampler().final_logits(logits, [_state(p.clone())], None)[0], 0)
    state = _state(p.clone())
    counts = torch.zeros(V)
    n = 4000
    for _ in range(n):
        counts[Sampler()(logits, [state])[0].token_id] += 1
    assert counts[4:].sum() == 0  # outside top-k: never
    torch.testing.assert_close(counts[:4] / n, expect[:4], atol=0.03, rtol=0)


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(17, V, generator=g)
    alone_state = _state(SamplingParams(temperature=1.0, seed=42))
    alone = [Sampler()(logits[:1], [alone_state])[0].token_id for _ in range(20)]
    batch_states = [_state(SamplingParams(temperature=1.0, seed=42))] + [
        _state(SamplingParams(temperature=1.0)) for _ in range(16)
    ]
    batched = [Sampler()(logits, batch_states)[0].token_id for _ in range(20)]
    assert alone == batched
    other = _state(SamplingParams(temperature=1.0, seed=43))
    assert [Sampler()(logits[:1], [other])[0].token_id for _ in range(20)] != alone


def test_truncation_within_the_head_equals_the_definition_on_a_large_vocabulary() -> None:
    # V = 64 x CANDIDATES: top-k / top-p rows are resolved within their largest logits, the
    # medium row's nucleus (~400 tokens) within the wider head, the flat rows' (~7000) through
    # the full sort; top-k 3000 sorts all
    big = 64 * truncation.CANDIDATES
    g = torch.Generator().manual_seed(5)
    peaked, flat = torch.randn(big, generator=g) * 6, torch.randn(big, generator=g) * 0.3
    medium = torch.randn(big, generator=g) * 3
    rows = [
        (peaked, SamplingParams(temperature=1.0, top_p=0.9)),
        (medium, SamplingParams(temperature=1.0, top_p=0.9)),
        (flat, SamplingParams(temperature=1.0, top_p=0.9)),
        (peaked, SamplingParams(temperature=1.0, top_k=50)),
        (flat, SamplingParams(temperature=0.8, top_k=40, top_p=0.5)),
        (peaked, SamplingParams(temperature=1.0)),
        (peaked, SamplingParams(temperature=1.0, min_p=0.01)),
        (flat, SamplingParams(temperature=1.0, top_p=0.99, min_p=0.2)),
    ]
    for extra in ([], [(flat, SamplingParams(temperature=1.0, top_k=3000, top_p=0.7))]):
        batch = rows + extra
        logits = torch.stack([x for x, _ in batch])
        states = [SamplingState.create(p, 0, [3], big, torch.device("cpu")) for _, p in batch]
        got = Sampler().final_logits(logits, states, None)
        for i, (x, p) in enumerate(batch):
            ref = _ref_final(x, p, [3], [], 0)
            assert torch.equal(torch.isinf(got[i]), torch.isinf(ref)), f"row {i}: {p}"
            fin = torch.isfinite(ref)
            torch.testing.assert_close(got[i][fin].double(), ref[fin], rtol=1e-5, atol=1e-5)
        if not extra:  # the batch starts at the 128-head (4 x 128 <= V): the three top-p rows
            # are settled there, in the 1024-head and by the sort
            kept = torch.isfinite(got).sum(dim=1).tolist()
            wide = truncation.CANDIDATES * truncation.WIDEN
            assert 4 * wide <= big < 4 * wide * truncation.WIDEN
            assert kept[0] < truncation.CANDIDATES < kept[1] < wide < kept[2]


def test_draw_matches_the_probabilities_across_blocks() -> None:
    # 700 tokens: two whole blocks and a short one; zero-mass tokens inside and at the end,
    # a token of 1e-9 beside one of 0.3 in the same block, mass spread over all three blocks
    n = 2 * categorical.BLOCK + 188
    probs = torch.zeros(n)
    probs[[3, 200, 255, 256, 400, 511, 512, 600, 690]] = torch.tensor(
        [0.3, 1e-9, 0.1, 0.05, 0.15, 0.1, 0.1, 0.12, 0.08])
    draws = 200_000
    u = torch.rand(draws, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(categorical.pick(probs.expand(draws, n), u), minlength=n).double()
    assert counts[probs == 0].sum() == 0
    p = probs.double() / probs.sum()
    sigma = (draws * p * (1 - p)).sqrt()
    big = p > 1e-3
    assert ((counts[big] - draws * p[big]).abs() <= 5 * sigma[big]).all(), counts[big] / draws


def test_draw_never_lands_on_a_zero_mass_token_when_u_rounds_up() -> None:
    # the offset inside a block is a ratio of two float64 sums: it can reach 1
    cdf = torch.tensor([[0.25, 0.5, 1.0, 1.0, 1.0]], dtype=torch.float64)
    i, rest = categorical._first_past(cdf, torch.tensor([[1.0]], dtype=torch.float64))
    assert int(i) == 2 and float(rest) == 0.5
    i, rest = categorical._first_past(cdf, torch.tensor([[0.0]], dtype=torch.float64))
    assert int(i) == 0 and float(rest) == 0.0


def test_logprobs_are_raw_log_softmax_with_ranks() -> None:
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(2))
    states = [_state(SamplingParams(temperature=0.0, logprobs=3)),
              _state(SamplingParams(temperature=2.0, top_k=2, logprobs=0))]
    out = Sampler()(logits, states)
    raw = torch.log_softmax(logits, -1)
    for i, tok in enumerate(out):
        assert tok.logprob == pytest.approx(float(raw[i, tok.token_id]), abs=1e-6)
        first = tok.top_logprobs[0]
        assert first[0] == tok.token_id
        assert first[2] == int((raw[i] > raw[i, tok.token_id]).sum()) + 1
    assert [t for t, _, _ in out[0].top_logprobs[1:]] == raw[0].topk(3).indices.tolist()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"n": 0}, "n"),
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"seed": 2**64}, "seed"),
        ({"use_beam_search": True, "best_of": 2, "temperature": 0.5}, "temperature"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"stop": [""]}, "stop"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"stop": ["x"], "detokenize": False}, "stop"),
        ({"stop_token_ids": ["a"]}, "stop_token_ids"),
        ({"n": 1, "best_of": 2, "output_kind": RequestOutputKind.DELTA}, "best_of"),
    ],
)
def test_invalid_values_name_the_field(kwargs: dict, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert str(err.value).startswith(field)


def test_repetition_penalty_has_no_upper_limit() -> None:
    assert SamplingParams(repetition_penalty=2.5).repetition_penalty == 2.5  # vLLM: > 0


def test_top_k_zero_disables_as_later_vllm_spells_it() -> None:
    """vLLM 0.6 refused top_k=0; later versions take it (their default) as "no top-k", and
    clients written for them send it: stored as -1, which the sampler reads as no top-k."""
    assert SamplingParams(temperature=0.8, top_k=0).top_k == -1
    assert SamplingParams(temperature=0.8, top_k=0) == SamplingParams(temperature=0.8)


def test_verify_checks_vocabulary_and_logprob_limits() -> None:
    with pytest.raises(ValueError, match="^logprobs"):
        SamplingParams(logprobs=21).verify(V, max_logprobs=20)
    with pytest.raises(ValueError, match="^logit_bias"):
        SamplingParams(logit_bias={V + 5: 1.0}).verify(V, 20)
    with pytest.raises(ValueError, match="^allowed_token_ids"):
        SamplingParams(allowed_token_ids=[V]).verify(V, 20)
