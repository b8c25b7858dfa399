"""Flags of ``ironlm run-batch`` / ``python -m ironlm.entrypoints.openai.run_batch`` (vLLM's
batch runner): the batch's own (input, output, metrics server), then the engine's and those
of ``ironlm serve`` that shape answers (``cli_args.add_request_args``: served names, chat
template options, LoRA modules, tool parser, logging). The HTTP server's own flags (host,
keys, TLS, CORS) have no meaning without a server and are not taken."""

from __future__ import annotations

import argparse

from ironlm.entrypoints.openai.cli_args import add_request_args, make_parser

DESCRIPTION = ("Answers every request of an OpenAI batch file (one JSON request per line: "
               "custom_id, method, url, body) with the engine, and writes one result per line "
               "in input order. Endpoints: /v1/chat/completions, /v1/completions, "
               "/v1/embeddings, /score, /v1/score, /rerank, /v1/rerank, /v2/rerank.")


def add_batch_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
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
    return p


def with_server_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The batch's flags over the server's defaults for its own (no middleware, no keys:
    nothing listens), the namespace the server's app and start-up checks read."""
    full = make_parser().parse_args([])
    for name, value in vars(args).items():
        setattr(full, name, value)
    return full
