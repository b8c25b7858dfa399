"""The OpenAI-compatible HTTP server: ``build_app`` (FastAPI app over a running AsyncEngine,
its routes from ``routes``) and ``run_server`` (flags -> engine -> uvicorn). Also ``python -m
ironlm.entrypoints.openai.api_server MODEL [flags]``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from ironlm import __version__
from ironlm.config import EngineConfig
from ironlm.contract_version import PluginContractError
from ironlm.engine.async_engine import AsyncEngine, EngineDeadError
from ironlm.engine.data_parallel import DataParallelEngine
from ironlm.engine.engine_client import EngineClient
from ironlm.engine.llm_engine import LLMEngine
from ironlm.entrypoints.chat_utils import load_chat_template
from ironlm.entrypoints.openai import serving_models
from ironlm.entrypoints.openai.access_log import AccessLogFilter, excluded_paths
from ironlm.entrypoints.openai.argv_expansion import expand_argv
from ironlm.entrypoints.openai.cli_args import engine_config_from_args, make_parser
from ironlm.entrypoints.openai.errors import install_error_handlers
from ironlm.entrypoints.openai.metrics import log_stats_forever
from ironlm.entrypoints.openai.middleware import (
    APIKeyMiddleware,
    BodySizeLimitMiddleware,
    LoadCounter,
    LoadTrackingMiddleware,
    RequestIdHeaderMiddleware,
    load_middleware,
)
from ironlm.entrypoints.openai.request_body import parse_body
from ironlm.entrypoints.openai.routes import (
    lora_router,
    metrics_router,
    router,
    tokenizer_info_router,
)
from ironlm.entrypoints.openai.serving_dev import DEV_MODE_ENV, dev_mode, dev_router
from ironlm.entrypoints.openai.shutdown import DrainingServer
from ironlm.entrypoints.openai.ssl_refresh import CertificateWatcher
from ironlm.entrypoints.openai.startup import (
    StartupError,
    bind_server_socket,
    bind_unix_socket,
    check_api_keys,
    load_plugin_file,
    preflight,
)
from ironlm.entrypoints.openai.state import ServerOptions, ServerState
from ironlm.interfaces.platform import Platform
from ironlm.plugin_manager import PluginManager
from ironlm.registry import PluginClashError

log = logging.getLogger("ironlm.server")


# -- the app -------------------------------------------------------------------------------
def server_options(args: argparse.Namespace, model: str) -> ServerOptions:
    log_requests = args.enable_log_requests and not args.disable_log_requests
    return ServerOptions(
        served_model_names=list(args.served_model_name or [model]),
        chat_template=load_chat_template(args.chat_template),
        trust_request_chat_template=args.trust_request_chat_template,
        default_chat_template_kwargs=dict(args.default_chat_template_kwargs or {}),
        chat_template_content_format=args.chat_template_content_format,
        response_role=args.response_role,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
        max_log_len=args.max_log_len,
        log_requests=log_requests,
        log_outputs=log_requests and args.enable_log_outputs,  # vLLM's: only with requests
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        enable_force_include_usage=args.enable_force_include_usage,
        disable_log_stats=args.disable_log_stats,
        lora_modules=list(getattr(args, "lora_modules", None) or []),
    )


def build_app(
    engine: EngineClient, args: argparse.Namespace, pm: PluginManager | None = None
) -> FastAPI:
    """The FastAPI app serving ``engine`` (already started) with the flags in ``args``."""
    app = api_app(engine, args, pm)
    add_http_middleware(app, args)
    return app


def api_app(
    engine: EngineClient, args: argparse.Namespace, pm: PluginManager | None = None
) -> FastAPI:
    """The app's routes over ``engine``, without the middleware of a listening server (keys,
    CORS, body size, request-id headers): what ``ironlm run-batch`` calls in process."""
    pm = pm or engine.engine.pm
    state = ServerState.create(engine, server_options(args, str(engine.engine.config.model)), pm)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = None if args.disable_log_stats else asyncio.ensure_future(
            log_stats_forever(engine)
        )
        try:
            yield
        finally:
            if task is not None:
                task.cancel()

    docs = not args.disable_fastapi_docs
    app = FastAPI(
        title="IronLM OpenAI-compatible API", version=__version__, lifespan=lifespan,
        root_path=args.root_path or "", openapi_url="/openapi.json" if docs else None,
        docs_url="/docs" if docs else None, redoc_url="/redoc" if docs else None,
    )
    app.state.server = state
    app.state.server_load = None  # a LoadCounter with --enable-server-load-tracking
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(metrics_router)
    if args.enable_tokenizer_info_endpoint:  # vLLM's opt-in: it shows the chat template
        app.include_router(tokenizer_info_router)
    if serving_models.runtime_lora_updating():
        log.warning("LoRA dynamic loading & unloading is enabled in the API server "
                    "(%s). This should ONLY be used for local development!",
                    serving_models.RUNTIME_LORA_ENV)
        app.include_router(lora_router)
    if dev_mode():  # vLLM's development routes: sleep mode, /collective_rpc, ...
        log.warning("%s=1: development routes on (POST /collective_rpc runs any worker "
                    "method); for development only", DEV_MODE_ENV)
        app.include_router(dev_router)
    elif args.enable_sleep_mode:
        log.warning("--enable-sleep-mode: the /sleep and /wake_up routes are served with "
                    "%s=1 only (as vLLM's)", DEV_MODE_ENV)
    return app


def add_http_middleware(app: FastAPI, args: argparse.Namespace) -> None:
    """The listening server's middleware: the user's, load tracking, API keys, body size,
    request-id headers, CORS."""
    # add_middleware wraps the app: the last added runs first (CORS, size, key, user's).
    for path in args.middleware or []:
        load_middleware(app, path)
    env_key = os.environ.get("IRONLM_API_KEY") or os.environ.get("VLLM_API_KEY")
    # surrounding whitespace (a secret file's newline) is no part of a key; blank keys were
    # refused at start-up, and an unset variable is no key
    api_keys = [key.strip() for key in (args.api_key or [env_key]) if key and key.strip()]
    if args.enable_server_load_tracking:  # inside the key check: refused calls do not count
        app.state.server_load = LoadCounter()
        app.add_middleware(LoadTrackingMiddleware, counter=app.state.server_load)
    if api_keys:
        app.add_middleware(APIKeyMiddleware, api_keys=api_keys)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=args.max_request_body_size)
    if args.enable_request_id_headers:  # outside the key and size checks: their errors too
        app.add_middleware(RequestIdHeaderMiddleware)
    app.add_middleware(
        CORSMiddleware, allow_origins=args.allowed_origins,
        allow_credentials=args.allow_credentials, allow_methods=args.allowed_methods,
        allow_headers=args.allowed_headers,
    )


def make_engine_client(
    config: EngineConfig, pm: PluginManager, max_waiting: int,
    on_dead: Callable[[BaseException], None],
) -> EngineClient:
    """The server's engine (not started): one, or ``data_parallel_size`` of them."""
    if config.data_parallel_size == 1:
        return AsyncEngine(lambda: LLMEngine(config, pm, serving=True),
                           max_waiting=max_waiting, on_dead=on_dead)
    builds = [partial(LLMEngine, replace(config, data_parallel_rank=rank), pm, serving=True)
              for rank in range(config.data_parallel_size)]
    return DataParallelEngine(builds, max_waiting=max_waiting, on_dead=on_dead)


