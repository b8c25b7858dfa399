"""ServerState: everything one app serves with (held in ``app.state.server``, never global)."""

from __future__ import annotations

import copy
import itertools
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from ironlm import __version__
from ironlm.engine.classification import Classifier
from ironlm.engine.engine_client import EngineClient
from ironlm.entrypoints.openai.chat_reasoning import markers_are_special
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.lora_modules import LoRAModulePath
from ironlm.entrypoints.openai.metrics import ServerMetrics
from ironlm.entrypoints.openai.protocol import StreamOptions
from ironlm.entrypoints.openai.request_tracker import RequestTracker
from ironlm.entrypoints.openai.responses_api import ResponseStore
from ironlm.entrypoints.openai.tokenizer_pool import TokenizerPool
from ironlm.interfaces.tool_parser import ToolParser
from ironlm.lora.request import LoRARequest
from ironlm.outputs import RequestOutput
from ironlm.plugin_manager import PluginManager

log = logging.getLogger("ironlm.server")


@dataclass
class ServerOptions:
    """The front-end flags the endpoints read (see cli_args)."""

    served_model_names: list[str]
    chat_template: str | None = None  # template text (already loaded from a file)
    trust_request_chat_template: bool = False  # a request's own chat_template may run
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    chat_template_content_format: str = "auto"  # auto | string | openai (chat_content_format)
    response_role: str = "assistant"
    return_tokens_as_token_ids: bool = False
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    exclude_tools_when_tool_choice_none: bool = False  # tool_choice "none": no tools in prompt
    max_log_len: int | None = None
    log_requests: bool = False  # vLLM's default since 0.10: off (--enable-log-requests)
    log_outputs: bool = False  # with log_requests: each request's output when it ends
    enable_prompt_tokens_details: bool = False  # usage names the prompt's cached tokens
    enable_force_include_usage: bool = False  # every stream ends with a usage chunk
    disable_log_stats: bool = False
    lora_modules: list[LoRAModulePath] = field(default_factory=list)  # served from start-up


