"""Engine side of speculative decoding: which drafts each request verifies and how many it asks
for, checks on arriving drafts, when speculation is off, and the counters behind the metrics.

Per step and request (the worker does the drafting and the verification):
- ``drafts``: the request's proposals from the last step, cut to what it may still emit
  (max_tokens, max_model_len) and to the step's token budget;
- ``plan_proposals``: how many drafts to ask for after this step; none while at least
  ``speculative_disable_by_batch_size`` requests run, none for sequences longer than
  ``speculative_max_model_len``, and none for a while where speculation does not pay: when a
  request's last ``HISTORY`` verifications kept fewer than ``MIN_MEAN_ACCEPTED`` drafts on
  average (the target then spends more on rejected drafts than it saves), it pauses for
  ``PAUSE_STEPS`` steps and tries again;
- ``accept_proposals``: the arriving drafts, cut before the first one a guided request's
  grammar would refuse (the target could never keep it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ironlm.config import EngineConfig
from ironlm.engine.guided_closing import CLOSE_WINDOW
from ironlm.engine.request import Request

log = logging.getLogger("ironlm.spec_decode")


@dataclass
class SpecDecodeStats:
    """Cumulative counters (vLLM's speculative-decoding metrics)."""

    num_drafts: int = 0  # verifications of at least one draft
    num_draft_tokens: int = 0  # drafts verified
    num_accepted_tokens: int = 0  # drafts kept
    num_emitted_tokens: int = 0  # tokens those verifications produced (kept drafts + one each)
    draft_time: float = 0.0  # seconds spent drafting
    target_time: float = 0.0  # seconds in the target's forward and sampling / verification

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verification produced on average (1 + kept drafts)."""
        return self.num_emitted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def efficiency(self) -> float:
        """Emitted tokens over the most the verifications could have emitted (k + 1 each)."""
        most = self.num_draft_tokens + self.num_drafts
        return self.num_emitted_tokens / most if most else 0.0

    def to_dict(self) -> dict[str, float]:
        return {
            "spec_decode_num_drafts": self.num_drafts,
            "spec_decode_num_draft_tokens": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
            "spec_decode_num_emitted_tokens": self.num_emitted_tokens,
            "spec_decode_draft_acceptance_rate": self.acceptance_rate,
            "spec_decode_mean_accepted_length": self.mean_accepted_length,
            "spec_decode_efficiency": self.efficiency,
            "spec_decode_draft_time_seconds": self.draft_time,
            "spec_decode_target_time_seconds": self.target_time,
        }


class SpeculationPolicy:
    HISTORY = 8  # verifications looked at
    MIN_MEAN_ACCEPTED = 0.5  # kept drafts per verification below which speculation pauses
    PAUSE_STEPS = 16

    def __init__(
        self, config: EngineConfig, max_model_len: int, lookahead: Callable[[int], int]
    ) -> None:
        assert config.num_speculative_tokens is not None
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.spec_max_len = min(config.speculative_max_model_len or max_model_len, max_model_len)
        self.disable_by_batch_size = config.speculative_disable_by_batch_size
        self.lookahead = lookahead  # the proposer's KV slots for drafting k tokens
        # slots a request keeps after a step: every position the target or the proposer may
        # have written past its computed tokens (the next step allocates more anyway)
        self.keep_slots = self.k + lookahead(self.k)
        self.stats = SpecDecodeStats()

    def step_enabled(self, num_running: int) -> bool:
        return self.disable_by_batch_size is None or num_running < self.disable_by_batch_size

    def _room(self, req: Request, num_tokens: int, outputs: int) -> int:
        """Tokens a verification may still emit beyond one, for a request that will hold
        ``num_tokens`` tokens, ``outputs`` of them generated."""
        room = self.max_model_len - num_tokens - 1
        max_tokens = req.sampling_params.max_tokens
        if max_tokens is not None:
            room = min(room, max_tokens - outputs - 1)
        return room

    def drafts(self, req: Request, budget: int) -> list[int]:
        """The drafts ``req`` verifies this step (it owes one token). None near the end of a
        tool call's budget: its last CLOSE_WINDOW tokens are closed one at a time
        (engine.guided_closing), which a multi-token verification would jump past."""
        room = self._room(req, req.num_tokens, len(req.output_token_ids))
        spec = req.sampling_params.guided_decoding
        if spec is not None and spec.close_at_budget and room - self.k < CLOSE_WINDOW:
            return []
        return req.spec_token_ids[: max(0, min(self.k, budget - 1, room))]

    def plan_proposals(self, req: Request, num_drafts: int) -> int:
        """How many drafts to ask for after this step (called once per scheduled step)."""
        if req.spec_paused_steps > 0:
            req.spec_paused_steps -= 1
            return 0
        if req.pooling:
            return 0
        # after this step the request holds at least one more token (and at most its drafts)
        low = req.num_tokens + 1
        room = self._room(req, low, len(req.output_token_ids) + 1)
        room = min(room, self.spec_max_len - (low + num_drafts) + 1)
        return max(0, min(self.k, room))

    def on_verified(self, req: Request, num_drafts: int, num_emitted: int) -> None:
        accepted = num_emitted - 1
        s = self.stats
        s.num_drafts += 1
        s.num_draft_tokens += num_drafts
        s.num_accepted_tokens += accepted
        s.num_emitted_tokens += num_emitted
        req.spec_history.append((num_drafts, accepted))
        del req.spec_history[: -self.HISTORY]
        if len(req.spec_history) == self.HISTORY:
            mean = sum(a for _, a in req.spec_history) / self.HISTORY
            if mean < self.MIN_MEAN_ACCEPTED:
                req.spec_paused_steps = self.PAUSE_STEPS
                req.spec_history.clear()

    def accept_proposals(self, req: Request, tokens: list[int]) -> None:
        """Keep ``tokens`` as ``req``'s drafts for the next step (a guided request's cut
        before the first token its grammar refuses)."""
        if req.is_finished or not tokens:
            req.spec_token_ids = []
            return
        if req.grammar is not None and not req.grammar_error is not None:
            tokens = _grammar_prefix(req, tokens)
        req.spec_token_ids = tokens


def _grammar_prefix(req: Request, tokens: list[int]) -> list[int]:
    """The longest prefix of ``tokens`` the request's grammar accepts (state left as found)."""
    grammar = req.grammar
    accepted = 0
    try:
        for t in tokens:
            if grammar.is_terminated() or not grammar.accept_token(t):
                break
            accepted += 1
    except Exception as exc:  # a backend dead end: no drafts; the request fails on its own
        log.warning("guided grammar failed on drafts of request %s: %s", req.request_id, exc)
    finally:
        if accepted:
            grammar.rollback(accepted)
    return tokens[:accepted]
