"""vLLM's development routes, served only with ``VLLM_SERVER_DEV_MODE=1`` (as vLLM serves
them; with ``--api-key`` they need the key, which vLLM does not ask for):

  POST /sleep?level=1|2        sleep mode (``--enable-sleep-mode``): 400 while requests run
  POST /wake_up[?tags=...]     ``weights`` / ``kv_cache``, repeatable; none: both
  GET  /is_sleeping            ``{"is_sleeping": bool}``
  POST /reset_prefix_cache     forget cached prefixes (after new weights)
  POST /collective_rpc         ``{"method": name, "args": [...], "kwargs": {...}}``: a worker
                               method (``--worker-extension-cls``'s included) on every worker;
                               ``{"results": [...]}`` in rank order, each result JSON as it
                               is when it is None, an object or a list, else its ``str``

Requests that come while the engine sleeps get 503 (``code: sleeping``). /collective_rpc runs
any worker method with the client's arguments: for development only, as vLLM warns.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from ironlm.engine.llm_engine import LLMEngine
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.request_body import parse_body
from ironlm.entrypoints.openai.state import ServerState
from ironlm.interfaces.worker import UnknownMethodError

DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
DEV_PATHS = frozenset({"/sleep", "/wake_up", "/is_sleeping", "/reset_prefix_cache",
                       "/collective_rpc"})
dev_router = APIRouter()


def dev_mode() -> bool:
    return os.environ.get(DEV_MODE_ENV, "0").strip().lower() in ("1", "true")


def _state(request: Request) -> ServerState:
    return request.app.state.server


@dev_router.post("/sleep")
async def sleep(request: Request) -> Response:
    text = request.query_params.get("level", "1")
    if text.strip() not in ("1", "2"):
        raise APIError(f"sleep level must be 1 or 2, got {text!r}", 400, param="level")
    level = int(text)
    engine = _state(request).engine
    try:  # not enabled, requests running
        await asyncio.wrap_future(engine.call_all(lambda e: e.sleep(level)))
    except ValueError as exc:
        # one data-parallel engine refused (its requests run): those that slept wake again,
        # so that the engines are all awake or all asleep
        await asyncio.wrap_future(engine.call_all(_wake_if_asleep))
        raise APIError(str(exc), 400) from None
    return Response(status_code=200)


def _wake_if_asleep(engine: LLMEngine) -> None:
    if engine.is_sleeping():
        engine.wake_up()


@dev_router.post("/wake_up")
async def wake_up(request: Request) -> Response:
    tags = request.query_params.getlist("tags") or None
    try:
        await asyncio.wrap_future(_state(request).engine.call_all(lambda e: e.wake_up(tags)))
    except ValueError as exc:
        raise APIError(str(exc), 400, param="tags") from None
    return Response(status_code=200)


@dev_router.get("/is_sleeping")
async def is_sleeping(request: Request) -> dict[str, bool]:
    # a read of the engine's state: no need to wait for the engine thread's step
    return {"is_sleeping": any(e.is_sleeping() for e in _state(request).engine.engines)}


@dev_router.post("/reset_prefix_cache")
async def reset_prefix_cache(request: Request) -> Response:
    done = await asyncio.wrap_future(
        _state(request).engine.call_all(lambda e: e.reset_prefix_cache()))
    if not all(done):  # every data-parallel engine's
        raise APIError("the prefix cache was not reset: requests hold KV blocks", 400)
    return Response(status_code=200)


@dev_router.post("/collective_rpc")
async def collective_rpc(request: Request) -> JSONResponse:
    body = await parse_body(request, None)
    if not isinstance(body, dict) or not isinstance(body.get("method"), str):
        raise APIError("Missing 'method' in request body", 400, param="method")
    args, kwargs = body.get("args", []), body.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise APIError("'args' must be a list and 'kwargs' an object", 400,
                       param="args" if not isinstance(args, list) else "kwargs")
    if body.get("timeout") is not None:
        raise APIError("timeout is not supported (the call waits for every worker)", 400,
                       param="timeout")
    method = body["method"]
    engine = _state(request).engine
    call = engine.call_all(lambda e: e.executor.collective_rpc(method, *args, **kwargs))
    try:
        results = await asyncio.wrap_future(call)
    except UnknownMethodError as exc:
        raise APIError(str(exc), 400, param="method") from None
    except (ValueError, TypeError) as exc:  # the method refused its arguments
        raise APIError(str(exc), 400, param="args") from None
    # one result per worker: every data-parallel engine's workers, in rank order
    return JSONResponse({"results": [_json(r) for ranks in results for r in ranks]})


def _json(result: Any) -> Any:
    return result if result is None or isinstance(result, (dict, list)) else str(result)
