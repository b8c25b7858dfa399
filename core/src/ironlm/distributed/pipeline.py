"""PipelineChannel: activations from one pipeline stage to the next, rank to rank.

Stage s's rank r sends every tensor the model hands on (``ModelArchitecture.pipeline_tensors``:
each (num_tokens, hidden_size) in the model dtype) to rank r + tp_size with point-to-point
``torch.distributed.send``; the receiver knows the shapes from the step's batch, which every
rank builds from the same ``ModelInput``, so no header travels.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ironlm.distributed.parallel_group import CommStats


class PipelineChannel:
    def __init__(
        self,
        prev_rank: int | None,  # global rank of the previous stage's peer (None: first stage)
        next_rank: int | None,  # global rank of the next stage's peer (None: last stage)
        names: tuple[str, ...],  # the model's pipeline tensors, in send order
        stats: CommStats,
    ) -> None:
        self.prev_rank = prev_rank
        self.next_rank = next_rank
        self.names = names
        self.stats = stats

    def send(self, tensors: dict[str, torch.Tensor]) -> None:
        assert self.next_rank is not None, "the last stage sends nothing"
        t0 = time.perf_counter()
        for name in self.names:
            dist.send(tensors[name].contiguous(), dst=self.next_rank)
        self.stats.send_s += time.perf_counter() - t0

    def recv(
        self, num_tokens: int, hidden_size: int, dtype: torch.dtype, device: torch.device
    ) -> dict[str, torch.Tensor]:
        assert self.prev_rank is not None, "the first stage receives nothing"
        t0 = time.perf_counter()
        out: dict[str, torch.Tensor] = {}
        for name in self.names:
            buf = torch.empty(num_tokens, hidden_size, dtype=dtype, device=device)
            dist.recv(buf, src=self.prev_rank)
            out[name] = buf
        self.stats.recv_s += time.perf_counter() - t0
        return out
