"""spec_from_request: every request form -> one GuidedSpec, and clear errors (core only)."""

from __future__ import annotations

import json

import pytest

from ironlm.guided_spec import spec_from_request
from ironlm.interfaces.guided import GuidedSpec

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}


def test_no_constraint_is_none() -> None:
    assert spec_from_request() is None
    assert spec_from_request(response_format={"type": "text"}) is None
    assert spec_from_request(structured_outputs={"json_object": False}) is None
    # a whitespace pattern alone constrains nothing
    assert spec_from_request(guided_whitespace_pattern=r"[ ]?") is None


@pytest.mark.parametrize("value", [SCHEMA, json.dumps(SCHEMA), json.dumps(SCHEMA, indent=4)])
def test_guided_json_forms_normalise_to_one_key(value: object) -> None:
    spec = spec_from_request(guided_json=value)
    assert spec == GuidedSpec("json", json.dumps(SCHEMA, separators=(",", ":")))
    # property order is kept: it is the order backends emit
    assert list(json.loads(spec.value)["properties"]) == ["b", "a"]


def test_guided_json_pydantic_model_class() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str
        age: int

    spec = spec_from_request(guided_json=Person)
    assert spec is not None and spec.kind == "json"
    assert json.loads(spec.value)["required"] == ["name", "age"]


def test_response_format_forms() -> None:
    assert spec_from_request(response_format={"type": "json_object"}) == GuidedSpec("json_object")
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}}
    assert spec_from_request(response_format=rf) == spec_from_request(guided_json=SCHEMA)


def test_structured_outputs_forms() -> None:
    assert spec_from_request(structured_outputs={"regex": "a+"}) == GuidedSpec("regex", "a+")
    assert spec_from_request(structured_outputs={"choice": ["x", "y", "x"]}) == GuidedSpec(
        "choice", choices=("x", "y")
    )
    assert spec_from_request(structured_outputs={"grammar": 'root ::= "a"'}).kind == "grammar"
    assert spec_from_request(structured_outputs={"json_object": True}).kind == "json_object"
    so = {"json": SCHEMA, "whitespace_pattern": r"[ ]?", "disable_fallback": True}
    assert spec_from_request(structured_outputs=so).whitespace_pattern == r"[ ]?"


def test_whitespace_pattern_only_kept_for_json() -> None:
    spec = spec_from_request(guided_json=SCHEMA, guided_whitespace_pattern=r"\s?")
    assert spec is not None and spec.whitespace_pattern == r"\s?"
    spec = spec_from_request(guided_regex="a", guided_whitespace_pattern=r"\s?")
    assert spec == GuidedSpec("regex", "a")  # same cache key as without it


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"guided_json": SCHEMA, "guided_regex": "a"}, ["guided_json", "guided_regex"]),
        (
            {"guided_choice": ["a"], "response_format": {"type": "json_object"}},
            ["guided_choice", "response_format (json_object)"],
        ),
        (
            {"guided_grammar": "root ::= 'a'", "structured_outputs": {"regex": "a"}},
            ["guided_grammar", "structured_outputs.regex"],
        ),
        (
            {"structured_outputs": {"regex": "a", "choice": ["a"]}},
            ["structured_outputs.regex", "structured_outputs.choice"],
        ),
    ],
)
def test_more_than_one_constraint_names_the_fields(kwargs: dict, names: list[str]) -> None:
    with pytest.raises(ValueError, match="more than one") as info:
        spec_from_request(**kwargs)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"guided_json": "{not json"}, "guided_json is not valid JSON"),
        ({"guided_json": "[1, 2]"}, "JSON schema object"),
        ({"guided_json": 3}, "guided_json must be a JSON schema"),
        ({"guided_regex": 5}, "guided_regex must be a string"),
        ({"guided_choice": "abc"}, "list of strings"),
        ({"guided_choice": []}, "at least one choice"),
        ({"guided_choice": ["a", 1]}, "only strings"),
        ({"guided_grammar": "  "}, "non-empty grammar"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, 'needs a "json_schema"'),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, '"schema"'),
        ({"structured_outputs": {"regexp": "a"}}, "unknown field"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "not supported"),
        ({"structured_outputs": "a"}, "must be an object"),
    ],
)
def test_malformed_values_are_value_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec_from_request(**kwargs)


def test_offline_params_refuse_a_plain_dict() -> None:
    # vLLM's SamplingParams takes GuidedDecodingParams (StructuredOutputsParams), not the
    # request's dict form: a ValueError naming the field, not an AttributeError at compile
    from ironlm import SamplingParams

    for field in ("guided_decoding", "structured_outputs"):
        with pytest.raises(ValueError, match="^guided_decoding must be a GuidedDecodingParams"):
            SamplingParams(**{field: {"json": SCHEMA}})
