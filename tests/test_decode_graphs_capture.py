"""DecodeGraphs' first step of a batch size: the static inputs are filled before the capture; a
capture that computes as it records (the cpu platform's) is that step, one that only records
(as a CUDA graph capture does) is replayed once; a capture refused after its forward ran leaves
the step to the eager path. Checked on the tiny random Llama's forward against the eager one,
through a capture wrapper that counts replays and, for a recording-only capture, poisons the
forward's output.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ironlm import LLM
from ironlm.attention.batch import build_attention_batch
from ironlm.interfaces.graphs import GraphCapture, GraphCaptureError, StepGraph
from ironlm.worker.decode_graphs import DecodeGraphs
from ironlm_cpu.graphs import CpuGraphCapture
from ironlm_cpu.layer_ops import CpuLayerOps

pytestmark = pytest.mark.usefixtures("c_decode_attention")  # conftest: graphs need it


class _CountedGraph(StepGraph):
    def __init__(self, graph: StepGraph, owner: _Wrapped) -> None:
        self.graph, self.owner = graph, owner

    def replay(self) -> None:
        self.owner.replays += 1
        self.graph.replay()


class _Wrapped(GraphCapture):
    """The cpu capture, made to behave as one that computes (or only records) on capture, or
    that refuses the forward after running it."""

    def __init__(self, inner: CpuGraphCapture, computes: bool, refuse: bool = False) -> None:
        self.inner, self.refuse, self.replays = inner, refuse, 0
        self.computes_on_capture = computes
        self.max_batch_size = inner.max_batch_size

    def capture(self, forward: Callable[[], torch.Tensor]) -> tuple[StepGraph, torch.Tensor]:
        graph, out = self.inner.capture(forward)
        if self.refuse:
            raise GraphCaptureError("refused after the forward ran")
        if not self.computes_on_capture:
            out.fill_(float("nan"))  # a recording-only capture leaves no result
        return _CountedGraph(graph, self), out


def _setup(tiny_llama_dir: Path) -> tuple[Any, LLM]:
    llm = LLM(str(tiny_llama_dir), device="cpu", dtype="float32", max_model_len=64,
              kv_cache_memory=4 * 2**20, enforce_eager=True)  # fmt: skip
    return llm.engine.executor.worker.model_runner, llm


def _graphs(runner: Any, capture: GraphCapture) -> DecodeGraphs:
    return DecodeGraphs(capture, runner.model, runner.attention, runner.kv_caches,
                        runner.config.block_size, 64, torch.device("cpu"))  # fmt: skip


def _eager(runner: Any, ids: list[int], pos: list[int], tables: list[list[int]]) -> torch.Tensor:
    batch = build_attention_batch(pos, [1] * len(ids), tables, runner.config.block_size)
    hidden = runner.model(torch.tensor(ids), torch.tensor(pos), runner.kv_caches,
                          runner.attention.build_metadata(batch))  # fmt: skip
    return runner.model.compute_logits(hidden)


@pytest.mark.parametrize("computes", [True, False], ids=["computes", "records-only"])
def test_first_step_is_the_capture_or_one_replay(tiny_llama_dir: Path, computes: bool) -> None:
    runner, _llm = _setup(tiny_llama_dir)
    ops = runner.model.model.layers[0].mlp.down_proj.layer_ops
    assert isinstance(ops, CpuLayerOps)
    capture = _Wrapped(CpuGraphCapture(ops.libraries() + runner.attention.libraries()), computes)
    graphs = _graphs(runner, capture)
    ids, tables = [5, 7, 11], [[1], [2], [3]]
    for step, pos in enumerate(([3, 5, 0], [4, 6, 1])):
        want = _eager(runner, ids, pos, tables)  # writes the same keys and values first
        got = graphs.run(ids, pos, tables)
        assert got is not None and not got.isnan().any()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        # computing captures: no replay for the step that captured; recording-only: one each
        assert capture.replays == (step if computes else step + 1)
    assert list(graphs.graphs) == [4]  # three rows padded to the size-4 graph


def test_a_refused_capture_leaves_the_step_eager(tiny_llama_dir: Path) -> None:
    runner, _llm = _setup(tiny_llama_dir)
    ops = runner.model.model.layers[0].mlp.down_proj.layer_ops
    capture = _Wrapped(CpuGraphCapture(ops.libraries() + runner.attention.libraries()), True,
                       refuse=True)  # fmt: skip
    graphs = _graphs(runner, capture)
    assert graphs.run([5, 7], [3, 5], [[1], [2]]) is None
    assert graphs.disabled == "refused after the forward ran" and not graphs.graphs
    assert not graphs.accepts(2)
