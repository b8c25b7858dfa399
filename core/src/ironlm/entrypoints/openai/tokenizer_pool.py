"""TokenizerPool: tokenization and chat templating off the event loop.

A 10 MB prompt takes seconds to tokenize; on the event loop that would stall every other
request and /health. The pool runs such work on a few worker threads, each with its own copy
of the tokenizer (HF fast tokenizers must not be used by two threads at once). The copies are
made up front, on the thread that builds the pool.
"""

from __future__ import annotations

import asyncio
import copy
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class TokenizerPool:
    def __init__(self, tokenizer: Any, workers: int = 2) -> None:
        self._free: queue.Queue[Any] = queue.Queue()
        for _ in range(workers):
            self._free.put(copy.deepcopy(tokenizer))
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="ironlm-tokenize")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(tokenizer, *args, **kwargs)`` on a worker thread with a tokenizer of its own."""
        def call() -> T:
            tok = self._free.get()  # never waits: one copy per worker
            try:
                return fn(tok, *args, **kwargs)
            finally:
                self._free.put(tok)

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
