"""Joining torch.distributed in a worker: the world group, one tensor-parallel group per
pipeline stage, and this rank's pipeline peers.

Every rank calls ``init_distributed`` with the same layout; groups are created by every rank in
the same order (torch.distributed requires it), each rank keeping the one it belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch.distributed as dist

from ironlm.distributed.layout import ParallelLayout
from ironlm.distributed.parallel_group import CommStats, ParallelGroup
from ironlm.distributed.pipeline import PipelineChannel


@dataclass
class Distributed:
    """This rank's place in the process groups."""

    layout: ParallelLayout
    rank: int  # global rank
    tp: ParallelGroup | None  # None when tp_size == 1
    stats: CommStats = field(default_factory=CommStats)

    @property
    def tp_rank(self) -> int:
        return self.layout.tp_rank(self.rank)

    @property
    def pp_rank(self) -> int:
        return self.layout.pp_rank(self.rank)

    def pipeline_channel(self, names: tuple[str, ...]) -> PipelineChannel:
        return PipelineChannel(
            self.layout.prev_stage_rank(self.rank), self.layout.next_stage_rank(self.rank),
            names, self.stats,
        )  # fmt: skip

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def init_distributed(
    backend: str,
    init_method: str,
    rank: int,
    layout: ParallelLayout,
    synchronize: Callable[[], None],
) -> Distributed:
    """Join the world of ``layout.world_size`` ranks at ``init_method`` (e.g.
    ``tcp://127.0.0.1:29500``) with the platform's ``backend``; build the groups."""
    dist.init_process_group(
        backend=backend, init_method=init_method, rank=rank, world_size=layout.world_size
    )
    stats = CommStats()
    tp: ParallelGroup | None = None
    if layout.tp_size > 1:
        for ranks in layout.tp_groups():
            group = dist.new_group(ranks, backend=backend)
            if rank in ranks:
                tp = ParallelGroup(ranks, rank, group, stats, synchronize)
    return Distributed(layout, rank, tp, stats)
