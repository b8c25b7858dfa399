"""The offline API's pooling calls, vLLM's names and shapes: ``encode`` (the pooled output as
a tensor), ``embed`` (as a list of floats), ``classify`` (a sequence classifier's class
probabilities) and ``score`` (text pairs, ``scoring``).

An LM's pooled state is the mean of a prompt's last hidden states (after the final norm); a
classifier's is its head over the prompt's last one (``engine/classification.py``). The
engine runs the prompt only (pooling requests generate nothing)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ironlm.engine.input_processor import PromptType, check_truncation
from ironlm.entrypoints.prompt_lists import as_prompt_list, per_prompt_lora
from ironlm.entrypoints.scoring import cosine, cross_encoder_ids, pair_indices, pair_token_ids
from ironlm.lora.request import LoRARequest
from ironlm.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
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

# the pooling tasks of an embedding model (a causal LM's hidden states) and of a sequence
# classifier; the token_ ones give one row per prompt position (vLLM's)
EMBED_TASKS = ("embed", "token_embed")
CLASSIFY_TASKS = ("classify", "score", "token_classify")


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
        """Each prompt's pooled output, ``outputs.data`` a float32 tensor: for "embed" (an
        LM's default) the (hidden_size,) mean-pooled state; for "classify" (a sequence
        classifier's default) and "score" the (num_labels,) class logits through the task's
        activation (``engine/classification.py``; the logits with ``use_activation=False``);
        vLLM's token tasks give a row per prompt token: "token_embed" (num_tokens,
        hidden_size) hidden states, "token_classify" (num_tokens, num_labels) through the
        classify activation (``LLM.reward``).
        ``pooling_params``: one for every prompt, or one per prompt;
        ``truncate_prompt_tokens`` (over theirs) keeps a prompt's last tokens (-1: as many
        as the context holds)."""
        task = self._pooling_task(pooling_task)
        batch = as_prompt_list(prompts)
        loras = per_prompt_lora(lora_request, len(batch))
        params = _per_prompt_params(pooling_params, len(batch))
        for p in params:
            p.check_task(task)
        ids: list[str] = []
        try:
            for prompt, lora, p in zip(batch, loras, params):
                truncate = truncate_prompt_tokens if truncate_prompt_tokens is not None \
                    else p.truncate_prompt_tokens
                run = SamplingParams(max_tokens=1, truncate_prompt_tokens=truncate)
                rid = str(next(self._ids))
                self.engine.add_request(rid, prompt, run, pooling=True, lora_request=lora,
                                        pool_every_row=task.startswith("token_"))
                ids.append(rid)
        except BaseException:
            self.engine.abort_request(ids)
            raise
        results = []
        classifier = self.engine.classifier
        for out, p in zip(self._run(ids, use_tqdm), params):
            vec = torch.as_tensor(out.embedding if out.embedding is not None else [],
                                  dtype=torch.float32)
            if p.normalize:  # each row (each token's, for token_embed)
                vec = torch.nn.functional.normalize(vec, dim=-1)
            if classifier is not None and p.use_activation is not False:
                vec = classifier.activate(vec, "score" if task == "score" else "classify")
            results.append(PoolingRequestOutput(out.request_id, out.prompt_token_ids,
                                                PoolingOutput(vec)))
        return results

    def _pooling_task(self, requested: str | None) -> str:
        """The task a request runs: the model's own when None ("classify" for a sequence
        classifier, "embed" otherwise); ValueError for one the model has no head for."""
        classifier = self.engine.classifier
        task = requested or ("embed" if classifier is None else "classify")
        if task not in EMBED_TASKS + CLASSIFY_TASKS:
            raise ValueError(f"unknown pooling_task {task!r}; choose one of "
                             f"{list(EMBED_TASKS + CLASSIFY_TASKS)}")
        if classifier is None and task not in EMBED_TASKS:
            raise ValueError(f"pooling_task {task!r} needs a sequence classifier (an HF "
                             "*ForSequenceClassification model); this model pools hidden "
                             f"states for {' and '.join(EMBED_TASKS)}")
        if classifier is not None and task in EMBED_TASKS:
            raise ValueError(f"this model ({classifier.architecture}) is a sequence "
                             "classifier: it has no embeddings; use classify, score or "
                             "token_classify")
        return task

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
                             use_tqdm=use_tqdm, lora_request=lora_request, pooling_task="embed")
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
        """vLLM's scores, one ``data_1`` against every ``data_2`` or pairwise (``scoring``):
        an embedding model's are the cosine of each pair's pooled states (bi-encoder); a
        classifier with one label reads each pair as one prompt, the tokenizer's pair
        encoding, and scores the sigmoid of its logit (cross-encoder, ``llm_classify``)."""
        first, second = as_prompt_list(data_1), as_prompt_list(data_2)
        if any(isinstance(p, dict) and "prompt_embeds" in p for p in first + second):
            raise ValueError("score takes text or token prompts, not prompt_embeds (a pair's "
                             "tokens are joined)")
        pairs = pair_indices(len(first), len(second))
        if self.engine.classifier is not None:  # a cross-encoder reads each pair at once
            return self._cross_encode(first, second, pairs, truncate_prompt_tokens, use_tqdm,
                                      pooling_params, lora_request)
        pooled = self.encode(first + second, pooling_params,
                             truncate_prompt_tokens=truncate_prompt_tokens, use_tqdm=use_tqdm,
                             lora_request=lora_request, pooling_task="embed")  # fmt: skip
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


    def classify(
        self,
        prompts: PromptType | Sequence[PromptType],
        *,
        use_tqdm: bool = True,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        truncate_prompt_tokens: int | None = None,
    ) -> list[ClassificationRequestOutput]:
        """A sequence classifier's class probabilities for each prompt (vLLM's):
        ``outputs.probs`` over the model's labels (``id2label`` order; logits with
        ``PoolingParams(use_activation=False)``), from the prompt's last token."""
        pooled = self.encode(prompts, pooling_params, truncate_prompt_tokens=truncate_prompt_tokens,
                             use_tqdm=use_tqdm, lora_request=lora_request,
                             pooling_task="classify")  # fmt: skip
        return [ClassificationRequestOutput(p.request_id, p.prompt_token_ids,
                                            ClassificationOutput(p.outputs.data.tolist()))
                for p in pooled]  # fmt: skip

    def reward(
        self,
        prompts: PromptType | Sequence[PromptType],
        /,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[PoolingRequestOutput]:
        """vLLM's: a sequence classifier's head on every prompt token, ``outputs.data``
        (num_tokens, num_labels) through the classify activation (``encode`` with
        pooling_task "token_classify")."""
        return self.encode(prompts, pooling_params, truncate_prompt_tokens=truncate_prompt_tokens,
                           use_tqdm=use_tqdm, lora_request=lora_request,
                           pooling_task="token_classify")  # fmt: skip

    def _cross_encode(
        self, first: list[PromptType], second: list[PromptType], pairs: list[tuple[int, int]],
        truncate_prompt_tokens: int | None, use_tqdm: bool, pooling_params: PoolingParams | None,
        lora_request: LoRARequest | None,
    ) -> list[ScoringRequestOutput]:  # fmt: skip
        """``score`` on a classifier: each pair as one prompt (the tokenizer's pair encoding,
        vLLM's, ``cross_encoder_ids``), scored by the head's one label through the score
        activation (a sigmoid unless the config names another)."""
        classifier = self.engine.classifier
        assert classifier is not None
        if classifier.num_labels != 1:
            raise ValueError(f"score needs a classifier with one label (a cross-encoder); "
                             f"this one has {classifier.num_labels}: use classify")
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ValueError("score on a cross-encoder tokenizes each pair; the tokenizer "
                             "was not loaded (skip_tokenizer_init)")
        a, b = [_pair_text(p) for p in first], [_pair_text(p) for p in second]
        params = pooling_params or PoolingParams()
        truncate = truncate_prompt_tokens if truncate_prompt_tokens is not None \
            else params.truncate_prompt_tokens
        keep = check_truncation(truncate, self.engine.max_model_len)
        joined: list[PromptType] = [
            {"prompt_token_ids": cross_encoder_ids(tokenizer, a[i], b[j], keep)}
            for i, j in pairs
        ]  # truncated as a pair (the longer text first), not by the joined ids' tail
        pooled = self.encode(joined, replace(params, truncate_prompt_tokens=None),
                             use_tqdm=use_tqdm, lora_request=lora_request, pooling_task="score")
        return [ScoringRequestOutput(p.request_id, p.prompt_token_ids,
                                     ScoringOutput(float(p.outputs.data[0])))
                for p in pooled]  # fmt: skip


def _pair_text(prompt: PromptType) -> str:
    """A cross-encoder's text: the tokenizer encodes each pair together."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str):
        return prompt["prompt"]
    raise ValueError("score on a cross-encoder takes text prompts (each pair is encoded "
                     "together by the tokenizer), not token ids")


def _per_prompt_params(
    params: PoolingParams | Sequence[PoolingParams] | None, n: int
) -> list[PoolingParams]:
    if params is None or isinstance(params, PoolingParams):
        return [params or PoolingParams()] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} pooling params for {n} prompts")
    return list(params)
