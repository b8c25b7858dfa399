"""``ironlm serve MODEL [flags]``: the OpenAI-compatible server."""

from __future__ import annotations

import argparse
import sys

from ironlm.plugin_manager import PluginManager
from ironlm.registry import UnavailableError, UnknownNameError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="start the OpenAI-compatible HTTP server")
    p.add_argument("model", nargs="?", help="HF folder or GGUF file to serve")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    pm = PluginManager()
    try:
        pm.select_platform(getattr(args, "device", "auto") or "auto")
    except (UnknownNameError, UnavailableError) as exc:
        print(f"ironlm serve: {exc}", file=sys.stderr)
        return 2
    print("ironlm serve: the HTTP server is not built yet (issue 5)", file=sys.stderr)
    return 2
