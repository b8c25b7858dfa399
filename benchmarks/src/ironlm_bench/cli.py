"""``ironlm bench {throughput,latency,serve,profile,specdec,plot}``: vLLM's benchmark commands.

The ``ironlm`` CLI finds ``add_parser`` through the entry-point group ``ironlm.commands``
(benchmarks/pyproject.toml). Each subcommand is a module of this package with
``add_cli_args(parser)`` and ``main(args) -> int``; this module only wires them under
``ironlm bench``.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Callable

from ironlm_bench import latency, plot, profile, serve, specdec, throughput

_SUBCOMMANDS = (
    ("throughput", throughput, "offline batch throughput, with --baseline hf / llama-cpp"),
    ("latency", latency, "end-to-end latency of a batch (mean, p50/p90/p99), with baselines"),
    ("serve", serve, "stream completions from an OpenAI-compatible server: TTFT, TPOT, ITL"),
    ("profile", profile, "where one decode step's time goes (torch.profiler and cProfile)"),
    ("specdec", specdec, "speculative decoding (n-gram, draft model) and multi-step vs plain"),
    ("plot", plot, "plot throughput vs batch size from throughput result files"),
)


# the subcommands that load the model in this process (serve talks to a server by name)
_LOADS_MODEL = frozenset({"throughput", "latency", "profile", "specdec"})


def _on_local_model(main: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``main`` run with a Hugging Face Hub repository id as the model fetched first (with
    --revision, --download-dir, --hf-token, --load-format), so the engine, the HF baseline,
    the tokenizer and the bounds all read the one local snapshot."""

    @functools.wraps(main)  # names the subcommand's own main (its module, its help)
    def run(args: argparse.Namespace) -> int:
        from ironlm.model_loader.hub import HubOptions, fetch_model, is_hub_reference

        model = getattr(args, "model", None)
        if model and not Path(model).expanduser().exists() and is_hub_reference(model):
            hub = HubOptions(getattr(args, "revision", None), getattr(args, "download_dir", None),
                             getattr(args, "hf_token", None), getattr(args, "load_format", "auto"))
            args.model = str(fetch_model(model, hub).path)
        return main(args)

    return run


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark IronLM (and baselines, and any server)",
                       description="Benchmarks mirroring `vllm bench`.")
    bench_sub = p.add_subparsers(dest="bench_command", required=True)
    for name, module, help_text in _SUBCOMMANDS:
        sp = bench_sub.add_parser(name, help=help_text, description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_cli_args(sp)
        sp.set_defaults(func=_on_local_model(module.main) if name in _LOADS_MODEL
                        else module.main)
