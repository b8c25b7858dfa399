"""The ``ironlm`` command. Each core subcommand lives in ``ironlm.commands.<name>_cmd`` and
exposes ``add_parser(subparsers)``, which sets ``func`` on its parser; other distributions add
theirs through the entry-point group ``ironlm.commands`` (``ironlm.commands.extensions``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from importlib.metadata import EntryPoint

from ironlm import __version__
from ironlm.commands import (
    client_cmd,
    collect_env_cmd,
    download_cmd,
    plugins_cmd,
    quantize_cmd,
    run_batch_cmd,
    serve_cmd,
)
from ironlm.commands.extensions import add_extension_commands
from ironlm.entrypoints.openai.argv_expansion import expand_argv


class Cli:
    """The parser of every command, and why each extension command that cannot run cannot."""

    def __init__(self, commands: Iterable[EntryPoint] | None = None) -> None:
        # commands: the extension entry points (default: those installed)
        self.parser = argparse.ArgumentParser(prog="ironlm",
                                              description="IronLM LLM serving engine")
        self.parser.add_argument("-v", "--version", action="version", version=__version__,
                                 help="print IronLM's version and exit (as `vllm --version`)")
        sub = self.parser.add_subparsers(dest="command", required=True)
        self.serve_parser = serve_cmd.add_parser(sub)
        # the commands that take vLLM's --foo_bar spelling and --config FILE
        self.vllm_style = {"serve": self.serve_parser,
                           "run-batch": run_batch_cmd.add_parser(sub)}
        for module in (plugins_cmd, download_cmd, quantize_cmd, client_cmd, collect_env_cmd):
            module.add_parser(sub)
        self.unavailable = add_extension_commands(sub, commands)

    def run(self, argv: list[str]) -> int:
        # the top-level parser takes no option but -h / -v: the first word names the command
        if argv and argv[0] in self.unavailable:
            print(f"ironlm {argv[0]}: {self.unavailable[argv[0]]}", file=sys.stderr)
            return 2
        parser = self.vllm_style.get(argv[0]) if argv else None
        if parser is not None:  # vLLM's --foo_bar spelling and --config FILE
            try:
                argv = [argv[0], *expand_argv(argv[1:], parser)]
            except (ValueError, OSError) as exc:
                parser.error(str(exc))
        args = self.parser.parse_args(argv)
        return int(args.func(args) or 0)


def build_parser() -> argparse.ArgumentParser:
    return Cli().parser


def main(argv: list[str] | None = None) -> int:
    return Cli().run(sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
