"""The ``ironlm`` command. Each subcommand lives in ``ironlm.commands.<name>_cmd`` and exposes
``add_parser(subparsers)``, which sets ``func`` on its parser."""

from __future__ import annotations

import argparse
import sys

from ironlm.commands import bench_cmd, download_cmd, plugins_cmd, serve_cmd


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ironlm", description="IronLM LLM serving engine")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (serve_cmd, plugins_cmd, download_cmd, bench_cmd):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
