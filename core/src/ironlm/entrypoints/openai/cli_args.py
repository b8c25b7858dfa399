"""Flags of ``ironlm serve`` / ``python -m ironlm.entrypoints.openai.api_server``.

vLLM's names and defaults. Every EngineConfig field becomes ``--kebab-case`` (generated from
the dataclass by ``ironlm.entrypoints.engine_args``, so a new engine argument is a new flag);
the front end's flags are listed here.
"""

from __future__ import annotations

import argparse
import json
import ssl

from ironlm.config import EngineConfig
from ironlm.entrypoints.chat_content_format import CONTENT_FORMATS
from ironlm.entrypoints.engine_args import (
    ENGINE_HELP,
    add_engine_args,
    engine_kwargs,
    json_object,
    parse_size,
)
from ironlm.entrypoints.openai.lora_modules import parse_lora_module

# Engine fields shown in another group (with the server's default), or as a positional too.
_FRONTEND_OWNED = ("model", "disable_log_stats")


def _json_list(text: str) -> list[str]:
    value = json.loads(text)
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError(f"expected a JSON list, got {text!r}")
    return value


def _switch(group: argparse._ArgumentGroup, flag: str, help: str) -> None:
    """A front-end boolean, off by default: ``--flag`` and vLLM's ``--no-flag``."""
    group.add_argument(flag, action=argparse.BooleanOptionalAction, default=False, help=help)


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Every flag of ``ironlm serve``: the HTTP server's own, then those it shares with
    ``ironlm run-batch`` (``add_request_args``)."""
    parser.add_argument("model_tag", nargs="?", metavar="MODEL",
                        help="HF folder or GGUF file to serve (or use --model)")
    add_server_args(parser)
    add_request_args(parser)
    return parser


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """The HTTP server's flags: listening, TLS, CORS, keys, routes, access log."""
    srv = parser.add_argument_group("server")
    srv.add_argument("--host", default=None, help="bind address (default: all interfaces)")
    srv.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    srv.add_argument("--uds", default=None,
                     help="serve on this Unix domain socket instead of --host / --port "
                     "(vLLM's)")
    srv.add_argument("--uvicorn-log-level", default="info",
                     choices=["debug", "info", "warning", "error", "critical", "trace"])
    srv.add_argument("--root-path", default=None,
                     help="path prefix when the server runs behind a path-based proxy")
    srv.add_argument("--ssl-keyfile", default=None, help="SSL key file")
    srv.add_argument("--ssl-certfile", default=None, help="SSL certificate file")
    srv.add_argument("--ssl-ca-certs", default=None, help="CA certificates file")
    srv.add_argument("--ssl-ciphers", default="TLSv1",
                     help="TLS ciphers (OpenSSL's cipher list syntax; default: uvicorn's "
                     "%(default)s)")
    _switch(srv, "--enable-ssl-refresh",
            help="reload --ssl-keyfile / --ssl-certfile / --ssl-ca-certs when they change, "
                 "without a restart (vLLM's)")
    srv.add_argument("--ssl-cert-reqs", type=int, default=int(ssl.CERT_NONE),
                     help="whether a client certificate is required (see ssl module; "
                     "default: %(default)s)")
    srv.add_argument("--middleware", action="append", default=[],
                     help="import path of an ASGI middleware class or an async "
                     "`f(request, call_next)` to add (repeatable)")
    srv.add_argument("--max-request-body-size", type=parse_size, default=8 * 1024**2,
                     help="larger request bodies get 413 before they are parsed, on every "
                     "route (IronLM; default: 8MiB)")
    srv.add_argument("--timeout-graceful-shutdown", type=float, default=30.0,
                     help="on SIGTERM / SIGINT, seconds requests in flight may still run "
                     "(new ones get 503); then they end with an error event and the server "
                     "exits 0 (default: %(default)s, Kubernetes' grace period)")
    srv.add_argument("--max-waiting-requests", type=int, default=1024,
                     help="more waiting requests than this get 503 (IronLM; per engine "
                     "under -dp; default: %(default)s)")
    _switch(srv, "--enable-request-id-headers",
            help="answer with an X-Request-Id header: the request's own, else a new id (vLLM's)")
    _switch(srv, "--enable-server-load-tracking",
            help="count the generation requests in flight, shown by GET /load (vLLM's; without it "
                 "/load reads 0)")
    srv.add_argument("--api-server-count", type=int, default=1,
                     help="vLLM's number of API server processes: only 1 (default: "
                     "%(default)s)")
    _switch(srv, "--disable-fastapi-docs",
            help="disable /docs, /redoc and /openapi.json")
    srv.add_argument("--api-key", nargs="+", default=None,
                     help="require one of these keys (Bearer) on /v1/* and /generate; else "
                     "the key in IRONLM_API_KEY, then vLLM's VLLM_API_KEY")
    _switch(srv, "--enable-tokenizer-info-endpoint",
            help="serve GET /tokenizer_info (off by default, as vLLM: it shows the chat template "
                 "and tokenizer configuration)")
    _switch(srv, "--disable-uvicorn-access-log",
            help="no access-log line per HTTP request")
    srv.add_argument("--disable-access-log-for-endpoints", default=None, metavar="PATHS",
                     help="comma-separated paths whose requests get no access-log line, e.g. "
                     "/health,/metrics (vLLM's; the query string is ignored)")
    cors = parser.add_argument_group("CORS")
    _switch(cors, "--allow-credentials",
            help="allow credentials")
    cors.add_argument("--allowed-origins", type=_json_list, default=["*"],
                      help='JSON list of allowed origins (default: ["*"])')
    cors.add_argument("--allowed-methods", type=_json_list, default=["*"],
                      help='JSON list of allowed methods (default: ["*"])')
    cors.add_argument("--allowed-headers", type=_json_list, default=["*"],
                      help='JSON list of allowed headers (default: ["*"])')


