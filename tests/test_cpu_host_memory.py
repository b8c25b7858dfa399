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

# a block of argv[1] MiB allocated, written and freed, twice, after tune_malloc: with the
# settings the heap keeps the block, so the second round faults in no fresh pages
_SCRIPT = """
import ctypes, resource, sys
from ironlm_cpu.host_memory import tune_malloc
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
print(tune_malloc())
faults = []
size = int(sys.argv[1]) << 20
for _ in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    libc.free(p)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
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
    out = _run(_SCRIPT, str(mib))
    assert out[0] == "True"
    assert int(out[1]) < 100  # fresh pages would be 256 a MiB: 6,000 / 12,000 faults


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's")
def test_without_the_settings_a_large_block_is_mapped_fresh() -> None:
    # the measurement above can tell: glibc's defaults map a 48 MiB block at each malloc
    out = _run(_SCRIPT, "48", **{ENV_VAR: "0"})
    assert out[0] == "False"
    assert int(out[1]) > 6000


def test_the_environment_opts_out() -> None:
    check = "from ironlm_cpu.host_memory import tune_malloc; print(tune_malloc())"
    assert _run(check, **{ENV_VAR: "0"}) == ["False"]
    assert _run(check) == [str(GLIBC)]
