"""POST /generate: the legacy endpoint of vLLM's ``api_server`` (used by the Ascend seed doc).

Request: ``{"prompt": str, "stream": bool, **sampling}`` where the sampling keys are
SamplingParams fields. Response: ``{"text": [prompt + completion, ...]}`` (one per sequence);
streamed as newline-delimited JSON objects of the same shape (cumulative text).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import fields
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ironlm.engine.input_processor import output_room
from ironlm.entrypoints.openai.engine_response import respond
from ironlm.entrypoints.openai.errors import APIError, from_value_error
from ironlm.entrypoints.openai.request_inputs import (
    KNOWN_FIELDS,
    check_context_length,
    tokenize_prompts,
)
from ironlm.entrypoints.openai.request_tracker import tracked
from ironlm.entrypoints.openai.state import ServerState, data_parallel_rank, random_id
from ironlm.entrypoints.openai.streaming import close_all
from ironlm.outputs import RequestOutput
from ironlm.sampling_params import SamplingParams

# Settable through /generate: the public SamplingParams fields, minus engine-internal ones.
_SAMPLING_KEYS = {f.name for f in fields(SamplingParams) if not f.name.startswith("_")} - {
    "guided_decoding", "use_beam_search",
}


async def generate(state: ServerState, request: Request, body: Any) -> Response:
    state.serves("Generate API")
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object", 400)
    body = dict(body)
    prompt = body.pop("prompt", None)
    stream = bool(body.pop("stream", False))
    body.pop("model", None)
    if not isinstance(prompt, str) or not prompt:
        raise APIError("prompt must be a non-empty string", 400, param="prompt")
    unknown = sorted(set(body) - _SAMPLING_KEYS)
    if unknown:
        raise APIError(f"unknown sampling parameter(s) {unknown}; accepted: "
                       f"{sorted(_SAMPLING_KEYS)}", 400, param=unknown[0])
    try:
        params = SamplingParams(**body)
    except (ValueError, TypeError) as exc:
        raise from_value_error(exc, KNOWN_FIELDS) from None
    (engine_prompt,) = await tokenize_prompts(state, [prompt], True, params.truncate_prompt_tokens,
                                              room=output_room(params.max_tokens))
    params.max_tokens = check_context_length(len(engine_prompt.token_ids), params.max_tokens,
                                             state.max_model_len)
    request_id = random_id("generate")
    state.log_request(request_id, prompt, engine_prompt.token_ids, params)
    gen = tracked(
        state.engine.generate(request_id, engine_prompt.as_engine_prompt(), params,
                              data_parallel_rank=data_parallel_rank(state, request)),
        state.new_tracker(max_tokens=params.max_tokens),
    )
    return await respond(
        request, [gen],
        build=lambda finals: JSONResponse(_body(prompt, finals[0])),
        stream=(lambda firsts: _stream(prompt, firsts[0], gen)) if stream else None,
        media_type="application/x-ndjson",
    )


def _body(prompt: str, out: RequestOutput) -> dict[str, list[str]]:
    return {"text": [prompt + o.text for o in out.outputs]}


async def _stream(
    prompt: str, first: RequestOutput, gen: AsyncIterator[RequestOutput]
) -> AsyncIterator[str]:
    try:
        yield json.dumps(_body(prompt, first), ensure_ascii=False) + "\n"
        async for out in gen:
            yield json.dumps(_body(prompt, out), ensure_ascii=False) + "\n"
    except (ValueError, RuntimeError) as exc:
        yield json.dumps(APIError(str(exc), 500).body()) + "\n"
    finally:
        await close_all([gen])
