"""Normal-form JSON schema -> what lm-format-enforcer's JsonSchemaParser enforces exactly.

lm-format-enforcer walks JSON character by character. Its gaps, and how they are closed here:

- numbers accept an exponent even for integers (``1e-5`` is no integer), and leading
  whitespace inside a string is not counted (``" red"`` passes for the enum value ``"red"``):
  ``JsonLexGuard`` wraps the parser and forbids both;
- raw control characters and backslash escapes inside strings (invalid JSON, and escapes make
  its minLength/maxLength count wrong), and tokens holding part of a UTF-8 character (counted
  wrong): the backend's JSON vocabulary leaves those tokens out, so strings are plain text;
- enums must be all strings or all numbers: mixed enums become anyOf groups; a lone boolean,
  objects, arrays, and strings needing escapes cannot be expressed and are refused;
- bounds, multipleOf, formats, prefixItems: refused by the normal form's SchemaSupport.
"""

from __future__ import annotations

import json
from typing import Any, Hashable

from lmformatenforcer import CharacterLevelParser
from lmformatenforcer.characterlevelparser import CharacterLevelParserConfig

from ironlm.interfaces.guided import UnsupportedFeatureError
from ironlm_guided.regex_check import full_match_body
from ironlm_guided.schema_normalize import SchemaSupport

LMFE_SUPPORT = SchemaSupport(
    backend="lm-format-enforcer",
    numeric_bounds=False,
    multiple_of=False,
    formats=frozenset(),
    pattern=True,
)
_UNSAFE_IN_STRING = frozenset('"\\') | frozenset(chr(c) for c in range(0x20))


def _refuse(where: str, problem: str) -> ValueError:
    return UnsupportedFeatureError(
        f"JSON schema at {where}: {problem}; the 'lm-format-enforcer' guided-decoding backend "
        "cannot enforce this"
    )


def _plain(text: str, where: str, what: str) -> str:
    if any(c in _UNSAFE_IN_STRING for c in text):
        raise _refuse(where, f"{what} {text!r} needs JSON escapes")
    return text


_ANY_VALUE = {"anyOf": [{"type": t} for t in ("string", "number", "boolean", "null", "array",
                                               "object")]}


def lmfe_schema(node: dict[str, Any], where: str = "#") -> dict[str, Any]:
    """Rewrite one normal-form node (recursively) for JsonSchemaParser."""
    if not node:  # the library has no "any value" schema of its own
        return _ANY_VALUE
    if "$defs" in node:
        defs = {k: lmfe_schema(v, f"#/$defs/{k}") for k, v in node["$defs"].items()}
        body = {k: v for k, v in node.items() if k != "$defs"}
        return {**lmfe_schema(body, where), "$defs": defs}
    if "$ref" in node:
        return node
    if "anyOf" in node:
        return {"anyOf": [lmfe_schema(o, f"{where}/anyOf/{i}") for i, o in
                          enumerate(node["anyOf"])]}
    if "enum" in node:
        return _enum(node["enum"], where)
    t = node["type"]
    if t == "object":
        if "properties" in node:
            props = {_plain(k, where, "property name"): lmfe_schema(v, f"{where}/properties/{k}")
                     for k, v in node["properties"].items()}
            return {"type": "object", "properties": props, "required": node["required"]}
        return {"type": "object", "additionalProperties":
                lmfe_schema(node["additionalProperties"], f"{where}/additionalProperties")}
    if t == "array":
        if "prefixItems" in node:
            raise _refuse(where, "prefixItems")
        if node.get("maxItems") == 0:  # lm-format-enforcer reads a zero bound as no bound
            raise _refuse(where, "maxItems 0 (an array that must be empty)")
        return {**node, "items": lmfe_schema(node["items"], f"{where}/items")}
    if t == "string" and "pattern" in node:
        body = full_match_body(node["pattern"], "JSON schema pattern")
        return {"type": "string", "pattern": body}
    return dict(node)


def literal_strings(node: Any) -> list[str]:
    """Property names and string enum values of an lmfe schema: text that must be produced
    exactly (the backend checks its vocabulary can spell them)."""
    out: list[str] = []
    if isinstance(node, dict):
        out.extend(node.get("properties", {}))
        out.extend(v for v in node.get("enum", []) if isinstance(v, str))
        for value in node.values():
            out.extend(literal_strings(value))
    elif isinstance(node, list):
        for value in node:
            out.extend(literal_strings(value))
    return out


