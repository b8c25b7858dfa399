"""The sampling rank's custom logits processors (``interfaces/logits_processor.py``) and the
batch indices they see.

The runner's rows come in the scheduler's order, which changes as requests come and go; the
processors see vLLM's persistent batch instead: each request keeps its index while it samples
step after step, new ones take freed indices first (lowest first) or the next one, and the
gaps left are closed by moving the highest indices down. ``begin_step`` turns the step's rows
into that view (a ``BatchUpdate`` for every processor); ``apply`` runs processors over the
rows gathered into index order and scatters the result back to the runner's order.
A request is known by its sampling state, so an id that returns as a new request (the engine
allows reuse once the old one finished) is removed and added.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ironlm.config import EngineConfig
from ironlm.interfaces.logits_processor import (
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
    MovedRequest,
)

if TYPE_CHECKING:
    from ironlm.worker.sampler import SamplingState


class LogitsProcessorBatch:
    def __init__(
        self, classes: Sequence[type[LogitsProcessor]], config: EngineConfig,
        device: torch.device, is_pin_memory: bool = False,
    ) -> None:  # fmt: skip
        processors = [cls(config, device, is_pin_memory) for cls in classes]
        # vLLM's split: those that can change the argmax run before the penalties, the
        # others after the temperature, and only when some row draws at random
        self.varying = [p for p in processors if not p.is_argmax_invariant()]
        self.invariant = [p for p in processors if p.is_argmax_invariant()]
        self.device = device
        # batch index -> the request's sampling state (its object, not its id: a finished
        # request's id may come back as a new request)
        self.slots: list[SamplingState] = []
        self.rows_to_slots: torch.Tensor | None = None  # (B,) this step's row -> index
        self.slots_to_rows: torch.Tensor | None = None  # (B,) index -> row
        self.in_order = True  # row i is index i this step (no gather needed)

    def begin_step(self, states: Sequence[SamplingState]) -> None:
        """This step's sampling rows (in the runner's order) as the batch; every processor's
        ``update_state`` with what changed since the last step."""
        now = {id(s) for s in states}
        slots: list[SamplingState | None] = list(self.slots)
        freed = [i for i, s in enumerate(slots) if id(s) not in now]
        for i in freed:
            slots[i] = None
        holes = list(freed)  # ascending: a heap already
        known = {id(s): i for i, s in enumerate(slots) if s is not None}
        added: list[AddedRequest] = []
        for s in states:
            if id(s) in known:
                continue
            index = heapq.heappop(holes) if holes else len(slots)
            if index == len(slots):
                slots.append(s)
            else:
                slots[index] = s
            known[id(s)] = index
            added.append((index, s.params, s.prompt_token_ids, _output_list(s)))
        # vLLM's BatchUpdateBuilder: an index a new request took is not also reported removed
        # (processors may handle added before removed, as vLLM's own helper does)
        reused = {a[0] for a in added}
        removed = [i for i in freed if i not in reused]
        moved: list[MovedRequest] = []
        size = len(states)
        for hole in sorted(holes):  # gaps below the batch size take the highest indices
            if hole >= size:
                break
            last = max(i for i, s in enumerate(slots) if s is not None)
            slots[hole], slots[last] = slots[last], None
            known[id(slots[hole])] = hole
            moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
        self.slots = [s for s in slots[:size] if s is not None]
        assert len(self.slots) == size, "batch indices out of step with the rows"
        update = BatchUpdate(size, removed, added, moved) if removed or added or moved \
            else None
        for p in self.varying + self.invariant:
            p.update_state(update)
        order = [known[id(s)] for s in states]
        self.in_order = order == list(range(size))
        self.rows_to_slots = torch.tensor(order, dtype=torch.long, device=self.device)
        self.slots_to_rows = torch.empty_like(self.rows_to_slots)
        self.slots_to_rows[self.rows_to_slots] = torch.arange(size, device=self.device)

    def apply(self, x: torch.Tensor, processors: list[LogitsProcessor]) -> torch.Tensor:
        """(B, V) rows in the runner's order -> a new tensor, each processor applied over
        the rows in batch-index order (``x`` is left as it was)."""
        assert self.slots_to_rows is not None and self.rows_to_slots is not None
        # a copy in batch-index order (processors may write in place)
        y = x.clone() if self.in_order else x[self.slots_to_rows]
        for p in processors:
            y = p.apply(y)
        return y if self.in_order else y[self.rows_to_slots]


def _output_list(state: SamplingState) -> list[int]:
    """The request's output ids as the sampler records them (the same list: it grows)."""
    if state.output_token_ids is None:
        state.output_token_ids = []
    return state.output_token_ids
