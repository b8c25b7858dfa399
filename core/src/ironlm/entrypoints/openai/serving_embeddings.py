"""POST /v1/embeddings (and vLLM's /pooling): mean-pooled last hidden states (``LLM.embed``),
one per input, or one for a chat (vLLM's ``messages`` form); ``normalize`` scales each to unit
length. ``check_fits`` and ``start_pooling`` serve /score and /rerank too."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ironlm.entrypoints.openai.chat_prompt import render_chat_prompt, warn_chat_fields
from ironlm.entrypoints.openai.engine_response import respond
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingData,
    PoolingRequest,
    UsageInfo,
)
from ironlm.entrypoints.openai.request_inputs import (
    EnginePrompt,
    split_prompts,
    tokenize_prompt,
    tokenize_prompts,
)
from ironlm.entrypoints.openai.request_tracker import tracked
from ironlm.entrypoints.openai.state import ServerState, data_parallel_rank, request_id_for
from ironlm.lora.request import LoRARequest
from ironlm.outputs import RequestOutput
from ironlm.sampling_params import SamplingParams


async def create_embedding(
    state: ServerState, request: Request, req: EmbeddingRequest, pooling_form: bool = False,
) -> Response:
    """/v1/embeddings; with ``pooling_form``, vLLM's /pooling: the same vectors as
    ``{"object": "pooling", "data": [...]}`` items under a ``pool-`` id."""
    lora = state.check_model(req.model)
    state.serves("Pooling API" if pooling_form else "Embeddings API")
    if isinstance(req, PoolingRequest):
        _check_pooling_fields(req)
    if req.dimensions is not None:
        raise APIError("dimensions is not supported: embeddings have the model's hidden size",
                       400, param="dimensions")
    prompts = await pooling_prompts(state, req)
    check_fits(state, prompts, "input" if req.messages is None else "messages")
    request_id, engine_id = request_id_for("pool" if pooling_form else "embd", request,
                                           req.request_id)
    every_row = isinstance(req, PoolingRequest) and req.task == "token_embed"
    gens = start_pooling(state, engine_id, prompts, req.priority, lora, every_row,
                         data_parallel_rank(state, request))
    num_tokens = sum(len(p.token_ids) for p in prompts)
    return await respond(
        request, gens,
        build=lambda finals: _response(req, finals, num_tokens, request_id,
                                       state.response_model(lora, req.model), pooling_form),
    )


async def pooling_prompts(state: ServerState, req: EmbeddingRequest) -> list[EnginePrompt]:
    """The request's prompts: each of ``input``, or ``messages`` through the chat template
    as one prompt (400 unless exactly one of the two is given)."""
    if (req.input is None) == (req.messages is None):
        raise APIError("give exactly one of input and messages", 400, param="input")
    if req.messages is not None:
        state.need_tokenizer("messages")
        assert state.tokenizers is not None
        return [await state.tokenizers.run(_chat_prompt, state, req)]
    warn_chat_fields(req)
    add_special = True if req.add_special_tokens is None else req.add_special_tokens
    return await tokenize_prompts(state, split_prompts(req.input, "input"), add_special,
                                  req.truncate_prompt_tokens, field="input")


def _check_pooling_fields(req: PoolingRequest) -> None:
    """/pooling on an embedding model: the "embed" and "token_embed" tasks; a classifier's
    fields refused (400 naming them)."""
    if req.task not in (None, "embed", "token_embed"):
        why = "needs a sequence classifier" if req.task in ("classify", "score",
                                                            "token_classify") else "is unknown"
        raise APIError(f"task {req.task!r} {why}; this model pools for 'embed' and "
                       "'token_embed'", 400, param="task")
    given = req.activation_given()
    if given is not None:
        raise APIError(f"{given[0]} is not supported: it applies to a classification head; "
                       "this model pools hidden states", 400, param=given[0])
    refused = req.unsupported_fields()
    if refused:
        name, why = refused[0]
        raise APIError(f"{name} is not supported: {why}", 400, param=name)


def check_fits(state: ServerState, prompts: list[EnginePrompt], field: str,
               operation: str = "embedding generation") -> None:
    """400 naming ``field`` when a prompt is longer than the context (vLLM's message, which
    names the ``operation``)."""
    for p in prompts:
        if len(p.token_ids) > state.max_model_len:
            raise APIError(
                f"This model's maximum context length is {state.max_model_len} tokens. "
                f"However, you requested {len(p.token_ids)} tokens in the input for "
                f"{operation}. Please reduce the length of the input.", 400, param=field,
            )


def start_pooling(
    state: ServerState, engine_id: str, prompts: list[EnginePrompt], priority: int,
    lora: LoRARequest | None, every_row: bool = False, dp_rank: int | None = None,
) -> list[AsyncIterator[RequestOutput]]:  # fmt: skip
    """One engine pooling request per prompt (``engine_id-i``): each ends with its embedding
    (``every_row``: a row per prompt token, for the token tasks), on data-parallel engine
    ``dp_rank`` when the request names one."""
    gens = []
    for i, p in enumerate(prompts):
        params = SamplingParams(max_tokens=1)
        state.log_request(f"{engine_id}-{i}", p.text, p.token_ids, params)
        gens.append(tracked(
            state.engine.generate(f"{engine_id}-{i}", p.as_engine_prompt(), params,
                                  priority=priority, pooling=True, lora_request=lora,
                                  pool_every_row=every_row, data_parallel_rank=dp_rank),
            state.new_tracker(),
        ))
    return gens


def _chat_prompt(tokenizer: Any, state: ServerState, req: EmbeddingRequest) -> EnginePrompt:
    assert req.messages is not None
    text = render_chat_prompt(
        tokenizer, req.messages, state.options,
        request_template=req.chat_template, add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        chat_template_kwargs=req.chat_template_kwargs,
    )
    # the template holds the special tokens already (vLLM's default for this form)
    return tokenize_prompt(tokenizer, text, bool(req.add_special_tokens),
                           req.truncate_prompt_tokens, field="messages",
                           max_model_len=state.max_model_len)


def _response(
    req: EmbeddingRequest, finals: list[RequestOutput], num_tokens: int, request_id: str,
    model: str, pooling_form: bool,
) -> JSONResponse:  # fmt: skip
    data = []
    for i, out in enumerate(finals):
        if out.embedding is None:
            raise APIError("the engine returned no embedding", 500)
        values = np.asarray(out.embedding, dtype=np.float32)  # ([num_tokens,] hidden_size)
        if req.normalize:  # each vector (each token's)
            norms = np.linalg.norm(values, axis=-1, keepdims=True)
            values = values / np.maximum(norms, 1e-12)
        vec: list[float] | list[list[float]] | str = values.tolist()
        if req.encoding_format == "base64":
            vec = base64.b64encode(values.astype("<f4").tobytes()).decode()
        data.append(PoolingData(index=i, data=vec) if pooling_form
                    else EmbeddingData(index=i, embedding=vec))
    return JSONResponse(EmbeddingResponse(
        id=request_id, created=int(time.time()), data=data, model=model,
        usage=UsageInfo(prompt_tokens=num_tokens, completion_tokens=0,
                        total_tokens=num_tokens),
    ).model_dump(exclude_none=True))
