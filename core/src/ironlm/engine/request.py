"""Request: one sequence's state through the engine (a parent with n > 1 fans out into
several Requests sharing a parent id)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ironlm.engine.prompt_embeds import block_digest
from ironlm.lora.request import LoRARequest
from ironlm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from ironlm.engine.guided_closing import ClosingState


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # freed, waits to be recomputed
    SWAPPED = "swapped"  # its KV is in the host swap space
    FINISHED_STOPPED = "stop"  # EOS, stop token or stop string
    FINISHED_LENGTH = "length"  # max_tokens or max_model_len
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self._value_ in FINISHED_VALUES  # _value_: the plain attribute behind .value

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI finish_reason string (None while not finished)."""
        return self.value if self.finished else None


# the finished states' values (a constant: read by every request's is_finished each step)
FINISHED_VALUES = frozenset(("stop", "length", "abort"))


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0  # lower runs first (vLLM's convention)
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache on first schedule
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    cumulative_logprob: float = 0.0
    logprobs: list[Any] = field(default_factory=list)  # per output token: {id: Logprob}
    prompt_logprobs: list[Any] = field(default_factory=list)
    grammar: Any = None  # the request's guided Grammar, when constrained
    grammar_backend: str | None = None  # the guided backend that runs it
    # Why the guided backend could not go on (a dead end): the request ends with this error,
    # never with text that breaks the constraint.
    grammar_error: str | None = None
    # Closing its constrained output within max_tokens (engine.guided_closing.ClosingState),
    # from the last tokens of its budget on; None before.
    closing: ClosingState | None = None
    pooling: bool = False  # a pooling request: run the prompt, return its pooled output
    # a classifier's pooling request reads only its last prompt row, so a cached prefix
    # serves it; an embedding's mean reads every row (no prefix-cache reuse)
    pools_last_row: bool = False
    # a token pooling task (token_embed / token_classify): a row per prompt token comes back
    pools_every_row: bool = False
    lora_request: LoRARequest | None = None  # the adapter it runs with (None: the base model)
    # vLLM's cache_salt: its prefix-cache chain starts from this string, so only requests that
    # carry the same salt share its cached blocks (no timing tells another user its prompt)
    cache_salt: str | None = None
    # vLLM's prompt_embeds: (num_prompt_tokens, hidden_size) float32 rows that stand for the
    # prompt (its token ids are placeholders); None for a prompt of tokens
    prompt_embeds: torch.Tensor | None = None
    first_scheduled_time: float | None = None  # monotonic; its time waiting ends here
    first_token_time: float | None = None
    last_token_time: float | None = None
    # Speculative decoding: drafts proposed after the last step, verified in the next one.
    spec_token_ids: list[int] = field(default_factory=list)
    # (drafts, accepted) of its latest verifications, and steps left without speculation
    # after it did not pay (engine.speculation.SpeculationPolicy).
    spec_history: list[tuple[int, int]] = field(default_factory=list)
    spec_paused_steps: int = 0
    # KV transfer (engine/kv_transfer.py): the root key, then the keys of its full blocks so
    # far; and whether a load from the store failed (it computes its prompt itself then)
    kv_block_keys: list[str] = field(default_factory=list)
    kv_load_refused: bool = False

    @property
    def lora_id(self) -> int:
        """The adapter's lora_int_id; 0 for the base model."""
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def tokens_left(self, max_model_len: int | None) -> int | None:
        """Tokens it may still generate: its max_tokens and ``max_model_len`` both bound them
        (None: neither does)."""
        max_tokens = self.sampling_params.max_tokens
        left = [max_tokens - len(self.output_token_ids)] if max_tokens is not None else []
        if max_model_len is not None:
            left.append(max_model_len - self.num_tokens)
        return min(left) if left else None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without building the whole list."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def embeds_slice(self, start: int, end: int) -> torch.Tensor | None:
        """The prompt_embeds rows of positions start .. end-1 that lie in the prompt (a
        prefix of that range); None when none do."""
        if self.prompt_embeds is None or start >= self.num_prompt_tokens:
            return None
        return self.prompt_embeds[start:min(end, self.num_prompt_tokens)]

    def block_key(self, start: int, end: int) -> tuple[int, ...] | tuple[tuple[int, ...], bytes]:
        """What identifies positions start .. end-1 in the prefix cache: their token ids, and
        a digest of their embedded rows where the prompt has them."""
        tokens = tuple(self.token_slice(start, end))
        rows = self.embeds_slice(start, end)
        return tokens if rows is None else (tokens, block_digest(rows))

    @property
    def is_finished(self) -> bool:
        return self.status.finished
