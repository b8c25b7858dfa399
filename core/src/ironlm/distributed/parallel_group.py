"""ParallelGroup: one torch.distributed process group as the layers use it, timing every
collective it runs (what ``ironlm bench throughput`` reports as all-reduce time per step).

Models get the tensor-parallel group through ``ModelContext.tp_group``; the layers call
``all_reduce`` (row-parallel outputs, vocab-parallel embedding) and ``all_gather`` (LM head
logits). On devices whose collectives are asynchronous the measured time is the call's only,
unless ``synchronize_timing`` is set (the bench sets it), which waits for the device around
each call.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist


@dataclass
class CommStats:
    """Seconds spent in, and number of, each kind of communication since the last reset."""

    all_reduce_s: float = 0.0
    all_reduce_calls: int = 0
    all_gather_s: float = 0.0
    all_gather_calls: int = 0
    send_s: float = 0.0  # pipeline: activations to the next stage
    recv_s: float = 0.0  # pipeline: waiting for and receiving the previous stage's
    steps: int = 0  # model steps (forwards) run meanwhile

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def reset(self) -> None:
        for name, value in asdict(CommStats()).items():
            setattr(self, name, value)


class ParallelGroup:
    """The ranks ``ranks`` (global ranks), of which this process is ``rank``."""

    def __init__(
        self,
        ranks: list[int],
        rank: int,
        group: Any,  # torch.distributed ProcessGroup
        stats: CommStats,
        synchronize: Callable[[], None],
    ) -> None:
        self.ranks = ranks
        self.size = len(ranks)
        self.rank_in_group = ranks.index(rank)
        self.group = group
        self.stats = stats
        self.synchronize = synchronize
        self.synchronize_timing = False

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the group, in place; returns ``x``."""
        t0 = self._start()
        dist.all_reduce(x, group=self.group)
        self.stats.all_reduce_s += self._stop(t0)
        self.stats.all_reduce_calls += 1
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, cols) on every rank -> (rows, size * cols): the ranks' parts side by side,
        in group order."""
        t0 = self._start()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        out = torch.cat(parts, dim=-1)
        self.stats.all_gather_s += self._stop(t0)
        self.stats.all_gather_calls += 1
        return out

    def _start(self) -> float:
        if self.synchronize_timing:
            self.synchronize()
        return time.perf_counter()

    def _stop(self, t0: float) -> float:
        if self.synchronize_timing:
            self.synchronize()
        return time.perf_counter() - t0
