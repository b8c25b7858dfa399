"""N-gram prompt lookup: drafts copied from the request's own earlier tokens.

The request's last n tokens (n from ``ngram_prompt_lookup_max`` down to
``ngram_prompt_lookup_min``) are looked up among its earlier tokens (prompt and output); the
tokens that followed their latest earlier occurrence are the drafts, or those after the first
occurrence when fewer than ``num_proposals`` tokens follow the latest (a run of one repeated
token, a loop close behind). It pays where the output quotes its context (editing, repeating,
code that reuses names) and costs nothing to compute: each request keeps a table per n from
n-gram to the ends of its first and latest occurrences, extended by the tokens that arrived
since the last lookup.
"""

from __future__ import annotations

from ironlm.interfaces.spec_decode import (
    Proposal,
    ProposalRequest,
    ProposerContext,
    SpeculativeProposer,
)


class NgramIndex:
    """One request's n-gram tables (n in [n_min, n_max])."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        # n -> {n-gram: [exclusive end of its first occurrence, of its latest]}
        self.tables: dict[int, dict[tuple[int, ...], list[int]]] = {
            n: {} for n in range(n_min, n_max + 1)
        }
        self.indexed_end = 0  # n-grams ending at or before this index are in the tables

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed an earlier occurrence of the longest matching
        suffix of ``tokens``; [] when no suffix of n_min or more tokens recurs."""
        size = len(tokens)
        # Record n-grams ending before the last token (the suffix itself never matches itself).
        for end in range(self.indexed_end + 1, size):
            for n, table in self.tables.items():
                if end >= n:
                    ends = table.setdefault(tuple(tokens[end - n : end]), [end, end])
                    ends[1] = end
        self.indexed_end = max(self.indexed_end, size - 1)
        for n in range(min(self.n_max, size), self.n_min - 1, -1):
            ends = self.tables[n].get(tuple(tokens[size - n :]))
            if ends is not None:
                first, latest = ends
                end = latest if size - latest >= k else first
                return tokens[end : end + k]
        return []


class NgramProposer(SpeculativeProposer):
    """``speculative_model="[ngram]"``: prompt lookup; drafts are point masses."""

    name = "ngram"

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        cfg = context.config
        if cfg.ngram_prompt_lookup_max is None or cfg.ngram_prompt_lookup_min is None:
            raise ValueError("the ngram proposer needs ngram_prompt_lookup_max / _min")
        self.n_min = cfg.ngram_prompt_lookup_min
        self.n_max = cfg.ngram_prompt_lookup_max
        self._index: dict[str, NgramIndex] = {}

    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        out: dict[str, Proposal] = {}
        for r in requests:
            index = self._index.get(r.request_id)
            if index is None:
                index = self._index[r.request_id] = NgramIndex(self.n_min, self.n_max)
            drafts = index.lookup(r.token_ids, r.num_proposals)
            if drafts:
                out[r.request_id] = Proposal(drafts)
        return out

    def drop_requests(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._index.pop(rid, None)
