"""Run one engine in its own process, so its peak RSS is its own and engines never share a heap.

Parent side: ``run_in_subprocess(spec)`` writes the spec as JSON, runs
``python -m ironlm_bench.worker SPEC OUT`` (stderr passes through, so progress shows) and reads
the result back. Child side: builds the runner the spec names, runs each job's batches in
order and writes timings, load time and peak RSS (VmHWM) as JSON.

spec = {"runner": {"kind": "ironlm" | "hf" | "llama-cpp", "model": ..., "label": name in the
                   results (default: the runner's), ...runner options},
        "threads": 2,
        "jobs": [{"label": "warmup", "output_len": 4, "batches": [[[1, 2, 3]]],
                  "temperature": 0.0 (optional; above 0 the runner samples)}, ...]}
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ironlm_bench.runners import Runner


class WorkerError(RuntimeError):
    pass


def run_in_subprocess(spec: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """Run ``spec`` in a fresh interpreter; WorkerError with its exit code when it fails."""
    threads = str(spec["threads"])
    env = dict(os.environ, IRONLM_CPU_THREADS=threads, OMP_NUM_THREADS=threads)
    with tempfile.TemporaryDirectory(prefix="ironlm-bench-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", "ironlm_bench.worker", str(spec_path), str(out_path)]
        # The child's stdout joins our stderr (fd 2): our stdout carries only the report.
        proc = subprocess.run(cmd, check=False, env=env, timeout=timeout, stdout=2)
        if proc.returncode != 0 or not out_path.is_file():
            raise WorkerError(
                f"the {spec['runner']['kind']} benchmark process failed "
                f"(exit code {proc.returncode}); its error is printed above"
            )
        return json.loads(out_path.read_text())


def peak_rss_bytes() -> int:
    """This process's peak resident set size (VmHWM; ru_maxrss where /proc is missing)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def build_runner(options: dict[str, Any], threads: int) -> Runner:
    kind = options["kind"]
    if kind == "ironlm":
        from ironlm_bench.runners import IronlmRunner

        return IronlmRunner(options["model"], options.get("engine_kwargs", {}),
                            options.get("detokenize", True), options.get("name", "ironlm"),
                            options.get("lora_paths"))
    if kind == "hf-merged":
        from ironlm_bench.lora import HfMergedRunner

        return HfMergedRunner(options["model"], options["lora_paths"], options.get("batch_size"),
                              options.get("seed", 0))
    if kind == "hf":
        from ironlm_bench.baselines import HfRunner

        return HfRunner(options["model"], options.get("dummy_weights", False),
                        options.get("batch_size"), options.get("seed", 0),
                        options.get("dtype", "float32"))
    if kind == "llama-cpp" and options.get("batched"):
        from ironlm_bench.llama_cpp_batched import LlamaCppBatchedRunner

        return LlamaCppBatchedRunner(options["gguf"], threads, options.get("seed", 0),
                                     options.get("flash_attn", False))
    if kind == "llama-cpp":
        from ironlm_bench.baselines import LlamaCppRunner

        return LlamaCppRunner(options["gguf"], threads, options["n_ctx"],
                              options.get("seed", 0), options.get("flash_attn", False))
    raise ValueError(f"unknown runner {kind!r}")


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    threads = int(spec["threads"])
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    runner = build_runner(spec["runner"], threads)
    load_seconds = time.perf_counter() - t0
    rss_after_load = current_rss_bytes()
    results: dict[str, list[dict[str, Any]]] = {}
    for job in spec["jobs"]:
        timings = results.setdefault(job["label"], [])
        for batch in job["batches"]:
            timings.append(runner.run(batch, int(job["output_len"]),
                                      float(job.get("temperature", 0.0))).to_dict())
    return {
        "runner": spec["runner"].get("label") or runner.name,
        "info": runner.info(),
        "threads": torch.get_num_threads(),
        "load_seconds": load_seconds,
        "rss_after_load_bytes": rss_after_load,
        "peak_rss_bytes": peak_rss_bytes(),
        "results": results,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m ironlm_bench.worker SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    result = run_spec(spec)
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
