"""``ironlm bench {throughput,latency,serve,profile,specdec,plot}``: vLLM's benchmark commands.

The ``ironlm`` CLI finds ``add_parser`` through the entry-point group ``ironlm.commands``
(benchmarks/pyproject.toml). Each subcommand is a module of this package with
``add_cli_args(parser)`` and ``main(args) -> int``; this module only wires them under
``ironlm bench``.
"""

from __future__ import annotations

import argparse

from ironlm_bench import latency, plot, profile, serve, specdec, throughput

_SUBCOMMANDS = (
    ("throughput", throughput, "offline batch throughput, with --baseline hf / llama-cpp"),
    ("latency", latency, "end-to-end latency of a batch (mean, p50/p90/p99), with baselines"),
    ("serve", serve, "stream completions from an OpenAI-compatible server: TTFT, TPOT, ITL"),
    ("profile", profile, "where one decode step's time goes (torch.profiler and cProfile)"),
    ("specdec", specdec, "speculative decoding (n-gram, draft model) and multi-step vs plain"),
    ("plot", plot, "plot throughput vs batch size from throughput result files"),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark IronLM (and baselines, and any server)",
                       description="Benchmarks mirroring `vllm bench`.")
    bench_sub = p.add_subparsers(dest="bench_command", required=True)
    for name, module, help_text in _SUBCOMMANDS:
        sp = bench_sub.add_parser(name, help=help_text, description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_cli_args(sp)
        sp.set_defaults(func=module.main)
