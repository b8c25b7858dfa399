"""Decode graphs on the cuda platform: CUDA graphs (``torch.cuda.CUDAGraph``).

``DecodeGraphs`` (core) builds the static inputs and asks for one capture per padded batch size;
this module records that forward as a CUDA graph. The forward runs once on a side stream first
(Triton compiles its kernels, cuBLAS picks its algorithms: neither may happen under capture),
then once under capture. All graphs of one engine share one memory pool, as vLLM's do: a replay
only writes its own graph's scratch, and the outputs each graph returns stay alive with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ironlm.interfaces.graphs import GraphCapture, GraphCaptureError, StepGraph


class CudaStepGraph(StepGraph):
    def __init__(self, graph: torch.cuda.CUDAGraph) -> None:
        self.graph = graph

    def replay(self) -> None:
        self.graph.replay()


class CudaGraphCapture(GraphCapture):
    """``max_batch_size``: the largest decode batch captured (vLLM captures up to 512; batches
    are padded to the next power of two, so 256 rows cost at most 2x the work of 129)."""

    def __init__(self, max_batch_size: int = 256) -> None:
        self.max_batch_size = max_batch_size
        self.pool: Any = None  # the first capture's memory pool, shared by the later ones

    def capture(self, forward: Callable[[], torch.Tensor]) -> tuple[StepGraph, torch.Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward()  # compile and warm up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                out = forward()
        except RuntimeError as exc:  # an op that synchronises or allocates on the host
            raise GraphCaptureError(f"CUDA graph capture failed: {exc}") from exc
        self.pool = graph.pool()
        return CudaStepGraph(graph), out
