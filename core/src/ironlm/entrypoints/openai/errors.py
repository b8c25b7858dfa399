"""OpenAI error objects and the exception handlers that produce them.

Every failure the server answers with has OpenAI's shape, so the official ``openai`` client
raises its typed errors (BadRequestError for 400, AuthenticationError for 401, ...)::

    {"error": {"message": str, "type": str, "param": str | None, "code": str | int | None}}
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus
from typing import Any, Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ironlm.engine.async_engine import (
    EngineDeadError,
    EngineOverloadedError,
    RequestFailedError,
    ServerShuttingDownError,
)
from ironlm.engine.sleep_calls import EngineSleepingError

log = logging.getLogger("ironlm.server")

# OpenAI's error "type" per status (what api.openai.com sends).
_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """An error answered as an OpenAI error object with ``status``."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | int | None = None,
        type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


_LEADING_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\.[A-Za-z_][A-Za-z0-9_]*)*)\b")


def from_value_error(exc: BaseException, known_fields: Iterable[str] = ()) -> APIError:
    """A 400 for a validation error. The engine's and SamplingParams' messages start with the
    field name ("top_p must be in (0, 1], got 1.5."); that name becomes ``param``."""
    message = str(exc)
    param = None
    m = _LEADING_NAME.match(message)
    if m and m.group(1) in set(known_fields):
        param = m.group(1) + m.group(2)
    return APIError(message, 400, param=param)


def overloaded(exc: BaseException) -> APIError:
    return APIError(str(exc), 503, code="overloaded")


def engine_error(exc: BaseException) -> APIError:
    """The error object for an exception the engine raised into a request (also sent as a
    stream's last event): 503 while shutting down or asleep, 500 otherwise."""
    if isinstance(exc, ServerShuttingDownError):
        return APIError(str(exc), 503, code="shutting_down")
    if isinstance(exc, EngineSleepingError):
        return APIError(str(exc), 503, code="sleeping")
    if isinstance(exc, RequestFailedError):
        return APIError(str(exc), 500, code="request_failed")
    return APIError(str(exc), 500)


def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if status == 404:
        message = f"route {request.method} {request.url.path} not found"
    else:
        message = str(exc.detail) if exc.detail else HTTPStatus(status).phrase
    return APIError(message, status, code=status).response()


def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_error(exc.errors()).response()


def validation_error(errors: Any) -> APIError:
    """A 400 from pydantic's error list: the first problem, its field as ``param``."""
    errors = list(errors)
    if not errors:
        return APIError("invalid request body", 400)
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    where = ".".join(loc)
    message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem(s))"
    return APIError(message, 400, param=loc[0] if loc else None)


def install_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return exc.response()

    async def engine_busy(request: Request, exc: Exception) -> JSONResponse:
        return overloaded(exc).response()

    async def engine_failed(request: Request, exc: Exception) -> JSONResponse:
        return engine_error(exc).response()

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        return _http_error(request, exc)

    async def request_validation(request: Request, exc: Exception) -> JSONResponse:
        return _validation_error(request, exc)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return APIError(f"internal server error: {exc!r}", 500).response()

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(EngineOverloadedError, engine_busy)
    app.add_exception_handler(EngineDeadError, engine_busy)
    app.add_exception_handler(RequestFailedError, engine_failed)
    app.add_exception_handler(ServerShuttingDownError, engine_failed)
    app.add_exception_handler(EngineSleepingError, engine_failed)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, request_validation)
    app.add_exception_handler(Exception, unexpected)
