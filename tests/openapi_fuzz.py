"""Requests generated from OpenAI's own OpenAPI description, sent to a running server.

``tests/data/openai-openapi-subset.json`` holds the operations IronLM implements (and every
component they reference), cut from the full spec by ``implemented_subset`` (regenerate with
``python tests/openapi_fuzz.py FULL_SPEC.yaml``). ``fuzz`` draws a bounded number of
schemathesis cases per operation in positive mode (valid per the spec) and negative mode
(violating it), sends each, and returns what came back; the caller asserts no 5xx.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUBSET = Path(__file__).parent / "data" / "openai-openapi-subset.json"
# (path in the spec, method): the routes IronLM serves under /v1
IMPLEMENTED = [("/completions", "post"), ("/chat/completions", "post"), ("/models", "get"),
               ("/models/{model}", "get")]
# generated values the spec allows but that would make a case run for long on a 2-core CI
# machine (max_tokens up to the context, n up to 128): capped (and max_tokens set when the
# case has none), the rest of the case is kept
NOT_AN_ERROR_OBJECT = "not an OpenAI error object: "  # prefix of a refusal the client can't read
CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "n": 2, "best_of": 2}


def implemented_subset(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with only the IMPLEMENTED operations and the components they reference."""
    paths: dict[str, Any] = {}
    for path, method in IMPLEMENTED:
        item = spec["paths"][path]
        paths.setdefault(path, {k: v for k, v in item.items() if k == "parameters"})
        paths[path][method] = item[method]
    kept: dict[str, dict[str, Any]] = {}
    todo = [paths]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/"):
                _, _, kind, name = ref.split("/", 3)
                if name not in kept.setdefault(kind, {}):
                    kept[kind][name] = spec["components"][kind][name]
                    todo.append(kept[kind][name])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return {"openapi": spec["openapi"], "info": spec["info"], "servers": spec["servers"],
            "paths": paths, "components": kept}


@dataclass
class FuzzResult:
    statuses: Counter[tuple[str, str, int]] = field(default_factory=Counter)  # (mode, op, status)
    server_errors: list[str] = field(default_factory=list)  # one line per 5xx answer
    no_negative_case: list[str] = field(default_factory=list)  # operations with no input
    # why valid (positive-mode) cases were refused: (operation, error message) -> count
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)

    def count(self, mode: str, ok: bool) -> int:
        return sum(n for (m, _, s), n in self.statuses.items()
                   if m == mode and (200 <= s < 300) == ok)


def _aim(case: Any, model: str, positive: bool) -> None:
    """Apply CAPS; in positive mode also name the served model (a random one is only a 404)."""
    body = case.body
    if positive and isinstance(body, dict):
        body["model"] = model
    if positive and case.path_parameters and "model" in case.path_parameters:
        case.path_parameters["model"] = model
    if isinstance(body, dict):
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = CAPS["max_tokens"]  # unset: up to the whole context
        for key, cap in CAPS.items():
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > cap:
                body[key] = cap


def fuzz(base_url: str, headers: dict[str, str], model: str, examples: int) -> FuzzResult:
    """``examples`` cases per implemented operation and mode, sent to ``base_url`` (…/v1)
    serving ``model``."""
    import schemathesis

    schema = schemathesis.openapi.from_dict(json.loads(SUBSET.read_text()))
    result = FuzzResult()
    for mode in schemathesis.GenerationMode:
        for op_result in schema.get_all_operations():
            _run_operation(op_result.ok(), mode, base_url, headers, model, examples, result)
    return result


def _run_operation(op: Any, mode: Any, base_url: str, headers: dict[str, str], model: str,
                   examples: int, result: FuzzResult) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable

    name = f"{op.method.upper()} {op.path}"

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(op.as_strategy(generation_mode=mode))
    def send(case: Any) -> None:
        _aim(case, model, mode.value == "positive")
        response = case.call(base_url=base_url, headers=headers, timeout=60)
        result.statuses[(mode.value, name, response.status_code)] += 1
        if mode.value == "positive" and 400 <= response.status_code < 500:
            try:
                message = str(response.json()["error"]["message"]) or NOT_AN_ERROR_OBJECT
            except (ValueError, KeyError, TypeError):
                message = NOT_AN_ERROR_OBJECT + response.text
            result.refused[(name, message[:160])] += 1
        if response.status_code >= 500:
            result.server_errors.append(
                f"{mode.value} {name} -> {response.status_code}: {response.text[:300]} "
                f"(request body: {str(case.body)[:300]})"
            )

    try:
        send()
    except Unsatisfiable:
        if mode.value == "positive":
            raise
        result.no_negative_case.append(name)  # nothing to violate (GET /models takes nothing)


if __name__ == "__main__":  # regenerate the subset from the full spec
    import yaml

    full = yaml.load(Path(sys.argv[1]).read_text(), Loader=yaml.CSafeLoader)
    SUBSET.write_text(json.dumps(implemented_subset(full), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SUBSET} ({SUBSET.stat().st_size} bytes)")
