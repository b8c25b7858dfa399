"""``ironlm bench {throughput,latency,serve,profile,specdec,plot}``: vLLM's benchmark commands.

Each subcommand lives in ``ironlm.bench.<name>`` with ``add_cli_args(parser)`` and
``main(args) -> int``; this module only wires them under ``ironlm bench``.
"""

from __future__ import annotations

import argparse
import importlib

_SUBCOMMANDS = (
    ("throughput", "offline batch throughput, with --baseline hf / llama-cpp"),
    ("latency", "end-to-end latency of a batch (mean, p50/p90/p99), with baselines"),
    ("serve", "stream completions from an OpenAI-compatible server: TTFT, TPOT, ITL"),
    ("profile", "where one decode step's time goes (torch.profiler and cProfile)"),
    ("specdec", "speculative decoding (n-gram, draft model) and multi-step vs plain decode"),
    ("plot", "plot throughput vs batch size from throughput result files"),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark IronLM (and baselines, and any server)",
                       description="Benchmarks mirroring `vllm bench`.")
    bench_sub = p.add_subparsers(dest="bench_command", required=True)
    for name, help_text in _SUBCOMMANDS:
        module = importlib.import_module(f"ironlm.bench.{name}")
        sp = bench_sub.add_parser(name, help=help_text, description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_cli_args(sp)
        sp.set_defaults(func=module.main)
