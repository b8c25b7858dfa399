"""``ironlm plugins``: what is installed, what it registered, and what can run here."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ironlm.plugin_manager import PluginManager


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugins", help="list installed plugins and what they registered")
    p.add_argument("--json", action="store_true", help="print the listing as JSON")
    p.set_defaults(func=run)


def format_table(rows: list[dict[str, Any]]) -> str:
    """One line per registered item: plugin, distribution, version, the contract version it
    declares, kind:name, status (an incompatible plugin: one line with the reason)."""
    header = ("PLUGIN", "DISTRIBUTION", "VERSION", "CONTRACT", "REGISTERED", "STATUS")
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        items = row["registered"] or [None]
        for item in items:
            what = f"{item['kind']}:{item['name']}" if item else "(nothing)"
            status = f"incompatible: {row['incompatible']}" if row.get("incompatible") else ""
            if item and "available" in item:
                status = "available" if item["available"] else f"unavailable: {item['reason']}"
                if item["available"] and item.get("reason"):
                    status += f" ({item['reason']})"
            lines.append((row["plugin"], row["distribution"] or "-", row["version"] or "-",
                          row.get("contract") or "-", what, status))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(col.ljust(w) for col, w in zip(line[:-1], widths)) + "  " + line[-1]
        for line in lines
    ).rstrip()


def format_details(rows: list[dict[str, Any]]) -> str:
    """Each registered item's details (a platform's ``describe()``), one ``key: value`` line
    each; a dict value one indented line per entry."""
    blocks = []
    for row in rows:
        for item in row["registered"]:
            details = item.get("details")
            if not details:
                continue
            lines = [f"{item['kind']}:{item['name']} ({row['plugin']})"]
            for key, value in details.items():
                if isinstance(value, dict):
                    lines.append(f"  {key}:" + ("" if value else " (none)"))
                    lines += [f"    {k}: {v}" for k, v in value.items()]
                else:
                    lines.append(f"  {key}: {value}")
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def run(args: argparse.Namespace) -> int:
    rows = PluginManager().describe()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    details = format_details(rows)
    print(format_table(rows) + (f"\n\n{details}" if details else ""))
    return 0