def add_request_args(parser: argparse.ArgumentParser) -> None:
    """The flags that shape how requests are answered (chat templates, tool calls, logging)
    and the engine's, shared by ``ironlm serve`` and ``ironlm run-batch``."""
    api = parser.add_argument_group("OpenAI API")
    api.add_argument("--served-model-name", nargs="+", default=None,
                     help="model name(s) the API accepts; responses report the name a request "
                     "used, the first when it named none (default: --model)")
    api.add_argument("--lora-modules", type=parse_lora_module, nargs="+", action="extend",
                     default=None, metavar="NAME=PATH|JSON",
                     help='LoRA adapters to serve (needs --enable-lora): name=path, or JSON '
                     '{"name": ..., "path": ..., "base_model_name": ...}')
    api.add_argument("--chat-template", default=None,
                     help="chat template file, or the template text itself")
    _switch(api, "--trust-request-chat-template",
            help="let requests bring their own chat_template (a Jinja program the server runs; "
                 "refused by default, as vLLM)")
    api.add_argument("--default-chat-template-kwargs", type=json_object, default=None,
                     help="JSON object of chat-template variables every request gets under "
                     "its own chat_template_kwargs, e.g. '{\"enable_thinking\": false}'")
    api.add_argument("--chat-template-content-format", default="auto",
                     choices=CONTENT_FORMATS,
                     help="how message content reaches the chat template: string (its text), "
                     "openai (a list of parts, [{\"type\": \"text\", \"text\": ...}]), or "
                     "auto: openai when the template loops over a message's content")
    api.add_argument("--response-role", default="assistant",
                     help="role of generated chat messages when add_generation_prompt is true")
    _switch(api, "--return-tokens-as-token-ids",
            help="show logprob tokens as 'token_id:<id>'")
    _switch(api, "--enable-force-include-usage",
            help="every streamed response ends with a usage chunk, whether or not stream_options "
                 "asks for it")
    _switch(api, "--enable-prompt-tokens-details",
            help="usage carries prompt_tokens_details.cached_tokens (prompt tokens the prefix "
                 "cache served) when there are any")
    tools = parser.add_argument_group("tool calling")
    _switch(tools, "--enable-auto-tool-choice",
            help="allow tool_choice \"auto\" (needs --tool-call-parser)")
    tools.add_argument("--tool-call-parser", default=None,
                       help="tool-call parser plugin (hermes, mistral, llama3_json, ...)")
    _switch(tools, "--exclude-tools-when-tool-choice-none",
            help='with tool_choice "none", the chat template gets no tool definitions '
                 "(vLLM's; by default it gets them, and no call is parsed from the answer)")
    tools.add_argument("--tool-parser-plugin", default="",
                       help="a Python file registering tool parsers via register_tool_parsers")
    tools.add_argument("--reasoning-parser-plugin", default="",
                       help="a Python file registering reasoning parsers via "
                       "register_reasoning_parsers (then named by --reasoning-parser)")
    logs = parser.add_argument_group("logging")
    logs.add_argument("--max-log-len", type=int, default=None,
                      help="log at most this many prompt characters / token ids")
    logs.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction,
                      default=False, help="log each request's prompt and parameters "
                      "(default: off, as vLLM since 0.10)")
    _switch(logs, "--disable-log-requests",
            help="deprecated (vLLM's too): requests are logged only with --enable-log-requests")
    _switch(logs, "--enable-log-outputs",
            help="with --enable-log-requests, log each request's generated text, token ids and "
                 "finish reason when it ends (vLLM's)")
    logs.add_argument("--disable-log-stats", action=argparse.BooleanOptionalAction,
                      default=False, help="do not log engine stats every 10 s")
    eng = parser.add_argument_group("engine")
    eng.add_argument("--model", default=None, help=ENGINE_HELP["model"])
    add_engine_args(eng, skip=_FRONTEND_OWNED)
    eng.add_argument("-O", "--optimization-level", type=int, choices=range(4), default=None,
                     metavar="{0,1,2,3}",
                     help="vLLM's optimization level: 0 is --enforce-eager (as in vLLM, -O0 "
                     "means no device graphs whatever --enforce-eager says); 1-3 leave the "
                     "default, device graphs where the platform has them (vLLM's levels differ "
                     "in what they compile; IronLM compiles nothing)")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from the parsed flags (ValueError for a missing model or a bad value)."""
    model = args.model_tag or args.model
    if not model:
        raise ValueError("a model is required: MODEL (or --model MODEL)")
    if args.api_server_count != 1:
        raise ValueError(
            f"--api-server-count {args.api_server_count}: IronLM serves from one process "
            "(its front end tokenizes on worker threads); run one server per replica behind a "
            "load balancer for more"
        )
    kwargs = engine_kwargs(args)
    if args.optimization_level == 0:
        kwargs["enforce_eager"] = True
    return EngineConfig(model=model, **kwargs)


def make_parser(prog: str = "ironlm serve") -> argparse.ArgumentParser:
    return make_arg_parser(argparse.ArgumentParser(
        prog=prog, description="OpenAI-compatible server of IronLM",
    ))
