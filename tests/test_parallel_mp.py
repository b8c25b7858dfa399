"""Tensor and pipeline parallelism with the ``mp`` executor on the real models: greedy tokens
at every split equal those of one rank (float32), and no worker process outlives the engine.

SmolLM2-135M has 9 attention heads and 3 KV heads, so its tensor-parallel sizes are 3 and 9
(tp=2 is refused, see test_parallel_errors.py); Gemma 3 270M (4 heads, 1 KV head) runs at
tp=2 with its KV head replicated on both ranks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from parallel_utils import ENGINE_ARGS, greedy_tokens, worker_pids

from ironlm import LLM


def run(model: Path, **kwargs: Any) -> list[list[int]]:
    llm = LLM(str(model), **ENGINE_ARGS, **kwargs)
    try:
        return greedy_tokens(llm)
    finally:
        llm.shutdown()
        assert worker_pids(os.getpid()) == [], "a worker process outlived its engine"


@pytest.fixture(scope="module")
def smollm2_reference(smollm2_dir: Path) -> list[list[int]]:
    return run(smollm2_dir)


@pytest.mark.parametrize(("tp", "pp"), [(3, 1), (1, 2), (3, 2)])
def test_smollm2_splits_match_one_rank(
    smollm2_dir: Path, smollm2_reference: list[list[int]], tp: int, pp: int
) -> None:
    tokens = run(smollm2_dir, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                 distributed_executor_backend="mp")
    assert tokens == smollm2_reference


def test_gemma3_tp2_replicated_kv_head_matches_one_rank(gemma3_dir: Path) -> None:
    reference = run(gemma3_dir)
    tokens = run(gemma3_dir, tensor_parallel_size=2, distributed_executor_backend="mp")
    assert tokens == reference