def checked_settings(args: argparse.Namespace) -> tuple[PluginManager, Platform, EngineConfig]:
    """The plugins, platform and engine configuration the flags select, each flag checked
    before anything loads (``ironlm serve`` and ``ironlm run-batch``). StartupError (a
    ValueError) and the plugin manager's selection errors say which flag cannot be honoured."""
    import torch

    pm = PluginManager()
    pm.check_compatible()
    if args.tool_parser_plugin:
        load_plugin_file(pm, args.tool_parser_plugin, "--tool-parser-plugin",
                         "register_tool_parsers")
    if args.reasoning_parser_plugin:
        load_plugin_file(pm, args.reasoning_parser_plugin, "--reasoning-parser-plugin",
                         "register_reasoning_parsers")
    platform = pm.select_platform(getattr(args, "device", None) or "auto")
    config = engine_config_from_args(args)
    preflight(pm, config, platform, args)
    load_chat_template(args.chat_template)  # a bad --chat-template fails before loading
    torch.manual_seed(config.seed)  # unseeded sampling draws from the global generator
    return pm, platform, config


def certificate_watcher(args: argparse.Namespace) -> CertificateWatcher | None:
    """--enable-ssl-refresh's watcher of the TLS files (None without the flag)."""
    if not args.enable_ssl_refresh:
        return None
    if not (args.ssl_keyfile and args.ssl_certfile):
        raise StartupError("--enable-ssl-refresh needs --ssl-keyfile and --ssl-certfile")
    return CertificateWatcher(args.ssl_keyfile, args.ssl_certfile, args.ssl_ca_certs)


