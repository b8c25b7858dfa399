"""Helpers of the tensor / pipeline parallel tests: the prompts, greedy references, and
finding an engine's worker processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
]
MAX_TOKENS = 12
# float32 so that every split computes (up to summation order) what one rank computes
ENGINE_ARGS: dict[str, Any] = {
    "dtype": "float32", "max_model_len": 256, "kv_cache_memory": 32 * 1024**2,
    "enforce_eager": True, "max_num_seqs": 8,
}


def greedy_tokens(llm: Any) -> list[list[int]]:
    from ironlm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(entry.name))
    return out


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def worker_pids(pid: int) -> list[int]:
    """The ``mp`` executor's worker processes under ``pid`` (spawned interpreters)."""
    return [c for c in child_pids(pid) if "spawn_main" in cmdline(c)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = (Path("/proc") / str(pid) / "stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
