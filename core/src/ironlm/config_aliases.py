"""vLLM's newer spellings of engine arguments, folded into the fields EngineConfig runs on.

vLLM renamed some arguments over its releases: ``kv_cache_memory_bytes`` is its name for the
KV budget per rank, ``num_gpu_blocks_override`` for the exact number of KV blocks, and ``speculative_config`` (a JSON object on the command line) replaced
the ``--speculative-model`` family of flags. Users copy either form from vLLM's docs, so both
are taken; each alias is moved into the older field and cleared, which keeps
``EngineConfig.__post_init__`` (run again by every ``dataclasses.replace``) idempotent.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ironlm.config import EngineConfig

log = logging.getLogger("ironlm.config")

# speculative_config keys and the EngineConfig field each one sets
_SPEC_FIELDS = {
    "num_speculative_tokens": "num_speculative_tokens",
    "max_model_len": "speculative_max_model_len",
    "disable_by_batch_size": "speculative_disable_by_batch_size",
    "prompt_lookup_max": "ngram_prompt_lookup_max",
    "prompt_lookup_min": "ngram_prompt_lookup_min",
}
_OLD_SPEC_FIELDS = ("speculative_model", *_SPEC_FIELDS.values())


def apply_vllm_aliases(cfg: EngineConfig) -> None:
    """Move the aliases ``cfg`` was given into their fields and clear them (ValueError when
    both forms are given, or for a value IronLM cannot honour)."""
    for name in ("kv_cache_memory", "kv_cache_memory_bytes"):
        value = getattr(cfg, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} takes a number of bytes (an int), got {value!r}; the "
                            "command line's --kv-cache-memory reads sizes such as 512MiB")
    if cfg.kv_cache_memory_bytes is not None:
        if cfg.kv_cache_memory is not None:
            raise ValueError("give kv_cache_memory or kv_cache_memory_bytes (vLLM's name of "
                             "the same budget), not both")
        cfg.kv_cache_memory, cfg.kv_cache_memory_bytes = cfg.kv_cache_memory_bytes, None
    if cfg.num_gpu_blocks_override is not None:
        if cfg.num_kv_blocks is not None:
            raise ValueError("give num_kv_blocks or num_gpu_blocks_override (vLLM's name of "
                             "the same override), not both")
        cfg.num_kv_blocks, cfg.num_gpu_blocks_override = cfg.num_gpu_blocks_override, None
    if cfg.speculative_config is not None:
        _apply_speculative_config(cfg, cfg.speculative_config)
        cfg.speculative_config = None
    if cfg.structured_outputs_config is not None:
        _apply_structured_outputs_config(cfg, cfg.structured_outputs_config)
        cfg.structured_outputs_config = None
    if cfg.compilation_config is not None:
        _apply_compilation_config(cfg, cfg.compilation_config)
        cfg.compilation_config = None


# compilation_config keys of vLLM's torch.compile (IronLM compiles nothing: accepted, logged)
_COMPILE_ONLY = frozenset({
    "level", "mode", "backend", "custom_ops", "splitting_ops", "use_inductor",
    "compile_sizes", "inductor_compile_config", "inductor_passes", "pass_config",
    "debug_dump_path", "cache_dir", "local_cache_dir", "compile_cache_save_format",
    "use_inductor_graph_partition", "cudagraph_num_of_warmups", "cudagraph_copy_inputs",
    "cudagraph_specialize_lora", "full_cuda_graph", "use_cudagraph", "dynamic_shapes_config",
    "compile_ranges_split_points", "compile_mm_encoder",
})  # fmt: skip
# vLLM's cudagraph modes; IronLM's graphs are full graphs of pure decode steps (prefill and
# mixed steps run eagerly), so every mode but NONE gives those
_CUDAGRAPH_MODES = frozenset({"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY",
                              "FULL_AND_PIECEWISE"})
# the integer values of vLLM's CUDAGraphMode enum (JSON may give those; the two combined
# modes' values are pairs, spelt by name only)
_CUDAGRAPH_MODE_VALUES = {0: "NONE", 1: "PIECEWISE", 2: "FULL"}


def _apply_compilation_config(cfg: EngineConfig, cc: dict[str, Any]) -> None:
    """vLLM's compilation_config: capture sizes onto the graph fields, cudagraph_mode NONE
    onto enforce_eager; torch.compile's keys are accepted and logged as unused."""
    if not isinstance(cc, dict):
        raise ValueError(f"compilation_config must be a JSON object, got {cc!r}")
    graph_keys = {"cudagraph_capture_sizes", "max_cudagraph_capture_size", "cudagraph_mode"}
    unknown = sorted(set(cc) - graph_keys - _COMPILE_ONLY)
    if unknown:
        raise ValueError(f"compilation_config keys {unknown} are not supported; IronLM takes "
                         f"{sorted(graph_keys)} (and accepts torch.compile's, unused)")
    unused = sorted(set(cc) & _COMPILE_ONLY)
    if unused:
        log.warning("compilation_config %s unused: IronLM compiles nothing", unused)
    for key in ("cudagraph_capture_sizes", "max_cudagraph_capture_size"):
        if cc.get(key) is not None:
            if getattr(cfg, key) is not None:
                raise ValueError(f"compilation_config's {key} and {key} given: use one form")
            if key == "cudagraph_capture_sizes" and not isinstance(cc[key], list):
                raise ValueError(f"compilation_config cudagraph_capture_sizes must be a list "
                                 f"of batch sizes, got {cc[key]!r}")
            setattr(cfg, key, cc[key])
    mode = cc.get("cudagraph_mode")
    if mode is not None:
        name = _CUDAGRAPH_MODE_VALUES.get(mode, str(mode).upper()) \
            if not isinstance(mode, bool) else str(mode)
        if name not in _CUDAGRAPH_MODES:
            raise ValueError(f"compilation_config cudagraph_mode {mode!r} is not one of "
                             f"{sorted(_CUDAGRAPH_MODES)}")
        if name == "NONE":
            cfg.enforce_eager = True


