"""Closing a constrained output inside its token budget (tool calls with required / named).

A greedy model can loop inside a value its schema leaves unbounded (a string of "_detail",
a number of zeros), or keep appending calls to a call array, until ``max_tokens`` cuts it, and
a cut tool call does not parse. For specs with ``close_at_budget``, in the last
``CLOSE_WINDOW`` tokens of the budget, ``BudgetCloser`` searches the request's own Grammar
(``accept_token``, ``fill_mask``, ``rollback``) for a short path to a complete match (EOS
allowed); what the grammar accepts is what the schema allows, on every backend. While that
path is more than ``SLACK`` tokens shorter than the budget left the model samples on, except
that a token which would open more than the budget can still close (a ',' starting one more
call, a '{' of an object with required keys) is masked out; once the path needs the budget,
it is forced token by token, then EOS, and the request ends with finish_reason "length" and
a complete call. Tokens that close JSON ('"', '}', ']') are tried first, then separators,
then short values, with backtracking when a choice dead-ends. Only tokens made of JSON
punctuation alone are checked as openers: a merged token such as ',"id' is not, and when it
opens more than the budget can close the search finds no path (retried a few tokens later;
the request is cut by its limit if none ever fits).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ironlm.interfaces.guided import Grammar

if TYPE_CHECKING:
    from ironlm.engine.request import Request

CLOSE_WINDOW = 48  # look for a closing path once this few tokens are left
SLACK = 6  # start closing while the path is up to this many tokens shorter than the budget
GROWTH_CHECKS = 8  # more allowed ',' '{' '[' tokens than this: they are string content
RETRY_AFTER = 4  # tokens between searches once one found no path within the budget
MAX_FILLS = 128  # mask fills one search may spend (a path is usually found on the first try)
BRANCH = 4  # candidates tried per position before backtracking further up
_CLOSERS = frozenset('"}]')
_GROWERS = frozenset(",{[")  # characters that start one more item, key or nested value
_UNHELPFUL = 1e6  # whitespace-only tokens: never needed to close compact JSON
_MINIMAL_VALUES = ("0", '""', "false", "null", "[]", "{}", "true", "1")  # in this order


def closing_rank(text: str) -> float:
    """How early a token with this text is tried on a closing path (lower first): closers
    that start with a quote, the shortest first (where a string value opens, '"]]' would
    open it with ']]' inside; inside a string, '}"' would close it with a '}' in it); other
    closers, shortest first; separators; minimal values; then whatever else the grammar
    allows, the longest first (a required key is spelled in few tokens)."""
    if text and all(c in _CLOSERS for c in text):
        return (-200.0 if text[0] == '"' else -100.0) + len(text)
    if text in (",", ":"):
        return 1.0
    if text in _MINIMAL_VALUES:
        return 2.0 + 0.01 * _MINIMAL_VALUES.index(text)
    if not text.strip():
        return _UNHELPFUL
    return 100.0 - min(len(text), 90)


class TokenRanks:
    """Per token id, computed once per tokenizer: ``ranks`` (vocab_size,) float32, its
    ``closing_rank``; ``growth`` (vocab_size,) bool, whether its text is only JSON punctuation
    with one of ',', '{', '[' (what opens more structure where it is not string content)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        known = min(vocab_size, len(tokenizer))
        texts = [tokenizer.decode([i]) for i in range(known)]
        ranks = [closing_rank(t) for t in texts] + [_UNHELPFUL] * (vocab_size - known)
        self.ranks = torch.tensor(ranks, dtype=torch.float32)  # past the tokenizer: unused ids
        growth = [bool(t) and set(t) <= _CLOSERS | _GROWERS | {":"} and bool(set(t) & _GROWERS)
                  for t in texts]  # fmt: skip
        self.growth = torch.tensor(growth + [False] * (vocab_size - known), dtype=torch.bool)


