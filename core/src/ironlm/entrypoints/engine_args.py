"""Engine flags: one ``--kebab-case`` flag per EngineConfig field, vLLM's names and defaults.

Generated from the dataclass, so a new engine argument is a new flag of every command that
takes engine flags (``ironlm serve``, the benchmarks); ``engine_kwargs`` turns the parsed
flags back into EngineConfig keyword arguments.
"""

from __future__ import annotations

import argparse
import json
import re
import types
import typing
from collections.abc import Collection
from dataclasses import MISSING, fields
from typing import Any

from ironlm.config import (
    DATA_PARALLEL_BACKENDS,
    LOAD_FORMATS,
    LOGPROBS_MODES,
    PREFIX_CACHING_HASH_ALGOS,
    EngineConfig,
)

# Help per engine argument (fields missing here still get a flag, with a generic help).
ENGINE_HELP: dict[str, str] = {
    "model": "HF folder, GGUF file, or Hugging Face Hub repository id (org/name, or "
             "org/name-GGUF:QUANT) to serve (same as the positional MODEL)",
    "tokenizer": "tokenizer folder or name (default: the model's)",
    "tokenizer_extension_path": "Python file defining extend_tokenizer(tokenizer) -> "
                                "tokenizer, called once after the tokenizer loads",
    "tokenizer_mode": "auto or hf: the model's Hugging Face tokenizer (vLLM's other modes, "
                      "mistral, custom, slow, are refused)",
    "skip_tokenizer_init": "load no tokenizer: prompts are token ids and outputs token ids "
                           "(text empty); text prompts, stop strings, bad words, guided "
                           "decoding and chat are refused",
    "trust_remote_code": "trust remote code of the model's HF config",
    "revision": "with a Hugging Face Hub repository id as the model: the branch, tag or "
                "commit hash to fetch (default: main)",
    "tokenizer_revision": "with a Hub repository id as --tokenizer: its branch, tag or "
                          "commit hash",
    "download_dir": "folder of the Hugging Face Hub cache models are fetched into and read "
                    "from (default: huggingface_hub's, e.g. ~/.cache/huggingface/hub)",
    "hf_token": "token for gated or private Hub repositories (default: HF_TOKEN or the "
                "token of `hf auth login`)",
    "hf_overrides": "JSON object laid over the model's HF config, e.g. "
                    "'{\"max_position_embeddings\": 4096}' (an object value updates the "
                    "sub-config of that name)",
    "dtype": "compute dtype: auto, float32, float16, bfloat16 (and half, float)",
    "max_model_len": "context length, e.g. 4096, 4k, 4K (default: the model's "
                     "max_position_embeddings; auto or -1: that, or the longest context the KV "
                     "cache holds when it holds less)",
    "disable_sliding_window": "the model's sliding-window layers attend to the whole "
                              "context, capped to the window (vLLM's)",
    "block_size": "tokens per KV-cache block (default: the platform's: 16 on cpu and cuda, "
                  "128 on npu)",
    "enable_prefix_caching": "reuse KV blocks of shared prompt prefixes",
    "prefix_caching_hash_algo": "hash naming a prefix-cache block (vLLM's): sha256 (default; "
    "collision resistant), sha256_cbor (canonical CBOR: the same bytes everywhere; needs "
    "cbor2), xxhash / xxhash_cbor (faster, not collision resistant; needs xxhash)",
    "enable_chunked_prefill": "split long prefills across steps",
    "max_num_seqs": "most sequences in one batch (default: the platform's for the server or "
                    "the offline LLM: cpu 128 / 256 per rank, others 256)",
    "max_num_batched_tokens": "token budget of one step (default: the platform's for the "
                              "server or the offline LLM: cpu 2048 / 4096 per rank, others "
                              "2048; at least max_model_len without chunked prefill)",
    "kv_cache_memory": "bytes for the KV cache per rank, e.g. 512MiB, 4GiB (default: "
                       "platform's)",
    "kv_cache_memory_bytes": "vLLM's name of --kv-cache-memory, read as vLLM reads it: "
                             "4G = 4 GiB, 4g = 4e9 bytes (give one of the two)",
    "num_kv_blocks": "exact number of KV blocks (overrides the memory-based size)",
    "num_gpu_blocks_override": "vLLM's name of --num-kv-blocks",
    "long_prefill_token_threshold": "vLLM's: prefill a longer prompt at most this many tokens "
                                    "a step (0: no cap)",
    "gpu_memory_utilization": "fraction of device memory the engine may use",
    "swap_space": "GiB of host memory per rank that preempted requests' KV is swapped to "
    "(0, or when full: preempt by recompute)",
    "seed": "random seed",
    "load_format": f"weights format: {', '.join(LOAD_FORMATS)}",
    "device": "device platform plugin (cpu, cuda, npu, ...; auto picks the best available)",
    "attention_backend": "attention backend plugin (default: the platform's)",
    "attention_backend_options": "JSON object of options for the attention backend",
    "quantization": "quantization method plugin (e.g. the checkpoint's quant_method)",
    "guided_decoding_backend": "default guided-decoding backend plugin (auto: first available)",
    "structured_outputs_config": "vLLM's newer form of --guided-decoding-backend: "
                                 "'{\"backend\": \"xgrammar\"}'; also takes "
                                 "reasoning_parser and enable_in_reasoning (the grammar "
                                 "constrains the reasoning too)",
    "reasoning_parser": "reasoning parser plugin (deepseek_r1, qwen3, ...): chat responses "
                        "carry the model's reasoning as reasoning (and reasoning_content) "
                        "apart from its answer, and structured output constrains a chat's "
                        "answer only",
    "distributed_executor_backend": "executor plugin: uni, mp, ray (default: uni for one "
    "rank; for more, ray when Ray is installed, otherwise mp)",
    "tensor_parallel_size": "number of tensor-parallel ranks (each layer split over them)",
    "pipeline_parallel_size": "number of pipeline stages (the layers split over them)",
    "data_parallel_size": "vLLM's data parallelism: this many engines of the model behind one "
    "server, each with -tp x -pp workers of its own and its own KV cache; a request goes to "
    "the engine with the fewest sequences in flight (max-num-seqs and max-waiting-requests "
    "apply per engine; the offline LLM runs one)",
    "data_parallel_backend": "what runs each data-parallel engine's workers: mp (child "
    "processes on this machine) or ray",
    "logprobs_mode": "what logprobs report: raw_logprobs (the model's), raw_logits, "
                     "processed_logprobs or processed_logits (after penalties, temperature, "
                     "top-k / top-p / min-p: what the draw used); vLLM's",
    "max_logprobs": "most logprobs a request may ask for (-1: no limit)",
    "generation_config": "default sampling parameters: auto (from the model's "
                         "generation_config.json: a request's unset temperature, top_p, top_k, "
                         "min_p, repetition_penalty take its values, and max_new_tokens caps "
                         "max_tokens), vllm (none), or a folder holding a generation_config.json",
    "override_generation_config": "JSON object laid over the generation config's sampling "
                                  "fields, e.g. '{\"temperature\": 0.5}'",
    "cudagraph_capture_sizes": "decode batch sizes captured as graphs, e.g. 1 2 4 8 16 (a "
                               "batch runs padded to the next; default: 1, 2, 4, then every "
                               "8th to 256, every 16th beyond, up to the largest)",
    "max_cudagraph_capture_size": "the largest decode batch captured (default: the "
                                  "platform's: cuda 256, cpu 64)",
    "compilation_config": "vLLM's JSON: its cudagraph_capture_sizes, "
                          "max_cudagraph_capture_size and cudagraph_mode (NONE: "
                          "--enforce-eager) are taken; torch.compile's keys are accepted "
                          "and unused (IronLM compiles nothing)",
    "enforce_eager": "never capture device graphs",
    "kv_cache_dtype": "KV-cache dtype (auto: the model dtype)",
    "speculative_model": "draft model (HF folder or GGUF sharing the tokenizer), or \"[ngram]\" "
                         "for prompt lookup, or \"[name]\" of another speculative proposer plugin",
    "num_speculative_tokens": "tokens to draft per step (required with --speculative-model)",
    "speculative_max_model_len": "no speculation for sequences longer than this (None: the "
                                 "draft's and the target's context length)",
    "speculative_disable_by_batch_size": "no speculation while this many requests run",
    "ngram_prompt_lookup_max": "[ngram]: longest suffix looked up in the request (required)",
    "ngram_prompt_lookup_min": "[ngram]: shortest suffix looked up (None: 1)",
    "speculative_config": "vLLM's JSON form of the speculative flags, e.g. "
                          "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                          "\"prompt_lookup_max\": 3}' or '{\"model\": DRAFT, "
                          "\"num_speculative_tokens\": 4}'; keys: method, model, "
                          "num_speculative_tokens, max_model_len, disable_by_batch_size, "
                          "prompt_lookup_max, prompt_lookup_min",
    "num_scheduler_steps": "the maximum number of forward steps per scheduler call",
    "stream_interval": "vLLM's: a streamed request's chunks come with its first token, then "
                       "once per this many tokens, and at its end (1: every token)",
    "worker_extension_cls": "vLLM's: module.Class whose methods collective_rpc runs on every "
                            "worker with the worker as self (POST /collective_rpc with "
                            "VLLM_SERVER_DEV_MODE=1)",
    "enable_sleep_mode": "vLLM's sleep mode: LLM.sleep(level) / wake_up(tags) offline; POST "
                         "/sleep?level=1|2, POST /wake_up[?tags=weights|kv_cache], GET "
                         "/is_sleeping on the server",
    "enable_prompt_embeds": "vLLM's: accept prompts as embeddings (offline {\"prompt_embeds\": "
                            "tensor}; the Completions API's prompt_embeds, base64 of "
                            "torch.save's bytes); for trusted clients",
    "logits_processors": "vLLM's custom logits processors: LogitsProcessor classes as "
                         "module:Class (or module.Class), or names a plugin registered; "
                         "requests pass their settings in vllm_xargs",
    "kv_transfer_config": "vLLM's KV transfer (disaggregated prefill), e.g. "
                          "'{\"kv_connector\": \"ExampleConnector\", \"kv_role\": "
                          "\"kv_both\", \"kv_connector_extra_config\": "
                          "{\"shared_storage_path\": \"/tmp/kv\"}}': kv_producer stores the "
                          "prompt blocks it computes, kv_consumer loads them; "
                          "kv_load_failure_policy fail (default) or recompute",
    "enable_lora": "serve LoRA adapters (--lora-modules, requests naming an adapter)",
    "max_loras": "most adapters that run in one batch step (requests of others wait)",
    "max_lora_rank": "highest adapter rank accepted",
    "max_cpu_loras": "adapters kept loaded, least recently used evicted (default: max_loras)",
    "lora_dtype": "dtype of adapter weights: auto (the model's), float32, float16, bfloat16",
    "lora_extra_vocab_size": "tokens an adapter may add (vLLM's flag; adapters that add tokens "
    "are refused)",
}
_SIZE_FIELDS = {"kv_cache_memory"}
# fields set only through another argument's JSON (structured_outputs_config): no flag
NO_FLAG_FIELDS = {"structured_outputs_enable_in_reasoning", "data_parallel_rank"}
# a class field named on the command line by vLLM's "module.Class" string
_CLASS_FIELDS = {"worker_extension_cls"}
# vLLM's integer flags that take 1k (1000) or 1K (1024) style values
# (max_model_len takes them too, and auto: _length_or_auto)
_HUMAN_INT_FIELDS = {"max_num_batched_tokens", "kv_cache_memory_bytes"}
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"^\s*([0-9.]+)\s*([kmgt]?)(i?b?)\s*$", re.I)


