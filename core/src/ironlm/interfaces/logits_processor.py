"""Custom logits processors: vLLM V1's batch-level interface, so a processor written for
vLLM (``vllm.v1.sample.logits_processor``) ports by changing its imports.

A processor sees the logits of every request that samples in a step as one
(batch_size, vocab) float32 tensor; row ``i`` belongs to the request at batch index ``i``.
The sampling rank keeps the indices the way vLLM's persistent batch does: a request keeps
its index while it samples in consecutive steps, new requests fill the indices freed by
departed ones first, and the remaining gaps are closed by moving the highest indices down.
Before each step ``update_state`` receives what changed (``BatchUpdate``; None when nothing
did), to be processed in the order removed, added, moved; then ``apply`` runs.

Where they run (vLLM's order): processors that can change the argmax
(``is_argmax_invariant() is False``) after logit_bias and before the penalties, on every
row; argmax-invariant ones after the temperature, only when some row draws at random (a
greedy row's token does not depend on them). Per-request settings come in
``SamplingParams.extra_args`` (the server's ``vllm_xargs``), checked by ``validate_params``
when the request arrives (a ValueError refuses it: a 400 on the server).

``__init__(config, device, is_pin_memory)`` gets IronLM's ``EngineConfig`` where vLLM passes
its ``VllmConfig`` (the fields carry vLLM's flag names: ``max_num_seqs``, ``max_model_len``).
A plugin registers processors by ``name`` (``register_logits_processors``) for
``--logits-processors NAME``; vLLM loads every installed one, IronLM only those named.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum, auto
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch

from ironlm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from ironlm.config import EngineConfig


class MoveDirectionality(Enum):
    UNIDIRECTIONAL = auto()  # the request at index a moves to index b (a is left empty)
    SWAP = auto()  # the requests at a and b exchange indices


RemovedRequest = int  # the batch index of a request that left the batch
# (index, params, prompt token ids (None: a prompt given as embeddings), output token ids):
# the output list is the request's own, growing as it samples
AddedRequest = tuple[int, SamplingParams, "list[int] | None", "list[int]"]
MovedRequest = tuple[int, int, MoveDirectionality]  # (from index, to index, how)


@dataclass(frozen=True)
class BatchUpdate:
    """What changed in the batch since the processor's last ``update_state``."""

    batch_size: int  # requests in the batch now (indices 0 .. batch_size - 1)
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """vLLM's ``LogitsProcessor``; ``name`` only for registration by a plugin."""

    name: ClassVar[str] = ""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Raise ValueError for a request this processor cannot take (its extra_args)."""

    @abstractmethod
    def __init__(self, config: EngineConfig, device: torch.device, is_pin_memory: bool) -> None:
        """Built once on the rank that samples, at start-up."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """(batch_size, vocab) float32 -> the processed logits (changed in place or new)."""

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True when the processor never changes a row's argmax (greedy rows skip it)."""

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Called before every step that samples, with the batch's changes (None: none)."""


S = TypeVar("S")


def process_dict_updates(
    states: dict[int, S], batch_update: BatchUpdate | None,
    new_state: Callable[[SamplingParams, list[int] | None, list[int]], S | None],
) -> bool:  # fmt: skip
    """vLLM's helper for a processor that keeps one state per batch index: apply
    ``batch_update`` to ``states`` (``new_state`` gives an added request's, None: not one
    the processor acts on); whether anything changed."""
    if batch_update is None:
        return False
    changed = False
    for index in batch_update.removed:
        changed |= states.pop(index, None) is not None
    for index, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        if state is not None:
            states[index] = state
            changed = True
        else:
            changed |= states.pop(index, None) is not None
    for a, b, how in batch_update.moved:
        sa, sb = states.pop(a, None), states.pop(b, None)
        if sa is not None:
            states[b] = sa
        if how is MoveDirectionality.SWAP and sb is not None:
            states[a] = sb
        changed |= sa is not None or sb is not None
    return changed


# A request-level processor (vLLM V0's form): (output_ids, logits_row) -> logits_row, or
# (prompt_ids, output_ids, logits_row) -> logits_row
RequestLogitsProcessor = Callable[..., torch.Tensor]


class AdapterLogitsProcessor(LogitsProcessor):
    """vLLM's wrapper of request-level processors: a subclass implements
    ``new_req_logits_processor(params)`` (None: the request is left alone) and
    ``is_argmax_invariant``; each row is passed to its request's callable."""

    def __init__(self, config: EngineConfig, device: torch.device, is_pin_memory: bool) -> None:
        # batch index -> the request's callable with its token lists bound (live references)
        self.req_info: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {}

    @abstractmethod
    def new_req_logits_processor(self, params: SamplingParams) -> RequestLogitsProcessor | None:
        """The request's processor, or None when it does not apply to the request."""

    def _new_state(
        self, params: SamplingParams, prompt_ids: list[int] | None, output_ids: list[int]
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        fn = self.new_req_logits_processor(params)
        if fn is None:
            return None
        three = len(inspect.signature(fn).parameters) == 3
        return partial(fn, prompt_ids, output_ids) if three else partial(fn, output_ids)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.req_info, batch_update, self._new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, fn in self.req_info.items():
            row = logits[index]
            new = fn(row)
            if new is not row:
                logits[index] = new
        return logits


def logits_processor_class(entry: Any) -> type[LogitsProcessor]:
    """``entry`` checked as a LogitsProcessor subclass (ValueError naming it otherwise)."""
    if not (isinstance(entry, type) and issubclass(entry, LogitsProcessor)):
        raise ValueError(  # noqa: TRY004 (a start-up argument: ValueError, as vLLM's)
            f"logits_processors: {entry!r} is not a subclass of "
            "ironlm.interfaces.logits_processor.LogitsProcessor")
    return entry
