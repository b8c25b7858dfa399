"""Flags of ``ironlm serve`` / ``python -m ironlm.entrypoints.openai.api_server``.

vLLM's names and defaults. Every EngineConfig field becomes ``--kebab-case`` (generated from
the dataclass, so a new engine argument is a new flag); the front end's flags are listed here.
"""

from __future__ import annotations

import argparse
import json
import re
import ssl
import types
import typing
from dataclasses import MISSING, fields
from typing import Any

from ironlm.config import LOAD_FORMATS, EngineConfig
from ironlm.entrypoints.openai.lora_modules import parse_lora_module

# Help per engine argument (fields missing here still get a flag, with a generic help).
_ENGINE_HELP: dict[str, str] = {
    "model": "HF folder, GGUF file, or model name to serve (same as the positional MODEL)",
    "tokenizer": "tokenizer folder or name (default: the model's)",
    "trust_remote_code": "trust remote code of the model's HF config",
    "dtype": "compute dtype: auto, float32, float16, bfloat16 (and half, float)",
    "max_model_len": "context length (default: the model's max_position_embeddings)",
    "block_size": "tokens per KV-cache block",
    "enable_prefix_caching": "reuse KV blocks of shared prompt prefixes",
    "enable_chunked_prefill": "split long prefills across steps",
    "max_num_seqs": "most sequences in one batch",
    "max_num_batched_tokens": "token budget of one step (default: 2048 with chunked prefill)",
    "kv_cache_memory": "bytes for the KV cache, e.g. 512MiB, 4GiB (default: platform's)",
    "num_kv_blocks": "exact number of KV blocks (overrides the memory-based size)",
    "gpu_memory_utilization": "fraction of device memory the engine may use",
    "swap_space": "GiB of host swap for preempted KV (IronLM preempts by recompute: 0)",
    "seed": "random seed",
    "load_format": f"weights format: {', '.join(LOAD_FORMATS)}",
    "device": "device platform plugin (cpu, cuda, npu, ...; auto picks the best available)",
    "attention_backend": "attention backend plugin (default: the platform's)",
    "attention_backend_options": "JSON object of options for the attention backend",
    "quantization": "quantization method plugin (e.g. the checkpoint's quant_method)",
    "guided_decoding_backend": "default guided-decoding backend plugin (auto: first available)",
    "distributed_executor_backend": "executor plugin: uni, mp, ray (default: uni for TP 1)",
    "tensor_parallel_size": "number of tensor-parallel workers",
    "max_logprobs": "most logprobs a request may ask for",
    "enforce_eager": "never capture device graphs",
    "kv_cache_dtype": "KV-cache dtype (auto: the model dtype)",
    "enable_lora": "serve LoRA adapters (--lora-modules, requests naming an adapter)",
    "max_loras": "most adapters that run in one batch step (requests of others wait)",
    "max_lora_rank": "highest adapter rank accepted",
    "max_cpu_loras": "adapters kept loaded, least recently used evicted (default: max_loras)",
    "lora_dtype": "dtype of adapter weights: auto (the model's), float32, float16, bfloat16",
    "lora_extra_vocab_size": "tokens an adapter may add (vLLM's flag; adapters that add tokens "
    "are refused)",
}
# Engine fields shown in another group, with the server's default.
_FRONTEND_OWNED = {"disable_log_stats"}
_SIZE = re.compile(r"^\s*([0-9.]+)\s*([kmgt]?)(i?b?)\s*$", re.I)


