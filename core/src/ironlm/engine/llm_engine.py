"""LLMEngine: add requests, step, get outputs. Synchronous; the server drives it from a thread.

    step():  plan = scheduler.schedule()
             output = executor.execute_model(inputs_for(plan))
             scheduler.on_step_done(plan, output)
             return outputs.update(plan, output)
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from ironlm.config import EngineConfig
from ironlm.distributed.layout import check_model_fits
from ironlm.engine.adapter_cache import AdapterCache
from ironlm.engine.block_hash import block_hasher
from ironlm.engine.block_manager import BlockManager
from ironlm.engine.classification import classifier_of
from ironlm.engine.context_length import max_model_len, model_limit
from ironlm.engine.guided_manager import GuidedManager
from ironlm.engine.input_processor import InputProcessor, PromptType
from ironlm.engine.iteration_tokens import IterationTokens
from ironlm.engine.kv_transfer import kv_transfer_of
from ironlm.engine.logits_processors import load_logits_processors, validate_request
from ironlm.engine.lora_calls import LoRACalls
from ironlm.engine.model_input import model_input, recomputed
from ironlm.engine.output_processor import OutputProcessor
from ironlm.engine.prompt_embeds import check_embeds_support
from ironlm.engine.reasoning_gate import MarkerTokens, gate_grammars
from ironlm.engine.request import Request, RequestStatus
from ironlm.engine.sampling_defaults import default_sampling
from ironlm.engine.scheduler import Scheduler, SchedulerOutput
from ironlm.engine.sleep_calls import SleepCalls
from ironlm.engine.startup_checks import check_budget, eos_token_id, speculation_policy
from ironlm.engine.tokenizer_extension import extend_tokenizer
from ironlm.interfaces.executor import Executor
from ironlm.interfaces.reasoning_parser import ReasoningParser
from ironlm.interfaces.step import ModelInput, ModelOutput, NewRequestData
from ironlm.lora.request import LoRARequest
from ironlm.model_loader import HubOptions, resolve_model
from ironlm.outputs import RequestOutput
from ironlm.plugin_manager import PluginManager
from ironlm.sampling_params import SamplingParams
from ironlm.worker.worker import Worker

log = logging.getLogger("ironlm.engine")


class LLMEngine(LoRACalls, SleepCalls):
    def __init__(
        self, config: EngineConfig, pm: PluginManager | None = None, serving: bool = False
    ) -> None:
        """``serving``: the engine serves the OpenAI API (the platform's scheduler defaults
        for a server; otherwise those for the offline ``LLM``, vLLM's usage contexts)."""
        self.pm = pm or PluginManager()
        self.pm.check_compatible()
        # the reasoning parser of chat responses; its end marker opens the grammars of guided
        # chat requests (reasoning_gate.py)
        self.reasoning_parser: type[ReasoningParser] | None = (
            self.pm.select_reasoning_parser(config.reasoning_parser)
            if config.reasoning_parser else None
        )
        # the front end's view of the platform the workers will select (same name, same host)
        platform = self.pm.select_platform(config.device)
        config = config.with_block_size(platform.default_block_size)
        fit_to_cache = config.max_model_len == -1  # vLLM's "auto": capped by the KV cache
        if fit_to_cache:
            config = replace(config, max_model_len=None)
        hub = HubOptions.of(config)
        source = resolve_model(config.model, config.trust_remote_code, config.hf_overrides, hub)
        # vLLM's: the tokenizer's revision defaults to the model's
        config = replace(config, tokenizer_revision=config.tokenizer_revision or config.revision)
        self.tokenizer: Any = None  # None with skip_tokenizer_init
        if not config.skip_tokenizer_init:
            self.tokenizer = source.load_tokenizer(
                config.tokenizer, replace(hub, revision=config.tokenizer_revision))
        if source.revision is not None:  # a Hub model: the workers load the same commit
            config = replace(config, revision=source.revision)
        if config.tokenizer_extension_path is not None:
            self.tokenizer = extend_tokenizer(self.tokenizer, config.tokenizer_extension_path)
        self.max_model_len = max_model_len(config, *model_limit(config, source))
        config = config.with_scheduler_limits(
            *platform.scheduler_defaults(serving, config.world_size), self.max_model_len
        )
        self.config = config
        budget = config.max_num_batched_tokens
        # a budget too small is refused before any worker starts; with max_model_len auto,
        # once the KV cache has set the length (the default budget follows the model's)
        if not fit_to_cache:
            check_budget(config, self.max_model_len)
        self.vocab_size = int(source.hf_config.vocab_size)
        # generation_config may name more end-of-sequence ids than the tokenizer (Gemma's
        # <end_of_turn>): they stop generation like stop_token_ids, as in vLLM.
        gen = source.load_generation_config()
        gen_eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        gen_eos = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        self.eos_token_id = eos_token_id(self.tokenizer, source, gen_eos)
        self.extra_eos_ids = [t for t in gen_eos if t != self.eos_token_id]
        # SamplingParams fields the generation config sets (vLLM's --generation-config): the
        # offline API's default params, the server's values for unset request fields
        self.default_sampling = default_sampling(config.generation_config, gen,
                                                 config.override_generation_config)
        # a model that cannot be split this way fails here, before any worker starts
        check_model_fits(source.hf_config, config.tensor_parallel_size,
                         config.pipeline_parallel_size)
        if config.kv_cache_dtype != "auto":  # refused here, naming it, not late in a worker
            self.pm.check_kv_cache_dtype(config.kv_cache_dtype, config.attention_backend,
                                         platform)
        self.spec = speculation_policy(self.pm, config, self.max_model_len, self.tokenizer,
                                       self.vocab_size)
        model_cls = self.pm.select_model(source.architectures)
        # a sequence classifier pools every request (None: a generative model)
        self.classifier = classifier_of(model_cls, source.architectures, source.hf_config,
                                        self.spec is not None)
        if config.enable_prompt_embeds:  # refused here, before any worker loads
            check_embeds_support(model_cls, self.spec)
        if config.logits_processors:  # classes from here on (the workers build them)
            self.config = config = replace(config, logits_processors=load_logits_processors(
                self.pm, config.logits_processors, self.spec))
        block_hash = block_hasher(config.prefix_caching_hash_algo) \
            if config.enable_prefix_caching else None  # its package is here: refused now
        executor_cls = self.pm.select_executor(config.distributed_executor_backend or "uni")
        self.executor: Executor = executor_cls(config, self.pm, Worker)
        self.executor.start()
        num_kv_blocks = self.executor.determine_num_kv_blocks()
        if fit_to_cache:
            try:
                self._fit_to_cache(config, num_kv_blocks * config.block_size)
            except ValueError:
                self.executor.shutdown()
                raise
        if num_kv_blocks * config.block_size < self.max_model_len:
            self.executor.shutdown()
            raise ValueError(
                f"The model's max seq len ({self.max_model_len}) is larger than the maximum "
                f"number of tokens that can be stored in KV cache "
                f"({num_kv_blocks * config.block_size}). Raise kv_cache_memory or lower "
                "max_model_len."
            )
        self.executor.initialize_kv_cache(num_kv_blocks)
        num_swap_blocks = self._init_swap_space()
        self.block_manager = BlockManager(
            num_kv_blocks, config.block_size, config.enable_prefix_caching, num_swap_blocks,
            run=max(1, platform.kv_run_tokens // config.block_size), hasher=block_hash,
        )
        self.kv_transfer = kv_transfer_of(config, self.pm, self.executor)
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, budget, config.enable_chunked_prefill,
            use_priority=config.scheduling_policy == "priority", spec=self.spec,
            num_scheduler_steps=config.num_scheduler_steps, max_model_len=self.max_model_len,
            max_loras=config.max_loras if config.enable_lora else 0,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            kv_transfer=self.kv_transfer,
        )
        self.adapters = AdapterCache(self.executor, int(config.max_cpu_loras or 1)) \
            if config.enable_lora else None
        self.sleeping_tags: set[str] = set()  # sleep mode (sleep_calls.py)
        self.inputs = InputProcessor(
            self.tokenizer, self.vocab_size, self.max_model_len, config.max_logprobs,
            int(source.hf_config.hidden_size) if config.enable_prompt_embeds else None,
        )
        self.guided = GuidedManager(
            self.pm, self.tokenizer, self.vocab_size, config.guided_decoding_backend,
            self.max_model_len,
        )
        self.outputs = OutputProcessor(self.tokenizer, self.max_model_len, config.stream_interval)
        self.iteration_tokens = IterationTokens()  # vllm:iteration_tokens_total
        self.reasoning_markers = MarkerTokens(self.tokenizer, self.reasoning_parser.end_marker) \
            if self.reasoning_parser is not None \
            and not config.structured_outputs_enable_in_reasoning else None
        self._new: list[NewRequestData] = []

    def _fit_to_cache(self, config: EngineConfig, cache_tokens: int) -> None:
        """max_model_len auto: the model's length, or what the KV cache holds when that is
        less; the checks and the speculation policy that read the length, redone with it."""
        if cache_tokens < self.max_model_len:
            log.info("max_model_len auto: %d tokens, the most the KV cache holds (the model "
                     "takes %d)", cache_tokens, self.max_model_len)
            self.max_model_len = cache_tokens
            if self.spec is not None:
                self.spec = speculation_policy(self.pm, config, self.max_model_len,
                                               self.tokenizer, self.vocab_size)
        check_budget(config, self.max_model_len)

    # -- requests --------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        priority: int = 0,
        add_special_tokens: bool = True,
        pooling: bool = False,
        lora_request: LoRARequest | None = None,
        reasoning_ended: bool | None = None,
        pool_every_row: bool = False,
    ) -> None:
        """Validate and queue a request (ValueError naming the field when invalid). With n or
        best_of > 1 it fans out into child sequences that share the prompt's cached blocks.
        ``pooling``: return the pooled prompt instead of generating (``pool_every_row``:
        every prompt row, for vLLM's token tasks).
        ``lora_request``: the adapter to run with (checked on first use).
        ``reasoning_ended``: from a chat front end with a reasoning parser, whether the
        prompt closed the reasoning; False holds a guided request's grammar back until the
        model closes it (reasoning_gate.py); None constrains from the first token."""
        self._check_awake()
        if priority != 0 and not self.scheduler.use_priority:
            raise ValueError(
                f"Got priority {priority} but priority scheduling is not enabled "
                "(scheduling_policy='priority')"
            )
        if request_id in self.outputs.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        if lora_request is not None:
            self._check_adapter(lora_request)
        if self.classifier is not None and not pooling:
            raise self.classifier.refuse_generation()
        params = params.clone()
        if not pooling:
            validate_request(self.config.logits_processors or [], params)
        processed = self.inputs.process(prompt, params, add_special_tokens, pooling)
        if not params.ignore_eos:
            params.stop_token_ids = list(params.stop_token_ids or []) + [
                t for t in self.extra_eos_ids if t not in (params.stop_token_ids or [])
            ]
        spec = params.guided_decoding
        grammars = [
            self.guided.grammar(spec, params.guided_decoding_backend) if spec else (None, None)
            for _ in range(params.best_of or 1)
        ]
        if spec:
            grammars = gate_grammars(grammars, self.reasoning_markers, reasoning_ended)
        children = []
        for i in range(params.best_of or 1):
            child_params = params
            if i > 0 and params.seed is not None:
                child_params = params.clone()
                child_params.seed = params.seed + i
            child = Request(
                request_id=f"{request_id}#{i}" if (params.best_of or 1) > 1 else request_id,
                prompt_token_ids=processed.token_ids,
                sampling_params=child_params,
                eos_token_id=self.eos_token_id,
                priority=priority,
                grammar=grammars[i][0],
                grammar_backend=grammars[i][1],
                pooling=pooling,
                pools_last_row=pooling and self.classifier is not None and not pool_every_row,
                pools_every_row=pooling and pool_every_row,
                lora_request=lora_request,
                cache_salt=processed.cache_salt,
                prompt_embeds=processed.embeds,
            )
            children.append(child)
            self.scheduler.add(child)
            self._new.append(
                NewRequestData(child.request_id, processed.output_token_ids, child_params,
                               child.eos_token_id, pooling, child.pools_every_row)
            )
        self.outputs.add_group(request_id, processed.prompt, processed.output_token_ids, params,
                               children)

    def abort_request(self, request_ids: str | list[str]) -> None:
        """Stop requests now and free their KV blocks at once."""
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            for child in self.outputs.children(rid):
                if not child.is_finished:
                    self.scheduler.finish(child, RequestStatus.FINISHED_ABORTED)
            self.outputs.drop_group(rid)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's): the next prompts are computed afresh. False,
        and nothing forgotten, while a request holds KV blocks."""
        if self.block_manager.num_used_blocks:
            log.warning("reset_prefix_cache: %d KV blocks are in use; not reset",
                        self.block_manager.num_used_blocks)
            return False
        self.block_manager.reset_prefix_cache()
        return True

    def get_tokenizer(self) -> Any:
        """The tokenizer the engine uses (vLLM's ``LLMEngine.get_tokenizer``); ValueError
        with skip_tokenizer_init, as vLLM's."""
        if self.tokenizer is None:
            raise ValueError("Unable to get tokenizer because `skip_tokenizer_init=True`")
        return self.tokenizer

    # -- one step --------------------------------------------------------------------------
    def _init_swap_space(self) -> int:
        """Host swap blocks on every rank (the minimum over ranks; 0 without swap_space).
        Speculative decoding and multi-step scheduling preempt by recompute: a draft model's
        KV and a multi-step window's blocks are not swapped."""
        if self.config.swap_space <= 0:
            return 0
        if self.spec is not None or self.config.num_scheduler_steps > 1:
            log.info("swap_space %s GiB unused: with speculative decoding or multi-step "
                        "scheduling, preempted requests are recomputed", self.config.swap_space)
            return 0
        num = min(self.executor.collective_rpc("num_swap_blocks"))
        self.executor.collective_rpc("initialize_swap_space", num)
        return int(num)

    def step(self) -> list[RequestOutput]:
        plan = self.scheduler.schedule()
        failed = self._load_adapters(plan.scheduled) if self.adapters is not None else []
        kv = self.kv_transfer
        if kv is not None and plan.kv_loads:  # blocks from the KV connector's store, first
            failed += kv.load(plan, self.executor, self.scheduler, self.outputs)
        if plan.is_empty():
            if plan.finished_ids or plan.has_swaps or plan.preempted:  # workers drop state
                # (finished, recomputed: a pooling sum) and copy swapped KV
                self.executor.execute_model(ModelInput(
                    [], self._take_new(), plan.finished_ids,
                    blocks_to_swap_out=plan.blocks_to_swap_out,
                    blocks_to_swap_in=plan.blocks_to_swap_in,
                    preempted_ids=recomputed(plan),
                ))
            return failed
        saves = kv.saves(plan, self.block_manager) if kv is not None else []
        output = self.executor.execute_model(
            model_input(plan, self.block_manager, self.guided, self._take_new()))
        if saves:  # the prompt blocks this step completed, to the store
            self.executor.collective_rpc("save_kv_blocks", saves)
        self.iteration_tokens.observe(plan.num_tokens)
        self.scheduler.on_step_done(plan, output)
        results = self.outputs.update(plan.scheduled, output, self.scheduler,
                                      per_step=bool(plan.num_steps))  # fmt: skip
        if self.spec is not None:
            self._after_speculation(plan, output)
        return failed + results

    def _take_new(self) -> list[NewRequestData]:
        new, self._new = self._new, []
        return new

    def _after_speculation(self, plan: SchedulerOutput, output: ModelOutput) -> None:
        """Count the step's drafting and verification; keep the new drafts for the next."""
        assert self.spec is not None
        self.spec.stats.draft_time += output.draft_time
        self.spec.stats.target_time += output.target_time
        for req, _ in plan.scheduled:
            proposed = output.spec_token_ids.get(req.request_id)
            if proposed and req.status == RequestStatus.RUNNING:
                self.spec.accept_proposals(req, proposed)

    # -- stats -----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        # a new key: say how data_parallel.merge_stats combines the engines' values
        bm = self.block_manager
        return {
            "num_running": self.scheduler.num_running,
            "num_waiting": self.scheduler.num_waiting,
            "kv_usage": bm.usage,
            "num_kv_blocks": bm.num_kv_blocks,
            "num_used_blocks": bm.num_used_blocks,
            "prefix_cache_queries": bm.stats.queries,
            "prefix_cache_hits": bm.stats.hits,
            "num_preemptions": self.scheduler.stats.num_preemptions,
            "num_swap_outs": self.scheduler.stats.num_swap_outs,
            "num_swapped": self.scheduler.num_swapped,
            "swap_usage": bm.swap_usage,
            "num_swap_blocks": bm.num_swap_blocks,
            "time": time.time(),
            "iteration_tokens": self.iteration_tokens.to_dict(),
            **(self.spec.stats.to_dict() if self.spec is not None else {}),
            **({"external_prefix_cache_queries": self.kv_transfer.stats.queries,
                "external_prefix_cache_hits": self.kv_transfer.stats.hits}
               if self.kv_transfer is not None else {}),
            **self._lora_stats(),
        }

    def check_health(self) -> None:
        """Raise when the workers cannot run steps any more (a worker died)."""
        self.executor.check_health()

    def shutdown(self) -> None:
        self.executor.shutdown()