def shortest_closing(grammar: Grammar, eos_id: int, ranks: torch.Tensor,
                     limit: int) -> list[int] | None:
    """Token ids (at most ``limit``) after which ``grammar`` allows EOS, found depth first in
    ``ranks`` order; None when no path turned up within ``MAX_FILLS`` mask fills. The grammar
    ends in the state it started in."""
    mask = torch.zeros(ranks.shape[0], dtype=torch.bool)
    path: list[int] = []
    fills = 0

    def visit(depth: int) -> bool:
        nonlocal fills
        mask.zero_()
        try:
            grammar.fill_mask(mask)
        except Exception:  # a dead end on a trial path (at depth 0: the request's own state)
            if depth == 0:
                raise
            return False
        fills += 1
        if bool(mask[eos_id]):
            return True
        if depth == limit or fills >= MAX_FILLS:
            return False
        scored = torch.where(mask, ranks, torch.full_like(ranks, float("inf")))
        k = min(BRANCH, int(mask.sum()))
        best = torch.topk(scored, k, largest=False)
        for score, token in zip(best.values.tolist(), best.indices.tolist()):
            if score == float("inf") or not _try_accept(grammar, token):
                continue
            path.append(token)
            if visit(depth + 1):
                return True
            grammar.rollback(1)
            path.pop()
        return False

    found = visit(0)
    if path:
        grammar.rollback(len(path))
    return path if found else None


def _try_accept(grammar: Grammar, token: int) -> bool:
    """accept_token, with a backend failure on a trial path read as a refusal."""
    try:
        return grammar.accept_token(token)
    except Exception:
        return False


@dataclass
class ClosingState:
    """One request's closing (``Request.closing``): the forced path once started (``plan``
    from output position ``start``, then EOS; the request then ends with finish_reason
    "length"); ``failed_at``: the output length at the last search that found no path (the
    next one waits RETRY_AFTER tokens: the model may close some nesting itself)."""

    plan: list[int] | None = None
    start: int = 0
    failed_at: int | None = None

    def next_token(self, num_output: int, eos_id: int) -> int:
        assert self.plan is not None
        at = num_output - self.start
        return self.plan[at] if at < len(self.plan) else eos_id


class BudgetCloser:
    """The engine's closing of ``close_at_budget`` requests (one per GuidedManager): the
    token ranks are built on first use; ``max_model_len`` bounds every budget."""

    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int | None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self._lock = threading.Lock()
        self._tokens: TokenRanks | None = None

    def fill_row(self, req: Request, row: torch.Tensor) -> bool:
        """For a ``close_at_budget`` request in the last CLOSE_WINDOW tokens of its budget,
        fill ``row`` ((vocab,) bool, all False) with its next allowed tokens: the forced
        closing path (then EOS), or the grammar's mask less the tokens after which no closing
        path fits. False when the request samples freely (row untouched: the caller fills it).
        After a search that finds no path within the budget the request samples freely for
        RETRY_AFTER tokens (it is cut by its limit, as without closing, if none ever fits)."""
        params, eos = req.sampling_params, req.eos_token_id
        spec = params.guided_decoding
        if spec is None or not spec.close_at_budget or eos is None:
            return False
        if not req.grammar.constraining:
            return False  # still reasoning: the budget cuts it as any free text
        state = req.closing if req.closing is not None else ClosingState()
        n_out = len(req.output_token_ids)
        if state.failed_at is not None and n_out - state.failed_at < RETRY_AFTER:
            return False
        if state.plan is not None:
            if req.output_token_ids[state.start:] == state.plan[: n_out - state.start]:
                row[state.next_token(n_out, eos)] = True
                return True
            state.plan = None  # a logits processor moved it off the path: search again
        left = req.tokens_left(self.max_model_len)
        if left is None or left > CLOSE_WINDOW or left < 1:
            return False
        tokens = self.token_ranks()
        grammar, ranks = req.grammar, tokens.ranks
        req.closing = state
        path = shortest_closing(grammar, eos, ranks, left)
        state.failed_at = None if path is not None else n_out
        if path is None:
            return False
        if len(path) + SLACK >= left and n_out + len(path) >= params.min_tokens:
            state.plan, state.start = path, n_out  # (EOS before min_tokens would be banned)
            row[state.next_token(n_out, eos)] = True
            return True
        grammar.fill_mask(row)
        if not bool(row.any()):
            raise RuntimeError("no token is allowed next")
        growers = (row & tokens.growth).nonzero().flatten().tolist()
        if len(growers) <= GROWTH_CHECKS:  # more: ',' '{' '[' are string content here
            for token in growers:
                if not _try_accept(grammar, token):
                    continue
                try:
                    fits = shortest_closing(grammar, eos, ranks, left - 1) is not None
                finally:
                    grammar.rollback(1)
                if not fits:
                    row[token] = False
        return True

    def token_ranks(self) -> TokenRanks:
        """The tokenizer's ranks, built once (the server builds them from its compile thread
        when a tool call is first compiled, so the engine thread does not wait on them)."""
        with self._lock:
            if self._tokens is None:
                self._tokens = TokenRanks(self.tokenizer, self.vocab_size)
            return self._tokens
