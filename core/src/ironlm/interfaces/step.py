"""What crosses the executor boundary each step: plain host data in, sampled tokens out.

Workers keep per-request sampling state (generators, penalty counts) keyed by request id:
``new_requests`` introduces a request once; ``finished_ids`` tells workers to drop it.
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
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    pooling: bool = False  # return the prompt's mean-pooled hidden state instead of sampling


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
    # The LoRA adapter (its lora_int_id) the tokens run with; 0: the base model. Workers hold
    # the adapter already (the engine loads it through collective_rpc("add_lora", ...)).
    lora_id: int = 0


@dataclass
class ModelInput:
    seqs: list[ScheduledSeq]
    new_requests: list[NewRequestData] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)
    # Guided decoding: (num_sampling_seqs, vocab) bool, True = allowed, rows in the order of
    # the seqs with sample=True; rows of unconstrained requests are all True. None: no guidance.
    allowed_mask: torch.Tensor | None = None


@dataclass
class SampledToken:
    token_id: int
    logprob: float  # log-probability of token_id under the model's raw distribution
    # Top logprobs when requested: [(token_id, logprob, rank)], sampled token first.
    top_logprobs: list[tuple[int, float, int]] | None = None


@dataclass
class ModelOutput:
    sampled: dict[str, SampledToken] = field(default_factory=dict)
    # Per request: one entry per prompt position computed this step, in position order;
    # each entry [(token_id, logprob, rank)] with the actual prompt token first.
    prompt_logprobs: dict[str, list[list[tuple[int, float, int]]]] = field(default_factory=dict)
    # Pooled hidden states for embedding requests: request id -> (hidden_size,) float32.
    embeddings: dict[str, torch.Tensor] = field(default_factory=dict)
