"""``ironlm bench specdec`` end to end on the tiny model: every engine made the plain tokens (the
command exits 1 otherwise) and the result file holds the figures it promises. No timed
assertions; the speed targets are the benchmark's output."""

from __future__ import annotations

import json
from pathlib import Path

from ironlm.cli import main as ironlm_main


def test_bench_specdec_runs_every_comparison(tiny_llama_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    rc = ironlm_main([
        "bench", "specdec", "--model", str(tiny_llama_dir), "--draft-layers", "1",
        "--draft-dir", str(tmp_path / "drafts"), "--output-len", "12", "--num-iters", "1",
        "--batch-sizes", "1,3", "--num-scheduler-steps", "4", "--input-len", "8",
        "--max-model-len", "512", "--kv-cache-memory", "16MiB", "--threads", "1",
        "--result-file", str(out),
    ])
    assert rc == 0
    result = json.loads(out.read_text())
    spec = result["speculative"]
    assert set(spec) == {"plain", "ngram", "draft model"}
    assert all(f["decode_tok_s"] > 0 for f in spec.values())
    for name in ("ngram", "draft model"):
        assert 0 <= spec[name]["acceptance_rate"] <= 1
        assert spec[name]["mean_accepted_length"] >= 1
    assert spec["draft model"]["draft_seconds"] > 0
    assert (tmp_path / "drafts" / f"{tiny_llama_dir.name}-first1layers" / "config.json").is_file()
    assert set(result["multi_step"]) == {"1", "3"}
    for figs in result["multi_step"].values():
        assert set(figs) == {"1", "4"} and all(f["ms_per_decode_step"] > 0 for f in figs.values())
    assert result["machine"]["cpu_model"]
