"""Speculative decoding: proposers draft tokens, the target model verifies them.

Each step the engine sends a request's drafts with its last token (``ScheduledSeq.
spec_token_ids``); the worker runs the target once over them, and rejection sampling keeps
the target's output distribution exactly (greedy: the target's own tokens), whatever was
drafted. Right after, still in the same ``execute_model``, the worker asks the proposer for the
next drafts (``ScheduledSeq.num_proposals`` of them) and returns them in
``ModelOutput.spec_token_ids``; the engine checks them (grammar, limits) and sends them back
the next step. A proposer therefore decides speed, never outputs.

A proposer is registered through ``register_speculative_proposers`` and built by the worker
that samples, as ``Proposer(context)`` with a :class:`ProposerContext` (the target, a loader
for draft models with their own paged KV cache, the request's sampling rule). Selection:
``speculative_model="[name]"`` picks the proposer called ``name`` (the core's ``ngram``); a
model path picks the proposer whose ``model_types`` holds the model's config.json
``model_type`` (Medusa, EAGLE, ... heads), else the core's ``draft_model``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ironlm.sampling_params import SamplingParams

if TYPE_CHECKING:  # the contract names its host for typing only
    from ironlm.config import EngineConfig
    from ironlm.interfaces.model import ModelArchitecture


@dataclass
class ProposalRequest:
    """One request a proposer drafts for, after this step's tokens were sampled."""

    request_id: str
    token_ids: list[int]  # every token so far: prompt, then output (the last was just sampled)
    num_proposals: int  # draft at most this many tokens (>= 1)
    # Its KV block table: covers len(token_ids) - 1 + lookahead_slots(num_proposals) slots.
    block_ids: list[int]
    params: SamplingParams
    # (rows, hidden_size): the target's final hidden states of this step's accepted rows for the
    # request (a prefill chunk's rows; a decode's last token and accepted drafts). Set only for
    # proposers with ``needs_target_hidden_states``.
    target_hidden_states: torch.Tensor | None = None


@dataclass
class Proposal:
    token_ids: list[int]  # at most num_proposals drafts; may be empty
    # (len(token_ids), vocab_size) float32: the distribution each draft was drawn from. None:
    # each draft was chosen deterministically (a point mass), as n-gram lookup does.
    probs: torch.Tensor | None = None


@dataclass
class DraftSeq:
    """Tokens to run through a draft model for one request."""

    token_ids: list[int]  # tokens at positions start_pos, start_pos + 1, ...
    start_pos: int  # tokens of this request already in the draft's KV cache
    block_ids: list[int]  # the request's block table (shared with the target)


class DraftModel(ABC):
    """A model the worker loaded for a proposer (``ProposerContext.load_draft_model``), with
    its own paged KV cache of the target's layout: same block ids, same block size, as many
    blocks, so a request's block table addresses both caches."""

    vocab_size: int
    max_model_len: int  # its max_position_embeddings

    @abstractmethod
    def kv_cache_bytes_per_block(self) -> int:
        """Bytes one KV block takes over this model's attention layers."""

    @abstractmethod
    def initialize_kv_cache(self, num_kv_blocks: int) -> None:
        """Allocate ``num_kv_blocks`` blocks per layer (the target's count)."""

    @abstractmethod
    def forward(self, seqs: list[DraftSeq]) -> torch.Tensor:
        """Run every sequence's tokens, writing their KV; returns (len(seqs), vocab_size)
        float32 logits of each sequence's last token."""


class ProposerContext(ABC):
    """What the worker offers its proposer (the core's worker implements it)."""

    config: EngineConfig
    device: torch.device
    dtype: torch.dtype
    vocab_size: int  # width of the target's logits
    target: ModelArchitecture  # the loaded target (heads may read its lm_head / embeddings)

    @abstractmethod
    def load_draft_model(self, model: str) -> DraftModel:
        """Load ``model`` (an HF folder or GGUF file the engine can load) on the target's
        device, platform and attention backend, in the target's dtype."""

    @abstractmethod
    def sample(self, logits: torch.Tensor, request_ids: list[str]) -> tuple[list[int], torch.Tensor]:
        """Draw one token per row of ``logits`` ((rows, vocab_size) float32) the way the
        target samples that request: its logit rules, temperature, top-k / top-p / min-p, its
        own generator when seeded; greedy requests take the argmax. Returns the tokens and
        (rows, vocab_size) float32 probabilities each was drawn from (one-hot for greedy
        rows), to hand back as ``Proposal.probs``."""


class SpeculativeProposer(ABC):
    """Drafts tokens for requests. Registered through ``register_speculative_proposers``;
    built once per engine in the worker that samples, as ``Proposer(context)``."""

    name: ClassVar[str]
    # Whether it loads a model from ``speculative_model`` (a path) rather than being named
    # in brackets.
    needs_model: ClassVar[bool] = False
    # config.json ``model_type`` values of the models this proposer loads (Medusa, EAGLE ...).
    model_types: ClassVar[tuple[str, ...]] = ()
    # Set when ``propose`` reads ``ProposalRequest.target_hidden_states`` (decode graphs,
    # which do not expose hidden states, are then off).
    needs_target_hidden_states: ClassVar[bool] = False

    def __init__(self, context: ProposerContext) -> None:
        self.context = context

    @classmethod
    def validate(cls, config: EngineConfig, tokenizer: Any, vocab_size: int) -> None:
        """Check the configuration at engine start-up, before any worker starts (ValueError
        naming the problem). ``tokenizer`` and ``vocab_size`` are the target's. Runs in the
        engine process."""

    @classmethod
    def lookahead_slots(cls, num_proposals: int) -> int:
        """KV slots past a request's last token that drafting ``num_proposals`` tokens writes
        (a draft model writes its KV for its own drafts); the engine allocates them."""
        return 0

    def load(self) -> None:
        """Load weights (called once, after the target model is loaded)."""

    def kv_cache_bytes_per_block(self) -> int:
        """Bytes per KV block the proposer adds to the target's (its own KV cache)."""
        return 0

    def initialize_kv_cache(self, num_kv_blocks: int) -> None:
        """Allocate the proposer's KV cache: ``num_kv_blocks`` blocks, the target's count."""

    @abstractmethod
    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        """Draft tokens for each request (missing or empty: none for it)."""

    def drop_requests(self, request_ids: list[str]) -> None:
        """These requests finished, or were preempted and lost their KV: forget their state."""