def parse_size(text: str) -> int:
    """Bytes from '1073741824', '512MiB', '4G', '2GB' (binary units, as vLLM's GiB flags)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512MiB, 4GiB)")
    factor = 1024 ** ("kmgt".find(m.group(2).lower()) + 1) if m.group(2) else 1
    return int(float(m.group(1)) * factor)


def human_readable_int(text: str) -> int:
    """vLLM's integers: '2048', '1k' = 1000, '25.6k' = 25600, '1K' = 1024 (a binary suffix
    takes no decimals)."""
    m = _HUMAN_INT.fullmatch(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r} (e.g. 2048, 2k, 2K)")
    number, suffix = m.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError(
            f"{text!r}: decimals go with a decimal suffix only (k, m, g, t), e.g. "
            f"{number}{suffix.lower()}")
    return int(number) * _BINARY.get(suffix, 1)


def _length_or_auto(text: str) -> int:
    """--max-model-len: a human-readable integer, or "auto" / -1 (vLLM: the longest context
    the KV cache holds, when that is less than the model's)."""
    return -1 if text.strip().lower() in ("auto", "-1") else human_readable_int(text)


def json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


# flags that take one of a few names (argparse's "invalid choice" error, as vLLM's)
FLAG_CHOICES: dict[str, tuple[str, ...]] = {"logprobs_mode": LOGPROBS_MODES,
                                            "data_parallel_backend": DATA_PARALLEL_BACKENDS,
                                            "prefix_caching_hash_algo": PREFIX_CACHING_HASH_ALGOS}

# vLLM's short aliases of engine flags.
SHORT_FLAGS: dict[str, str] = {"tensor_parallel_size": "-tp", "pipeline_parallel_size": "-pp",
                               "data_parallel_size": "-dp", "data_parallel_backend": "-dpb",
                               "quantization": "-q", "compilation_config": "-cc"}


def add_engine_args(
    group: argparse.ArgumentParser | argparse._ArgumentGroup, skip: Collection[str] = ("model",)
) -> None:
    """Add a flag for every EngineConfig field not in ``skip`` (the caller adds those its own
    way: ``serve`` takes the model as a positional too and shows ``disable_log_stats`` with its
    logging flags)."""
    hints = typing.get_type_hints(EngineConfig)
    for f in fields(EngineConfig):
        if f.name in skip or f.name in NO_FLAG_FIELDS:
            continue
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        base = hint  # X | None -> X
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            base = next(a for a in typing.get_args(hint) if a is not type(None))
        default = f.default if f.default is not MISSING else None
        help_text = ENGINE_HELP.get(f.name, f"engine argument {f.name}")
        help_text += " (default: %(default)s)"
        if base is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                               help=help_text)
        elif f.name in _CLASS_FIELDS:
            group.add_argument(flag, type=str, default=default, help=help_text)
        elif f.name in _SIZE_FIELDS:
            group.add_argument(flag, type=parse_size, default=default, help=help_text)
        elif f.name == "max_model_len":
            group.add_argument(flag, type=_length_or_auto, default=default, help=help_text)
        elif f.name in _HUMAN_INT_FIELDS:
            group.add_argument(flag, type=human_readable_int, default=default, help=help_text)
        elif typing.get_origin(base) is list:  # space-separated values: list[int], or names
            item = int if typing.get_args(base) == (int,) else str
            group.add_argument(flag, type=item, nargs="+", default=default, help=help_text)
        elif typing.get_origin(base) is dict or base is dict:
            names = [flag] + ([SHORT_FLAGS[f.name]] if f.name in SHORT_FLAGS else [])
            group.add_argument(*names, type=json_object, default=None, help=help_text)
        elif base in (int, float, str):
            names = [flag] + ([SHORT_FLAGS[f.name]] if f.name in SHORT_FLAGS else [])
            group.add_argument(*names, type=base, default=default, help=help_text,
                               choices=FLAG_CHOICES.get(f.name))  # fmt: skip
        else:
            raise TypeError(f"EngineConfig.{f.name}: no flag type for {hint!r}")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig keyword arguments (all but ``model``) from the parsed flags: every field
    the namespace has; a dict field left unset keeps its factory default."""
    out: dict[str, Any] = {}
    for f in fields(EngineConfig):
        if f.name == "model" or not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        if value is None and f.default_factory is not MISSING:
            continue
        out[f.name] = value
    return out
