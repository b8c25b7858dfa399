"""The offline API: ``LLM(model, ...)`` with generate, chat and beam_search; encode, embed
and score come from ``llm_pooling``."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from ironlm.config import EngineConfig
from ironlm.engine.input_processor import PromptType
from ironlm.engine.llm_engine import LLMEngine
from ironlm.entrypoints.chat_utils import apply_chat_template, reply_part
from ironlm.entrypoints.llm_pooling import PoolingCalls
from ironlm.entrypoints.prompt_lists import as_prompt_list, per_prompt_lora
from ironlm.lora.request import LoRARequest
from ironlm.outputs import RequestOutput
from ironlm.plugin_manager import PluginManager
from ironlm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

_ENGINE_ARGS = {f.name for f in fields(EngineConfig)}


class LLM(PoolingCalls):
    """Generate from a model in this process. Keyword arguments are vLLM's engine arguments
    (see ``EngineConfig``); plugins are selected by name (device, attention_backend,
    quantization, guided_decoding_backend, distributed_executor_backend)."""

    def __init__(self, model: str, *, plugin_manager: PluginManager | None = None, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - _ENGINE_ARGS)
        if unknown:
            raise TypeError(
                f"LLM() got unknown argument(s) {unknown}; engine arguments are: "
                f"{sorted(_ENGINE_ARGS - {'model'})}"
            )
        if kwargs.get("data_parallel_size", 1) != 1:  # vLLM refuses it too
            raise ValueError(
                f"LLM(data_parallel_size={kwargs['data_parallel_size']}): the offline LLM runs "
                "one engine in this process; serve data-parallel engines with `ironlm serve "
                "MODEL -dp N`, or run one LLM process per replica on its share of the prompts"
            )
        config = EngineConfig(model=model, **kwargs)
        torch.manual_seed(config.seed)  # unseeded sampling draws from the global generator
        self.engine = LLMEngine(config, plugin_manager)
        self._ids = itertools.count()

    @property
    def llm_engine(self) -> LLMEngine:
        """The engine, under vLLM's name for it (``llm.llm_engine.get_tokenizer()``)."""
        return self.engine

    def get_tokenizer(self) -> Any:
        """The engine's tokenizer; ValueError with skip_tokenizer_init (vLLM's)."""
        return self.engine.get_tokenizer()

    def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate`` and ``chat`` use when given no SamplingParams: SamplingParams'
        defaults with the generation config's sampling fields (``generation_config``,
        ``override_generation_config``; its max_new_tokens as max_tokens)."""
        return SamplingParams(**self.engine.default_sampling)

    # -- generation ------------------------------------------------------------------------
    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: list[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Run all prompts to completion; outputs come back in input order. ``lora_request``:
        one adapter for every prompt, or one (or None) per prompt."""
        return self._generate(prompts, sampling_params, use_tqdm, priority, lora_request)

    def _generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
        priority: list[int] | None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None,
        reasoning_ended: list[bool | None] | None = None,
    ) -> list[RequestOutput]:
        """``generate``; chat passes, per prompt, whether its reply closed the reasoning
        (LLMEngine.add_request's ``reasoning_ended``)."""
        batch = as_prompt_list(prompts)
        params = _per_prompt(sampling_params or self.get_default_sampling_params(), len(batch))
        loras = per_prompt_lora(lora_request, len(batch))
        if any(p.use_beam_search for p in params):
            return self._generate_beams(batch, params, loras)
        if priority is not None and len(priority) != len(batch):
            raise ValueError(f"The lengths of prompts ({len(batch)}) and priority "
                             f"({len(priority)}) must be the same.")
        params = [_final_only(p) for p in params]
        ids = []
        try:
            for i, (prompt, p) in enumerate(zip(batch, params)):
                rid = str(next(self._ids))
                self.engine.add_request(rid, prompt, p, priority=priority[i] if priority else 0,
                                        lora_request=loras[i],
                                        reasoning_ended=reasoning_ended[i]
                                        if reasoning_ended else None)
                ids.append(rid)
        except BaseException:
            self.engine.abort_request(ids)  # a bad prompt queues none of the batch
            raise
        return self._run(ids, use_tqdm)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        chat_template_content_format: str = "auto",
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, via the chat template.
        ``chat_template_content_format``: message content as text ("string"), as a list of
        parts ("openai"), or "auto" from the template (vLLM's). With a ``reasoning_parser``
        the replies' text is not split (as in vLLM), but a guided reply's grammar waits for
        the end of its reasoning, as on the server."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        tok = self.engine.tokenizer
        if tok is None:
            raise ValueError("chat needs the tokenizer (its chat template), and "
                             "`skip_tokenizer_init` is True")
        parser_cls = self.engine.reasoning_parser

        def render(conv: list[dict[str, Any]], generation: bool, continued: bool) -> str:
            return apply_chat_template(tok, conv, chat_template, generation, continued, tools,
                                       None, chat_template_kwargs, chat_template_content_format)

        prompts: list[PromptType] = []
        ended: list[bool | None] = []
        for conv in conversations:
            text = render(conv, add_generation_prompt, continue_final_message)
            # The template already holds BOS and friends: tokenize without adding them again.
            ids = tok(text, add_special_tokens=False).input_ids
            prompts.append({"prompt": text, "prompt_token_ids": ids})
            reply = reply_part(text, lambda c: render(c, False, False), conv,
                               continue_final_message) if parser_cls is not None else ""
            ended.append(parser_cls(tok, chat_template_kwargs).prompt_ends_reasoning(reply)
                         if parser_cls is not None else None)
        return self._generate(prompts, sampling_params, use_tqdm, None, lora_request, ended)

    def beam_search(
        self, prompts: PromptType | Sequence[PromptType], params: BeamSearchParams,
        lora_request: LoRARequest | None = None,
    ) -> list[Any]:  # fmt: skip
        from ironlm.entrypoints.beam_search import run_beam_search

        return run_beam_search(self, as_prompt_list(prompts), params, lora_request)

    def _generate_beams(
        self, batch: list[PromptType], params: list[SamplingParams],
        loras: list[LoRARequest | None],
    ) -> list[RequestOutput]:  # fmt: skip
        """SamplingParams(use_beam_search=True): beam width best_of, the n best beams."""
        from ironlm.entrypoints.beam_search import completion_text, run_beam_search
        from ironlm.outputs import CompletionOutput

        if not all(p.use_beam_search for p in params):
            raise ValueError("use_beam_search must be the same for every prompt of one call")
        results = []
        for prompt, p, lora in zip(batch, params, loras):
            beam = BeamSearchParams(
                beam_width=p.best_of or p.n, max_tokens=p.max_tokens or 16,
                ignore_eos=p.ignore_eos, length_penalty=p.length_penalty,
            )
            out = run_beam_search(self, [prompt], beam, lora)[0]
            prompt_ids = self.engine.inputs.process(prompt, SamplingParams()).token_ids
            outs = [
                CompletionOutput(
                    index=i, text=completion_text(self.get_tokenizer(), s, len(prompt_ids)),
                    token_ids=s.tokens[len(prompt_ids):],
                    cumulative_logprob=s.cum_logprob, finish_reason=s.finish_reason,
                )
                for i, s in enumerate(out.sequences[: p.n])
            ]
            text = prompt if isinstance(prompt, str) else None
            results.append(RequestOutput(str(next(self._ids)), text, prompt_ids, outs, True))
        return results

    # -- the loop --------------------------------------------------------------------------
    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm or len(request_ids) < 2)
        try:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        except BaseException:
            self.engine.abort_request(request_ids)  # never leave blocks behind
            raise
        finally:
            bar.close()
        return [done[rid] for rid in request_ids if rid in done]

    def abort(self, request_ids: str | list[str]) -> None:
        self.engine.abort_request(request_ids)

    def reset_prefix_cache(self) -> bool:
        """vLLM's: forget the cached prefixes (a cold-cache benchmark, new weights); False
        while requests hold KV blocks."""
        return self.engine.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """vLLM's sleep mode (``enable_sleep_mode=True``): level 1 frees the KV cache and
        offloads the weights (on the cpu platform they stay where they are), level 2 discards
        them (zeros after ``wake_up`` until new ones are loaded, e.g. through
        ``collective_rpc``, or ``collective_rpc("reload_weights")``). No request may run."""
        self.engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back what ``sleep`` freed: tags "weights", "kv_cache" (None: both)."""
        self.engine.wake_up(tags)

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """vLLM's: run ``method`` on every worker, results in rank order. A name is a worker
        method, ``worker_extension_cls``'s included (the worker's class derives from it, as in
        vLLM); a callable is called as ``method(worker, *args, **kwargs)`` (with worker
        processes, ``mp``: a module-level function). A call that fails on every rank raises
        its error and leaves the workers running. New weights go in through
        ``self.model_runner.model.load_weights(weights)`` there, as in vLLM; call
        ``reset_prefix_cache()`` afterwards so no prefix computed with the old weights is
        reused. ``timeout``: None only (the call waits for every worker)."""
        if timeout is not None:
            raise ValueError("collective_rpc: timeout is not supported (the call waits for "
                             "every worker); pass timeout=None")
        return self.engine.executor.collective_rpc(method, *args, **(kwargs or {}))

    def apply_model(self, func: Callable[[torch.nn.Module], Any]) -> list[Any]:
        """vLLM's: ``func(model)`` on every worker's model (its shard), results in rank
        order."""
        return self.collective_rpc("apply_model", args=(func,))

    def shutdown(self) -> None:
        self.engine.shutdown()


def _final_only(params: SamplingParams) -> SamplingParams:
    """A copy of ``params`` asking for the final output only: generate() returns nothing
    else, so the engine builds no output on the other steps (vLLM's LLM does the same)."""
    if params.output_kind == RequestOutputKind.FINAL_ONLY:
        return params
    final = copy.copy(params)
    final.output_kind = RequestOutputKind.FINAL_ONLY
    return final


def _per_prompt(
    params: SamplingParams | Sequence[SamplingParams], n: int
) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"got {len(params)} sampling params for {n} prompts")
    return list(params)
