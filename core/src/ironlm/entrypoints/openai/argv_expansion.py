"""vLLM's command-line conventions, applied to ``argv`` before a parser reads it: ``--foo_bar``
is ``--foo-bar``, ``--config FILE`` reads flags from YAML, and a JSON flag's dotted form
(``-cc.cudagraph_mode NONE``) sets one key of its object. ``ironlm serve`` and ``ironlm
run-batch`` both take them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ironlm.entrypoints.engine_args import json_object


def expand_argv(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """vLLM's command-line conventions, applied before ``parser`` parses ``argv``:
    ``--foo_bar`` is ``--foo-bar``, and ``--config FILE`` reads flags from a YAML mapping
    (``max-model-len: 512``, ``enforce-eager: true``, lists for several values) that the
    command line's own flags override; ``false`` is ``--no-FLAG`` where the parser has it,
    else the flag is left out (as vLLM). ValueError for a config that is not such a mapping,
    OSError for one that cannot be read."""
    out = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            arg = _kebab(name) + eq + value
        out.append(arg)
    path = None
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            path, out = out[i + 1], out[:i] + out[i + 2:]
            break
        if arg.startswith("--config="):
            path, out = arg.partition("=")[2], out[:i] + out[i + 1:]
            break
    if path is None:
        return fold_dotted_json(out, parser)
    import yaml

    with open(path, encoding="utf-8") as f:
        config = yaml.safe_load(f) or {}
    if not isinstance(config, dict):
        raise ValueError(f"--config {path}: a YAML mapping of flag names to values is needed")
    flags: list[str] = []
    for key, value in config.items():
        flag = "--" + _kebab(str(key))
        if "." in flag:  # one key of a JSON flag: its value as JSON (false, a list, ...)
            flags.append(f"{flag}={json.dumps(value)}")
        elif value is True:
            flags.append(flag)
        elif value is False:
            # argparse lists its option strings only in this attribute
            if "--no-" + flag[2:] in parser._option_string_actions:
                flags.append("--no-" + flag[2:])
        elif isinstance(value, list):
            flags += [flag, *(str(v) for v in value)]
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    # before the first flag of the command line (after a leading MODEL): later flags win
    at = next((i for i, a in enumerate(out) if a.startswith("-")), len(out))
    return fold_dotted_json(out[:at] + flags + out[at:], parser)


def _kebab(name: str) -> str:
    """A flag's name with ``-`` for ``_`` (vLLM takes both); the keys of its dotted form
    (``compilation_config.cudagraph_mode``) are JSON keys and keep theirs."""
    flag, dot, keys = name.partition(".")
    return flag.replace("_", "-") + dot + keys


def fold_dotted_json(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """vLLM's dotted form of a JSON flag: ``--compilation-config.cudagraph_mode NONE`` (or
    ``-cc.cudagraph_mode=NONE``; ``a.b`` sets a nested key) sets one key of that flag's JSON
    object. The keys are laid over the flag's own JSON where the command line gives it too
    (the last one), and the flag goes where that one stood, else at the end. A value is
    JSON where it parses as JSON, else a string; a key with no value is true."""
    dotted: dict[str, dict[str, Any]] = {}  # option string -> the keys it was given
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg, i = argv[i], i + 1
        name, eq, value = arg.partition("=")
        flag, _, keys = name.partition(".")
        # argparse lists its option strings only in this attribute
        action = parser._option_string_actions.get(flag) if arg.startswith("-") else None
        if not keys or action is None or action.type is not json_object:
            out.append(arg)
            continue
        if not eq:
            if i < len(argv) and not _is_flag(argv[i]):
                value, i = argv[i], i + 1
            else:
                value = "true"
        try:
            parsed: Any = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        node = dotted.setdefault(action.option_strings[0], {})
        *path, last = keys.split(".")
        for key in path:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ValueError(f"{arg}: {key} is not a JSON object")
        node[last] = parsed
    for flag, keys in dotted.items():
        action = parser._option_string_actions[flag]
        # the flag's own JSON, last given: "--flag JSON" or "--flag=JSON"
        at = max((j for j, a in enumerate(out) if a in action.option_strings and j + 1 < len(out)
                  or a.partition("=")[0] in action.option_strings and "=" in a),
                 default=None)  # fmt: skip
        if at is None:
            out += [flag, json.dumps(keys)]
            continue
        joined = "=" in out[at]
        own = out[at].partition("=")[2] if joined else out[at + 1]
        try:
            merged = json.dumps(_merged(json_object(own), keys))
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise ValueError(f"{flag}: expected a JSON object, got {own!r}") from exc
        if joined:
            out[at] = out[at].partition("=")[0] + "=" + merged
        else:
            out[at + 1] = merged
    return out


def _is_flag(arg: str) -> bool:
    """Whether ``arg`` is an option rather than a value (a negative number is a value)."""
    if not arg.startswith("-"):
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid over ``base``, nested objects merged key by key."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out
