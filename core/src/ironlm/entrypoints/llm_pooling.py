"""The offline API's pooling calls, vLLM's names and shapes: ``encode`` (the pooled state as
a tensor), ``embed`` (as a list of floats) and ``score`` (text pairs, ``scoring``).

A prompt's pooled state is the mean of its last hidden states (after the final norm); the
engine runs the prompt only (pooling requests generate nothing)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ironlm.engine.input_processor import PromptType
from ironlm.entrypoints.prompt_lists import as_prompt_list, per_prompt_lora
from ironlm.entrypoints.scoring import cosine, pair_indices, pair_token_ids
from ironlm.lora.request import LoRARequest
from ironlm.outputs import (
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from ironlm.pooling_params import PoolingParams
from ironlm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from ironlm.engine.llm_engine import LLMEngine
    from ironlm.outputs import RequestOutput

# vLLM's pooling tasks that need a head this engine's models do not have
_HEADLESS_TASKS = ("classify", "score", "token_classify", "token_embed", "encode")


class PoolingCalls:
    """Mixed into ``LLM``: it supplies the engine, the request ids and the run loop."""

    engine: LLMEngine
    _ids: itertools.count[int]

    if TYPE_CHECKING:
        def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]: ...

    def encode(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        pooling_task: str | None = None,
    ) -> list[PoolingRequestOutput]:
        """Each prompt's pooled state, ``outputs.data`` a (hidden_size,) float32 tensor.
        ``pooling_params``: one for every prompt, or one per prompt; ``truncate_prompt_tokens``
        (over theirs) keeps a prompt's last tokens (-1: as many as the context holds);
        ``pooling_task`` "embed" (or None) only."""
        if pooling_task in _HEADLESS_TASKS:
            raise ValueError(f"pooling_task {pooling_task!r} needs a classification or "
                             "per-token head; this engine pools for 'embed' only")
        if pooling_task not in (None, "embed"):
            raise ValueError(f"unknown pooling_task {pooling_task!r}")
        batch = as_prompt_list(prompts)
        loras = per_prompt_lora(lora_request, len(batch))
        params = _per_prompt_params(pooling_params, len(batch))
        ids: list[str] = []
        try:
            for prompt, lora, p in zip(batch, loras, params):
                truncate = truncate_prompt_tokens if truncate_prompt_tokens is not None \
                    else p.truncate_prompt_tokens
                run = SamplingParams(max_tokens=1, truncate_prompt_tokens=truncate)
                rid = str(next(self._ids))
                self.engine.add_request(rid, prompt, run, pooling=True, lora_request=lora)
                ids.append(rid)
        except BaseException:
            self.engine.abort_request(ids)
            raise
        results = []
        for out, p in zip(self._run(ids, use_tqdm), params):
            vec = torch.tensor(out.embedding or [], dtype=torch.float32)
            if p.normalize:
                vec = torch.nn.functional.normalize(vec, dim=0)
            results.append(PoolingRequestOutput(out.request_id, out.prompt_token_ids,
                                                PoolingOutput(vec)))
        return results

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """Each prompt's embedding, ``outputs.embedding`` a list of floats (``encode``)."""
        pooled = self.encode(prompts, pooling_params, truncate_prompt_tokens=truncate_prompt_tokens,
                             use_tqdm=use_tqdm, lora_request=lora_request)
        return [EmbeddingRequestOutput(p.request_id, p.prompt_token_ids,
                                       EmbeddingOutput(p.outputs.data.tolist()))
                for p in pooled]  # fmt: skip

    def score(
        self,
        data_1: PromptType | Sequence[PromptType],
        data_2: PromptType | Sequence[PromptType],
        /,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        pooling_params: PoolingParams | None = None,
        lora_request: LoRARequest | None = None,
    ) -> list[ScoringRequestOutput]:
        """vLLM's bi-encoder scores: the cosine of each pair's pooled states, one ``data_1``
        against every ``data_2`` or pairwise (``scoring``)."""
        first, second = as_prompt_list(data_1), as_prompt_list(data_2)
        if any(isinstance(p, dict) and "prompt_embeds" in p for p in first + second):
            raise ValueError("score takes text or token prompts, not prompt_embeds (a pair's "
                             "tokens are joined)")
        pairs = pair_indices(len(first), len(second))
        pooled = self.encode(first + second, pooling_params,
                             truncate_prompt_tokens=truncate_prompt_tokens, use_tqdm=use_tqdm,
                             lora_request=lora_request)  # fmt: skip
        a, b = pooled[: len(first)], pooled[len(first) :]
        pad = getattr(self.engine.tokenizer, "pad_token_id", None)
        return [
            ScoringRequestOutput(
                f"{a[i].request_id}_{b[j].request_id}",
                pair_token_ids(a[i].prompt_token_ids, b[j].prompt_token_ids, pad),
                ScoringOutput(cosine(a[i].outputs.data, b[j].outputs.data)),
            )
            for i, j in pairs
        ]


def _per_prompt_params(
    params: PoolingParams | Sequence[PoolingParams] | None, n: int
) -> list[PoolingParams]:
    if params is None or isinstance(params, PoolingParams):
        return [params or PoolingParams()] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} pooling params for {n} prompts")
    return list(params)
