"""EngineConfig: every engine argument, with vLLM's names and defaults, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}
LOAD_FORMATS = ("auto", "safetensors", "pt", "gguf", "dummy")
# vLLM's accepted LoRA limits (max_lora_rank values; extra vocabulary sizes)
LORA_MAX_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LORA_EXTRA_VOCAB_SIZES = (0, 256, 512)


@dataclass
class EngineConfig:
    model: str
    tokenizer: str | None = None
    trust_remote_code: bool = False
    dtype: str = "auto"  # auto | float32 | float16 | bfloat16 (and vLLM's aliases)
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_num_seqs: int = 256
    scheduling_policy: str = "fcfs"  # fcfs | priority (lower priority value runs first)
    max_num_batched_tokens: int | None = None  # None: 2048 with chunked prefill, else max_model_len
    # KV cache size: bytes for the KV cache (vLLM's kv_cache_memory). None: platform default
    # (cpu: 4 GiB like VLLM_CPU_KVCACHE_SPACE; devices: gpu_memory_utilization of free memory).
    kv_cache_memory: int | None = None
    num_kv_blocks: int | None = None  # exact override (vLLM's num_gpu_blocks_override)
    gpu_memory_utilization: float = 0.9
    swap_space: float = 0  # GiB of host swap for preempted KV (0: preempt by recompute)
    seed: int = 0
    load_format: str = "auto"
    device: str = "auto"
    attention_backend: str | None = None
    attention_backend_options: dict[str, Any] = field(default_factory=dict)
    quantization: str | None = None
    guided_decoding_backend: str = "auto"
    distributed_executor_backend: str | None = None  # None: uni when tensor_parallel_size == 1
    tensor_parallel_size: int = 1
    max_logprobs: int = 20
    enforce_eager: bool = False
    kv_cache_dtype: str = "auto"
    disable_log_stats: bool = True
    # Multi-LoRA serving (vLLM's names and defaults; see docs/lora.md)
    enable_lora: bool = False
    max_loras: int = 1  # adapters that may run in one step (others wait)
    max_lora_rank: int = 16  # highest adapter rank accepted
    max_cpu_loras: int | None = None  # adapters kept loaded (LRU); None: max_loras
    lora_dtype: str = "auto"  # auto (the model dtype) | float32 | float16 | bfloat16
    # Tokens an adapter may add to the vocabulary (vLLM's flag; IronLM, like current vLLM,
    # refuses adapters that add tokens, so only adapters adding none load)
    lora_extra_vocab_size: int = 256

    def __post_init__(self) -> None:
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
        for name in ("block_size", "max_num_seqs", "tensor_parallel_size", "max_logprobs"):
            if getattr(self, name) < 1 and name != "max_logprobs":
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be non-negative, got {self.max_logprobs}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be at least 1, got {self.max_model_len}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be at least 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy {self.scheduling_policy!r} is not supported; choose "
                "'fcfs' or 'priority'"
            )
        if self.swap_space:
            raise ValueError(
                "swap_space > 0 is not supported: IronLM preempts by recomputation; "
                "pass swap_space=0"
            )
        self._check_lora()
        if self.distributed_executor_backend is None:
            self.distributed_executor_backend = "uni" if self.tensor_parallel_size == 1 else "mp"

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

    def lora_torch_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The dtype adapter weights are held in: ``lora_dtype``, or the model's for auto."""
        return model_dtype if self.lora_dtype == "auto" else _DTYPES[self.lora_dtype]

    def torch_dtype(self, checkpoint_dtype: torch.dtype, platform_default: torch.dtype) -> torch.dtype:
        """The compute dtype: explicit choice, else the platform's choice for the checkpoint."""
        if self.dtype == "auto":
            return platform_default
        return _DTYPES[self.dtype]

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
