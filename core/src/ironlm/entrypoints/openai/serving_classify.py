"""vLLM's /classify on a sequence classifier (and /pooling, whose tasks there are classify and
token_classify, a row per token):
each input's class probabilities from the head over its last token, the label of the highest
(``engine/classification.py``); ``use_activation: false`` (or vLLM's older ``activation`` /
``softmax``) gives the head's logits."""

from __future__ import annotations

import time

import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ironlm.engine.classification import Classifier
from ironlm.entrypoints.openai.classify_protocol import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
)
from ironlm.entrypoints.openai.engine_response import respond
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.protocol import (
    EmbeddingResponse,
    PoolingData,
    PoolingRequest,
    UsageInfo,
)
from ironlm.entrypoints.openai.serving_embeddings import check_fits, pooling_prompts, start_pooling
from ironlm.entrypoints.openai.state import ServerState, data_parallel_rank, request_id_for
from ironlm.outputs import RequestOutput


async def create_classification(
    state: ServerState, request: Request, req: ClassificationRequest | PoolingRequest
) -> Response:
    """/classify; a ``PoolingRequest`` (/pooling) gets the probabilities as its ``data``."""
    lora = state.check_model(req.model)
    state.serves("Classification API", classifies=True)
    classifier = state.classifier
    assert classifier is not None
    pooling_form = isinstance(req, PoolingRequest)
    if isinstance(req, PoolingRequest):
        _check_pooling_fields(req)
    _check_embedding_fields(req)
    _refuse_unsupported(req)
    prompts = await pooling_prompts(state, req)
    check_fits(state, prompts, "input" if req.messages is None else "messages",
               "classification")
    request_id, engine_id = request_id_for("pool" if pooling_form else "classify", request,
                                           req.request_id)
    every_row = isinstance(req, PoolingRequest) and req.task == "token_classify"
    gens = start_pooling(state, engine_id, prompts, req.priority, lora, every_row,
                         data_parallel_rank(state, request))
    tokens = sum(len(p.token_ids) for p in prompts)
    model = state.response_model(lora, req.model)

    def build(finals: list[RequestOutput]) -> Response:
        rows = [_probs(classifier, out, req.applies_activation()) for out in finals]
        usage = UsageInfo(prompt_tokens=tokens, completion_tokens=0, total_tokens=tokens)
        if pooling_form:
            body = EmbeddingResponse(
                id=request_id, created=int(time.time()), model=model, usage=usage,
                data=[PoolingData(index=i, data=row) for i, row in enumerate(rows)],
            )
        else:
            body = ClassificationResponse(  # type: ignore[assignment]
                id=request_id, created=int(time.time()), model=model, usage=usage,
                data=[ClassificationData(index=i, probs=row, num_classes=len(row),
                                         label=classifier.labels[_argmax(row)])
                      for i, row in enumerate(rows)],
            )  # fmt: skip
        return JSONResponse(body.model_dump(exclude_none=True))

    return await respond(request, gens, build=build)


def _check_pooling_fields(req: PoolingRequest) -> None:
    """/pooling on a classifier: the classify and token_classify tasks (400 naming what it
    does not take)."""
    if req.task not in (None, "classify", "token_classify"):
        raise APIError(f"task {req.task!r} is not this model's: a sequence classifier pools "
                       "for 'classify' and 'token_classify'", 400, param="task")


def _check_embedding_fields(req: ClassificationRequest | PoolingRequest) -> None:
    """An embedding's options (400 naming the first one set off its default)."""
    for name, given in (("normalize", req.normalize), ("dimensions", req.dimensions is not None),
                        ("encoding_format", req.encoding_format != "float")):
        if given:
            raise APIError(f"{name} is not supported: it applies to embeddings, not to a "
                           "classifier's probabilities", 400, param=name)


def _refuse_unsupported(req: ClassificationRequest | PoolingRequest) -> None:
    refused = req.unsupported_fields()
    if refused:
        name, why = refused[0]
        raise APIError(f"{name} is not supported: {why}", 400, param=name)


def _probs(classifier: Classifier, out: RequestOutput,
           activate: bool) -> list[float] | list[list[float]]:  # fmt: skip
    if out.embedding is None:
        raise APIError("the engine returned no class logits", 500)
    logits = torch.as_tensor(out.embedding, dtype=torch.float32)  # ([num_tokens,] num_labels)
    return (classifier.activate(logits, "classify") if activate else logits).tolist()


def _argmax(row: list[float]) -> int:
    return max(range(len(row)), key=row.__getitem__)
