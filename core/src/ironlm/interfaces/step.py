"""What crosses the executor boundary each step: plain host data in, sampled tokens out.

Workers keep per-request sampling state (generators, penalty counts) keyed by request id:
``new_requests`` introduces a request once; ``finished_ids`` tells workers to drop it.

A step returns one or more tokens per sampling request: speculative decoding verifies drafts
(``spec_token_ids``) and keeps the accepted ones plus one; multi-step scheduling
(``num_steps``) runs several decode steps back to back, each sampled token the next input.
Each scheduled sequence names its LoRA adapter (``lora_id``); at most ``max_loras`` distinct
adapters appear in one step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ironlm.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    request_id: str
    prompt_token_ids: list[int] | None  # None: a prompt given as embeddings (prompt_embeds)
    sampling_params: SamplingParams
    eos_token_id: int | None
    pooling: bool = False  # return the prompt's mean-pooled hidden state instead of sampling
    # a token pooling task (token_embed / token_classify): every prompt row, not their mean
    # (a classifier's: every row through its head, not the last)
    pool_every_row: bool = False


@dataclass
class ScheduledSeq:
    request_id: str
    token_ids: list[int]  # the tokens to run this step (a prompt chunk, or the last token)
    start_pos: int  # position of token_ids[0] (= tokens already in the KV cache)
    block_ids: list[int]  # the request's whole block table
    sample: bool  # whether this step completes the request's known tokens (sample one more)
    num_output_tokens: int  # generated tokens so far (min_tokens, penalties)
    # Return logprobs of the prompt tokens this chunk predicts (positions start_pos+1 ...).
    want_prompt_logprobs: bool = False
    # Speculative decoding: drafts to verify, run after token_ids in the same forward (at
    # positions start_pos + len(token_ids), ...); only with sample=True. The step returns the
    # accepted drafts and one more token.
    spec_token_ids: list[int] = field(default_factory=list)
    # Drafts to propose for this request after this step's sampling (0: none); its block table
    # holds the proposer's lookahead slots.
    num_proposals: int = 0
    # Multi-step: decode steps to run back to back (one token in each, sampled on the worker and
    # fed to the next); block_ids cover start_pos + num_steps slots. > 1 only for pure decode.
    num_steps: int = 1
    # The LoRA adapter (its lora_int_id) the tokens run with; 0: the base model. Workers hold
    # the adapter already (the engine loads it through collective_rpc("add_lora", ...)).
    lora_id: int = 0
    # vLLM's prompt_embeds: (k, hidden_size) float32 rows that replace the embeddings of the
    # first k of token_ids (prompt positions of a prompt given as embeddings, whose ids are
    # placeholders); None: every token is embedded from its id
    prompt_embeds: torch.Tensor | None = None


@dataclass
class ModelInput:
    seqs: list[ScheduledSeq]
    new_requests: list[NewRequestData] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)
    # Guided decoding: (num_sampling_rows, vocab) bool, True = allowed; for each seq with
    # sample=True in order, 1 + len(spec_token_ids) rows (the row after its last token, then
    # the row after each draft, the grammar advanced through the drafts before it). Rows of
    # unconstrained requests are all True. Only the first of several steps (num_steps > 1) is
    # masked: the engine gives guided requests one step. None: no guidance.
    allowed_mask: torch.Tensor | None = None
    # Swap preemption, applied by every worker before the step runs, out before in:
    # (device block, host block) pairs to copy to the host swap space, and (host block,
    # device block) pairs to copy back.
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Requests preempted since the last step: their KV is gone (workers drop KV-derived state,
    # e.g. a draft model's progress); they come back later, recomputed from start_pos 0.
    preempted_ids: list[str] = field(default_factory=list)


@dataclass
class SampledToken:
    token_id: int
    # log-probability of token_id under the model's raw distribution; None when its request
    # does not report it (SamplingParams.reports_logprobs)
    logprob: float | None
    # Top logprobs when requested: [(token_id, logprob, rank)], sampled token first.
    top_logprobs: list[tuple[int, float, int]] | None = None


@dataclass
class ModelOutput:
    # Tokens sampled per request this step, in order: one normally; the accepted drafts and one
    # more with speculative decoding; one per step of a multi-step run.
    sampled: dict[str, list[SampledToken]] = field(default_factory=dict)
    # Per request: one entry per prompt position computed this step, in position order;
    # each entry [(token_id, logprob, rank)] with the actual prompt token first.
    prompt_logprobs: dict[str, list[list[tuple[int, float, int]]]] = field(default_factory=dict)
    # Pooling requests: request id -> (hidden_size,) float32 mean-pooled hidden state, or a
    # classifier's (num_labels,) float32 class logits (before any activation); for a
    # request of a token task, one such row per prompt position, (num_prompt_tokens, ...).
    embeddings: dict[str, torch.Tensor] = field(default_factory=dict)
    # Speculative decoding: drafts proposed after this step (ScheduledSeq.num_proposals).
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # Seconds this step spent drafting, and in the target's forward and sampling (set when
    # speculative decoding is configured).
    draft_time: float = 0.0
    target_time: float = 0.0
