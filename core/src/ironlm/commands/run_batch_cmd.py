"""``ironlm run-batch -i INPUT -o OUTPUT --model MODEL [flags]``: vLLM's batch runner (an OpenAI
batch file answered offline, no server). It takes the engine's flags and those of ``ironlm
serve`` that shape answers (chat template, tool calls, served names, LoRA modules, logging);
the HTTP server's own flags (host, keys, TLS, CORS) have no meaning here and are refused by
the parser. See ``ironlm.entrypoints.openai.run_batch``."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from ironlm.entrypoints.openai.cli_args import add_request_args

    p = sub.add_parser(
        "run-batch",
        help="answer an OpenAI batch file (JSONL) offline, as vLLM's run-batch",
        description="Answers every request of an OpenAI batch file (one JSON request per line: "
        "custom_id, method, url, body) with the engine, and writes one result per line in "
        "input order. Endpoints: /v1/chat/completions, /v1/completions, /v1/embeddings, "
        "/score, /v1/score, /rerank, /v1/rerank, /v2/rerank.",
    )
    p.add_argument("model_tag", nargs="?", metavar="MODEL",
                   help="HF folder or GGUF file (or use --model)")
    batch = p.add_argument_group("batch")
    batch.add_argument("-i", "--input-file", required=True,
                       help="the batch file: a local path, or an http(s) URL read with GET")
    batch.add_argument("-o", "--output-file", required=True,
                       help="where the results go: a local path, or an http(s) URL written "
                       "with PUT when the batch has finished")
    batch.add_argument("--output-tmp-dir", default=None,
                       help="folder of the local copy of a URL output before its upload "
                       "(default: the system's temporary folder)")
    batch.add_argument("--enable-metrics", action="store_true",
                       help="serve Prometheus metrics (GET /metrics) at --url:--port while "
                       "the batch runs")
    batch.add_argument("--url", default="0.0.0.0",
                       help="address of the metrics server (default: %(default)s)")
    batch.add_argument("--port", type=int, default=8000,
                       help="port of the metrics server (default: %(default)s)")
    add_request_args(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from ironlm.entrypoints.openai.api_server import exit_status
    from ironlm.entrypoints.openai.cli_args import make_parser
    from ironlm.entrypoints.openai.run_batch import run_batch

    # the server's defaults for its own flags (no middleware, no keys: nothing listens),
    # under this command's values
    full = make_parser().parse_args([])
    for name, value in vars(args).items():
        setattr(full, name, value)
    return exit_status(run_batch, full, "ironlm run-batch")
