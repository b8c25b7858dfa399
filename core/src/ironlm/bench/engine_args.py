"""Engine flags for the offline benchmarks: one ``--kebab-case`` flag per EngineConfig field.

Generated from the dataclass (as ``ironlm serve`` does), so a new engine argument is a new
benchmark flag too; the values go back into ``EngineConfig(**engine_kwargs(args))``.
"""

from __future__ import annotations

import argparse
import json
import typing
from dataclasses import MISSING, fields
from typing import Any

from ironlm.config import EngineConfig
from ironlm.entrypoints.openai.cli_args import parse_size

_SIZE_FIELDS = {"kv_cache_memory"}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine", "IronLM engine arguments (vLLM's names)")
    hints = typing.get_type_hints(EngineConfig)
    for f in fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        args = typing.get_args(hint)
        base = next((a for a in args if a is not type(None)), hint) if args else hint
        default = f.default if f.default is not MISSING else None
        if f.name == "model":
            group.add_argument(flag, required=True, help="HF folder or GGUF file to benchmark")
        elif base is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                               help=f"engine argument {f.name} (default: %(default)s)")
        elif f.name in _SIZE_FIELDS:
            group.add_argument(flag, type=parse_size, default=default,
                               help=f"{f.name} in bytes or with a unit, e.g. 512MiB "
                               "(default: the platform's)")
        elif typing.get_origin(base) is dict or base is dict:
            group.add_argument(flag, type=json.loads, default=None,
                               help=f"engine argument {f.name} as a JSON object")
        elif base in (int, float, str):
            group.add_argument(flag, type=base, default=default,
                               help=f"engine argument {f.name} (default: %(default)s)")
        else:
            raise TypeError(f"EngineConfig.{f.name}: no flag type for {hint!r}")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig keyword arguments (all but ``model``) from parsed flags."""
    out: dict[str, Any] = {}
    for f in fields(EngineConfig):
        if f.name == "model":
            continue
        value = getattr(args, f.name)
        if value is None and f.default_factory is not MISSING:  # type: ignore[misc]
            continue  # dict fields left unset keep their factory default
        out[f.name] = value
    return out
