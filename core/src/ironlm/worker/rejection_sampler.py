"""Rejection sampling: verify drafted tokens against the target's distribution, exactly.

A request with drafts d_1..d_k has k + 1 rows of target logits: row j follows the request's
tokens and d_1..d_{j-1}. Each row goes through the same rules as plain sampling (penalties,
min_tokens, bad words see the drafts before it; guided masks come per row), giving the target
distribution p_j. Then, in order:

- greedy requests keep d_j while it is the argmax of p_j; the first row where it is not (or
  row k + 1 when every draft matched) contributes its argmax. The tokens are exactly those of
  plain greedy decoding.
- sampled requests keep d_j with probability min(1, p_j(d_j) / q_j(d_j)), q_j being the
  distribution d_j was drawn from (a point mass when the proposer gives none); at the first
  rejection they draw from the residual max(0, p_j - q_j), renormalised, and stop; when every
  draft is kept they draw one more token from p_{k+1}. Each emitted token is then distributed
  as plain sampling would have drawn it (Leviathan et al. 2023, Chen et al. 2023).

Seeded requests draw their uniforms and residual samples from their own generator, so a seeded
request's output depends only on its seed and its drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ironlm.interfaces.step import SampledToken
from ironlm.worker.sampler import Sampler, SamplingState, top_logprobs
from ironlm.worker.draw_inputs import draw


@dataclass
class SpecRows:
    """One sampling request's rows in a verification step."""

    state: SamplingState
    drafts: list[int]  # k drafts (k may be 0: plain sampling of one row)
    draft_probs: torch.Tensor | None  # (k, V) distributions the drafts came from; None: point masses


class RejectionSampler:
    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def __call__(
        self,
        logits: torch.Tensor,  # (R, V) float32, R = sum(k + 1): each request's rows in order
        groups: list[SpecRows],
        allowed_mask: torch.Tensor | None = None,  # (R, V) bool, per row
    ) -> list[list[SampledToken]]:
        row_states: list[SamplingState] = []
        for g in groups:
            row_states += [g.state.extended(g.drafts[:j]) for j in range(len(g.drafts) + 1)]
        if logits.shape[0] != len(row_states):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(row_states)} verify rows")
        if allowed_mask is not None and allowed_mask.shape != logits.shape:
            raise ValueError("guided mask does not match the verification rows")
        x = self.sampler.final_logits(logits, row_states, allowed_mask)
        probs = None
        if not all(g.state.params.sampling_type_greedy for g in groups):
            probs = torch.softmax(x, dim=-1)  # (R, V) target distributions after every rule
        chosen: list[list[int]] = []
        rows_of: list[list[int]] = []  # logit row that produced each emitted token
        first = 0
        for g in groups:
            k = len(g.drafts)
            rows = list(range(first, first + k + 1))
            if g.state.params.sampling_type_greedy:
                tokens = self._greedy(x[rows[0] : rows[-1] + 1], g.drafts)
            else:
                assert probs is not None
                tokens = self._sampled(probs[rows[0] : rows[-1] + 1], g)
            chosen.append(tokens)
            rows_of.append(rows[: len(tokens)])
            first += k + 1
        return self._outputs(logits, groups, chosen, rows_of)

    @staticmethod
    def _greedy(x: torch.Tensor, drafts: list[int]) -> list[int]:
        """x: (k + 1, V) processed logits; the drafts that match the argmax, then the argmax."""
        best = x.argmax(dim=-1).tolist()
        out = []
        for j, d in enumerate(drafts):
            if best[j] != d:
                break
            out.append(d)
        out.append(best[len(out)])
        return out

    @staticmethod
    def _sampled(p: torch.Tensor, g: SpecRows) -> list[int]:
        """p: (k + 1, V) target distributions of one request."""
        k = len(g.drafts)
        gen = g.state.generator
        out: list[int] = []
        if k:
            d = torch.tensor(g.drafts, dtype=torch.long, device=p.device)
            p_d = p[:k].gather(1, d.unsqueeze(1)).squeeze(1)  # (k,)
            q_d = (
                g.draft_probs.to(p.device).gather(1, d.unsqueeze(1)).squeeze(1)
                if g.draft_probs is not None else torch.ones_like(p_d)
            )  # fmt: skip
            u = torch.rand(k, generator=gen, device=p.device)
            accepted = (u * q_d < p_d).tolist()  # u < p/q, without dividing by q = 0
            for j in range(k):
                if not accepted[j]:
                    q = (
                        g.draft_probs[j].to(p.device) if g.draft_probs is not None
                        else torch.nn.functional.one_hot(d[j], p.shape[1]).to(p.dtype)
                    )  # fmt: skip
                    residual = (p[j] - q).clamp(min=0)
                    total = residual.sum()
                    # p == q exactly leaves nothing; then the draft was kept for sure (u < 1)
                    row = residual / total if float(total) > 0 else p[j]
                    out.append(int(draw(row.unsqueeze(0), [g.state])[0]))
                    return out
                out.append(g.drafts[j])
        out.append(int(draw(p[k].unsqueeze(0), [g.state])[0]))
        return out

    @staticmethod
    def _outputs(
        logits: torch.Tensor,
        groups: list[SpecRows],
        chosen: list[list[int]],
        rows_of: list[list[int]],
    ) -> list[list[SampledToken]]:
        """Logprobs under the raw distribution of each token's own row; record the tokens."""
        flat_rows = [r for rows in rows_of for r in rows]
        flat_toks = [t for toks in chosen for t in toks]
        idx = torch.tensor(flat_rows, dtype=torch.long, device=logits.device)
        sub = logits[idx]  # (E, V)
        lp = (sub.gather(1, torch.tensor(flat_toks, device=logits.device).unsqueeze(1)).squeeze(1)
              - torch.logsumexp(sub, dim=-1)).tolist()  # fmt: skip
        out: list[list[SampledToken]] = []
        at = 0
        for g, toks in zip(groups, chosen):
            k_top = g.state.params.logprobs
            lps = torch.log_softmax(sub[at : at + len(toks)], dim=-1) if k_top is not None else None
            emitted = []
            for j, t in enumerate(toks):
                top = top_logprobs(lps[j], t, k_top) if lps is not None and k_top is not None else None
                emitted.append(SampledToken(t, lp[at + j], top))
                g.state.record(t)
            out.append(emitted)
            at += len(toks)
        return out