def _enum(values: list[Any], where: str) -> dict[str, Any]:
    groups: list[dict[str, Any]] = []
    strings = [_plain(v, where, "enum value") for v in values if isinstance(v, str)]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    bools = [v for v in values if isinstance(v, bool)]
    if strings:
        groups.append({"type": "string", "enum": strings})
    if numbers:
        groups.append({"enum": numbers})
    if len(bools) == 2:
        groups.append({"type": "boolean"})
    elif bools:
        raise _refuse(where, f"enum with the single boolean {json.dumps(bools[0])}")
    if None in values:
        groups.append({"type": "null"})
    if len(strings) + len(numbers) + len(bools) + (None in values) < len(values):
        raise _refuse(where, "enum / const with object or array values")
    return groups[0] if len(groups) == 1 else {"anyOf": groups}


class JsonLexGuard(CharacterLevelParser):
    """Wraps a JSON CharacterLevelParser with lexical rules it lacks:

    - outside strings, ``e`` / ``E`` may not follow a digit or a decimal point (numbers are
      written without exponent, so an integer never becomes ``1e-5``, nor a number ``1.e5``),
      and no ``.`` after ``-0`` (the library lets an integer continue ``-0.84``; numbers lose
      the range (-1, 0) with it);
    - a string may not start with whitespace (the library skips leading whitespace inside a
      string, so ``" red"`` would pass an enum, a pattern or maxLength check for ``"red"``).
      Its free-text shortcut bypasses ``get_allowed_characters``, so the backend also removes
      whitespace-led tokens from the mask while ``string_start`` is set;
    - no ``}`` or ``]`` right after a comma (the library allows ``{"a": 1,}``);
    - with ``compact`` (disable_any_whitespace), no whitespace outside strings at all;
    - a character the wrapped parser would not take, or raises on, ends that path: the library
      silently drops its whole parse stack on such a character and then allows EOS.
    """

    def __init__(self, inner: CharacterLevelParser | None,
                 config: CharacterLevelParserConfig | None = None, in_string: bool = False,
                 escaped: bool = False, number: str = "",
                 string_start: bool = False, after_comma: bool = False,
                 compact: bool = False) -> None:
        self.inner = inner  # None: a dead end
        self.compact = compact
        self._config = config or CharacterLevelParserConfig()
        self.in_string = in_string
        self.escaped = escaped
        self.number = number  # the number being written, first three characters
        self.string_start = string_start
        self.after_comma = after_comma

    @property
    def config(self) -> CharacterLevelParserConfig:
        return self._config

    @config.setter
    def config(self, new_config: CharacterLevelParserConfig) -> None:
        self._config = new_config
        if self.inner is not None:
            self.inner.config = new_config

    def add_character(self, new_character: str) -> JsonLexGuard:
        if self.inner is None:
            return self
        if self.in_string and new_character not in self.get_allowed_characters():
            return JsonLexGuard(None, self._config)  # the library would drop its stack
        if self.compact and not self.in_string and new_character.isspace():
            return JsonLexGuard(None, self._config)
        in_string, escaped, string_start = self.in_string, False, False
        after_comma = self.after_comma
        if in_string:
            if self.escaped:
                pass
            elif new_character == "\\":
                escaped = True
            elif new_character == '"':
                in_string = False
        elif new_character == '"':
            in_string = string_start = True
        try:
            inner = self.inner.add_character(new_character)
        except Exception:  # the library's own parse errors: this path is impossible
            inner = None
        number = ""
        if not in_string and new_character in "-+.0123456789":
            number = (self.number + new_character)[:3]
        if not self.in_string and not new_character.isspace():
            after_comma = new_character == ","
        return JsonLexGuard(inner, self._config, in_string, escaped, number, string_start,
                            after_comma, self.compact)

    def get_allowed_characters(self) -> str:
        if self.inner is None:
            return ""
        allowed = self.inner.get_allowed_characters()
        if self.number[-1:].isdigit() or self.number[-1:] == ".":
            allowed = allowed.replace("e", "").replace("E", "")
        if self.number == "-0":
            allowed = allowed.replace(".", "")
        if self.string_start:
            allowed = "".join(c for c in allowed if not c.isspace())
        if self.after_comma and not self.in_string:
            allowed = allowed.replace("}", "").replace("]", "")
        if self.compact and not self.in_string:
            allowed = "".join(c for c in allowed if not c.isspace())
        return allowed

    def can_end(self) -> bool:
        return self.inner is not None and self.inner.can_end()

    def shortcut_key(self) -> Hashable | None:
        return None if self.inner is None else self.inner.shortcut_key()

    def cache_key(self) -> Hashable | None:
        key = None if self.inner is None else self.inner.cache_key()
        return None if key is None else (key, self.number, self.string_start,
                                          self.after_comma)
