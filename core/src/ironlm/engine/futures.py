"""gather: one concurrent future for several (a call on every data-parallel engine's thread)."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future
from typing import Any


def gather(futures: list[Future[Any]]) -> Future[list[Any]]:
    """One future for several: their results in order once every one is done, else the first
    one's exception (raised only then: no engine is left mid-call). Cancelling it cancels
    those not started yet."""
    out: Future[list[Any]] = Future()
    if not futures:
        out.set_result([])
        return out
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future[Any]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        if not out.set_running_or_notify_cancel():  # the caller gave up
            return
        failed = [f for f in futures if f.cancelled() or f.exception() is not None]
        if failed:
            first = failed[0]
            out.set_exception(CancelledError() if first.cancelled() else first.exception())
        else:
            out.set_result([f.result() for f in futures])

    def cancel_rest(done: Future[list[Any]]) -> None:
        if done.cancelled():
            for f in futures:
                f.cancel()  # only those not started yet are cancelled

    out.add_done_callback(cancel_rest)
    for f in futures:
        f.add_done_callback(one_done)
    return out