@dataclass
class ServerState:
    engine: EngineClient
    options: ServerOptions
    plugin_manager: PluginManager
    tool_parser_cls: type[ToolParser] | None
    metrics: ServerMetrics
    # The front end's own tokenizer: the engine thread uses the engine's concurrently, and HF
    # fast tokenizers must not be shared across threads.
    tokenizer: Any = None
    # Tokenization and chat templating of request prompts, on worker threads.
    tokenizers: TokenizerPool | None = None
    max_model_len: int = 0
    # SamplingParams fields from the generation config (LLMEngine.default_sampling): values
    # of unset request fields; its max_tokens caps every request
    default_sampling: dict[str, Any] = field(default_factory=dict)
    vocab_size: int = 0
    # --enable-prompt-embeds: the hidden size the Completions API's prompt_embeds must have
    # (None: prompt_embeds are refused)
    embeds_hidden_size: int | None = None
    # a sequence classifier's labels and activation (None: a generative model)
    classifier: Classifier | None = None
    model_path: str = ""
    created: int = 0  # start time, reported as the model cards' "created"
    # LoRA adapters served by name (--lora-modules, /v1/load_lora_adapter), in load order
    loras: dict[str, LoRARequest] = field(default_factory=dict)
    lora_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    # Responses API: stored responses (store=true), for previous_response_id and GET
    responses: ResponseStore = field(default_factory=ResponseStore)
    # the reasoning parser's markers are special tokens: chat requests keep them in the text
    reasoning_markers_special: bool = False

    @classmethod
    def create(
        cls, engine: EngineClient, options: ServerOptions, pm: PluginManager
    ) -> ServerState:
        llm = engine.engine
        parser = pm.select_tool_parser(options.tool_call_parser) if options.tool_call_parser \
            else None
        return cls(
            engine=engine,
            options=options,
            plugin_manager=pm,
            tool_parser_cls=parser,
            metrics=ServerMetrics(options.served_model_names[0]),
            tokenizer=copy.deepcopy(llm.tokenizer),
            tokenizers=TokenizerPool(llm.tokenizer),
            max_model_len=llm.max_model_len,
            default_sampling=dict(llm.default_sampling),
            vocab_size=llm.vocab_size,
            embeds_hidden_size=llm.inputs.embeds_hidden_size,
            classifier=llm.classifier,
            model_path=str(llm.config.model),
            created=int(time.time()),
            reasoning_markers_special=markers_are_special(llm.reasoning_parser, llm.tokenizer),
        )

    @property
    def model_name(self) -> str:
        """The first --served-model-name: what responses report when a request names none."""
        return self.options.served_model_names[0]

    @property
    def system_fingerprint(self) -> str:
        return f"ironlm-{__version__}"

    def serves(self, api: str, classifies: bool = False) -> None:
        """400 when the model's kind does not serve ``api`` (vLLM's message): a classifier
        serves /classify, /score and /rerank; a generative model everything else."""
        if (self.classifier is not None) != classifies:
            raise APIError(f"The model does not support {api}", 400)

    def need_tokenizer(self, field: str | None) -> None:
        """400 naming ``field`` when the server runs without a tokenizer
        (--skip-tokenizer-init): text in, chat, stop strings and the like need one."""
        if self.tokenizer is None:
            raise APIError(f"{field or 'this endpoint'} needs the tokenizer, and the server "
                           "runs with --skip-tokenizer-init", 400, param=field)

    def check_model(self, name: str | None) -> LoRARequest | None:
        """The LoRA adapter a request's model names (None: the base model); 404 for a model
        this server does not serve (a missing name means the default)."""
        if name is None or name == "" or name in self.options.served_model_names:
            return None
        lora = self.loras.get(name)
        if lora is not None:
            return lora
        raise APIError(
            f"The model `{name}` does not exist.", 404, param="model", code="model_not_found"
        )

    def response_model(self, lora: LoRARequest | None, requested: str | None) -> str:
        """The model name responses report, as vLLM: the adapter's, the served name the
        request used, or (none given) the first served name."""
        if lora is not None:
            return lora.lora_name
        return requested if requested in self.options.served_model_names else self.model_name

    def stream_usage(self, opts: StreamOptions | None) -> tuple[bool, bool]:
        """(a final usage chunk, usage on every chunk) for a stream: what ``stream_options``
        asks; --enable-force-include-usage adds the final chunk to every stream (vLLM 0.10's
        should_include_usage)."""
        include = bool(opts and opts.include_usage) or self.options.enable_force_include_usage
        return include, bool(include and opts and opts.continuous_usage_stats)

    def cached_tokens(self, outputs: list[RequestOutput]) -> int | None:
        """Prompt tokens the prefix cache served for ``outputs`` (a request's prompts), for
        usage's prompt_tokens_details; None unless --enable-prompt-tokens-details."""
        if not self.options.enable_prompt_tokens_details:
            return None
        return sum(out.num_cached_tokens for out in outputs)

    def new_tracker(self, n: int = 1, best_of: int | None = None,
                    max_tokens: int | None = None) -> RequestTracker:
        on_finish = self.log_output if self.options.log_outputs else None
        return RequestTracker(self.metrics, n, best_of, max_tokens, on_finish)

    def log_output(self, out: RequestOutput) -> None:
        """vLLM's --enable-log-outputs line, one per choice of a request that ended."""
        n = self.options.max_log_len  # None: all of it (``[:None]``)
        for o in out.outputs:
            log.info("Generated response %s: output: %r, output_token_ids: %s, "
                     "finish_reason: %s", out.request_id, o.text[:n], list(o.token_ids[:n]),
                     o.finish_reason)  # fmt: skip

    def log_request(self, request_id: str, prompt: str | None, token_ids: list[int],
                    params: Any) -> None:
        if not self.options.log_requests:
            return
        n = self.options.max_log_len  # None: all of it (``[:None]``)
        log.info("Received request %s: prompt: %r, params: %s, prompt_token_ids: %s",
                 request_id, prompt[:n] if prompt is not None else None, params, token_ids[:n])


def data_parallel_rank(state: ServerState, request: Request) -> int | None:
    """vLLM's ``X-data-parallel-rank`` header: the data-parallel engine a router pins the
    request to (None: the least loaded). As vLLM, a value that is not an integer is ignored;
    400 naming the header for an engine the server does not have."""
    text = request.headers.get("x-data-parallel-rank")
    try:
        rank = int(text) if text is not None else None
    except ValueError:
        return None
    engines = len(state.engine.engines)
    if rank is not None and not 0 <= rank < engines:
        raise APIError(f"X-data-parallel-rank {rank} is out of range [0, {engines}): the "
                       f"server runs {engines} data-parallel engine(s)", 400,
                       param="X-data-parallel-rank")
    return rank


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def request_id_for(prefix: str, request: Request, given: str | None = None) -> tuple[str, str]:
    """(the response's id, the engine's), as vLLM makes them: ``prefix-`` and the X-Request-Id
    header, else the body's ``request_id``, else a random id. An id the caller named may be in
    flight twice (a retry, a gateway reusing ids), so the engine's id adds 8 random hex digits
    to it (vLLM's randomisation); logs and aborts use the engine's."""
    base = request.headers.get("x-request-id") or given
    if not base:
        rid = random_id(prefix)
        return rid, rid
    return f"{prefix}-{base}", f"{prefix}-{base}-{uuid.uuid4().hex[:8]}"
