"""Commands other distributions add to ``ironlm``: the entry-point group ``ironlm.commands``.

Each entry point names a callable ``add_parser(subparsers) -> None`` that adds the command of
the entry point's name and sets ``func`` on its parser, as the core's own command modules do
(ironlm-bench: ``bench = "ironlm_bench.cli:add_parser"``). An extension that fails to load
leaves the other commands working and explains itself when its command is asked for; a
command the project ships as a distribution of its own says how to install it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points

GROUP = "ironlm.commands"

# Commands of this project that live in a distribution of their own: how to install each.
INSTALL_HINTS: dict[str, str] = {
    "bench": "pip install ./benchmarks (the ironlm-bench distribution, from IronLM's source tree)",
}


def discover() -> list[EntryPoint]:
    return sorted(entry_points(group=GROUP), key=lambda ep: ep.name)


def add_extension_commands(
    sub: argparse._SubParsersAction, commands: Iterable[EntryPoint] | None = None
) -> dict[str, str]:
    """Add the command of each entry point (default: those installed) to ``sub``.

    Returns {command: why it cannot run} for the extensions that failed and for the commands
    of INSTALL_HINTS that are not installed; these still get a line in ``ironlm --help``. An
    extension naming a built-in command is ignored with a warning.
    """
    unavailable: dict[str, str] = {}
    builtin = set(sub.choices)
    for ep in discover() if commands is None else commands:
        origin = ep.dist.name if ep.dist is not None else ep.value
        if ep.name in builtin:  # the built-in command runs; the extension's is ignored
            print(f"ironlm: warning: {origin} declares the command '{ep.name}', which is a "
                  "built-in command; its own is ignored", file=sys.stderr)
        elif ep.name in sub.choices:
            unavailable[ep.name] = (f"two installed distributions declare the command "
                                    f"'{ep.name}' (one is {origin}); uninstall one")
        else:
            problem = _add(ep, sub)
            if problem is not None:
                unavailable[ep.name] = f"{origin} is installed but broken: {problem}"
    for name, hint in INSTALL_HINTS.items():
        if name not in sub.choices and name not in unavailable:
            unavailable[name] = f"not installed: {hint}"
    for name, why in unavailable.items():
        if name not in sub.choices:  # a line in `ironlm --help`; `ironlm.cli` refuses the run
            sub.add_parser(name, help=why.splitlines()[0][:120], add_help=False)
    return unavailable


def _add(ep: EntryPoint, sub: argparse._SubParsersAction) -> str | None:
    """Add ``ep``'s command, or say why not. It is tried on a scratch parser first, so that
    one failing half-way leaves nothing behind in ``sub``."""
    try:
        add_parser = ep.load()
        scratch = argparse.ArgumentParser().add_subparsers()
        add_parser(scratch)
        if list(scratch.choices) != [ep.name]:
            return (f"{ep.value} adds the commands {sorted(scratch.choices)}, "
                    f"expected only '{ep.name}'")
        add_parser(sub)
    except Exception as exc:  # third-party code: any error is that extension's alone
        return f"{ep.value} failed: {type(exc).__name__}: {exc}"
    return None
