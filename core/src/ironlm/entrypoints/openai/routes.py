"""The server's routes: each OpenAI / vLLM endpoint parses its body and hands it to its
``serving_*`` module. ``router`` and ``metrics_router`` hold the routes every server has
(``ironlm run-batch --enable-metrics`` serves the second alone); ``lora_router`` and
``tokenizer_info_router`` the opt-in ones (``api_server.build_app`` mounts them)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

from ironlm import __version__
from ironlm.entrypoints.openai import (
    serving_chat,
    serving_classify,
    serving_completions,
    serving_embeddings,
    serving_generate,
    serving_models,
    serving_responses,
    serving_score,
    serving_tokenize,
)
from ironlm.entrypoints.openai.classify_protocol import ClassificationRequest
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.metrics import fresh_stats
from ironlm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    LoadLoRAAdapterRequest,
    PoolingRequest,
    TokenizeRequest,
    UnloadLoRAAdapterRequest,
)
from ironlm.entrypoints.openai.request_body import parse_body, validated
from ironlm.entrypoints.openai.responses_api import ResponsesRequest
from ironlm.entrypoints.openai.score_protocol import RerankRequest, ScoreRequest
from ironlm.entrypoints.openai.state import ServerState

router = APIRouter()
# GET /metrics (Prometheus)
metrics_router = APIRouter()
# POST /v1/load_lora_adapter and /v1/unload_lora_adapter: only with VLLM_ALLOW_RUNTIME_LORA_UPDATING
lora_router = APIRouter()
# GET /tokenizer_info, only with --enable-tokenizer-info-endpoint (vLLM's opt-in)
tokenizer_info_router = APIRouter()


def _server(request: Request) -> ServerState:
    return request.app.state.server


# -- routes --------------------------------------------------------------------------------
@router.get("/health")
@router.get("/ping")  # vLLM's SageMaker-style liveness route, GET and POST, as /health
@router.post("/ping")
async def health(request: Request) -> Response:
    if not _server(request).engine.is_alive:
        raise APIError("the engine loop is not running", 503)
    return Response(status_code=200)


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": __version__}


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": serving_models.model_cards(_server(request))}


@router.get("/v1/models/{model_id:path}")
async def model(request: Request, model_id: str) -> dict[str, Any]:
    card = next((c for c in serving_models.model_cards(_server(request)) if c["id"] == model_id),
                None)
    if card is None:
        raise APIError(f"The model `{model_id}` does not exist.", 404, param="model",
                       code="model_not_found")
    return card


@lora_router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request) -> Response:
    req = await parse_body(request, LoadLoRAAdapterRequest)
    text = await serving_models.load_lora_adapter(_server(request), req)
    return Response(text, status_code=200)


@lora_router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> Response:
    req = await parse_body(request, UnloadLoRAAdapterRequest)
    text = await serving_models.unload_lora_adapter(_server(request), req)
    return Response(text, status_code=200)


@router.get("/v1/plugins")
async def plugins(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": _server(request).plugin_manager.describe()}


@metrics_router.get("/metrics")
async def metrics(request: Request) -> Response:
    s = _server(request)
    s.metrics.set_engine_stats(await fresh_stats(s.engine))
    return Response(s.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    req = await parse_body(request, CompletionRequest)
    return await serving_completions.create_completion(_server(request), request, req)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    req = await parse_body(request, ChatCompletionRequest)
    return await serving_chat.create_chat_completion(_server(request), request, req)


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    req = await parse_body(request, EmbeddingRequest)
    return await serving_embeddings.create_embedding(_server(request), request, req)


@router.post("/pooling")
async def pooling(request: Request) -> Response:
    req = await parse_body(request, PoolingRequest)
    state = _server(request)
    if state.classifier is not None:  # the classifier's task: /classify's results
        return await serving_classify.create_classification(state, request, req)
    return await serving_embeddings.create_embedding(state, request, req, pooling_form=True)


@router.post("/classify")
async def classify(request: Request) -> Response:
    req = await parse_body(request, ClassificationRequest)
    return await serving_classify.create_classification(_server(request), request, req)


@router.post("/score")
@router.post("/v1/score")
async def score(request: Request) -> Response:
    req = await parse_body(request, ScoreRequest)
    return await serving_score.create_score(_server(request), request, req)


@router.post("/rerank")
@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def rerank(request: Request) -> Response:
    req = await parse_body(request, RerankRequest)
    return await serving_score.create_rerank(_server(request), request, req)


@router.post("/v1/responses")
async def responses(request: Request) -> Response:
    req = await parse_body(request, ResponsesRequest)
    return await serving_responses.create_response(_server(request), request, req)


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> dict[str, Any]:
    return serving_responses.retrieve_response(_server(request), response_id)


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> dict[str, Any]:
    return serving_responses.delete_response(_server(request), response_id)


@router.get("/load")
async def load(request: Request) -> dict[str, int]:
    """vLLM's: the generation requests in flight (--enable-server-load-tracking; else 0)."""
    counter = request.app.state.server_load
    return {"server_load": counter.value if counter is not None else 0}


# SageMaker's one route: the body's key picks the endpoint (vLLM's order of request types)
_INVOCATION_TYPES: list[tuple[str, type[BaseModel], Callable[..., Awaitable[Response]]]] = [
    ("messages", ChatCompletionRequest, serving_chat.create_chat_completion),
    ("prompt", CompletionRequest, serving_completions.create_completion),
    ("input", EmbeddingRequest, serving_embeddings.create_embedding),
    *((side, ScoreRequest, serving_score.create_score) for side in ("text_1", "data_1", "queries")),
    ("query", RerankRequest, serving_score.create_rerank),
]


@router.post("/invocations")
async def invocations(request: Request) -> Response:
    """A chat body (``messages``), a completion (``prompt``), an embedding (``input``), a
    score (``text_1``, ``data_1`` or ``queries``) or a rerank (``query``), validated as that
    request (a bad field is a 400 naming it); to a classifier, ``input`` or ``messages`` is a
    classification."""
    body = await parse_body(request, None)
    state = _server(request)
    if state.classifier is not None and isinstance(body, dict) and (
        "input" in body or "messages" in body
    ):  # the model's task: either form of /classify
        return await serving_classify.create_classification(
            state, request, validated(body, ClassificationRequest))
    for key, request_type, endpoint in _INVOCATION_TYPES:
        if isinstance(body, dict) and key in body:
            return await endpoint(state, request, validated(body, request_type))
    names = ", ".join(dict.fromkeys(t.__name__ for _, t, _ in _INVOCATION_TYPES))
    raise APIError(f"Cannot find suitable handler for request. Expected one of: {names}", 400)


@router.post("/tokenize")
async def tokenize(request: Request) -> JSONResponse:
    req = await parse_body(request, TokenizeRequest)
    return JSONResponse(await serving_tokenize.tokenize(_server(request), req))


@router.post("/detokenize")
async def detokenize(request: Request) -> JSONResponse:
    req = await parse_body(request, DetokenizeRequest)
    return JSONResponse(await serving_tokenize.detokenize(_server(request), req))


@tokenizer_info_router.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> JSONResponse:
    return JSONResponse(serving_tokenize.tokenizer_info(_server(request)))


@router.post("/generate")
async def generate(request: Request) -> Response:
    body = await parse_body(request, None)
    return await serving_generate.generate(_server(request), request, body)
