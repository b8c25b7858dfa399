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
        firsts: list[int] = []  # each request's first row
        for g in groups:
            firsts.append(len(row_states))
            row_states += [g.state.extended(g.drafts[:j]) for j in range(len(g.drafts) + 1)]
        if logits.shape[0] != len(row_states):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(row_states)} verify rows")
        if allowed_mask is not None and allowed_mask.shape != logits.shape:
            raise ValueError("guided mask does not match the verification rows")
        x = self.sampler.final_logits(logits, row_states, allowed_mask)
        chosen: list[list[int]] = [[] for _ in groups]
        greedy = [i for i, g in enumerate(groups) if g.state.params.sampling_type_greedy]
        sampled = [i for i, g in enumerate(groups) if not g.state.params.sampling_type_greedy]
        # each row's argmax (greedy requests) and log-normaliser (sampled ones: p = exp(x - lse)
        # where one value is wanted, no (R, V) softmax), in the platform's one pass
        lse, best = self.sampler.ops.logsumexp_argmax(x, argmax=bool(greedy),
                                                      logsumexp=bool(sampled))
        if greedy:
            assert best is not None
            best_list = best.tolist()  # (R,)
            for i in greedy:
                rows = best_list[firsts[i] : firsts[i] + len(groups[i].drafts) + 1]
                chosen[i] = self._greedy(rows, groups[i].drafts)
        if sampled:
            assert lse is not None
            tokens = self._sampled(x, lse, [firsts[i] for i in sampled],
                                   [groups[i] for i in sampled])
            for i, t in zip(sampled, tokens):
                chosen[i] = t
        rows_of = [list(range(f, f + len(t))) for f, t in zip(firsts, chosen)]
        return self._outputs(logits, groups, chosen, rows_of)

    @staticmethod
    def _greedy(best: list[int], drafts: list[int]) -> list[int]:
        """best: the argmax of each of a request's k + 1 rows; the drafts that match it, then
        the argmax of the row after them."""
        out = []
        for j, d in enumerate(drafts):
            if best[j] != d:
                break
            out.append(d)
        out.append(best[len(out)])
        return out

    @staticmethod
    def _sampled(x: torch.Tensor, lse: torch.Tensor, firsts: list[int],
                 groups: list[SpecRows]) -> list[list[int]]:
        """x: (R, V) final logits, lse (R,) their log-normalisers (p_j = softmax(x_j)); the
        sampling requests and their first rows -> each one's tokens. Every draft's p_j(d_j) in
        one gather and one comparison with its uniform (drawn from the request's own generator,
        before its last draw, as alone), then one draw over the rows that end the requests:
        the residual max(0, p_j - q_j) at the first rejection (the draw is by running total:
        no renormalising), or p_{k+1}."""
        dev = x.device
        ks = [len(g.drafts) for g in groups]
        at = [f + j for f, k in zip(firsts, ks) for j in range(k)]
        drafts = [d for g in groups for d in g.drafts]
        accepted: list[bool] = []
        if drafts:
            p_d = (x[at, drafts] - lse[at]).exp()  # (D,)
            q_d = torch.cat([
                g.draft_probs.to(dev)[list(range(k)), g.drafts] if g.draft_probs is not None
                else torch.ones(k, dtype=p_d.dtype, device=dev)
                for g, k in zip(groups, ks) if k
            ])  # fmt: skip
            u = torch.cat([torch.rand(k, generator=g.state.generator, device=dev)
                           for g, k in zip(groups, ks) if k])  # fmt: skip
            accepted = (u * q_d < p_d).tolist()  # u < p/q, without dividing by q = 0
        out: list[list[int]] = []
        last_rows: list[int] = []  # the row each request's last token is drawn from
        rejected: list[tuple[int, SpecRows, int]] = []  # (index in last_rows, request, draft)
        flat = 0
        for f, g, k in zip(firsts, groups, ks):
            kept = 0
            while kept < k and accepted[flat + kept]:
                kept += 1
            flat += k
            out.append(g.drafts[:kept])
            if kept < k:
                rejected.append((len(last_rows), g, kept))
            last_rows.append(f + kept)
        p = torch.softmax(x[last_rows], dim=-1)  # (G, V)
        w = p.clone()
        for m, g, j in rejected:
            if g.draft_probs is not None:
                w[m] = (w[m] - g.draft_probs[j].to(dev)).clamp(min=0)
            else:  # a point mass: p_j without the draft
                w[m, g.drafts[j]] = 0.0
        empty = w.sum(dim=-1) <= 0  # p == q exactly: then the draft was kept for sure (u < 1)
        if bool(empty.any()):
            w[empty] = p[empty]
        for tokens, t in zip(out, draw(w, [g.state for g in groups]).tolist()):
            tokens.append(int(t))
        return out

    def _outputs(
        self,
        logits: torch.Tensor,
        groups: list[SpecRows],
        chosen: list[list[int]],
        rows_of: list[list[int]],
    ) -> list[list[SampledToken]]:
        """Logprobs under the raw distribution of each token's own row (where a request reports
        them: x[t] - logsumexp(x) of every row in one pass; the top ones from its rows'
        log-softmax); record the tokens."""
        flat_rows = [r for rows in rows_of for r in rows]
        flat_toks = [t for toks in chosen for t in toks]
        lp: list[float | None] = [None] * len(flat_toks)
        if any(g.state.params.reports_logprobs for g in groups):
            lse, _ = self.sampler.ops.logsumexp_argmax(logits, argmax=False)
            assert lse is not None
            lp = (logits[flat_rows, flat_toks] - lse[flat_rows]).tolist()
        out: list[list[SampledToken]] = []
        at = 0
        for g, toks, rows in zip(groups, chosen, rows_of):
            k_top = g.state.params.logprobs
            lps = torch.log_softmax(logits[rows], dim=-1) if k_top is not None else None
            emitted = []
            for j, t in enumerate(toks):
                top = top_logprobs(lps[j], t, k_top) if lps is not None and k_top is not None else None
                emitted.append(SampledToken(t, lp[at + j], top))
                g.state.record(t)
            out.append(emitted)
            at += len(toks)
        return out
