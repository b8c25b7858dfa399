"""/score and /rerank on a cross-encoder (a sequence classifier with one label, vLLM's): each
pair is one prompt, the tokenizer's encoding of the two texts together (``text_pair``), and
scores the sigmoid of the head's logit (its raw logit with ``use_activation: false``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from starlette.requests import Request
from starlette.responses import Response

from ironlm.entrypoints.openai.engine_response import respond
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.request_inputs import EnginePrompt, tokenize_prompt
from ironlm.entrypoints.openai.score_protocol import RerankRequest, ScoreRequest
from ironlm.entrypoints.openai.serving_embeddings import check_fits, start_pooling
from ironlm.entrypoints.openai.state import ServerState
from ironlm.lora.request import LoRARequest
from ironlm.outputs import RequestOutput


async def cross_encode(
    state: ServerState, request: Request, req: ScoreRequest | RerankRequest,
    lora: LoRARequest | None, engine_id: str, sides: list[list[str]], names: tuple[str, str],
    pairs: list[tuple[int, int]], build: Callable[[list[float], int], Response],
    operation: str,
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

    def encode(tok: Any) -> list[EnginePrompt]:
        return [tokenize_prompt(tok, list(tok(first[i], text_pair=second[j])["input_ids"]),
                                False, req.truncate_prompt_tokens, state.vocab_size, names[1],
                                state.max_model_len)
                for i, j in pairs]  # fmt: skip

    prompts = await state.tokenizers.run(encode)
    check_fits(state, prompts, names[1], operation)
    gens = start_pooling(state, engine_id, prompts, req.priority, lora)

    def scored(finals: list[RequestOutput]) -> Response:
        scores = []
        for out in finals:
            if not out.embedding:
                raise APIError("the engine returned no class logit", 500)
            logit = torch.tensor(out.embedding[:1], dtype=torch.float32)
            value = logit if req.use_activation is False else classifier.activate(logit)
            scores.append(float(value[0]))
        return build(scores, sum(len(p.token_ids) for p in prompts))

    return await respond(request, gens, build=scored)
