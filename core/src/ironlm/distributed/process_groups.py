"""Joining torch.distributed in a worker: the world group, one tensor-parallel group per
pipeline stage, and this rank's pipeline peers.

Every rank calls ``init_distributed`` with the same layout; groups are created by every rank in
the same order (torch.distributed requires it), each rank keeping the one it belongs to.

The rendezvous store is hosted by the executor (``host_rendezvous``), not by rank 0: every rank,
the in-process driver included, joins as a client. No rank's start-up then blocks while hosting
it, and when a rank fails during start-up the executor drops the store, which ends the waits of
the ranks it left behind instead of leaving them blocked until the timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable
from urllib.parse import urlsplit

import torch.distributed as dist

from ironlm.distributed.layout import ParallelLayout
from ironlm.distributed.parallel_group import CommStats, ParallelGroup
from ironlm.distributed.pipeline import PipelineChannel

RENDEZVOUS_TIMEOUT = timedelta(minutes=5)  # joining the world, and every store wait in it


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


def host_rendezvous(host: str, world_size: int) -> dist.TCPStore:
    """A rendezvous store listening on a free port (its ``port``); ``tcp://{host}:{port}`` is
    every rank's ``init_method``. The store lives as long as the returned object."""
    return dist.TCPStore(
        host, 0, world_size, is_master=True, timeout=RENDEZVOUS_TIMEOUT, wait_for_workers=False
    )


def init_distributed(
    backend: str,
    init_method: str,
    rank: int,
    layout: ParallelLayout,
    synchronize: Callable[[], None],
) -> Distributed:
    """Join the world of ``layout.world_size`` ranks through the store at ``init_method`` (e.g.
    ``tcp://127.0.0.1:29500``, see ``host_rendezvous``) with the platform's ``backend``; build
    the groups."""
    address = urlsplit(init_method)
    if address.scheme != "tcp" or address.hostname is None or address.port is None:
        raise ValueError(f"init_method must be tcp://host:port, got {init_method!r}")
    store = dist.TCPStore(
        address.hostname, address.port, layout.world_size, is_master=False,
        timeout=RENDEZVOUS_TIMEOUT,
    )  # fmt: skip
    try:
        dist.init_process_group(
            backend=backend, store=store, rank=rank, world_size=layout.world_size,
            timeout=RENDEZVOUS_TIMEOUT,
        )  # fmt: skip
        stats = CommStats()
        tp: ParallelGroup | None = None
        if layout.tp_size > 1:
            for ranks in layout.tp_groups():
                group = dist.new_group(ranks, backend=backend)
                if rank in ranks:
                    tp = ParallelGroup(ranks, rank, group, stats, synchronize)
    except BaseException:
        reset_process_state()
        raise
    return Distributed(layout, rank, tp, stats)


def reset_process_state() -> None:
    """Leave this process as if it had never joined a world.

    torch.distributed names groups by a per-process counter that only a destroyed default
    group resets; a join that failed half-way leaves it advanced, and the next world this
    process joins (the in-process driver of a new engine) would then wait for keys its fresh
    peers never write. A one-rank gloo world on an in-memory store, destroyed at once, resets
    it through the public API."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dist.destroy_process_group()
