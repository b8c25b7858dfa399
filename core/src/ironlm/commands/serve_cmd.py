"""``ironlm serve MODEL [flags]``: the OpenAI-compatible server (vLLM's flags and endpoints).

With no usable device platform installed it names the platform plugins to install and exits 2;
any other flag the engine cannot honour is rejected the same way (see
``ironlm.entrypoints.openai.startup``).
"""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``serve`` parser (``Cli`` expands vLLM's underscores and --config for it)."""
    from ironlm.entrypoints.openai.cli_args import make_arg_parser

    p = sub.add_parser(
        "serve",
        help="start the OpenAI-compatible HTTP server",
        description="OpenAI-compatible server: vLLM's flags, endpoints and extra parameters.",
    )
    make_arg_parser(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from ironlm.entrypoints.openai.api_server import serve

    return serve(args)
