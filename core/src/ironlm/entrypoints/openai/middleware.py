"""ASGI middleware of the server: API key, request-body size limit, X-Request-Id headers, the
server-load count, and --middleware loading.

Pure ASGI (not BaseHTTPMiddleware): streaming responses and disconnect detection pass through
untouched.
"""

from __future__ import annotations

import hmac
import importlib
import inspect
import uuid
from typing import Any, Awaitable, Callable

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.serving_dev import DEV_PATHS


def _route_path(scope: Scope) -> str:
    """The path inside the app (without --root-path when the server put it in the path)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "") or ""
    if root and path.startswith(root):
        path = path[len(root):] or "/"
    return path


async def _send_error(send: Send, error: APIError) -> None:
    response = error.response()
    await response({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:  # JSONResponse never reads the request
    return {"type": "http.disconnect"}


# the routes that run the engine, counted by --enable-server-load-tracking (vLLM's)
LOAD_TRACKED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                                "/v1/responses", "/generate", "/invocations"})


class LoadCounter:
    """Requests in flight on LOAD_TRACKED_PATHS (GET /load). One event loop updates it."""

    def __init__(self) -> None:
        self.value = 0


class LoadTrackingMiddleware:
    """--enable-server-load-tracking: a generation request counts from its arrival until its
    response, streamed ones included, has been sent (or the client left)."""

    def __init__(self, app: ASGIApp, counter: LoadCounter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _route_path(scope) not in LOAD_TRACKED_PATHS:
            await self.app(scope, receive, send)
            return
        self.counter.value += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.counter.value -= 1


class RequestIdHeaderMiddleware:
    """--enable-request-id-headers (vLLM's): every response carries ``X-Request-Id``, the
    request's own header when it sent one (its completion ids carry it too), else a new id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        value = dict(scope.get("headers") or []).get(b"x-request-id") or uuid.uuid4().hex.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() != b"x-request-id"]  # fmt: skip
                message = {**message, "headers": [*headers, (b"x-request-id", value)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class APIKeyMiddleware:
    """Requires ``Authorization: Bearer <key>`` on /v1/* and /generate (not /health, /metrics,
    /version, /tokenize, ...: vLLM protects /v1 only; /generate and the development routes,
    ``serving_dev.DEV_PATHS``, are added here)."""

    def __init__(self, app: ASGIApp, api_keys: list[str]) -> None:
        self.app = app
        if not api_keys or not all(api_keys):
            raise ValueError("APIKeyMiddleware needs non-empty keys")
        self.expected = [key.encode() for key in api_keys]  # any one of them is accepted

    def _protected(self, scope: Scope) -> bool:
        path = _route_path(scope)
        return path.startswith("/v1/") or path in ("/v1", "/generate") or path in DEV_PATHS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS" \
                or not self._protected(scope):
            await self.app(scope, receive, send)
            return
        got = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, token = got.strip().partition(b" ")
        # the scheme is case-insensitive (RFC 9110): "Bearer", "bearer", "BEARER"
        # every key compared, so the time taken does not tell which one came close
        matches = [hmac.compare_digest(token.strip(), key) for key in self.expected]
        if not (scheme.lower() == b"bearer" and any(matches)):
            message = "Missing API key: send 'Authorization: Bearer <key>'" if not got \
                else "Incorrect API key provided."
            await _send_error(send, APIError(message, 401, code="invalid_api_key"))
            return
        await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """413 for a request body above ``max_bytes`` (declared length or streamed bytes)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _error(self) -> APIError:
        return APIError(f"request body too large: the limit is {self.max_bytes} bytes", 413,
                        code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _send_error(send, self._error())
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self._error())
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge as exc:  # when no handler inside the app answered it already
            if not started:
                await _send_error(send, exc)


class _TooLarge(APIError):
    def __init__(self, error: APIError) -> None:
        super().__init__(error.message, error.status, code=error.code)


def load_middleware(app: FastAPI, path: str) -> None:
    """--middleware MODULE.ATTR: an ASGI middleware class (added with ``add_middleware``) or an
    ``async def f(request, call_next)`` function (added as HTTP middleware), as in vLLM."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"--middleware {path!r} must be an import path like 'pkg.module.Name'")
    try:
        obj: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--middleware {path!r} cannot be imported: {exc}") from None
    if inspect.isclass(obj):
        app.add_middleware(obj)
    elif inspect.iscoroutinefunction(obj):
        func: Callable[..., Awaitable[Any]] = obj
        app.middleware("http")(func)
    else:
        raise ValueError(f"--middleware {path!r} is neither a class nor an async function")
