"""Request bodies: JSON parsed (off the event loop when large) and validated into a protocol
model, every failure a 400 naming what is wrong."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from ironlm.entrypoints.openai.errors import APIError, validation_error

M = TypeVar("M", bound=BaseModel)


async def parse_body(request: Request, model: type[M] | None) -> Any:
    """The JSON body, validated into ``model``; 400 for a wrong content type, malformed JSON,
    or a field of the wrong type."""
    ctype = request.headers.get("content-type", "")
    if ctype and "json" not in ctype.split(";")[0].lower():
        raise APIError(f"Unsupported Content-Type {ctype!r}: send application/json", 400)
    raw = await request.body()
    if len(raw) > _PARSE_ON_LOOP_BYTES:  # megabytes of JSON: parse off the event loop
        return await asyncio.get_running_loop().run_in_executor(None, _parse, raw, model)
    return _parse(raw, model)


_PARSE_ON_LOOP_BYTES = 256 * 1024


def _parse(raw: bytes, model: type[M] | None) -> Any:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise APIError(f"Invalid JSON body: {exc}", 400) from None
    return data if model is None else validated(data, model)


def validated(data: Any, model: type[M]) -> M:
    """``data`` (a parsed JSON body) as ``model``; 400 naming the first wrong field."""
    if not isinstance(data, dict):
        raise APIError("the request body must be a JSON object", 400)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
