"""The cpu platform's glibc malloc settings (``host_memory``): set in every engine process
unless the environment opts out, and the server's engine thread on the main arena. Their
effect on a whole step (no page faults for a prefill step's fresh intermediates) is measured
in benchmarks; here on single blocks, and the order the server calls the hooks in."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from ironlm_cpu.host_memory import ENV_VAR, tune_malloc

from server_utils import TESTS_DIR, RemoteServer

GLIBC = platform.libc_ver()[0] == "glibc"

# a block of argv[1] MiB allocated, written and freed, twice, after tune_malloc, on the main
# thread or (argv[2] "thread") a thread started after it and after the server's hook where
# argv[3] is "hook": where the heap keeps the block, the second round faults in no fresh pages
# (a thread arena's heaps are at most 64 MB: a 96 MiB block there is mapped fresh each time)
_SCRIPT = """
import ctypes, resource, sys, threading
from ironlm_cpu.host_memory import tune_malloc
from ironlm_cpu.platform import CpuPlatform
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
print(tune_malloc())
if sys.argv[3] == "hook":
    CpuPlatform().before_engine_thread()
faults = []
def rounds():
    size = int(sys.argv[1]) << 20
    for _ in range(2):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)
        libc.free(p)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
if sys.argv[2] == "thread":
    thread = threading.Thread(target=rounds)
    thread.start()
    thread.join()
else:
    rounds()
print(faults[1])
"""


def _run(script: str, *args: str, **env: str) -> list[str]:
    """``script`` in a fresh interpreter (malloc settings are per process) with ``args``, and
    ``env`` on top of this one's minus IRONLM_CPU_MALLOC."""
    clean = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, check=True, timeout=60, env={**clean, **env}).stdout.split()


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's")
@pytest.mark.parametrize("mib", [24, 48])  # under and over glibc's 32 MB mmap threshold cap
def test_freed_blocks_stay_in_the_heap(mib: int) -> None:
    out = _run(_SCRIPT, str(mib), "main", "-")
    assert out[0] == "True"
    assert int(out[1]) < 100  # fresh pages would be 256 a MiB: 6,000 / 12,000 faults


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's")
def test_without_the_settings_a_large_block_is_mapped_fresh() -> None:
    # the measurement above can tell: glibc's defaults map a 48 MiB block at each malloc
    out = _run(_SCRIPT, "48", "main", "-", **{ENV_VAR: "0"})
    assert out[0] == "False"
    assert int(out[1]) > 6000


def test_the_environment_opts_out() -> None:
    check = "from ironlm_cpu.host_memory import tune_malloc; print(tune_malloc())"
    assert _run(check, **{ENV_VAR: "0"}) == ["False"]
    assert _run(check) == [str(GLIBC)]


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's")
@pytest.mark.parametrize("hook", [True, False])
def test_a_thread_started_after_the_servers_hook_keeps_its_blocks(hook: bool) -> None:
    faults = int(_run(_SCRIPT, "96", "thread", "hook" if hook else "-")[1])
    if hook:
        assert faults < 100
    else:  # the measurement can tell: 24,576 fresh pages
        assert faults > 20000


@pytest.mark.server
def test_the_server_calls_the_hook_before_the_engine_thread_starts(
        tiny_llama_dir: Path, tmp_path: Path) -> None:
    # the cpu platform under another name (tests/plugins/probe) writes down each hook's thread
    log = tmp_path / "hooks.log"
    probe = TESTS_DIR / "plugins" / "probe"
    env = {"PYTHONPATH": os.pathsep.join([str(probe), str(TESTS_DIR)]),
           "IRONLM_TEST_PROBE_LOG": str(log)}
    with RemoteServer(tiny_llama_dir, ["--device", "cpu-probe", "--max-model-len", "128",
                                       "--kv-cache-memory", "8MiB"], env=env) as server:
        client = server.openai_client()
        done = client.completions.create(model=str(tiny_llama_dir), prompt="Hi", max_tokens=2)
        assert done.usage.completion_tokens == 2
    assert log.read_text().splitlines() == [
        "before_engine_thread MainThread 0",  # no engine thread yet: it takes the main arena
        "configure_process ironlm-engine 1",  # the worker, on the engine thread
    ]
