"""``--lora-modules``: adapters to serve from start-up, as vLLM takes them.

Each item is ``name=path`` or a JSON object ``{"name": ..., "path": ...,
"base_model_name": ...}`` (base_model_name optional: the served model the adapter card names as
its parent).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRAModulePath:
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoRAModulePath:
    """One ``--lora-modules`` item (argparse type: a bad item is a usage error)."""
    if "=" in text and "," not in text and not text.lstrip().startswith("{"):
        name, _, path = text.partition("=")
        if not name or not path or "=" in path:
            raise argparse.ArgumentTypeError(f"expected name=path, got {text!r}")
        return LoRAModulePath(name, path)
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"Invalid JSON format for --lora-modules: {text}") \
            from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"Invalid JSON format for --lora-modules: {text}")
    unknown = sorted(set(value) - {"name", "path", "base_model_name"})
    missing = sorted({"name", "path"} - set(value))
    if unknown or missing:
        what = f"unknown field(s) {unknown}" if unknown else f"missing field(s) {missing}"
        raise argparse.ArgumentTypeError(f"Invalid fields for --lora-modules: {text} - {what}")
    if not all(isinstance(value.get(k), str) and value.get(k) for k in ("name", "path")):
        raise argparse.ArgumentTypeError(
            f"Invalid fields for --lora-modules: {text} - name and path must be non-empty "
            "strings"
        )
    base = value.get("base_model_name")
    if base is not None and not isinstance(base, str):
        raise argparse.ArgumentTypeError(
            f"Invalid fields for --lora-modules: {text} - base_model_name must be a string"
        )
    return LoRAModulePath(value["name"], value["path"], base)
