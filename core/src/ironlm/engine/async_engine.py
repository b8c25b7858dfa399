"""AsyncEngine: the LLMEngine on a background thread, streamed to asyncio callers.

The engine loop never runs on the event loop, so the HTTP server stays responsive while a
step computes. Commands (add, abort) cross over through a queue; outputs come back through
``loop.call_soon_threadsafe`` into one asyncio.Queue per request.

A failing step fails the requests in flight and the loop goes on, unless the executor says its
workers are gone (``LLMEngine.check_health``, also asked while idle): then the engine is dead,
``fatal_error`` holds why, the loop ends (``is_alive`` is False: /health answers 503) and
``on_dead`` is called once from the engine thread (the server uses it to exit).

The engine is also built on that thread (``AsyncEngine(build)``; ``start`` waits for it and
raises what building raised): every compute call of the process then comes from one thread.
Why: OpenMP runtimes (torch's libgomp, which the cpu plugin's kernels share) keep one pool of
worker threads per thread that opens parallel regions; loading and warming the model up on the
main thread and stepping on this one made two pools, libgomp then counts more threads than
cores and its workers stop spinning between regions (each region pays a futex wake-up). A
batch-64 SmolLM2 decode step on the 2-core Zen 5: 26.3 ms on the main thread, 35.3 ms here with
the engine built on the main thread, 26.5 ms built here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from ironlm.engine.command_queue import CommandQueue, Refuse, fail_future
from ironlm.engine.futures import gather
from ironlm.engine.llm_engine import LLMEngine
from ironlm.outputs import RequestOutput

log = logging.getLogger("ironlm.engine")


class EngineOverloadedError(RuntimeError):
    """Too many requests are waiting; the caller should answer 503."""


class EngineDeadError(RuntimeError):
    """The engine thread is gone; the caller should answer 500/503."""


class RequestFailedError(RuntimeError):
    """One request failed inside the engine (a guided-decoding backend's dead end); the others
    go on. The caller answers 500 (an error event in a stream)."""


class ServerShuttingDownError(RuntimeError):
    """The server is draining for shutdown: new requests get 503; requests still running when
    the grace period ends are aborted with this error."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException]

    def put(self, item: RequestOutput | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop has closed: nobody reads this stream
            pass


class AsyncEngine:
    def __init__(
        self,
        build: Callable[[], LLMEngine],
        max_waiting: int = 1024,
        on_dead: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._build = build
        self.engine: LLMEngine  # set by start(), on the engine thread
        self.on_dead = on_dead
        self.fatal_error: BaseException | None = None
        self.max_waiting = max_waiting
        # Sequences (n / best_of per request) between generate() entry and their end; only
        # touched on the event loop. Overloaded = more in flight than can run (max_num_seqs)
        # plus may wait (max_waiting).
        self._in_flight = 0
        self.capacity = max_waiting  # plus max_num_seqs once the engine is built
        self.draining = False  # set at shutdown: new requests get ServerShuttingDownError
        self._commands = CommandQueue()
        self._streams: dict[str, _Stream] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ironlm-engine", daemon=True)
        self._built = threading.Event()
        self._build_error: BaseException | None = None
        self.last_error: BaseException | None = None
        self.last_stats: dict[str, Any] = {}

    def start(self) -> None:
        """Start the engine thread, which builds the engine; returns once it is built, or
        raises what building raised."""
        self.begin_start()
        self.wait_started()

    def begin_start(self) -> None:
        """Start the engine thread, which builds the engine (``wait_started`` waits for it)."""
        self._thread.start()

    def wait_started(self) -> None:
        """Return once the engine is built, or raise what building raised."""
        self._built.wait()
        if self._build_error is not None:
            self._thread.join()
            raise self._build_error

    def shutdown(self) -> None:
        self._stop.set()
        self._submit(lambda: None)
        self._thread.join(timeout=30)
        if self._build_error is None and self._built.is_set():
            self.engine.shutdown()

    @property
    def engines(self) -> list[LLMEngine]:
        return [self.engine]

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # -- API for the event loop ------------------------------------------------------------
    async def generate(
        self, request_id: str, prompt: Any, params: Any, data_parallel_rank: int | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[RequestOutput]:
        """Validate and queue one request, then yield its cumulative outputs until finished.
        Validation errors (ValueError) are raised before the first output. Cancelling the
        consumer (client disconnect) aborts the request and frees its blocks.
        ``data_parallel_rank``: the engine to run on, none but 0 here (DataParallelEngine)."""
        if data_parallel_rank not in (None, 0):
            raise ValueError(f"data_parallel_rank {data_parallel_rank} is out of range [0, 1)")
        if not self.is_alive:
            raise EngineDeadError("the engine loop is not running")
        if self.draining:
            raise ServerShuttingDownError("the server is shutting down; retry on another "
                                          "replica")
        seqs = self.check_num_seqs(params)
        if self._in_flight + seqs > self.capacity:
            raise EngineOverloadedError(
                f"server overloaded: {self._in_flight} sequences already in flight (the limit "
                f"is {self.capacity}: max_num_seqs + --max-waiting-requests); this request "
                f"adds {seqs}"
            )
        self._in_flight += seqs
        inner = self._generate(request_id, prompt, params, **kwargs)
        try:
            async for out in inner:
                yield out
        finally:
            self._in_flight -= seqs
            await inner.aclose()  # run its abort-on-disconnect now, not at garbage collection

    @property
    def num_in_flight(self) -> int:
        """Sequences of the requests between generate() entry and their end."""
        return self._in_flight

    def check_num_seqs(self, params: Any) -> int:
        """The sequences a request runs (best_of, else n); ValueError naming the field when
        more than the server can ever hold at once (running plus waiting)."""
        n = int(getattr(params, "n", 1) or 1)
        best_of = int(getattr(params, "best_of", None) or n)
        field, seqs = ("best_of", best_of) if best_of > n else ("n", n)
        if seqs > self.capacity:
            raise ValueError(
                f"{field} must be at most {self.capacity} on this server (the sequences it "
                f"can hold at once: max_num_seqs + --max-waiting-requests), got {seqs}."
            )
        return seqs

    async def _generate(
        self, request_id: str, prompt: Any, params: Any, **kwargs: Any
    ) -> AsyncIterator[RequestOutput]:
        loop = asyncio.get_running_loop()
        stream = _Stream(loop, asyncio.Queue())
        added: Future[None] = Future()

        def add() -> None:
            # The caller may have been cancelled (client gone) before this ran: skip the add.
            if not added.set_running_or_notify_cancel():
                return
            try:
                self.engine.add_request(request_id, prompt, params, **kwargs)
                self._streams[request_id] = stream
                added.set_result(None)
            except BaseException as exc:  # validation error: hand it to the caller
                added.set_exception(exc)

        spec = getattr(params, "guided_decoding", None)
        if spec is not None:  # compile off the engine thread; add_request finds it cached
            await self.compile_guided(spec, params.guided_decoding_backend)
        self._submit(add, refuse=fail_future(added))
        finished = False
        try:
            try:
                await asyncio.wrap_future(added)
            except asyncio.CancelledError:
                raise  # the add may have run already: the finally aborts it
            except BaseException:
                finished = True  # rejected: nothing was queued, nothing to abort
                raise
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(request_id)

    async def compile_guided(self, spec: Any, backend: str | None) -> None:
        """Compile a guided spec on a worker thread (cached for the request's add); ValueError
        when it is invalid or no backend may enforce it."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.engine.guided.compile, spec, backend)

    def abort(self, request_id: str) -> None:
        def do() -> None:
            self._streams.pop(request_id, None)
            self.engine.abort_request(request_id)

        self._submit(do)

    def call(self, fn: Callable[[LLMEngine], Any]) -> Future[Any]:
        """Run ``fn(engine)`` on the engine thread (stats, cache reset, ...)."""
        fut: Future[Any] = Future()

        def do() -> None:
            if not fut.set_running_or_notify_cancel():  # the caller gave up waiting
                return
            try:
                fut.set_result(fn(self.engine))
            except BaseException as exc:
                fut.set_exception(exc)

        self._submit(do, refuse=fail_future(fut))
        return fut

    def call_all(self, fn: Callable[[LLMEngine], Any]) -> Future[list[Any]]:
        """``call`` with its result in a list: one per engine, as a data-parallel group's."""
        return gather([self.call(fn)])

    def _submit(self, run: Callable[[], None], refuse: Refuse | None = None) -> None:
        self._commands.submit(run, refuse, self._closed_error)

    def _closed_error(self) -> EngineDeadError:
        why = f": {self.fatal_error}" if self.fatal_error is not None else ""
        return EngineDeadError(f"the engine loop is not running{why}")

    # -- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.engine = self._build()
            self.capacity += self.engine.config.max_num_seqs
            self.last_stats = self.engine.stats()
        except BaseException as exc:  # start() raises it in the caller
            self._build_error = exc
            self._commands.close(self._closed_error())
            return
        finally:
            self._built.set()
        try:
            self._loop()
        finally:
            self._commands.close(self._closed_error())
            for stream in self._streams.values():  # requests the loop left running
                stream.put(self._closed_error())
            self._streams.clear()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._commands.run_queued(block=not self.engine.has_unfinished_requests())
            if self._workers_gone():
                return
            if not self.engine.has_unfinished_requests():
                self.last_stats = self.engine.stats()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a failing step fails its requests, not the server
                log.exception("engine step failed")
                self.last_error = exc
                self._fail_all(exc)
                if self._workers_gone():
                    return
                continue
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    stream.put(RequestFailedError(out.error) if out.error else out)
                    if out.finished:
                        del self._streams[out.request_id]
            self.last_stats = self.engine.stats()

    def _workers_gone(self) -> bool:
        """Whether the executor lost its workers; if so, fail everything and report once."""
        try:
            self.engine.check_health()
        except Exception as exc:
            log.error("engine dead: %s", exc)
            self.fatal_error = self.last_error = exc
            self._fail_all(exc)
            if self.on_dead is not None:
                self.on_dead(exc)
            return True
        return False

    def abort_all(self, err: Exception) -> None:
        """End every request in flight with ``err`` (raised to each consumer) and free them."""
        self._submit(lambda: self._fail_all(err, as_is=True))

    def _fail_all(self, exc: Exception, as_is: bool = False) -> None:
        err = exc if as_is else RuntimeError(f"engine step failed: {exc!r}")
        for rid, stream in list(self._streams.items()):
            stream.put(err)
            self.engine.abort_request(rid)
        self._streams.clear()
        # Requests with no stream (already abandoned) are aborted too.
        for rid in list(self.engine.outputs.groups):
            self.engine.abort_request(rid)
