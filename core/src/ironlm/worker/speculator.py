"""The worker side of speculative decoding: verify this step's drafts, propose the next ones.

The model runner hands over the logits of every verification row (a sampling request's last
token and its drafts); ``verify`` runs rejection sampling with the distributions the drafts
were drawn from, which the speculator kept from the proposal (they never cross the executor:
the proposer runs here, on the worker that samples). After sampling, ``propose`` asks the
proposer for the next drafts of every request the engine wants them for.
"""

from __future__ import annotations

import torch

from ironlm.interfaces.spec_decode import Proposal, ProposalRequest, SpeculativeProposer
from ironlm.interfaces.step import ScheduledSeq, SampledToken
from ironlm.worker.rejection_sampler import RejectionSampler, SpecRows
from ironlm.worker.sampler import Sampler, SamplingState


class Speculator:
    def __init__(
        self,
        proposer: SpeculativeProposer,
        sampler: Sampler,
        states: dict[str, SamplingState],
        vocab_size: int,
    ) -> None:
        self.proposer = proposer
        self.vocab_size = vocab_size
        self.rejection = RejectionSampler(sampler)
        self.states = states  # the runner's per-request sampling states
        self._proposals: dict[str, Proposal] = {}  # last proposal per request

    def drop(self, request_ids: list[str]) -> None:
        """Finished or preempted requests: the proposer forgets them."""
        if request_ids:
            self.proposer.drop_requests(request_ids)
            for rid in request_ids:
                self._proposals.pop(rid, None)

    def verify(
        self, logits: torch.Tensor, seqs: list[ScheduledSeq], mask: torch.Tensor | None
    ) -> list[list[SampledToken]]:
        """logits: (sum(1 + len(spec)), V), rows of ``seqs`` (every one samples) in order."""
        groups = [SpecRows(self.states[s.request_id], s.spec_token_ids, self._draft_probs(s))
                  for s in seqs]  # fmt: skip
        return self.rejection(logits, groups, mask)

    def _draft_probs(self, seq: ScheduledSeq) -> torch.Tensor | None:
        proposal = self._proposals.pop(seq.request_id, None)
        k = len(seq.spec_token_ids)
        if not k:
            return None
        if proposal is None or proposal.token_ids[:k] != seq.spec_token_ids:
            raise RuntimeError(
                f"request {seq.request_id}: the drafts to verify are not the ones proposed"
            )
        return None if proposal.probs is None else proposal.probs[:k]

    def propose(
        self,
        seqs: list[ScheduledSeq],
        sampled: dict[str, list[SampledToken]],
        hidden: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, list[int]]:
        """Drafts for every sequence that sampled and asks for some (``num_proposals``);
        ``hidden``: per request, its accepted rows' target hidden states (when the proposer
        reads them)."""
        requests = []
        for s in seqs:
            if s.num_proposals <= 0 or s.request_id not in sampled:
                continue
            state = self.states[s.request_id]
            # (prompt embeddings, which have no prompt ids, are refused with speculation)
            assert state.prompt_token_ids is not None
            requests.append(ProposalRequest(
                request_id=s.request_id,
                token_ids=state.prompt_token_ids + (state.output_token_ids or []),
                num_proposals=s.num_proposals,
                block_ids=s.block_ids,
                params=state.params,
                target_hidden_states=hidden.get(s.request_id) if hidden else None,
            ))  # fmt: skip
        if not requests:
            return {}
        limits = {r.request_id: r.num_proposals for r in requests}
        out: dict[str, list[int]] = {}
        for rid, p in self.proposer.propose(requests).items():
            k = limits.get(rid)
            if k is None or not p.token_ids:
                continue
            tokens = [int(t) for t in p.token_ids[:k]]
            if any(not 0 <= t < self.vocab_size for t in tokens):
                raise ValueError(
                    f"proposer {self.proposer.name!r} drafted a token outside the vocabulary "
                    f"(0..{self.vocab_size - 1}) for request {rid}: {tokens}"
                )
            probs = p.probs[:k] if p.probs is not None else None
            if probs is not None and probs.shape[0] != len(tokens):
                raise ValueError(
                    f"proposer {self.proposer.name!r} gave {len(tokens)} drafts but "
                    f"{probs.shape[0]} probability rows for request {rid}"
                )
            self._proposals[rid] = Proposal(tokens, probs)
            out[rid] = tokens
        return out
