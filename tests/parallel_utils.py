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
    return greedy_outputs(llm)[0]


def greedy_outputs(llm: Any) -> tuple[list[list[int]], list[str]]:
    """Token ids and texts of greedy completions of PROMPTS (EOS ignored)."""
    from ironlm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], [o.outputs[0].text for o in outs]


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


class RayHead:
    """A Ray head on 127.0.0.1 (``ray start --head --block``) for one test module; closing
    it stops the processes it started (and nothing else on the machine)."""

    def __init__(self, num_cpus: int = 8) -> None:
        import subprocess
        import sys
        import time

        from server_utils import free_port

        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        ray = str(Path(sys.executable).parent / "ray")
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        # the tests folder importable by the Ray workers (a collective_rpc callable or worker
        # extension is sent by reference: its module must import on every node)
        tests_dir = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tests_dir, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [ray, "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
             "--port", str(self.port), "--num-cpus", str(num_cpus), "--disable-usage-stats"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )
        status = [ray, "status", "--address", self.address]
        deadline = time.monotonic() + 120
        while subprocess.run(status, capture_output=True, env=env).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the Ray head did not start")
            time.sleep(1.0)

    def close(self) -> None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def worker_facts(worker: Any) -> tuple[int, int, int, int]:
    """collective_rpc callable: (pid, local rank, ranks sharing the machine, torch threads)."""
    import torch

    return (os.getpid(), worker.local_rank, worker.worker_rank.local_world_size,
            torch.get_num_threads())


def running_requests(server: Any) -> float:
    """The server's vllm:num_requests_running (0 when it does not answer)."""
    import httpx

    try:
        text = httpx.get(server.url("/metrics"), timeout=5).text
    except httpx.HTTPError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running{"):
            return float(line.split()[-1])
    return 0.0


def assert_server_exited_after_worker_death(server: Any, workers: list[int]) -> None:
    """After a worker was killed: the server exits by itself, non-zero, saying the engine
    died, and no worker process is left."""
    assert server.proc.wait(timeout=60) != 0
    assert "the engine died" in server.log_text()
    assert not any(alive(p) for p in workers)

