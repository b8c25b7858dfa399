"""One worker rank in a child process of the ``mp`` executor, and both ends of the channel.

The channel is a duplex pipe carrying pickled messages in lockstep: the executor sends one
call ``(method, args, kwargs)`` (or None: stop) and waits for its one reply before sending
the next, so at most one message is in flight each way (a bounded channel).

Replies: ``("ok", result)`` or ``("error", (exception, traceback text))``. The child first
replies to its construction. A step that fails leaves the process groups unusable, so the
child exits after reporting it (the other ranks' collectives then fail instead of waiting).
The child also exits when the engine's end of the pipe closes (the engine process is gone).
"""

from __future__ import annotations

import os
import pickle
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from ironlm.config import EngineConfig
from ironlm.interfaces.worker import WorkerBase, WorkerRank, with_extension

STOP = None


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process (its ``__cause__``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def error_reply(exc: BaseException) -> tuple[str, Any]:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickle.dumps(exc)
        payload: BaseException = exc
    except Exception:  # an exception that cannot cross processes: keep its text
        payload = RuntimeError(f"{type(exc).__name__}: {exc}")
    return "error", (payload, text)


def run_worker(
    config: EngineConfig, rank: WorkerRank, worker_cls: type[WorkerBase], conn: Connection
) -> None:
    """The child's main function (``multiprocessing`` spawn target)."""
    try:
        cls = with_extension(worker_cls, config.worker_extension_cls)
        worker = cls(config, rank, None)  # discovers plugins in this process
    except BaseException as exc:
        conn.send(error_reply(exc))
        return
    conn.send(("ok", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the engine is gone
            break
        if message is STOP:
            break
        method, args, kwargs = message
        try:
            result = worker.execute_method(method, *args, **kwargs)
        except BaseException as exc:
            conn.send(error_reply(exc))
            if method == "execute_model":
                break  # collectives are out of step now: leave, so the peers fail fast
            continue
        conn.send(("ok", result))
    try:
        worker.shutdown()
    finally:
        conn.close()


class WorkerDiedError(RuntimeError):
    """A worker process of the executor is gone; the engine cannot run steps any more."""


class WorkerChild:
    """The ``mp`` executor's handle on one worker process: its end of the channel."""

    def __init__(self, rank: int, proc: BaseProcess, conn: Connection) -> None:
        self.rank = rank
        self.proc = proc
        self.conn = conn

    def reply(self, dead: Callable[[], str | None]) -> Any:
        """The child's next reply; raises its exception, or WorkerDiedError when it is gone."""
        try:
            status, payload = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(timeout=1.0)
            raise WorkerDiedError(
                dead() or f"worker rank {self.rank} (pid {self.proc.pid}) exited with code "
                f"{self.proc.exitcode}"
            ) from None
        if status == "error":
            exc, text = payload
            raise exc from RemoteTraceback(f"in worker rank {self.rank}:\n{text}")
        return payload


def call_payload(method: str | Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> bytes:
    """One call, pickled once for every child; ValueError, before anything is sent, for what
    cannot cross processes (a callable goes by reference: a module-level function, not a
    lambda or a nested function)."""
    try:
        return pickle.dumps((method, args, kwargs))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ValueError(
            f"collective_rpc: the call to {getattr(method, '__qualname__', method)!r} cannot be "
            f"sent to the worker processes ({exc}); a callable must be a module-level "
            "function, its arguments picklable"
        ) from exc
