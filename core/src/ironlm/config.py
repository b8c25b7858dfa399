"""EngineConfig: every engine argument, with vLLM's names and defaults, validated once."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from ironlm.config_aliases import apply_vllm_aliases
from ironlm.interfaces.kv_connector import KVTransferConfig
from ironlm.python_file import import_class

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}
LOAD_FORMATS = ("auto", "safetensors", "pt", "gguf", "dummy")
# vLLM's tokenizer modes IronLM honours: both load the model's Hugging Face tokenizer
TOKENIZER_MODES = ("auto", "hf")
# vLLM's logprobs modes: the model's distribution (raw) or the one the draw used (processed)
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
# vLLM's accepted LoRA limits (max_lora_rank values; extra vocabulary sizes)
LORA_MAX_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LORA_EXTRA_VOCAB_SIZES = (0, 256, 512)
# vLLM's data-parallel backends: what runs each data-parallel engine's workers
DATA_PARALLEL_BACKENDS = ("mp", "ray")
# vLLM's --prefix-caching-hash-algo choices (ironlm.engine.block_hash)
PREFIX_CACHING_HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


@dataclass
class EngineConfig:
    model: str
    tokenizer: str | None = None
    # a Python file defining extend_tokenizer(tokenizer) -> tokenizer, called once after the
    # tokenizer loads (engine/tokenizer_extension.py); None: the tokenizer as loaded
    tokenizer_extension_path: str | None = None
    tokenizer_mode: str = "auto"  # auto / hf: the HF tokenizer (TOKENIZER_MODES)
    # vLLM's: no tokenizer at all. Prompts are token ids, outputs token ids (text ""); what
    # needs the tokenizer (text prompts, stop strings, bad words, guided decoding, a
    # reasoning parser, chat) is refused naming it
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    # a model (or tokenizer) named by a Hugging Face Hub repository id (model_loader/hub.py):
    # its revision (a branch, tag or commit hash; None: main), the tokenizer's when
    # ``tokenizer`` is a repository id, the cache folder (None: huggingface_hub's), and a
    # token for gated or private repositories (None: HF_TOKEN or the stored login)
    revision: str | None = None
    tokenizer_revision: str | None = None
    download_dir: str | None = None
    hf_token: str | None = field(default=None, repr=False)
    # laid over the model's HF config before anything reads it (vLLM's hf_overrides): a
    # nested object updates the sub-config of that name
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    dtype: str = "auto"  # auto | float32 | float16 | bfloat16 (and vLLM's aliases)
    # None: the model's max_position_embeddings; -1 (vLLM's "auto"): that, or the longest
    # context the KV cache holds when it holds less
    max_model_len: int | None = None
    # vLLM's: the model's sliding-window layers attend to the whole context, which is capped
    # to the window (so the outputs are the same); no effect on a model without a window
    disable_sliding_window: bool = False
    block_size: int | None = None  # None: the platform's default_block_size (16; npu 128)
    enable_prefix_caching: bool = True
    # the prefix cache's block hash: sha256 | sha256_cbor | xxhash | xxhash_cbor (block_hash.py)
    prefix_caching_hash_algo: str = "sha256"
    enable_chunked_prefill: bool = True
    # None (both): the platform's defaults for the offline LLM or the server
    # (Platform.scheduler_defaults; cpu: vLLM's 4096 tokens / 256 sequences offline, 2048 / 128
    # serving); without chunked prefill the budget is at least max_model_len
    max_num_seqs: int | None = None
    scheduling_policy: str = "fcfs"  # fcfs | priority (lower priority value runs first)
    max_num_batched_tokens: int | None = None
    # vLLM's: a prompt longer than this is prefilled at most this many tokens a step, so long
    # prompts do not hold the decodes of a step back (0: no cap)
    long_prefill_token_threshold: int = 0
    # KV cache size: bytes for the KV cache (vLLM's kv_cache_memory). None: platform default
    # (cpu: 4 GiB like VLLM_CPU_KVCACHE_SPACE; devices: gpu_memory_utilization of free memory).
    kv_cache_memory: int | None = None
    kv_cache_memory_bytes: int | None = None  # vLLM's name of kv_cache_memory (give one)
    num_kv_blocks: int | None = None  # exact override (vLLM's num_gpu_blocks_override)
    num_gpu_blocks_override: int | None = None  # vLLM's name of num_kv_blocks (give one)
    gpu_memory_utilization: float = 0.9
    # GiB of host memory (per rank) that preempted requests' KV is swapped to; when it is
    # full, or 0, preemption recomputes instead (vLLM's default: 4)
    swap_space: float = 4
    seed: int = 0
    load_format: str = "auto"
    device: str = "auto"
    attention_backend: str | None = None
    attention_backend_options: dict[str, Any] = field(default_factory=dict)
    quantization: str | None = None
    guided_decoding_backend: str = "auto"
    # vLLM's newer form of guided_decoding_backend: {"backend": name, "reasoning_parser":
    # name, "enable_in_reasoning": bool} (config_aliases.py)
    structured_outputs_config: dict[str, Any] | None = None
    # A reasoning parser plugin's name (deepseek_r1, qwen3, ...): chat responses split the
    # reasoning from the answer, and structured output constrains only the answer
    reasoning_parser: str | None = None
    # Structured output constrains the reasoning too (vLLM's structured_outputs_config
    # enable_in_reasoning; no flag of its own)
    structured_outputs_enable_in_reasoning: bool = False
    # None: "uni" for one rank; for more, "ray" when Ray is installed, otherwise "mp"
    distributed_executor_backend: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # vLLM's data parallelism (the server's internal load balancing): this many engines of
    # the model, each with tensor_parallel_size x pipeline_parallel_size workers of its own
    # (engine/data_parallel.py); the offline LLM runs one
    data_parallel_size: int = 1
    # this engine's place among them (set by the server for each engine; no flag)
    data_parallel_rank: int = 0
    # what runs every data-parallel engine's workers: "mp" (child processes) or "ray"
    data_parallel_backend: str = "mp"
    max_logprobs: int = 20
    # what logprobs (and prompt logprobs) report (LOGPROBS_MODES; vLLM's, default raw):
    # processed = after penalties, bans, temperature and top-k / top-p / min-p
    logprobs_mode: str = "raw_logprobs"
    # Default sampling parameters (engine/sampling_defaults.py): "auto" (the model's
    # generation_config.json), "vllm" (none) or a folder holding one; the override's fields
    # are laid over it
    generation_config: str = "auto"
    override_generation_config: dict[str, Any] = field(default_factory=dict)
    enforce_eager: bool = False
    # decode graphs (vLLM's CUDA-graph sizes): the decode batch sizes captured (a batch runs
    # padded to the next one) and the largest; None: vLLM's pattern, 1, 2, 4, then steps of
    # 8 to 256 and of 16 beyond, up to the largest (None: the platform's; cuda 256, cpu 64)
    cudagraph_capture_sizes: list[int] | None = None
    max_cudagraph_capture_size: int | None = None
    # vLLM's compilation_config JSON: its cudagraph_capture_sizes, max_cudagraph_capture_size
    # and cudagraph_mode ("NONE": enforce_eager) are taken (config_aliases.py)
    compilation_config: dict[str, Any] | None = None
    kv_cache_dtype: str = "auto"
    disable_log_stats: bool = True
    # Speculative decoding (vLLM's flags): a draft model's path, or "[ngram]" (prompt lookup), or
    # "[name]" for another registered proposer. None: off.
    speculative_model: str | None = None
    num_speculative_tokens: int | None = None  # drafts per step (required with speculative_model)
    speculative_max_model_len: int | None = None  # no speculation for longer sequences
    speculative_disable_by_batch_size: int | None = None  # off while this many requests run
    ngram_prompt_lookup_max: int | None = None  # "[ngram]": longest suffix looked up (required)
    ngram_prompt_lookup_min: int | None = None  # "[ngram]": shortest suffix looked up (default 1)
    # vLLM's newer form of the speculative flags above: {"method": "ngram" | "draft_model" |
    # proposer name, "model", "num_speculative_tokens", ...} (config_aliases.py)
    speculative_config: dict[str, Any] | None = None
    num_scheduler_steps: int = 1  # multi-step: most decode steps the runner runs per plan
    # vLLM's stream_interval: a streamed (DELTA) request's outputs come with its first token,
    # then once per this many new tokens, and at its end (fewer outputs: less host work)
    stream_interval: int = 1
    # Multi-LoRA serving (vLLM's names and defaults; see docs/lora.md)
    enable_lora: bool = False
    max_loras: int = 1  # adapters that may run in one step (others wait)
    max_lora_rank: int = 16  # highest adapter rank accepted
    max_cpu_loras: int | None = None  # adapters kept loaded (LRU); None: max_loras
    lora_dtype: str = "auto"  # auto (the model dtype) | float32 | float16 | bfloat16
    # Tokens an adapter may add to the vocabulary (vLLM's flag; IronLM, like current vLLM,
    # refuses adapters that add tokens, so only adapters adding none load)
    lora_extra_vocab_size: int = 256
    # vLLM's sleep mode: ``LLM.sleep(level)`` frees the KV cache and offloads (1) or discards
    # (2) the weights until ``wake_up``; the server gets POST /sleep, /wake_up, GET /is_sleeping
    enable_sleep_mode: bool = False
    # vLLM's: prompts may be given as embeddings, {"prompt_embeds": (num_tokens, hidden_size)}
    # offline and base64 ``torch.save`` payloads in the Completions API (engine/prompt_embeds.py)
    enable_prompt_embeds: bool = False
    # vLLM's custom logits processors (interfaces/logits_processor.py): LogitsProcessor
    # subclasses, vLLM's "module:Class" names, or names a plugin registered; the engine
    # turns the names into classes before any worker starts
    logits_processors: list[Any] | None = None
    # vLLM's: a class whose methods ``collective_rpc`` calls on every worker with the worker
    # as ``self`` (reinforcement-learning weight sync); vLLM's "module.Class" string is
    # imported here, in the engine's process (so workers elsewhere unpickle the class)
    worker_extension_cls: type | str | None = None
    # vLLM's KV transfer (interfaces/kv_connector.py, engine/kv_transfer.py): a
    # KVTransferConfig, or its JSON object (--kv-transfer-config); None: off
    kv_transfer_config: dict[str, Any] | KVTransferConfig | None = None

    def __post_init__(self) -> None:
        if self.kv_transfer_config is not None:
            self.kv_transfer_config = KVTransferConfig.of(self.kv_transfer_config)
        if isinstance(self.worker_extension_cls, str):
            self.worker_extension_cls = import_class(self.worker_extension_cls,
                                                     "worker_extension_cls")
        elif self.worker_extension_cls is not None and \
                not isinstance(self.worker_extension_cls, type):
            raise ValueError("worker_extension_cls must be a class or a 'module.Class' name, got "
                             f"{self.worker_extension_cls!r}")
        if self.dtype not in ("auto", *_DTYPES):
            raise ValueError(
                f"dtype {self.dtype!r} is not supported; choose one of "
                f"{['auto', *_DTYPES]}"
            )
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(
                f"load_format {self.load_format!r} is not supported; choose one of "
                f"{list(LOAD_FORMATS)}"
            )
        for name in ("block_size", "max_num_seqs", "tensor_parallel_size",
                     "pipeline_parallel_size", "data_parallel_size", "max_logprobs"):
            if getattr(self, name) is not None and getattr(self, name) < 1 \
                    and name != "max_logprobs":
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode {self.logprobs_mode!r} is not supported; choose one "
                             f"of {list(LOGPROBS_MODES)}")
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be non-negative or -1 (no limit), got "
                             f"{self.max_logprobs}")
        if self.max_model_len is not None and self.max_model_len < 1 \
                and self.max_model_len != -1:
            raise ValueError(f"max_model_len must be at least 1, or -1 (the longest the KV "
                             f"cache holds), got {self.max_model_len}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be at least 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.prefix_caching_hash_algo not in PREFIX_CACHING_HASH_ALGOS:
            raise ValueError(f"prefix_caching_hash_algo {self.prefix_caching_hash_algo!r} is not "
                             f"one of {', '.join(PREFIX_CACHING_HASH_ALGOS)}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy {self.scheduling_policy!r} is not supported; choose "
                "'fcfs' or 'priority'"
            )
        if self.swap_space < 0:
            raise ValueError(f"swap_space must be non-negative (GiB), got {self.swap_space}")
        if self.tokenizer_mode == "slow":
            raise ValueError(
                "tokenizer_mode 'slow' is not supported: transformers 5 loads every tokenizer "
                "with its fast (tokenizers) backend and ignores use_fast=False; use 'auto'"
            )
        if self.tokenizer_mode not in TOKENIZER_MODES:
            raise ValueError(
                f"tokenizer_mode {self.tokenizer_mode!r} is not supported: IronLM loads "
                f"Hugging Face tokenizers only; choose one of {list(TOKENIZER_MODES)}"
            )
        if self.skip_tokenizer_init:
            needs = [name for name in ("tokenizer_extension_path", "reasoning_parser")
                     if getattr(self, name)]
            if needs:
                raise ValueError(f"{needs[0]} needs the tokenizer, and skip_tokenizer_init "
                                 "is set")
        if self.hf_overrides is None:  # vLLM's default spelling of "none"
            self.hf_overrides = {}
        if not isinstance(self.hf_overrides, dict):
            raise ValueError(f"hf_overrides must be a dict of HF config fields (a JSON object), "
                             f"got {type(self.hf_overrides).__name__}")
        apply_vllm_aliases(self)
        _check_speculative(self)
        if self.speculative_model is not None and self.logprobs_mode != "raw_logprobs":
            raise ValueError(f"logprobs_mode {self.logprobs_mode!r} is not supported with "
                             "speculative decoding yet (its verification reports raw logprobs)")
        _check_capture_sizes(self.cudagraph_capture_sizes, self.max_cudagraph_capture_size)
        if self.long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be 0 (no cap) or positive, "
                             f"got {self.long_prefill_token_threshold}")  # fmt: skip
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be at least 1, got {self.stream_interval}")
        if self.num_scheduler_steps < 1:
            raise ValueError(
                f"num_scheduler_steps must be at least 1, got {self.num_scheduler_steps}"
            )
        if self.num_scheduler_steps > 1 and self.world_size > 1:
            raise ValueError(
                f"num_scheduler_steps={self.num_scheduler_steps} is not supported with tensor "
                "or pipeline parallelism yet (every rank would need each step's sampled "
                "tokens); use num_scheduler_steps=1"
            )
        if self.num_scheduler_steps > 1 and self.speculative_model is not None:
            raise ValueError(
                "speculative decoding is not supported with multi-step scheduling "
                f"(num_scheduler_steps={self.num_scheduler_steps}); use one of them"
            )
        self._check_lora()
        if self.kv_transfer_config is not None and self.speculative_model not in (None,
                                                                                   "[ngram]"):
            raise ValueError("kv_transfer_config is not supported with a speculative model "
                             "yet (its KV is not transferred); [ngram] (prompt lookup, no KV "
                             "of its own) is")
        self._check_data_parallel()
        if self.distributed_executor_backend is None and self.data_parallel_size > 1:
            # every engine's forward runs in its own workers, in parallel with the others'
            self.distributed_executor_backend = self.data_parallel_backend
        if self.distributed_executor_backend is None:
            # vLLM's rule: "ray when Ray is installed and more than one device is used,
            # otherwise mp" (and the in-process executor for a single rank)
            if self.world_size == 1:
                self.distributed_executor_backend = "uni"
            else:
                ray_installed = importlib.util.find_spec("ray") is not None
                self.distributed_executor_backend = "ray" if ray_installed else "mp"

    def with_scheduler_limits(
        self, tokens: int, seqs: int, max_model_len: int
    ) -> EngineConfig:
        """This config with ``max_num_batched_tokens`` and ``max_num_seqs`` fixed: the user's,
        or the platform's defaults ``tokens`` / ``seqs`` when unset (a budget of at least
        ``max_model_len`` without chunked prefill, vLLM's rule: every prompt fits one step)."""
        if self.max_num_batched_tokens is None and not self.enable_chunked_prefill:
            tokens = max(tokens, max_model_len)
        return replace(self, max_num_batched_tokens=self.max_num_batched_tokens or tokens,
                       max_num_seqs=self.max_num_seqs or seqs)

    def with_block_size(self, default: int) -> EngineConfig:
        """This config with ``block_size`` fixed: the user's, or ``default`` (the platform's
        ``default_block_size``) when none was given. The engine fixes it before any worker
        starts, so every rank and the block manager use one size."""
        return self if self.block_size is not None else replace(self, block_size=default)

    @property
    def world_size(self) -> int:
        """Ranks the model runs on: tensor_parallel_size x pipeline_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def _check_data_parallel(self) -> None:
        if not 0 <= self.data_parallel_rank < self.data_parallel_size:
            raise ValueError(f"data_parallel_rank must be in [0, data_parallel_size="
                             f"{self.data_parallel_size}), got {self.data_parallel_rank}")
        if self.data_parallel_backend not in DATA_PARALLEL_BACKENDS:
            raise ValueError(f"data_parallel_backend {self.data_parallel_backend!r} is not "
                             f"supported; choose one of {list(DATA_PARALLEL_BACKENDS)}")
        if self.data_parallel_size > 1 and self.data_parallel_backend == "ray" and \
                self.distributed_executor_backend not in (None, "ray"):
            raise ValueError(f"data_parallel_backend 'ray' runs every engine's workers as Ray "
                             f"actors: distributed_executor_backend "
                             f"{self.distributed_executor_backend!r} contradicts it")
        if self.data_parallel_size > 1 and self.distributed_executor_backend == "uni":
            raise ValueError("data_parallel_size > 1 runs each engine's workers out of the "
                             "server's process: distributed_executor_backend 'uni' (in "
                             "process) cannot; use 'mp' or 'ray' (or leave it unset)")

    def _check_lora(self) -> None:
        """vLLM's LoRAConfig checks (made whether or not LoRA is enabled, as the flags are)."""
        if self.max_lora_rank not in LORA_MAX_RANKS:
            raise ValueError(
                f"max_lora_rank ({self.max_lora_rank}) must be one of {LORA_MAX_RANKS}."
            )
        if self.lora_extra_vocab_size not in LORA_EXTRA_VOCAB_SIZES:
            raise ValueError(
                f"lora_extra_vocab_size ({self.lora_extra_vocab_size}) must be one of "
                f"{LORA_EXTRA_VOCAB_SIZES}."
            )
        if self.max_loras < 1:
            raise ValueError(f"max_loras ({self.max_loras}) must be >= 1.")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        elif self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )
        if self.lora_dtype not in ("auto", *_DTYPES):
            raise ValueError(
                f"lora_dtype {self.lora_dtype!r} is not supported; choose one of "
                f"{['auto', *_DTYPES]}"
            )
        if self.enable_lora and self.pipeline_parallel_size > 1:
            raise ValueError(
                "enable_lora is not supported with pipeline parallelism yet "
                f"(pipeline_parallel_size={self.pipeline_parallel_size}): adapters are not "
                "split by stage; use tensor_parallel_size instead"
            )

    def lora_torch_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The dtype adapter weights are held in: ``lora_dtype``, or the model's for auto."""
        return model_dtype if self.lora_dtype == "auto" else _DTYPES[self.lora_dtype]

    def torch_dtype(self, checkpoint_dtype: torch.dtype, platform_default: torch.dtype) -> torch.dtype:
        """The compute dtype: explicit choice, else the platform's choice for the checkpoint."""
        if self.dtype == "auto":
            return platform_default
        return _DTYPES[self.dtype]

    @property
    def speculative_proposer_name(self) -> str | None:
        """The proposer named in brackets ("[ngram]" -> "ngram"); None for a model path."""
        spec = self.speculative_model
        if spec is not None and spec.startswith("[") and spec.endswith("]"):
            return spec[1:-1]
        return None

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def _check_speculative(cfg: EngineConfig) -> None:
    """vLLM's rules for the speculative flags; a flag that would be ignored is an error."""
    k = cfg.num_speculative_tokens
    if cfg.speculative_model is None:
        given = [n for n in ("num_speculative_tokens", "speculative_max_model_len",
                             "speculative_disable_by_batch_size", "ngram_prompt_lookup_max",
                             "ngram_prompt_lookup_min") if getattr(cfg, n) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} given without speculative_model")
        return
    if not cfg.speculative_model.strip():
        raise ValueError("speculative_model is empty: give a draft model path or '[ngram]'")
    if k is None:
        raise ValueError("num_speculative_tokens must be provided with speculative_model")
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be at least 1, got {k}")
    if cfg.speculative_max_model_len is not None and cfg.speculative_max_model_len < 1:
        raise ValueError(
            f"speculative_max_model_len must be at least 1, got {cfg.speculative_max_model_len}"
        )
    if cfg.speculative_disable_by_batch_size is not None and cfg.speculative_disable_by_batch_size < 2:
        raise ValueError(
            "speculative_disable_by_batch_size must be larger than 1 (speculation is off while "
            f"that many requests run), got {cfg.speculative_disable_by_batch_size}"
        )
    lo, hi = cfg.ngram_prompt_lookup_min, cfg.ngram_prompt_lookup_max
    if cfg.speculative_model != "[ngram]":
        if lo is not None or hi is not None:
            raise ValueError(
                "ngram_prompt_lookup_max / ngram_prompt_lookup_min are only used with "
                f"speculative_model '[ngram]', not {cfg.speculative_model!r}"
            )
        return
    if hi is None or hi < 1:
        raise ValueError(
            f"ngram_prompt_lookup_max must be set to at least 1 with speculative_model "
            f"'[ngram]', got {hi}"
        )
    if lo is None:
        cfg.ngram_prompt_lookup_min = lo = 1
    if lo < 1:
        raise ValueError(f"ngram_prompt_lookup_min must be at least 1, got {lo}")
    if lo > hi:
        raise ValueError(
            f"ngram_prompt_lookup_min ({lo}) cannot be larger than ngram_prompt_lookup_max ({hi})"
        )


def _check_capture_sizes(sizes: list[int] | None, largest: int | None) -> None:
    """vLLM's checks of the decode-graph sizes: positive integers, at least one when a list is
    given, and a given largest size equal to the largest listed one."""
    given = [*(sizes or []), *([] if largest is None else [largest])]
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in given):
        raise ValueError(f"cudagraph capture sizes must be positive integers, got "
                         f"{sizes} / {largest}")  # fmt: skip
    if sizes is not None and not sizes:
        raise ValueError("cudagraph_capture_sizes is empty: name at least one decode batch "
                         "size (enforce_eager turns the graphs off)")  # fmt: skip
    if sizes and largest is not None and largest != max(sizes):
        raise ValueError(f"max_cudagraph_capture_size ({largest}) should be the largest of "
                         f"cudagraph_capture_sizes ({max(sizes)})")  # fmt: skip
