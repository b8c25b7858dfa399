"""``ironlm bench throughput`` at tp=2: runs the split engine and the same engine on one rank
in the same run, and reports the per-step communication time of the split (no timed
assertion: the figures exist and are consistent with the counts)."""

from __future__ import annotations

import json
from pathlib import Path

from ironlm.cli import main as ironlm_main


def test_bench_throughput_tp2_next_to_tp1(tiny_llama_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    rc = ironlm_main([
        "bench", "throughput", "--model", str(tiny_llama_dir), "--num-prompts", "3",
        "--input-len", "8", "--output-len", "3", "--no-single-stream", "--skip-machine-limits",
        "--result-file", str(out), "--kv-cache-memory", "16MiB", "--threads", "2",
        "--tensor-parallel-size", "2", "--distributed-executor-backend", "mp",
    ])
    assert rc == 0
    engines = json.loads(out.read_text())["engines"]
    assert set(engines) == {"ironlm", "ironlm tp=1"}
    split, one = engines["ironlm"], engines["ironlm tp=1"]
    assert split["output_tokens"] == one["output_tokens"] == 9
    assert split["info"]["world_size"] == 2 and one["info"]["world_size"] == 1
    ranks = split["info"]["collective"]
    assert len(ranks) == 2
    # 2 layers x 2 row-parallel all-reduces + 1 embedding all-reduce per step, on each rank
    assert all(r["all_reduce_calls"] == 5 * r["steps"] > 0 for r in ranks)
    assert split["all_reduce_ms_per_step"] > 0
    assert "all_reduce_ms_per_step" not in one
