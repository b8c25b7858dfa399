"""POST /v1/embeddings: mean-pooled last hidden states (``LLM.encode``), one per input."""

from __future__ import annotations

import base64

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ironlm.entrypoints.openai.engine_response import respond
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.metrics import tracked
from ironlm.entrypoints.openai.protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    UsageInfo,
)
from ironlm.entrypoints.openai.request_inputs import split_prompts, tokenize_prompts
from ironlm.entrypoints.openai.state import ServerState, random_id
from ironlm.outputs import RequestOutput
from ironlm.sampling_params import SamplingParams


async def create_embedding(
    state: ServerState, request: Request, req: EmbeddingRequest
) -> Response:
    lora = state.check_model(req.model)
    if req.dimensions is not None:
        raise APIError("dimensions is not supported: embeddings have the model's hidden size",
                       400, param="dimensions")
    prompts = await tokenize_prompts(state, split_prompts(req.input, "input"),
                                     req.add_special_tokens, req.truncate_prompt_tokens,
                                     field="input")
    for p in prompts:
        if len(p.token_ids) >= state.max_model_len:
            raise APIError(
                f"This model's maximum context length is {state.max_model_len} tokens. "
                f"However, you requested {len(p.token_ids)} tokens in the input for embedding "
                "generation. Please reduce the length of the input.", 400, param="input",
            )
    request_id = random_id("embd")
    gens = []
    for i, p in enumerate(prompts):
        params = SamplingParams(max_tokens=1)
        state.log_request(f"{request_id}-{i}", p.text, p.token_ids, params)
        gens.append(tracked(
            state.engine.generate(f"{request_id}-{i}", p.as_engine_prompt(), params,
                                  priority=req.priority, pooling=True, lora_request=lora),
            state.new_tracker(),
        ))
    num_tokens = sum(len(p.token_ids) for p in prompts)
    return await respond(
        request, gens,
        build=lambda finals: _response(state, req, finals, num_tokens,
                                       state.response_model(lora, req.model)),
    )


def _response(
    state: ServerState, req: EmbeddingRequest, finals: list[RequestOutput], num_tokens: int,
    model: str,
) -> JSONResponse:  # fmt: skip
    data = []
    for i, out in enumerate(finals):
        if out.embedding is None:
            raise APIError("the engine returned no embedding", 500)
        vec: list[float] | str = out.embedding
        if req.encoding_format == "base64":
            vec = base64.b64encode(np.asarray(out.embedding, dtype="<f4").tobytes()).decode()
        data.append(EmbeddingData(index=i, embedding=vec))
    return JSONResponse(EmbeddingResponse(
        data=data, model=model,
        usage=UsageInfo(prompt_tokens=num_tokens, completion_tokens=None,
                        total_tokens=num_tokens),
    ).model_dump(exclude_none=True))
