"""The common tail of the generating endpoints: wait for the engine, then answer or stream.

An endpoint has started one engine generator per prompt. Without streaming it answers from
their final outputs; with streaming it first waits for every generator's first output, so that
an error the engine finds in a request (a ValueError) is still a 400 rather than an error event
inside a 200 stream. Either wait ends early when the client disconnects: 499, and the engine
requests are aborted. The generators are closed on every path, except that a started stream
owns them (its own ``finally`` closes them).
"""

from __future__ import annotations

from typing import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ironlm.entrypoints.openai.errors import from_value_error
from ironlm.entrypoints.openai.request_inputs import KNOWN_FIELDS
from ironlm.entrypoints.openai.streaming import (
    ClientDisconnected,
    close_all,
    gather_or_cancel,
    last_item,
    run_unless_disconnected,
    stream_unless_disconnected,
)
from ironlm.outputs import RequestOutput

# One output per generator, in the generators' order -> the whole response / its chunks.
BuildResponse = Callable[[list[RequestOutput]], Response]
StreamChunks = Callable[[list[RequestOutput]], AsyncIterator[str]]


async def respond(
    request: Request,
    gens: list[AsyncIterator[RequestOutput]],
    build: BuildResponse,
    stream: StreamChunks | None = None,
    media_type: str = "text/event-stream",
) -> Response:
    """``build(final outputs)``; or, given ``stream``, a StreamingResponse of
    ``stream(first outputs)`` that stops when the client disconnects."""
    try:
        if stream is None:
            try:
                finals = await run_unless_disconnected(
                    request, gather_or_cancel([last_item(g) for g in gens])
                )
            finally:
                await close_all(gens)
            return build(finals)
        firsts = await run_unless_disconnected(
            request, gather_or_cancel([anext(g) for g in gens])
        )
    except ClientDisconnected:
        await close_all(gens)
        return Response(status_code=499)
    except ValueError as exc:
        await close_all(gens)
        raise from_value_error(exc, KNOWN_FIELDS) from None
    except BaseException:
        await close_all(gens)
        raise
    return StreamingResponse(
        stream_unless_disconnected(request, stream(firsts)), media_type=media_type
    )
