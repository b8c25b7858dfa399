"""Repetition, frequency and presence penalties (vLLM's), applied to the rows whose requests
have them, as one tensor op over those rows."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ironlm.worker.sampler import SamplingState


def apply_penalties(x: torch.Tensor, states: list[SamplingState]) -> torch.Tensor:
    """``x`` (B, V) with each penalised row changed in place (the caller's copy): repetition
    divides a positive logit (multiplies a negative one) of a token seen in the prompt or the
    output; frequency subtracts per occurrence in the output, presence once."""
    rows = [i for i, s in enumerate(states) if s.output_counts is not None]
    if not rows:
        return x
    idx = torch.tensor(rows, device=x.device)
    counts = torch.stack([states[i].output_counts for i in rows]).to(x.dtype)  # (R, V)
    rep = torch.tensor([states[i].params.repetition_penalty for i in rows], device=x.device)
    freq = torch.tensor([states[i].params.frequency_penalty for i in rows], device=x.device)
    pres = torch.tensor([states[i].params.presence_penalty for i in rows], device=x.device)
    sub = x[idx]
    seen = counts > 0
    prompt = [states[i].prompt_mask for i in rows]
    if any(m is not None for m in prompt):
        pm = torch.stack([m if m is not None else torch.zeros_like(seen[0]) for m in prompt])
        rep_seen = seen | pm
        r = rep.unsqueeze(1)
        sub = torch.where(rep_seen, torch.where(sub > 0, sub / r, sub * r), sub)
    sub = sub - freq.unsqueeze(1) * counts - pres.unsqueeze(1) * seen.to(x.dtype)
    x[idx] = sub
    return x
