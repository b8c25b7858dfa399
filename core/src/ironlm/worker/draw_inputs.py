"""What the sampler's draw reads from the requests' sampling states: one uniform per row, and
each row's top-k / top-p / min-p limits (``ironlm.interfaces.truncation``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ironlm.interfaces.categorical import pick

if TYPE_CHECKING:
    from ironlm.worker.sampler import SamplingState


def uniforms(states: list[SamplingState], device: torch.device) -> torch.Tensor:
    """(B, 1) float64 uniforms on [0, 1), one per row: a seeded row's from its request's
    generator (so it samples alike alone or in any batch), the others' from the shared one."""
    u = torch.rand(len(states), 1, dtype=torch.float64, device=device)
    for i, s in enumerate(states):
        if s.generator is not None and not s.params.sampling_type_greedy:
            u[i] = torch.rand(1, generator=s.generator, dtype=torch.float64, device=device)
    return u


def truncates(states: list[SamplingState]) -> bool:
    """Whether any row has a top-k, top-p or min-p to apply."""
    return any(s.params.top_k > 0 or s.params.top_p < 1.0 or s.params.min_p > 0 for s in states)


def limits(states: list[SamplingState]) -> tuple[list[int], list[float], list[float]]:
    """Each row's top_k (-1: none), top_p (1: none) and min_p (0: none)."""
    return ([s.params.top_k for s in states], [s.params.top_p for s in states],
            [s.params.min_p for s in states])


def limit_tensors(
    states: list[SamplingState], vocab_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``limits`` as ``LayerOps.truncated_categorical`` takes them: top_k (B, 1) int64
    (vocab_size where a row has none), top_p and min_p (B, 1) float32."""
    ks, ps, ms = limits(states)
    k = torch.tensor([t if 0 < t < vocab_size else vocab_size for t in ks], device=device)
    as_column = {"device": device, "dtype": torch.float32}
    return (k.unsqueeze(1), torch.tensor(ps, **as_column).unsqueeze(1),
            torch.tensor(ms, **as_column).unsqueeze(1))


def draw(probs: torch.Tensor, states: list[SamplingState]) -> torch.Tensor:
    """(B,) one categorical draw per row of ``probs`` ((B, V), non-negative, rows not all 0),
    by inverse CDF with ``uniforms`` (``ironlm.interfaces.categorical.pick``)."""
    return pick(probs, uniforms(states, probs.device))
