"""The constraint cases the guided-backend walks use (test_guided_backends), and checks that
the cases themselves are sound: schemas are valid JSON Schema, grammar checkers accept what
the grammar means and nothing else."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest

LMFE = "lm-format-enforcer"
_BOUNDS = {LMFE: "numeric bounds"}


def _obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required, **extra}


# (id, schema, {backend: message of the ValueError it must raise instead})
SCHEMAS: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("flat", _obj({"name": {"type": "string"}, "age": {"type": "integer"}}), {}),
    ("nested", _obj({"user": _obj({"id": {"type": "integer"}, "email": {"type": "string"}}),
                     "address": _obj({"city": {"type": "string"}, "zip": {"type": "string"}})}),
     {}),
    ("string_array", _obj({"tags": {"type": "array", "items": {"type": "string"},
                                    "minItems": 1, "maxItems": 3}}), {}),
    ("enum", _obj({"color": {"enum": ["red", "green", "blue"]},
                   "size": {"type": "string", "enum": ["S", "M", "L", "XL"]}}), {}),
    ("booleans_nulls", _obj({"ok": {"type": "boolean"}, "nothing": {"type": "null"},
                             "flags": {"type": "array", "items": {"type": "boolean"}}}), {}),
    ("numbers", _obj({"x": {"type": "number"}, "y": {"type": "number"},
                      "n": {"type": "integer"}}), {}),
    ("integer_bounds", _obj({"age": {"type": "integer", "minimum": 18, "maximum": 120},
                             "floor": {"type": "integer", "minimum": -40, "maximum": -3}}),
     _BOUNDS),
    ("number_bounds", _obj({"pct": {"type": "number", "minimum": 0, "maximum": 100},
                            "temp": {"type": "number", "exclusiveMinimum": -10,
                                     "exclusiveMaximum": 10}}), _BOUNDS),
    ("exclusive_integer", _obj({"pos": {"type": "integer", "exclusiveMinimum": 0},
                                "neg": {"type": "integer", "exclusiveMaximum": 0}}), _BOUNDS),
    ("string_pattern", _obj({"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                             "word": {"type": "string", "pattern": "[a-z]+"}}), {}),
    ("pattern_alternation", _obj({"v": {"type": "string", "pattern": "^(cat|dog)s?$"}}), {}),
    ("string_lengths", _obj({"short": {"type": "string", "minLength": 2, "maxLength": 5},
                             "long": {"type": "string", "minLength": 3}}), {}),
    ("optional_props", _obj({"id": {"type": "integer"}, "nick": {"type": "string"},
                             "score": {"type": "number"}}, required=["id"]), {}),
    ("optional_anyof_null", _obj({"maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                                  "either": {"anyOf": [{"type": "integer"},
                                                       {"type": "boolean"}]}}), {}),
    ("array_of_objects", _obj({"items": {"type": "array", "maxItems": 3, "items": _obj(
        {"sku": {"type": "string", "maxLength": 8}, "qty": {"type": "integer"}})}}), {}),
    ("matrix", _obj({"m": {"type": "array", "maxItems": 3, "items": {
        "type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}}}), {}),
    ("defs_refs", {"$defs": {"Point": _obj({"x": {"type": "integer"}, "y": {"type": "integer"}})},
                   **_obj({"a": {"$ref": "#/$defs/Point"}, "b": {"$ref": "#/$defs/Point"}})}, {}),
    ("recursive_tree", {"$defs": {"Node": _obj({"v": {"type": "integer"}, "kids": {
        "type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/Node"}}}, required=["v"])},
        "$ref": "#/$defs/Node"}, {}),
    ("const", _obj({"kind": {"const": "point"}, "version": {"const": 2}}), {}),
    ("mixed_enum", _obj({"v": {"enum": [1, "two", None, 3.5]}}), {}),
    ("dictionary", {"type": "object", "additionalProperties": {"type": "integer"}}, {}),
    ("type_list", _obj({"v": {"type": ["string", "integer"]},
                        "w": {"type": ["number", "null"]}}), {}),
    ("discriminated_union", {"$defs": {
        "Cat": _obj({"pet": {"const": "cat"}, "meows": {"type": "boolean"}}),
        "Dog": _obj({"pet": {"const": "dog"}, "barks": {"type": "integer"}})},
        **_obj({"animal": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                           "discriminator": {"propertyName": "pet"}}})}, {}),
    ("all_of_merge", {"allOf": [_obj({"a": {"type": "integer"}}),
                                _obj({"b": {"type": "string"}})]}, {}),
    ("tuple", _obj({"pair": {"type": "array", "prefixItems": [{"type": "integer"},
                                                              {"type": "string"}]}}),
     {LMFE: "prefixItems"}),
    ("multiple_of", _obj({"even": {"type": "integer", "multipleOf": 2}}),
     {LMFE: "multipleOf", "outlines": "multipleOf"}),
    ("uuid_format", _obj({"id": {"type": "string", "format": "uuid"}}), {LMFE: "format"}),
    ("any_value", _obj({"meta": {}, "list": {"type": "array", "maxItems": 2}}), {}),
    ("empty_object", {"type": "object", "additionalProperties": False}, {}),
    ("top_level_array", {"type": "array", "items": {"type": "integer", "minimum": 0},
                         "maxItems": 4}, _BOUNDS),
    ("enum_needs_escapes", _obj({"q": {"enum": ['say "hi"', "back\\slash"]}}),
     {LMFE: "needs JSON escapes"}),
]

REGEXES = [
    r"\d{3}-\d{4}",
    r"[a-z]+@[a-z]+\.(com|org)",
    r"(yes|no|maybe)",
    r"-?[0-9]+(\.[0-9]{1,2})?",
    r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}",
    r"(ab|cd)*e",
    r"0x[0-9a-fA-F]{1,8}",
    r"\w+\s\w+",
    r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
    r"[^\n]{1,12}\n[0-9]",
]


def _arith(text: str) -> bool:
    """expr := term (("+"|"-") term)*; term := factor (("*"|"/") factor)*;
    factor := [0-9]+ | "(" expr ")"."""
    pos = 0

    def factor() -> bool:
        nonlocal pos
        if pos < len(text) and text[pos] == "(":
            pos += 1
            if not expr() or pos >= len(text) or text[pos] != ")":
                return False
            pos += 1
            return True
        m = re.compile(r"[0-9]+").match(text, pos)
        if not m:
            return False
        pos = m.end()
        return True

    def chain(item: Any, ops: str) -> bool:
        nonlocal pos
        if not item():
            return False
        while pos < len(text) and text[pos] in ops:
            pos += 1
            if not item():
                return False
        return True

    def term() -> bool:
        return chain(factor, "*/")

    def expr() -> bool:
        return chain(term, "+-")

    return expr() and pos == len(text)


def _kv_list(text: str) -> bool:
    return re.fullmatch(r"(?:[a-z]+|[0-9]+)(?:,(?:[a-z]+|[0-9]+))*", text) is not None


def _json_ints(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


# (id, grammar text, checker of the language it means)
GRAMMARS: list[tuple[str, str, Any]] = [
    ("gbnf_arith", "\n".join([
        'root ::= expr',
        'expr ::= term (("+" | "-") term)*',
        'term ::= factor (("*" | "/") factor)*',
        'factor ::= [0-9]+ | "(" expr ")"',
    ]), _arith),
    ("lark_list", "\n".join([
        'start: item ("," item)*',
        "item: WORD | NUMBER",
        "WORD: /[a-z]+/",
        "NUMBER: /[0-9]+/",
    ]), _kv_list),
    ("gbnf_json_ints", "\n".join([
        'root ::= "[" ws (num (ws "," ws num)*)? ws "]"',
        'num ::= "0" | [1-9] [0-9]*',
        'ws ::= [ ]?',
    ]), _json_ints),
]


def check_grammar_text(name: str, text: str) -> bool:
    return {g[0]: g[2] for g in GRAMMARS}[name](text)


@pytest.mark.parametrize("case", SCHEMAS, ids=[c[0] for c in SCHEMAS])
def test_schema_cases_are_valid_json_schema(case: tuple) -> None:
    jsonschema.Draft202012Validator.check_schema(case[1])


def test_enough_schema_cases() -> None:
    assert len(SCHEMAS) >= 20
    everywhere = [c for c in SCHEMAS if not c[2]]
    assert len(everywhere) >= 20  # every backend enforces at least 20 of them


@pytest.mark.parametrize("regex", REGEXES)
def test_regex_cases_compile(regex: str) -> None:
    re.compile(regex)


@pytest.mark.parametrize(
    "name, good, bad",
    [
        ("gbnf_arith", ["1", "(2+3)*4", "((7))", "1/2-3"], ["", "1+", "(1", "a", "1)"]),
        ("lark_list", ["a", "ab,12,c"], ["", "a,", "a1", "A"]),
        ("gbnf_json_ints", ["[]", "[0, 12]", "[ 3 ]"], ["[01]", "[-1]", "[1,]", "{}"]),
    ],
)
def test_grammar_checkers(name: str, good: list[str], bad: list[str]) -> None:
    assert all(check_grammar_text(name, t) for t in good)
    assert not any(check_grammar_text(name, t) for t in bad)