# StructuredOutputsConfig options and the value that leaves them off (vLLM's defaults); a
# request may still ask for disable_* itself (structured_outputs options)
_STRUCTURED_DEFAULTS: dict[str, Any] = {
    "disable_fallback": False, "disable_any_whitespace": False,
    "disable_additional_properties": False,
}


def _apply_structured_outputs_config(cfg: EngineConfig, so: dict[str, Any]) -> None:
    """vLLM's structured_outputs_config: its ``backend`` is guided_decoding_backend, its
    ``reasoning_parser`` the engine's, ``enable_in_reasoning`` lets the grammar constrain the
    reasoning too; its other options are taken at their defaults only (IronLM applies them per
    request)."""
    if not isinstance(so, dict):
        raise ValueError(f"structured_outputs_config must be a JSON object, got {so!r}")
    unknown = sorted(set(so) - {"backend", "reasoning_parser", "enable_in_reasoning",
                                *_STRUCTURED_DEFAULTS})
    changed = sorted(k for k, v in so.items() if k in _STRUCTURED_DEFAULTS
                     and v != _STRUCTURED_DEFAULTS[k])
    if unknown or changed:
        raise ValueError(
            f"structured_outputs_config {unknown + changed} not supported: IronLM takes "
            "'backend' here; disable_fallback, disable_any_whitespace and "
            "disable_additional_properties go in each request's structured_outputs options"
        )
    if not isinstance(so.get("backend", "auto"), str):
        raise ValueError(f"structured_outputs_config backend must be a name, got "
                         f"{so['backend']!r}")
    if so.get("backend", "auto") != "auto":
        if cfg.guided_decoding_backend != "auto":
            raise ValueError("structured_outputs_config's backend and guided_decoding_backend "
                             "given: use one form")
        cfg.guided_decoding_backend = so["backend"]
    parser = so.get("reasoning_parser") or None  # vLLM's default is "": none
    if parser is not None:
        if not isinstance(parser, str):
            raise ValueError(f"structured_outputs_config reasoning_parser must be a name, got "
                             f"{parser!r}")
        if cfg.reasoning_parser not in (None, parser):
            raise ValueError("structured_outputs_config's reasoning_parser and reasoning_parser "
                             "name different parsers: use one form")
        cfg.reasoning_parser = parser
    if "enable_in_reasoning" in so:
        in_reasoning = so["enable_in_reasoning"]
        if not isinstance(in_reasoning, bool):
            raise ValueError(f"structured_outputs_config enable_in_reasoning must be true or "
                             f"false, got {in_reasoning!r}")
        if cfg.structured_outputs_enable_in_reasoning and not in_reasoning:
            raise ValueError("structured_outputs_config's enable_in_reasoning and "
                             "structured_outputs_enable_in_reasoning differ: use one form")
        cfg.structured_outputs_enable_in_reasoning = in_reasoning


def _apply_speculative_config(cfg: EngineConfig, spec: dict[str, Any]) -> None:
    """vLLM's speculative_config onto the speculative fields. ``method``: "ngram" (also the
    model "ngram" / "[ngram]"), "draft_model" or absent with a ``model`` path (a draft model),
    or another proposer plugin's name. As vLLM: an ngram config without prompt_lookup_min /
    max takes 5 for both, and one given alone stands for the other too."""
    if not isinstance(spec, dict):
        raise ValueError(f"speculative_config must be a JSON object, got {spec!r}")
    given = [name for name in _OLD_SPEC_FIELDS if getattr(cfg, name) is not None]
    if given:
        raise ValueError(f"speculative_config and {', '.join(given)} given: use one form")
    unknown = sorted(set(spec) - {"method", "model", *_SPEC_FIELDS})
    if unknown:
        raise ValueError(
            f"speculative_config keys {unknown} are not supported; IronLM takes method, model, "
            f"{', '.join(_SPEC_FIELDS)}"
        )
    method, model = spec.get("method"), spec.get("model")
    if method is None and model in ("ngram", "[ngram]"):
        method, model = "ngram", None
    if method in ("ngram", "[ngram]"):
        if model is not None:
            raise ValueError("speculative_config: method 'ngram' takes no model")
        cfg.speculative_model = "[ngram]"
        lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
        if lo is None and hi is None:
            lo = hi = 5
        spec = {**spec, "prompt_lookup_min": hi if lo is None else lo,
                "prompt_lookup_max": lo if hi is None else hi}
    elif method in (None, "draft_model"):
        if not isinstance(model, str) or not model:
            raise ValueError("speculative_config needs a draft 'model' path (method "
                             "'draft_model'), or method 'ngram'")
        cfg.speculative_model = model
    else:  # a proposer plugin by name; the engine lists the names it has when none matches
        if model is not None:
            raise ValueError(f"speculative_config: method {method!r} takes no model here "
                             "(IronLM's proposer plugins are named by method alone)")
        cfg.speculative_model = f"[{method}]"
    for key, name in _SPEC_FIELDS.items():
        if spec.get(key) is not None:
            setattr(cfg, name, spec[key])
