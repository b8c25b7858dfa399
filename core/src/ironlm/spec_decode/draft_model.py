"""Draft model: a smaller model with the target's tokenizer drafts tokens one by one.

The draft keeps its own paged KV cache in the target's block layout (a request's block table
addresses both), so it only runs the tokens it has not seen: per request, a catch-up run over
the tokens accepted since its last proposal (the whole prompt the first time), whose last logits
give the first draft, then one single-token step per further draft. Drafts are drawn the way
the target samples the request (``ProposerContext.sample``); their probabilities go with the
proposal so that rejection sampling keeps the target's distribution.

KV bookkeeping per request: ``_done`` counts the leading positions whose draft KV holds the
request's real tokens; after a proposal, the drafts it fed (at the positions right after the
last real token) stay valid as far as they turn out equal to the tokens accepted there. A
preempted request is dropped and starts over at position 0, as a new one does; the draft never
trusts KV it did not write for the request (prefix-cache hits are recomputed by the draft,
writing the same values into the shared blocks).
"""

from __future__ import annotations

from typing import Any

import torch

from ironlm.config import EngineConfig
from ironlm.interfaces.spec_decode import (
    DraftModel,
    DraftSeq,
    Proposal,
    ProposalRequest,
    ProposerContext,
    SpeculativeProposer,
)
from ironlm.model_loader import HubOptions, ModelSource, resolve_model


class DraftModelProposer(SpeculativeProposer):
    """``speculative_model=PATH``: any model the engine loads that shares the tokenizer."""

    name = "draft_model"
    needs_model = True

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        self.draft: DraftModel | None = None
        self.max_len = 0
        self._done: dict[str, int] = {}  # request -> leading positions with valid draft KV
        self._fed: dict[str, list[int]] = {}  # request -> drafts fed after its last real token

    # -- start-up ----------------------------------------------------------------------------
    @classmethod
    def validate(cls, config: EngineConfig, tokenizer: Any, vocab_size: int) -> None:
        path = config.speculative_model
        assert path is not None
        source = resolve_model(path, config.trust_remote_code, None, HubOptions.cache_of(config))
        draft_vocab = int(source.hf_config.vocab_size)
        if tokenizer is None:  # skip_tokenizer_init: only the vocabularies' sizes compare
            if draft_vocab != vocab_size:
                raise ValueError(f"draft model {path!r} has {draft_vocab} vocabulary rows, "
                                 f"the target model {config.model!r} {vocab_size}")
            return cls._check_length(config, source)
        draft_tok = source.load_tokenizer()
        problem = _tokenizer_difference(tokenizer, draft_tok)
        if draft_vocab != vocab_size or problem:
            raise ValueError(
                f"draft model {path!r} does not share the target model {config.model!r}'s "
                f"tokenizer: the target has {vocab_size} vocabulary rows and a tokenizer of "
                f"{len(tokenizer)} tokens ({type(tokenizer).__name__}), the draft "
                f"{draft_vocab} rows and {len(draft_tok)} tokens ({type(draft_tok).__name__})"
                + (f"; {problem}" if problem else "")
            )
        cls._check_length(config, source)

    @staticmethod
    def _check_length(config: EngineConfig, source: ModelSource) -> None:
        limit = config.speculative_max_model_len
        if limit is not None and limit > source.max_position_embeddings:
            raise ValueError(
                f"speculative_max_model_len ({limit}) is larger than the draft model's "
                f"max_position_embeddings ({source.max_position_embeddings})"
            )

    @classmethod
    def lookahead_slots(cls, num_proposals: int) -> int:
        # the last real token's KV (written one step before the target's) and k - 1 drafts
        return num_proposals

    def load(self) -> None:
        cfg = self.context.config
        assert cfg.speculative_model is not None
        self.draft = self.context.load_draft_model(cfg.speculative_model)
        self.max_len = min(cfg.speculative_max_model_len or self.draft.max_model_len,
                           self.draft.max_model_len)

    def kv_cache_bytes_per_block(self) -> int:
        return self.model.kv_cache_bytes_per_block()

    def initialize_kv_cache(self, num_kv_blocks: int) -> None:
        self.model.initialize_kv_cache(num_kv_blocks)

    @property
    def model(self) -> DraftModel:
        if self.draft is None:
            raise RuntimeError("draft model proposer: load() has not run")
        return self.draft

    # -- drafting ----------------------------------------------------------------------------
    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        # positions used: up to len(token_ids) + num_proposals - 2 (the last draft is not fed)
        live = [r for r in requests if len(r.token_ids) + r.num_proposals - 1 <= self.max_len]
        if not live:
            return {}
        ids = [r.request_id for r in live]
        catch_up = []
        for r in live:
            done = self._valid_prefix(r)
            catch_up.append(DraftSeq(r.token_ids[done:], done, r.block_ids))
        tokens, probs = self.context.sample(self.model.forward(catch_up), ids)
        drafts = {rid: [t] for rid, t in zip(ids, tokens)}
        rows = {rid: [probs[i]] for i, rid in enumerate(ids)}
        for j in range(1, max(r.num_proposals for r in live)):
            step = [r for r in live if r.num_proposals > j]
            seqs = [DraftSeq([drafts[r.request_id][-1]], len(r.token_ids) + j - 1, r.block_ids)
                    for r in step]  # fmt: skip
            step_ids = [r.request_id for r in step]
            tokens, probs = self.context.sample(self.model.forward(seqs), step_ids)
            for i, (rid, t) in enumerate(zip(step_ids, tokens)):
                drafts[rid].append(t)
                rows[rid].append(probs[i])
        out = {}
        for r in live:
            rid = r.request_id
            self._done[rid] = len(r.token_ids)
            self._fed[rid] = drafts[rid][:-1]
            greedy = r.params.sampling_type_greedy  # greedy verification never reads probs
            out[rid] = Proposal(drafts[rid], None if greedy else torch.stack(rows[rid]))
        return out

    def _valid_prefix(self, r: ProposalRequest) -> int:
        """Leading positions of ``r`` whose draft KV is right; at most all but the last
        token, which is always run (its logits give the first draft)."""
        done = self._done.get(r.request_id, 0)
        for token in self._fed.get(r.request_id, []):
            if done >= len(r.token_ids) or r.token_ids[done] != token:
                break
            done += 1
        return min(done, len(r.token_ids) - 1)

    def drop_requests(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._done.pop(rid, None)
            self._fed.pop(rid, None)


def _tokenizer_difference(target: Any, draft: Any) -> str | None:
    """Why two HF tokenizers differ (None when they map the same tokens to the same ids)."""
    a, b = target.get_vocab(), draft.get_vocab()
    if a == b:
        return None
    for token, tid in a.items():
        if b.get(token) != tid:
            return (f"token {token!r} is id {tid} for the target, "
                    f"{b.get(token, 'missing')} for the draft")  # fmt: skip
    extra = next(t for t in b if t not in a)
    return f"the draft has token {extra!r}, the target does not"
