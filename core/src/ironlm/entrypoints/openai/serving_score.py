"""vLLM's /score and /rerank. On an embedding model (bi-encoder): each text embedded on its
own (as /v1/embeddings embeds it), a pair scored by the cosine of its two embeddings
(``entrypoints/scoring.py``). On a one-label sequence classifier (cross-encoder,
``score_pairs.py``): each pair read as one prompt, the sigmoid of the head's logit.
/rerank is Jina's and Cohere's form: one query, documents ordered by relevance, the best
``top_n``."""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ironlm.entrypoints.openai.engine_response import respond
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.protocol import UsageInfo
from ironlm.entrypoints.openai.request_inputs import tokenize_prompts
from ironlm.entrypoints.openai.score_pairs import cross_encode as _cross_encode
from ironlm.entrypoints.openai.score_protocol import (
    BI_ENCODER_REFUSAL,
    SCORE_SIDES,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from ironlm.entrypoints.openai.serving_embeddings import check_fits, start_pooling
from ironlm.entrypoints.openai.state import ServerState, data_parallel_rank, request_id_for
from ironlm.entrypoints.scoring import cosine, pair_indices, pair_token_ids
from ironlm.lora.request import LoRARequest
from ironlm.outputs import RequestOutput

# (each pair's score in the pairs' order, the tokens usage counts) -> the endpoint's reply
BuildScores = Callable[[list[float], int], Response]


async def create_score(state: ServerState, request: Request, req: ScoreRequest) -> Response:
    lora = state.check_model(req.model)
    names = _score_sides(req)
    request_id, engine_id = request_id_for("score", request, req.request_id)
    model = state.response_model(lora, req.model)

    def build(scores: list[float], tokens: int) -> Response:
        return JSONResponse(ScoreResponse(
            id=request_id, created=int(time.time()), model=model,
            data=[ScoreData(index=i, score=s) for i, s in enumerate(scores)],
            usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens),
        ).model_dump(exclude_none=True))

    sides = [_texts(getattr(req, name)) for name in names]
    return await _score_pairs(state, request, req, lora, engine_id, sides, names, build,
                              operation="score")


async def create_rerank(state: ServerState, request: Request, req: RerankRequest) -> Response:
    lora = state.check_model(req.model)
    request_id, engine_id = request_id_for("rerank", request, req.request_id)
    model = state.response_model(lora, req.model)

    def build(scores: list[float], tokens: int) -> Response:
        results = [
            RerankResult(index=i, document=RerankDocument(text=req.documents[i]),
                         relevance_score=s)
            for i, s in enumerate(scores)
        ]  # fmt: skip
        results.sort(key=lambda r: r.relevance_score, reverse=True)  # stable: ties keep order
        top = req.top_n if 0 < req.top_n < len(results) else len(results)  # <= 0: all
        return JSONResponse(RerankResponse(
            id=request_id, model=model, results=results[:top],
            usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens),
        ).model_dump(exclude_none=True))

    return await _score_pairs(state, request, req, lora, engine_id,
                              [[req.query], req.documents], ("query", "documents"), build)


def _score_sides(req: ScoreRequest) -> tuple[str, str]:
    """The one pair of fields (``SCORE_SIDES``) a score request gives; 400 naming the field
    missing from a half-given pair, or the one given beside a whole pair."""
    names = dict.fromkeys(n for pair in SCORE_SIDES for n in pair)
    present = [n for n in names if getattr(req, n) is not None]
    whole = [pair for pair in SCORE_SIDES if set(pair) <= set(present)]
    if len(whole) == 1 and len(present) == 2:
        return whole[0]
    if whole:
        extra = next(n for n in present if n not in whole[0])
        raise APIError(f"{extra} given with {whole[0][0]} and {whole[0][1]}", 400, param=extra)
    half = next((pair for pair in SCORE_SIDES if set(pair) & set(present)), SCORE_SIDES[0])
    missing = half[1] if half[0] in present else half[0]
    spelled = ", ".join(f"{a} and {b}" for a, b in SCORE_SIDES)
    raise APIError(f"{missing} is required: give the texts to score as one of {spelled}", 400,
                   param=missing)


def _texts(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


async def _score_pairs(
    state: ServerState, request: Request, req: ScoreRequest | RerankRequest,
    lora: LoRARequest | None,
    engine_id: str, sides: list[list[str]], names: tuple[str, str], build: BuildScores,
    operation: str = "embedding generation",
) -> Response:  # fmt: skip
    """Embed both sides' texts, then ``build`` from each pair's cosine and the usage's token
    count (each pair's tokens, as vLLM counts them); on a classifier, ``_cross_encode``."""
    refused = req.unsupported_fields()
    if refused:
        name, why = refused[0]
        raise APIError(f"{name} is not supported: {why}", 400, param=name)
    first, second = sides
    try:
        pairs = pair_indices(len(first), len(second))
    except ValueError as exc:
        raise APIError(str(exc), 400, param=names[1] if first and not second else names[0]) \
            from None
    if state.classifier is not None:
        return await _cross_encode(state, request, req, lora, engine_id, sides, names, pairs,
                                   build)
    given = req.activation_given()
    if given is not None:
        raise APIError(f"{given[0]} is not supported: it {BI_ENCODER_REFUSAL}", 400,
                       param=given[0])
    prompts = []
    for texts, name in zip(sides, names):
        part = await tokenize_prompts(state, list(texts), True, req.truncate_prompt_tokens,
                                      field=name)
        check_fits(state, part, name, operation)  # vLLM names the score's operation
        prompts += part
    gens = start_pooling(state, engine_id, prompts, req.priority, lora,
                         dp_rank=data_parallel_rank(state, request))
    pad = getattr(state.tokenizer, "pad_token_id", None)

    def scored(finals: list[RequestOutput]) -> Response:
        a, b = finals[: len(first)], finals[len(first) :]
        for out in finals:
            if out.embedding is None:
                raise APIError("the engine returned no embedding", 500)
        scores = [cosine(a[i].embedding or [], b[j].embedding or []) for i, j in pairs]
        tokens = sum(len(pair_token_ids(a[i].prompt_token_ids, b[j].prompt_token_ids, pad))
                     for i, j in pairs)  # fmt: skip
        return build(scores, tokens)

    return await respond(request, gens, build=scored)
