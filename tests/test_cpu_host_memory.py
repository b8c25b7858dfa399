"""The cpu platform's glibc malloc settings (``host_memory``): set in every engine process
unless the environment opts out; their effect (no page faults for a prefill step's fresh
intermediates) is measured in benchmarks, not asserted here."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
from ironlm_cpu.host_memory import ENV_VAR, tune_malloc

GLIBC = platform.libc_ver()[0] == "glibc"

# a 24 MiB block freed and allocated again, twice, after tune_malloc: with the thresholds set
# the heap keeps the block, so the second round faults in no fresh pages
_SCRIPT = """
import ctypes, resource, sys
from ironlm_cpu.host_memory import tune_malloc
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
print(tune_malloc())
faults = []
for _ in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(24 << 20)
    ctypes.memset(p, 1, 24 << 20)
    libc.free(p)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[1])
"""


def _run(script: str, **env: str) -> list[str]:
    """``script`` in a fresh interpreter (malloc settings are per process), with ``env`` on
    top of this one's minus IRONLM_CPU_MALLOC."""
    clean = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=60, env={**clean, **env}).stdout.split()


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's")
def test_freed_blocks_stay_in_the_heap() -> None:
    out = _run(_SCRIPT)
    assert out[0] == "True"
    assert int(out[1]) < 100  # 24 MiB of fresh pages would be ~6,000 faults


def test_the_environment_opts_out() -> None:
    check = "from ironlm_cpu.host_memory import tune_malloc; print(tune_malloc())"
    assert _run(check, **{ENV_VAR: "0"}) == ["False"]
    assert _run(check) == [str(GLIBC)]
