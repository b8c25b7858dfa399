"""Client-disconnect handling and async-iterator plumbing shared by the endpoints.

A disconnect must abort the engine requests of the HTTP request: the coroutine or stream
consuming ``AsyncEngine.generate`` is cancelled, which aborts the request and frees its KV
blocks. Disconnects are detected by waiting on the ASGI ``receive`` channel (after the body has
been read, the next message is ``http.disconnect``), so they are seen even while no token is
being produced (a request still queued, a long prefill).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Awaitable, Coroutine, TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The HTTP client went away; its engine requests were aborted."""


async def wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _cancel(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and wait until they are done. Every cancel is requested before the
    first wait, so that a caller cancelled meanwhile still leaves none running; their
    outcomes are consumed (no "exception was never retrieved" noise)."""
    for t in tasks:
        if not t.done():
            t.cancel()
    if tasks:
        await asyncio.wait(tasks)
    for t in tasks:
        if not t.cancelled():
            t.exception()


async def run_unless_disconnected(request: Request, coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro``; if the client disconnects first, cancel it and raise ClientDisconnected."""
    task = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        await _cancel(task)
        raise ClientDisconnected()
    finally:
        await _cancel(watcher, task)


async def stream_unless_disconnected(
    request: Request, chunks: AsyncIterator[T]
) -> AsyncIterator[T]:
    """Yield from ``chunks`` until it ends or the client disconnects; then close it (which
    closes the engine generators underneath and aborts what is unfinished)."""
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            pending = asyncio.ensure_future(chunks.__anext__())
            done, _ = await asyncio.wait({pending, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if pending not in done:
                return  # disconnected: the finally cancels the pending step (aborting)
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield item
    finally:
        await _cancel(watcher, *([pending] if pending is not None else []))
        await chunks.aclose()  # type: ignore[attr-defined]


async def gather_or_cancel(aws: list[Awaitable[T]]) -> list[T]:
    """Like asyncio.gather, but the first failure cancels the others before it is raised."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        await _cancel(*tasks)


async def close_all(iterators: list[AsyncIterator[Any]]) -> None:
    """Close async generators (idempotent): an unfinished engine generator aborts its request."""
    for it in iterators:
        await it.aclose()  # type: ignore[attr-defined]


async def last_item(it: AsyncIterator[T]) -> T:
    """Consume ``it``; its final item (the finished RequestOutput)."""
    last: T | None = None
    async for item in it:
        last = item
    if last is None:
        raise RuntimeError("the engine returned no output")
    return last


async def merge(iterators: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Interleave several iterators as items arrive: (iterator index, item). Closing the merge
    cancels the readers, which closes every iterator."""
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    done = object()

    async def read(i: int, it: AsyncIterator[T]) -> None:
        try:
            async for item in it:
                await queue.put((i, item))
            await queue.put((i, done))
        except Exception as exc:  # handed to the consumer
            await queue.put((i, exc))
        finally:
            await it.aclose()  # type: ignore[attr-defined]

    readers = [asyncio.ensure_future(read(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(readers)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        await _cancel(*readers)


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event: ``data: <json>\\n\\n`` (or a literal such as [DONE])."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"
