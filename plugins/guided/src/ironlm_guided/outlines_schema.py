"""JSON schema -> one regex for outlines-core, exact for the normal form.

outlines-core's builder has gaps that would let output break the schema: it ignores numeric
bounds, inserts ``pattern`` unparenthesised (``a|b`` escapes the quotes), and renders an empty
sub-schema as an ungrouped alternation. So the normal form is rewritten first: bounded numbers
and patterns become unique string constants in the schema handed to the builder, and the
constants' regexes (``"IRONLMSPLICE0"``) are replaced afterwards by exact regexes built here.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from ironlm.interfaces.guided import UnsupportedFeatureError
from ironlm_guided.regex_check import ascii_shorthands, check_python_regex, full_match_body
from ironlm_guided.regex_ranges import integer_range, number_range
from ironlm_guided.schema_normalize import SchemaSupport, normalize_schema

OUTLINES_SUPPORT = SchemaSupport(
    backend="outlines",
    numeric_bounds=True,
    multiple_of=False,
    formats=frozenset({"uuid", "email"}),
    pattern=True,
)
_DEFAULT_WHITESPACE = r"[ ]?"  # outlines-core's default between JSON tokens
_STRING = r'"(?:[^"\\\x00-\x1F]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_SCALAR = rf"{_STRING}|{_NUMBER}|true|false|null"
_WHITESPACE = frozenset(b" \t\n\r")
# bytes a JSON string body cannot hold raw: the quote, the backslash, control characters
_NOT_IN_STRING = frozenset(b'"\\') | frozenset(range(0x20))


def check_whitespace_pattern(whitespace_pattern: str | None) -> str:
    """The regex to put between JSON tokens; ValueError when it could emit non-whitespace."""
    if whitespace_pattern is None:
        return _DEFAULT_WHITESPACE
    if whitespace_pattern:
        check_python_regex(whitespace_pattern, "guided_whitespace_pattern")
        if not _emits_only(whitespace_pattern, lambda b: b in _WHITESPACE):
            raise ValueError(
                f"guided_whitespace_pattern {whitespace_pattern!r} may produce characters other "
                "than JSON whitespace (space, tab, newline, carriage return)"
            )
        return f"(?:{whitespace_pattern})"  # grouped: it is spliced between other tokens
    return whitespace_pattern


def outlines_schema_regex(text: str, whitespace_pattern: str | None) -> str:
    """The full-match regex for JSON text ``text`` (a schema); ValueError for what outlines
    cannot enforce exactly."""
    from outlines_core.json_schema import build_regex_from_schema

    ws = check_whitespace_pattern(whitespace_pattern)
    normal = normalize_schema(text, OUTLINES_SUPPORT)
    splices: dict[str, str] = {}
    schema = _rewrite(normal, splices, ws)
    try:
        regex = build_regex_from_schema(json.dumps(schema), ws)
    except (ValueError, RuntimeError) as e:
        raise UnsupportedFeatureError(
            f"outlines-core cannot build a regex for the JSON schema: {e}") from None
    for placeholder, replacement in splices.items():
        regex = regex.replace(f'"{placeholder}"', replacement)
    return regex


def any_json(ws: str, depth: int, top: str = "value") -> str:
    """Regex for any JSON value (or object, ``top="object"``) nested at most ``depth`` levels.
    A regex automaton grows steeply with nesting (outlines-core's own any-object regex takes
    about a minute to index over a 49k vocabulary), so nesting is bounded: a subset of JSON,
    which is all a constraint needs."""
    value = f"(?:{_SCALAR})"
    obj = ""
    for _ in range(depth):
        arr = rf"\[{ws}(?:{value}(?:{ws},{ws}{value})*)?{ws}\]"
        member = rf"{_STRING}{ws}:{ws}{value}"
        obj = rf"\{{{ws}(?:{member}(?:{ws},{ws}{member})*)?{ws}\}}"
        value = f"(?:{_SCALAR}|{arr}|{obj})"
    return obj if top == "object" else value


def _splice(splices: dict[str, str], regex: str) -> dict[str, Any]:
    for placeholder, known in splices.items():
        if known == regex:
            return {"const": placeholder}
    placeholder = f"IRONLMSPLICE{len(splices)}"
    splices[placeholder] = regex
    return {"const": placeholder}


_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')  # characters a JSON string writes escaped


def _rewrite(node: dict[str, Any], splices: dict[str, str], ws: str) -> dict[str, Any]:
    if not node:  # any value: outlines-core renders {} as an ungrouped alternation
        return _splice(splices, any_json(ws, depth=1))
    if "$defs" in node:
        defs = {k: _rewrite(v, splices, ws) for k, v in node["$defs"].items()}
        body = {k: v for k, v in node.items() if k != "$defs"}
        return {**_rewrite(body, splices, ws), "$defs": defs}
    if "anyOf" in node:
        return {"anyOf": [_rewrite(o, splices, ws) for o in node["anyOf"]]}
    t = node.get("type")
    if t == "object":
        if "properties" in node:
            escaped = [k for k in node["properties"] if _NEEDS_ESCAPE.search(k)]
            if escaped:  # outlines-core writes property names into its regex unescaped
                raise UnsupportedFeatureError(
                    f"property name {escaped[0]!r} needs JSON escaping, which the 'outlines' "
                    "backend does not enforce")
            props = {k: _rewrite(v, splices, ws) for k, v in node["properties"].items()}
            return {**node, "properties": props}
        value = _rewrite(node["additionalProperties"], splices, ws)
        return {"type": "object", "additionalProperties": value}
    if t == "array":
        if "prefixItems" in node:
            items = [_rewrite(p, splices, ws) for p in node["prefixItems"]]
            return {**node, "prefixItems": items}
        return {**node, "items": _rewrite(node["items"], splices, ws)}
    if t == "integer" and ("minimum" in node or "maximum" in node):
        return _splice(splices, integer_range(node.get("minimum"), node.get("maximum")))
    if t == "number" and len(node) > 1:
        try:
            regex = number_range(
                node.get("minimum"),
                node.get("maximum"),
                node.get("exclusiveMinimum"),
                node.get("exclusiveMaximum"),
            )
        except ValueError as e:
            raise UnsupportedFeatureError(
                f"JSON schema number bounds: {e}; the 'outlines' guided-decoding backend only "
                "enforces integer-valued bounds on numbers"
            ) from None
        return _splice(splices, regex)
    if t == "string" and "pattern" in node:
        body = ascii_shorthands(full_match_body(node["pattern"], "JSON schema pattern"))
        if not _emits_only(body, lambda b: b not in _NOT_IN_STRING):
            raise UnsupportedFeatureError(
                f"JSON schema pattern {node['pattern']!r} may produce a quote, backslash or "
                "control character, which a JSON string must escape; the 'outlines' backend "
                "cannot enforce it"
            )
        return _splice(splices, '"(?:' + body + ')"')
    return node


def _emits_only(regex: str, allowed: Callable[[int], bool]) -> bool:
    """Whether every byte of every string ``regex`` matches satisfies ``allowed``: walks the
    regex's automaton over a one-token-per-byte vocabulary."""
    from outlines_core import Index, Vocabulary

    vocabulary = Vocabulary(256, {bytes([b]): [b] for b in range(256)})
    try:
        index = Index(regex, vocabulary)
    except (ValueError, RuntimeError) as e:
        raise UnsupportedFeatureError(
            f"outlines-core cannot compile the regex {regex!r}: {e}") from None
    used = {t for edges in index.get_transitions().values() for t in edges}
    return all(allowed(b) for b in used if b < 256)
