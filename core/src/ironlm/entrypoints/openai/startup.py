"""Start-up checks: every flag is either honoured or rejected here with a clear message.

Selections are made by name through the plugin manager before the model loads, so a wrong
``--device``, ``--attention-backend``, ``--quantization``, ``--tool-call-parser``, ... fails in
a second with the list of what is installed, instead of after minutes of loading.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path

from ironlm.config import EngineConfig
from ironlm.engine.tokenizer_extension import load_tokenizer_extension
from ironlm.entrypoints.openai.chat_prompt import reserved_kwargs
from ironlm.interfaces.platform import Platform
from ironlm.plugin_manager import PluginManager
from ironlm.python_file import import_python_file

log = logging.getLogger("ironlm.server")


class StartupError(ValueError):
    """A flag the server cannot honour (the message says why and what to do)."""


def load_plugin_file(pm: PluginManager, path: str, flag: str, hook: str) -> None:
    """--tool-parser-plugin / --reasoning-parser-plugin FILE: a single-file plugin that
    implements ``hook``, registered before the engine starts (so the engine sees it too)."""
    try:
        module = import_python_file(path, flag)
    except ValueError as exc:
        raise StartupError(str(exc)) from exc
    if not hasattr(module, hook):
        raise StartupError(
            f"{flag} {path!r} defines no {hook} hook (decorate it with @ironlm.hookimpl)"
        )
    # one name per file: a file given to both plugin flags registers once
    pm.register(module, name=f"plugin-file:{Path(path).resolve()}")
    pm.registries  # collect now: a broken plugin fails at start, naming itself


def preflight(pm: PluginManager, config: EngineConfig, platform: Platform,
              args: argparse.Namespace) -> None:
    """Select every named plugin once; UnknownNameError / UnavailableError carry the lists."""
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        installed = ", ".join(pm.registries.tool_parsers.names()) or "none"
        raise StartupError("--enable-auto-tool-choice requires --tool-call-parser "
                           f"(installed parsers: {installed})")
    if args.tool_call_parser:
        pm.select_tool_parser(args.tool_call_parser)
    if config.reasoning_parser:
        pm.select_reasoning_parser(config.reasoning_parser)
    pm.select_executor(config.distributed_executor_backend or "uni")
    if config.world_size > 1 and config.distributed_executor_backend == "uni":
        raise StartupError(
            f"--tensor-parallel-size {config.tensor_parallel_size} x --pipeline-parallel-size "
            f"{config.pipeline_parallel_size} needs a multi-worker executor "
            "(--distributed-executor-backend mp or ray); 'uni' runs one worker"
        )
    pm.select_attention_backend(config.attention_backend, platform)
    try:
        pm.check_kv_cache_dtype(config.kv_cache_dtype, config.attention_backend, platform)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    if config.quantization:
        pm.select_quantization(config.quantization, platform)
    if config.guided_decoding_backend != "auto":
        pm.select_guided_backend(config.guided_decoding_backend)
    if config.tokenizer_extension_path is not None:
        # file and function are checked before the model loads; the call runs in the engine
        load_tokenizer_extension(config.tokenizer_extension_path)
    if getattr(args, "lora_modules", None) and not config.enable_lora:
        raise StartupError("--lora-modules needs --enable-lora")
    if args.disable_log_requests:
        log.warning("--disable-log-requests is deprecated (as in vLLM): requests are logged "
                    "only with --enable-log-requests")
    reserved = reserved_kwargs(args.default_chat_template_kwargs or {})
    if reserved:
        raise StartupError(f"--default-chat-template-kwargs: {reserved} are parameters of "
                           "the chat template call, set by each request")


def check_api_keys(args: argparse.Namespace) -> None:
    """The listening server's keys: --api-key, else IRONLM_API_KEY / VLLM_API_KEY; a blank one
    is refused (it would let an empty bearer token through)."""
    if args.api_key is not None and not all(key.strip() for key in args.api_key):
        raise StartupError("--api-key must not be empty")
    for env in ("IRONLM_API_KEY", "VLLM_API_KEY"):
        value = os.environ.get(env)
        if value is not None and value and not value.strip():  # "" is unset, as in vLLM
            raise StartupError(f"{env} is blank: set a key, or unset it to serve without one")


def bind_unix_socket(path: str) -> socket.socket:
    """--uds (vLLM's): the server's Unix domain socket at ``path``, bound before the engine
    starts as bind_server_socket's; a stale socket file there is replaced, anything else is
    refused (OSError)."""
    target = Path(path)
    if target.is_socket():
        target.unlink()
    elif target.exists():
        raise OSError(f"--uds {path}: exists and is not a socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {path}: {exc.strerror}") from exc
    target.chmod(0o666)  # as uvicorn leaves its own: any local user may connect
    return sock


def bind_server_socket(host: str, port: int) -> socket.socket:
    """The HTTP server's socket, bound before the engine starts: the engine's workers and
    their process groups (gloo, Ray) take ephemeral ports while it loads, and one of them could
    take a free port the server had not bound yet (a test picking a free port hit this with
    ``-pp 2``; vLLM binds first for the same reason). A port in use fails here, in a second,
    instead of after the model has loaded (OSError: the CLI prints it, exit status 2)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    return sock
