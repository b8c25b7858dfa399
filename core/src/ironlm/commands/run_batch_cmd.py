"""``ironlm run-batch -i INPUT -o OUTPUT --model MODEL [flags]``: vLLM's batch runner (an OpenAI
batch file answered offline, no server). Flags: ``ironlm.entrypoints.openai.batch_args``; the
runner: ``ironlm.entrypoints.openai.run_batch``."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from ironlm.entrypoints.openai.batch_args import DESCRIPTION, add_batch_args

    p = sub.add_parser("run-batch", description=DESCRIPTION,
                       help="answer an OpenAI batch file (JSONL) offline, as vLLM's run-batch")
    add_batch_args(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from ironlm.entrypoints.openai.run_batch import run_cli  # the server's modules: when run

    return run_cli(args)
