"""A float32 row placed next to unreadable pages: a kernel that reads outside it faults."""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def row_beside_unreadable_pages(n: int, at: str) -> Iterator[torch.Tensor]:
    """(n,) float32 view whose first element follows an unreadable page (``at="start"``) or
    whose last element precedes one (``at="end"``); the pages on both sides are unreadable."""
    page = mmap.PAGESIZE
    buf = mmap.mmap(-1, 3 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base, page, 0) == 0 and libc.mprotect(base + 2 * page, page, 0) == 0
    row = torch.frombuffer(buf, dtype=torch.float32, count=n,
                           offset=page if at == "start" else 2 * page - n * 4)
    try:
        yield row
    finally:
        libc.mprotect(base, 3 * page, mmap.PROT_READ | mmap.PROT_WRITE)
        del row
        buf.close()
