"""Decode graphs: a platform's way to record one decode forward and replay it without Python.

vLLM captures CUDA graphs for decode batches of fixed sizes: the forward runs once under
capture on static input tensors, later steps copy their inputs into those tensors and replay
the recorded kernels. A platform offers the same through ``Platform.graph_capture``, which
returns a ``GraphCapture`` for one model's layer ops and attention backend (CUDA: CUDA graphs;
cpu: a recorded list of its C kernel calls). The engine side (which steps qualify, static
buffers, padding to a captured size) is ``ironlm.worker.decode_graphs``.

Contract for ``capture(forward)``: ``forward`` reads only tensors that stay alive and keep their
addresses (the static inputs, weights, the KV cache) and returns a tensor; everything it
allocates is kept by the graph, so the returned tensor is rewritten in place by each
``replay``. A capture that cannot record the forward faithfully (an op that would not be
replayed, a data-dependent branch) raises ``GraphCaptureError`` naming it; the engine then runs
that batch size eagerly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch


class GraphCaptureError(RuntimeError):
    """The forward cannot be captured on this platform; the message says why."""


class StepGraph(ABC):
    """One captured forward. ``replay`` reruns it on the static inputs' current contents."""

    @abstractmethod
    def replay(self) -> None: ...


class GraphCapture(ABC):
    """Captures forwards for one model on one platform.

    ``max_batch_size``: the largest decode batch worth a graph here by default (batches are
    padded up to the next captured size: vLLM's 1, 2, 4, 8, 16, 24, ... up to this, unless
    the engine's cudagraph_capture_sizes / max_cudagraph_capture_size say otherwise).
    ``computes_on_capture``: whether the forward that ``capture`` records also computed its
    output from the static inputs' contents at that time (cpu: the recorded calls ran; CUDA:
    a captured stream only records), so the step that captured needs no replay."""

    max_batch_size: int = 8
    computes_on_capture: bool = False

    @abstractmethod
    def capture(self, forward: Callable[[], torch.Tensor]) -> tuple[StepGraph, torch.Tensor]:
        """Run ``forward`` once under capture; returns the graph and its (static) output."""