def run_server(args: argparse.Namespace) -> None:
    """Check the flags, load the engine, serve until interrupted."""
    pm, platform, config = checked_settings(args)
    check_api_keys(args)
    certificates = certificate_watcher(args)  # its flags checked before the model loads
    host = args.host or "0.0.0.0"
    # before any worker takes a port
    sock = bind_unix_socket(args.uds) if args.uds else bind_server_socket(host, args.port)
    log.info("IronLM %s: loading %s on %s", __version__, config.model, platform.name)
    server: DrainingServer | None = None

    def engine_dead(exc: BaseException) -> None:  # from the engine thread: stop serving
        if server is not None:
            server.should_exit = True

    engine = make_engine_client(config, pm, args.max_waiting_requests, engine_dead)
    platform.before_engine_thread()  # on this thread: settings a new thread takes at its start
    try:
        engine.start()  # builds the engine(s), each on its own thread (see AsyncEngine)
        app = build_app(engine, args, pm)
        serving_models.load_static_loras(app.state.server, app.state.server.options.lora_modules)
        server = DrainingServer(uvicorn.Config(
            app, host=host, port=args.port,
            log_level=args.uvicorn_log_level, timeout_keep_alive=5,
            access_log=not args.disable_uvicorn_access_log,
            ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile,
            ssl_ca_certs=args.ssl_ca_certs, ssl_cert_reqs=args.ssl_cert_reqs,
            ssl_ciphers=args.ssl_ciphers,
        ), engine, args.timeout_graceful_shutdown, certificates)
        quiet = excluded_paths(args.disable_access_log_for_endpoints)
        if quiet:  # after uvicorn.Config, which sets up uvicorn's loggers
            logging.getLogger("uvicorn.access").addFilter(AccessLogFilter(quiet))
        server.should_exit = engine.fatal_error is not None  # died before this line
        server.run(sockets=[sock])
    finally:
        engine.shutdown()
        sock.close()
        if args.uds:  # the socket file goes with the server (uvicorn leaves its own behind)
            Path(args.uds).unlink(missing_ok=True)
    if engine.fatal_error is not None:
        raise EngineDeadError(f"the engine died: {engine.fatal_error}")


def serve(args: argparse.Namespace, prog: str = "ironlm serve") -> int:
    """run_server with start-up errors printed as one line; exit status 2 for them."""
    return exit_status(run_server, args, prog)


def exit_status(run: Callable[[argparse.Namespace], None], args: argparse.Namespace,
                prog: str) -> int:
    """``run(args)`` with logging set up and its errors printed as one line: exit status 2
    for a flag or file that cannot be honoured, 1 when the engine died, else 0."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    try:
        run(args)
    except EngineDeadError as exc:  # a worker died while serving: exit non-zero at once
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError, PluginClashError, PluginContractError) as exc:
        # StartupError, selection errors, plugins written for another contract
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    prog = "python -m ironlm.entrypoints.openai.api_server"
    parser = make_parser(prog)
    try:
        argv = expand_argv(sys.argv[1:] if argv is None else list(argv), parser)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    return serve(parser.parse_args(argv), prog)


__all__ = ["StartupError", "build_app", "checked_settings", "exit_status", "main", "parse_body",
           "run_server", "serve"]

if __name__ == "__main__":
    sys.exit(main())
