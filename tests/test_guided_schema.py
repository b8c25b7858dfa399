"""The guided plugin's tokenizer-free pieces: the schema normal form, bounded-number regexes,
regex rewriting, and the outlines schema-to-regex splicing."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest

from ironlm_guided.regex_check import ascii_shorthands, escape_literal, full_match_body
from ironlm_guided.regex_ranges import integer_range, number_range
from ironlm_guided.schema_normalize import SchemaSupport, normalize_schema

FULL = SchemaSupport("test", numeric_bounds=True, multiple_of=True,
                     formats=frozenset({"uuid"}), pattern=True)
BARE = SchemaSupport("bare", numeric_bounds=False, multiple_of=False,
                     formats=frozenset(), pattern=False)


def _norm(schema: dict, support: SchemaSupport = FULL) -> dict:
    return normalize_schema(json.dumps(schema), support)


@pytest.mark.parametrize("lo, hi", [(None, None), (0, None), (3, 50), (-7, 7), (-120, -3),
                                    (None, 17), (-5, None), (100, 100), (9, 10), (37, 1130)])
def test_integer_range_is_exact(lo: int | None, hi: int | None) -> None:
    regex = re.compile(integer_range(lo, hi))
    for n in range(-1300, 1300):
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert bool(regex.fullmatch(str(n))) == inside, n
    for text in ("-0", "01", "+1", "1.0", ""):
        assert not regex.fullmatch(text)


_NUMBERS = sorted({f"{i}{f}" for i in range(-30, 31) for f in ("", ".0", ".5", ".05", ".50")}
                  | {"-0.5", "-0.05", "0.0"})


@pytest.mark.parametrize("bounds", [(0, None, None, None), (None, None, 0, None),
                                    (None, 10, None, None), (None, None, None, 10),
                                    (-5, 5, None, None), (None, None, -5, 5),
                                    (-20, -3, None, None), (None, None, -20, -3),
                                    (3, 3, None, None), (None, 1, 0, None)])
def test_number_range_is_sound_and_complete(bounds: tuple) -> None:
    mn, mx, emn, emx = bounds
    regex = re.compile(number_range(*bounds))
    for text in _NUMBERS:
        x = Decimal(text)
        inside = ((mn is None or x >= mn) and (mx is None or x <= mx)
                  and (emn is None or x > emn) and (emx is None or x < emx))
        if regex.fullmatch(text):
            assert inside, text
        elif not text.startswith("-0"):  # "-0..." has a canonical form without the sign
            assert not inside, text


def test_number_range_refuses_fractional_bounds() -> None:
    with pytest.raises(ValueError, match="not an integer"):
        number_range(0.5, 2)


@pytest.mark.parametrize("text", ["a|b (c)*", "x-y~z&w#v", "new\nline", 'é "q" \\ back',
                                  "$5.00^", "[x]{2}"])
def test_escape_literal_matches_itself(text: str) -> None:
    assert re.fullmatch(escape_literal(text), text)
    assert not re.fullmatch(escape_literal(text), text + "x")


def test_ascii_shorthands() -> None:
    assert ascii_shorthands(r"\d{3}-\w+\s") == "[0-9]{3}-[0-9A-Za-z_]+[ \\t\\n\\r\\f\\v]"
    assert ascii_shorthands(r"[\d_]") == "[0-9_]"
    assert ascii_shorthands(r"[^\s]\D\\d") == r"[^\s]\D\\d"  # negations and escapes kept


def test_full_match_body() -> None:
    assert full_match_body("^ab$", "p") == "ab"
    assert full_match_body(r"a\$", "p") == r"a\$"
    assert full_match_body("[$^]x", "p") == "[$^]x"
    with pytest.raises(ValueError, match="anchors inside"):
        full_match_body("^a$|^b$", "p")
    with pytest.raises(ValueError, match="invalid p"):
        full_match_body("a(", "p")


def test_normal_form_basics() -> None:
    schema = {"title": "P", "type": "object", "properties": {
        "age": {"type": "integer", "exclusiveMinimum": 0, "maximum": 9.5},
        "tag": {"type": ["string", "null"], "maxLength": 3},
        "kind": {"enum": ["a", "b", 3], "type": "string"},
    }, "required": ["age"], "additionalProperties": False}
    assert _norm(schema) == {"type": "object", "required": ["age"], "properties": {
        "age": {"type": "integer", "minimum": 1, "maximum": 9},
        "tag": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]},
        "kind": {"enum": ["a", "b"]},  # 3 is no string: dropped
    }}


def test_refs_and_recursion_are_normalised_once() -> None:
    schema = {"$defs": {"N": {"type": "object", "properties": {"k": {"type": "array", "items":
              {"$ref": "#/$defs/N"}}}}}, "$ref": "#/$defs/N"}
    out = _norm(schema)
    assert out["$ref"] == "#/$defs/d0"
    assert out["$defs"]["d0"]["properties"]["k"]["items"] == {"$ref": "#/$defs/d0"}


def test_all_of_and_any_of_siblings_merge() -> None:
    out = _norm({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                           {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})
    assert out["properties"].keys() == {"a", "b"} and out["required"] == ["b"]
    out = _norm({"type": "string", "anyOf": [{"maxLength": 2}, {"format": "uuid"}]})
    assert out == {"anyOf": [{"type": "string", "maxLength": 2},
                             {"type": "string", "format": "uuid"}]}


def test_one_of_only_when_disjoint() -> None:
    cat = {"type": "object", "properties": {"pet": {"const": "cat"}}, "required": ["pet"]}
    dog = {"type": "object", "properties": {"pet": {"const": "dog"}}, "required": ["pet"]}
    assert len(_norm({"oneOf": [cat, dog]})["anyOf"]) == 2
    assert len(_norm({"oneOf": [{"type": "string"}, {"type": "integer"}]})["anyOf"]) == 2
    for overlapping in ([{"type": "integer"}, {"type": "number"}],
                        [{"type": "object"}, cat]):
        with pytest.raises(ValueError, match="oneOf may both match"):
            _norm({"oneOf": overlapping})


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"type": "integer", "minimum": 1}, "numeric bounds"),
        ({"type": "integer", "multipleOf": 3}, "multipleOf"),
        ({"type": "string", "format": "date"}, "string format 'date'"),
        ({"type": "string", "pattern": "a+"}, "string pattern"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "array", "contains": {"type": "integer"}}, "contains"),
        ({"if": {"type": "string"}, "then": {"minLength": 2}}, "unsupported keyword"),
        ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties"),
        ({"type": "object", "properties": {"a": {}}, "minProperties": 2}, "minProperties"),
        ({"$ref": "#/$defs/Missing"}, "does not resolve"),
        ({"type": "string", "minLength": 4, "maxLength": 2}, "accepts nothing"),
        ({"enum": [1, 2], "type": "string"}, "no enum/const value"),
        ({"type": "object", "properties": {"a": False}}, "accepts nothing"),
    ],
)
def test_refusals_name_the_keyword_and_place(schema: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        _norm(schema, BARE)
    assert "JSON schema" in str(info.value)


def test_invalid_schemas() -> None:
    with pytest.raises(ValueError, match="invalid JSON schema at properties/a/type"):
        _norm({"properties": {"a": {"type": "text"}}})
    with pytest.raises(ValueError, match="not valid JSON"):
        normalize_schema("{", FULL)
    with pytest.raises(ValueError, match="must be a JSON object"):
        normalize_schema("[]", FULL)


def test_outlines_regex_splices_bounds_and_patterns() -> None:
    pytest.importorskip("outlines_core")
    from ironlm_guided.outlines_schema import outlines_schema_regex

    schema = {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 2, "maximum": 12},
        "v": {"type": "string", "pattern": "^(cat|dog)s?$"}}, "required": ["n", "v"]}
    regex = re.compile(outlines_schema_regex(json.dumps(schema), None))
    assert regex.fullmatch('{"n":12,"v":"dogs"}')
    assert regex.fullmatch('{ "n": 2, "v": "cat" }')
    for bad in ('{"n":13,"v":"cat"}', '{"n":1,"v":"cat"}', '{"n":5,"v":"cat|dog"}',
                '{"n":5,"v":"cow"}'):
        assert not regex.fullmatch(bad), bad
    with pytest.raises(ValueError, match="quote, backslash or control"):
        outlines_schema_regex(json.dumps({"type": "string", "pattern": ".+"}), None)
    with pytest.raises(ValueError, match="integer-valued bounds"):
        outlines_schema_regex(json.dumps({"type": "number", "maximum": 2.5}), None)


def test_integral_float_counts_are_ints() -> None:
    """JSON Schema takes 2.0 for 2 (the JSON-Schema-Test-Suite's "maxLength validation with a
    decimal"); a float bound reached outlines as no bound at all."""
    out = _norm({"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 2.0, "minLength": 1.0},
        "a": {"type": "array", "maxItems": 3.0}}, "required": ["s", "a"]})
    s, a = out["properties"]["s"], out["properties"]["a"]
    assert (s["maxLength"], s["minLength"], a["maxItems"]) == (2, 1, 3)
    assert all(type(v) is int for v in (s["maxLength"], s["minLength"], a["maxItems"]))


@pytest.mark.parametrize("schema, message", [
    ({"allOf": [{"properties": {"a": {"type": "integer"}}}], "additionalProperties": False},
     "additionalProperties next to properties"),
    ({"properties": {"a": {}}, "anyOf": [{"additionalProperties": False}]},
     "additionalProperties next to properties"),
    ({"allOf": [{"properties": {"foo": True}, "unevaluatedProperties": False}],
      "anyOf": [{"properties": {"bar": True}}]}, "unevaluatedProperties next to properties"),
    ({"allOf": [{"prefixItems": [{"minimum": 3}]}], "items": {"minimum": 5}},
     "items next to prefixItems"),
])
def test_keywords_that_see_their_siblings_are_not_merged(schema: dict, message: str) -> None:
    """Merging allOf parts / anyOf options into one object would change what these keywords
    see (JSON-Schema-Test-Suite cases whose outputs violated the schema before)."""
    with pytest.raises(ValueError, match=message):
        _norm(schema)
