"""glibc malloc settings for a process that runs the engine on the CPU (``configure_process``).

Why: an eager prefill step allocates its intermediates fresh (a 2048-token SmolLM2 step: a
12.6 MB gate/up output per layer, and its neighbours), and frees them by the next layer. glibc
serves such blocks from its heap only while its dynamic mmap threshold has grown past their
size, and hands the heap's free top back to the kernel once it passes the trim threshold
(twice the mmap threshold), so the next allocation faults in fresh zeroed pages. On the 2-core
Zen 5, the bench's 64 x 64-token prompts after one round of decoding: each 2048-token prefill
step faulted ~90,000 pages (~370 MB) and took 613-623 ms; with the settings below 0-800 faults
and 515-545 ms. Decode steps replay graphs over fixed buffers and allocate next to nothing.

glibc will not raise the mmap threshold past 32 MB, and a block over it is mapped fresh and
unmapped at its free whatever the threshold, so ``M_MMAP_MAX`` 0 turns those maps off: every
block comes from an arena. Blocks that large are a step's ordinary intermediates at larger
budgets and models (SmolLM2's float32 gate/up output is 50 MB at 4096 tokens, Gemma 3 270M's
67 MB at 2048). Zen 4, SmolLM2 float32, 64 x 64-token prompts in one 4096-token step, five
batches a process: with the maps, 200,000-410,000 page faults (0.8-1.6 GB) in every batch
when the engine runs on a thread of its own (the server), in some processes on the main
thread too; without, 40,000-190,000 in the first batch or two, then 0-8,400 a batch.

The price is memory the process keeps: up to ``TRIM_THRESHOLD`` of freed heap is not returned
to the kernel (the engine reaches that high-water mark in every prefill step anyway), and
every block comes from the heap, so heap space freed below live blocks is not returned
either (peak RSS 0-40 MB higher in the runs above). With ``LLM`` in a user's own process the
settings hold for that whole process. ``IRONLM_CPU_MALLOC=0`` leaves glibc's defaults; other
C libraries are left alone (an allocator preloaded over glibc's, jemalloc or tcmalloc, does
not read these settings).

The OpenAI server runs the engine on a thread of its own, and glibc gives each new thread
that allocates an arena of its own: heaps of at most 64 MB, handed back to the kernel when
wholly free, and a block larger than a heap is mapped fresh whatever ``M_MMAP_MAX`` says.
``share_main_arena`` (``M_ARENA_MAX`` 1), set on the server's main thread before the engine
thread starts, puts every later thread on the main arena, which the settings above keep.
Zen 4, ``ironlm serve`` in float32 at its 2048-token budget, requests of 64 x 64-token
prompts (``max_tokens`` 1): after the first request Gemma 3 270M (67 MB gate/up output)
faulted 0-50,000 pages a request, SmolLM2 8-101,000; on the main arena 0-8,200 and 0-3,100,
peak RSS 170-230 and ~135 MB lower. The threads then take one lock for their mallocs: the
engine's are a few hundred a step, and the C kernels' OpenMP teams allocate nothing per call
(the paged-attention kernel keeps each thread's scratch, ``decode_kernel_src``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

logger = logging.getLogger(__name__)

ENV_VAR = "IRONLM_CPU_MALLOC"
# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 << 20  # the largest glibc takes on 64-bit: larger blocks stay mmap'ed
TRIM_THRESHOLD = 256 << 20


def _glibc() -> ctypes.CDLL | None:
    """This process's C library where the settings apply: None where the environment opts out
    or the C library is not glibc."""
    if os.environ.get(ENV_VAR, "1") == "0":
        logger.info("cpu platform: %s=0, glibc's malloc settings left as they are", ENV_VAR)
        return None
    return _libc()


def _libc() -> ctypes.CDLL | None:
    """glibc, or None where the C library is another."""
    return ctypes.CDLL(None) if platform.libc_ver()[0] == "glibc" else None


def tune_malloc() -> bool:
    """Set glibc's mmap and trim thresholds, and no maps of their own for large blocks, for
    this process (see the module doc); True when they were set, False where the environment
    opts out or the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and ok  # no block is mapped on its own (above)
    if not ok:
        logger.warning("cpu platform: glibc refused the malloc thresholds; prefill steps may "
                       "fault in fresh pages for their intermediates")
    return ok


def trim_heap() -> bool:
    """Hand the heap's free pages back to the kernel now (``malloc_trim(0)``: the settings
    above keep them otherwise), e.g. after sleep mode freed the KV cache; True where glibc
    returned any. Also with ``IRONLM_CPU_MALLOC=0``: trimming changes no setting."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0) == 1)


def share_main_arena() -> bool:
    """Threads started from now on allocate from glibc's main arena (see the module doc);
    True when set, False where the environment opts out or the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    ok = libc.mallopt(M_ARENA_MAX, 1) == 1
    if not ok:
        logger.warning("cpu platform: glibc refused M_ARENA_MAX; the engine thread's prefill "
                       "intermediates may fault in fresh pages")
    return ok