def parse_size(text: str) -> int:
    """Bytes from '1073741824', '512MiB', '4G', '2GB' (binary units, as vLLM's GiB flags)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512MiB, 4GiB)")
    factor = 1024 ** ("kmgt".find(m.group(2).lower()) + 1) if m.group(2) else 1
    return int(float(m.group(1)) * factor)


def _json_list(text: str) -> list[str]:
    value = json.loads(text)
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError(f"expected a JSON list, got {text!r}")
    return value


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _add_engine_args(group: argparse._ArgumentGroup) -> None:
    hints = typing.get_type_hints(EngineConfig)
    for f in fields(EngineConfig):
        if f.name in _FRONTEND_OWNED or f.name == "model":
            continue
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        base = hint  # X | None -> X
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            base = next(a for a in typing.get_args(hint) if a is not type(None))
        default = f.default if f.default is not MISSING else None
        help_text = _ENGINE_HELP.get(f.name, f"engine argument {f.name}")
        help_text += " (default: %(default)s)"
        if base is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                               help=help_text)
        elif f.name == "kv_cache_memory":
            group.add_argument(flag, type=parse_size, default=default, help=help_text)
        elif typing.get_origin(base) is dict or base is dict:
            group.add_argument(flag, type=_json_object, default=None, help=help_text)
        elif base in (int, float, str):
            group.add_argument(flag, type=base, default=default, help=help_text)
        else:
            raise TypeError(f"EngineConfig.{f.name}: no flag type for {hint!r}")


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("model_tag", nargs="?", metavar="MODEL",
                        help="HF folder or GGUF file to serve (or use --model)")
    srv = parser.add_argument_group("server")
    srv.add_argument("--host", default=None, help="bind address (default: all interfaces)")
    srv.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    srv.add_argument("--uvicorn-log-level", default="info",
                     choices=["debug", "info", "warning", "error", "critical", "trace"])
    srv.add_argument("--root-path", default=None,
                     help="path prefix when the server runs behind a path-based proxy")
    srv.add_argument("--ssl-keyfile", default=None, help="SSL key file")
    srv.add_argument("--ssl-certfile", default=None, help="SSL certificate file")
    srv.add_argument("--ssl-ca-certs", default=None, help="CA certificates file")
    srv.add_argument("--ssl-cert-reqs", type=int, default=int(ssl.CERT_NONE),
                     help="whether a client certificate is required (see ssl module; "
                     "default: %(default)s)")
    srv.add_argument("--middleware", action="append", default=[],
                     help="import path of an ASGI middleware class or an async "
                     "`f(request, call_next)` to add (repeatable)")
    srv.add_argument("--max-request-body-size", type=parse_size, default=32 * 1024**2,
                     help="larger request bodies get 413 (IronLM; default: 32MiB)")
    srv.add_argument("--max-waiting-requests", type=int, default=1024,
                     help="more waiting requests than this get 503 (IronLM; default: "
                     "%(default)s)")
    srv.add_argument("--disable-fastapi-docs", action="store_true",
                     help="disable /docs, /redoc and /openapi.json")
    srv.add_argument("--lora-modules", type=parse_lora_module, nargs="+", action="extend",
                     default=None, metavar="NAME=PATH|JSON",
                     help='LoRA adapters to serve (needs --enable-lora): name=path, or JSON '
                     '{"name": ..., "path": ..., "base_model_name": ...}')
    cors = parser.add_argument_group("CORS")
    cors.add_argument("--allow-credentials", action="store_true", help="allow credentials")
    cors.add_argument("--allowed-origins", type=_json_list, default=["*"],
                      help='JSON list of allowed origins (default: ["*"])')
    cors.add_argument("--allowed-methods", type=_json_list, default=["*"],
                      help='JSON list of allowed methods (default: ["*"])')
    cors.add_argument("--allowed-headers", type=_json_list, default=["*"],
                      help='JSON list of allowed headers (default: ["*"])')
    api = parser.add_argument_group("OpenAI API")
    api.add_argument("--api-key", default=None,
                     help="require this key (Bearer) on /v1/* and /generate; also read from "
                     "IRONLM_API_KEY")
    api.add_argument("--served-model-name", nargs="+", default=None,
                     help="model name(s) the API accepts; the first is reported in responses "
                     "(default: --model)")
    api.add_argument("--chat-template", default=None,
                     help="chat template file, or the template text itself")
    api.add_argument("--response-role", default="assistant",
                     help="role of generated chat messages when add_generation_prompt is true")
    api.add_argument("--return-tokens-as-token-ids", action="store_true",
                     help="show logprob tokens as 'token_id:<id>'")
    tools = parser.add_argument_group("tool calling")
    tools.add_argument("--enable-auto-tool-choice", action="store_true",
                       help='allow tool_choice "auto" (needs --tool-call-parser)')
    tools.add_argument("--tool-call-parser", default=None,
                       help="tool-call parser plugin (hermes, mistral, llama3_json, ...)")
    tools.add_argument("--tool-parser-plugin", default="",
                       help="a Python file registering tool parsers via register_tool_parsers")
    logs = parser.add_argument_group("logging")
    logs.add_argument("--max-log-len", type=int, default=None,
                      help="log at most this many prompt characters / token ids")
    logs.add_argument("--disable-log-requests", action="store_true", help="do not log requests")
    logs.add_argument("--disable-log-stats", action=argparse.BooleanOptionalAction,
                      default=False, help="do not log engine stats every 10 s")
    eng = parser.add_argument_group("engine")
    eng.add_argument("--model", default=None, help=_ENGINE_HELP["model"])
    _add_engine_args(eng)
    return parser


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from the parsed flags (ValueError for a missing model or a bad value)."""
    model = args.model_tag or args.model
    if not model:
        raise ValueError("a model is required: ironlm serve MODEL (or --model MODEL)")
    kwargs: dict[str, Any] = {"model": model}
    for f in fields(EngineConfig):
        if f.name != "model" and hasattr(args, f.name):
            value = getattr(args, f.name)
            if f.name == "attention_backend_options" and value is None:
                continue
            kwargs[f.name] = value
    return EngineConfig(**kwargs)


def make_parser(prog: str = "ironlm serve") -> argparse.ArgumentParser:
    return make_arg_parser(argparse.ArgumentParser(
        prog=prog, description="OpenAI-compatible server of IronLM",
    ))
