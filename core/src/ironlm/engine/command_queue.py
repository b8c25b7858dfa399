"""The engine thread's command queue: the event loop's calls (add a request, abort one, run a
function on the engine) run on the engine thread between steps. Once that thread has left its
loop (the engine died, or shut down) the queue is closed: what was still queued and every later
command is refused, so no caller waits for a command no thread will run."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

log = logging.getLogger("ironlm.engine")

# How a command fails its caller when it will not run (the error says why).
Refuse = Callable[[BaseException], None]


def fail_future(fut: Future[Any]) -> Refuse:
    """A Refuse that fails ``fut`` (unless its caller gave up waiting on it)."""

    def fail(exc: BaseException) -> None:
        if fut.set_running_or_notify_cancel():
            fut.set_exception(exc)

    return fail


class CommandQueue:
    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[[], None], Refuse | None]] = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()  # a command is queued before the close, or refused

    def submit(self, run: Callable[[], None], refuse: Refuse | None,
               closed_error: Callable[[], BaseException]) -> None:
        """Queue ``run`` for the engine thread; when closed, ``refuse`` with
        ``closed_error()`` at once instead (a command with no caller waiting is dropped)."""
        with self._lock:
            if not self._closed:
                self._queue.put((run, refuse))
                return
        if refuse is not None:
            refuse(closed_error())

    def run_queued(self, block: bool) -> None:
        """On the engine thread: run every queued command (waiting up to 0.5 s for the first
        when ``block``). A command that raises is logged: it must not end the thread."""
        try:
            cmd, _ = self._queue.get(timeout=0.5) if block else self._queue.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                cmd()
            except Exception:
                log.exception("engine command failed")
            try:
                cmd, _ = self._queue.get_nowait()
            except queue.Empty:
                return

    def close(self, error: BaseException) -> None:
        """On the engine thread, as it leaves its loop: refuse what is queued with ``error``;
        later commands are refused by ``submit``."""
        with self._lock:
            self._closed = True
        while True:
            try:
                _, refuse = self._queue.get_nowait()
            except queue.Empty:
                return
            if refuse is not None:
                refuse(error)
