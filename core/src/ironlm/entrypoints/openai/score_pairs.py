"""/score and /rerank on a cross-encoder (a sequence classifier with one label, vLLM's): each
pair is one prompt, the tokenizer's encoding of the two texts together (``text_pair``; a
``truncate_prompt_tokens`` cuts the pair as the tokenizer does, the longer text first), and
scores the head's logit through the score activation (a sigmoid unless the config names
another; the raw logit with ``use_activation: false``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from starlette.requests import Request
from starlette.responses import Response

from ironlm.engine.input_processor import check_truncation
from ironlm.entrypoints.openai.engine_response import respond
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.request_inputs import EnginePrompt, tokenize_prompt
from ironlm.entrypoints.openai.score_protocol import RerankRequest, ScoreRequest
from ironlm.entrypoints.openai.serving_embeddings import check_fits, start_pooling
from ironlm.entrypoints.openai.state import ServerState, data_parallel_rank
from ironlm.entrypoints.scoring import cross_encoder_ids
from ironlm.lora.request import LoRARequest
from ironlm.outputs import RequestOutput


async def cross_encode(
    state: ServerState, request: Request, req: ScoreRequest | RerankRequest,
    lora: LoRARequest | None, engine_id: str, sides: list[list[str]], names: tuple[str, str],
    pairs: list[tuple[int, int]], build: Callable[[list[float], int], Response],
) -> Response:  # fmt: skip
    """``build`` from each pair's score and the pairs' tokens (what the model read)."""
    classifier = state.classifier
    assert classifier is not None
    if classifier.num_labels != 1:
        raise APIError(f"The model does not support Score API: scores need a classifier with "
                       f"one label (a cross-encoder); this one has {classifier.num_labels}, "
                       "use /classify", 400)
    state.need_tokenizer(names[0])
    assert state.tokenizers is not None
    first, second = sides

    try:
        keep = check_truncation(req.truncate_prompt_tokens, state.max_model_len)
    except ValueError as exc:
        raise APIError(str(exc), 400, param="truncate_prompt_tokens") from None

    def encode(tok: Any) -> list[EnginePrompt]:  # a pair cut as a pair: both texts stay
        return [tokenize_prompt(tok, cross_encoder_ids(tok, first[i], second[j], keep), False,
                                None, state.vocab_size, names[1])
                for i, j in pairs]  # fmt: skip

    try:
        prompts = await state.tokenizers.run(encode)
    except ValueError as exc:  # the truncation cannot hold the pair's special tokens
        raise APIError(str(exc), 400, param="truncate_prompt_tokens") from None
    check_fits(state, prompts, names[1], "score")
    gens = start_pooling(state, engine_id, prompts, req.priority, lora,
                         dp_rank=data_parallel_rank(state, request))

    def scored(finals: list[RequestOutput]) -> Response:
        scores = []
        for out in finals:
            if not out.embedding:
                raise APIError("the engine returned no class logit", 500)
            logit = torch.tensor(out.embedding[:1], dtype=torch.float32)
            value = classifier.activate(logit, "score") if req.applies_activation() else logit
            scores.append(float(value[0]))
        return build(scores, sum(len(p.token_ids) for p in prompts))

    return await respond(request, gens, build=scored)
