"""Decode graphs on the cuda platform: CUDA graphs (``torch.cuda.CUDAGraph``).

``DecodeGraphs`` (core) builds the static inputs and asks for one capture per padded batch size;
this module records that forward as a CUDA graph. The forward runs once on a side stream first
(Triton compiles its kernels, cuBLAS picks its algorithms: neither may happen under capture),
then once under capture. All graphs of one engine share one memory pool, as vLLM's do: a
later graph may place its scratch where an earlier one's was, so a replay can overwrite what
another graph computed; the engine reads each replay's logits before the next replay. The
pool is not counted when the KV cache is sized from gpu_memory_utilization (vLLM reserves
for it; here it comes out of the remaining tenth).
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
    """``max_batch_size``: the largest decode batch captured by default (vLLM's default goes
    to 512; batches run padded to the next captured size, worker/decode_graphs.py)."""

    def __init__(self, max_batch_size: int = 256) -> None:
        self.max_batch_size = max_batch_size
        self.pool: Any = None  # the first capture's memory pool, shared by the later ones

    def capture(self, forward: Callable[[], torch.Tensor]) -> tuple[StepGraph, torch.Tensor]:
        """Warm up, then capture; any failure (an op that synchronises or allocates on the
        host, a Triton compile error) becomes GraphCaptureError with the engine's stream
        restored (a capture that fails at its end leaves the capture stream current)."""
        engine_stream = torch.cuda.current_stream()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(engine_stream)
            with torch.cuda.stream(side):
                forward()  # compile and warm up outside the capture
            engine_stream.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = forward()
        except Exception as exc:
            torch.cuda.set_stream(engine_stream)
            torch.cuda.synchronize()
            raise GraphCaptureError(f"CUDA graph capture failed: {exc}") from exc
        self.pool = graph.pool()
        return CudaStepGraph(graph), out
