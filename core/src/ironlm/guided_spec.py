"""Request-level structured-output inputs -> one normalised GuidedSpec (or None).

Lives in the core, not in ironlm-guided, so that the server can answer 400 for a malformed or
ambiguous request even when no guided-decoding plugin is installed. Three request forms are
understood, as vLLM and OpenAI clients send them:

- vLLM 0.6 parameters: ``guided_json`` (JSON text, dict, or a pydantic model class),
  ``guided_regex``, ``guided_choice``, ``guided_grammar``, ``guided_whitespace_pattern``;
- OpenAI ``response_format``: ``{"type": "text" | "json_object" | "json_schema",
  "json_schema": {"name", "schema", "strict"}}`` (what ``client.chat.completions.parse`` sends);
- vLLM's newer ``structured_outputs``: ``{json | regex | choice | grammar | json_object, ...}``
  with its options ``disable_fallback``, ``disable_any_whitespace`` (carried on the spec for
  the backends and the selection) and ``disable_additional_properties`` (applied here: every
  object schema that does not say otherwise gets ``"additionalProperties": false``).

Exactly one constraint may be given; more than one is a ValueError naming every field used.
Deep checks (is the regex valid, can the backend enforce the schema) belong to the backend's
``compile``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from ironlm.interfaces.guided import GuidedSpec

# structured_outputs keys that tune a constraint rather than state one.
_STRUCTURED_OPTIONS = frozenset(
    {
        "whitespace_pattern",
        "disable_fallback",
        "disable_any_whitespace",
        "disable_additional_properties",
    }
)
_STRUCTURED_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def spec_from_request(
    guided_json: Any = None,
    guided_regex: str | None = None,
    guided_choice: Any = None,
    guided_grammar: str | None = None,
    guided_whitespace_pattern: str | None = None,
    response_format: Any = None,
    structured_outputs: Any = None,
) -> GuidedSpec | None:
    """The request's single constraint as a GuidedSpec, or None when it has none.

    Raises ValueError (the server's 400) for a malformed value or for more than one constraint.
    """
    found: list[tuple[str, GuidedSpec]] = []
    whitespace = guided_whitespace_pattern
    if guided_json is not None:
        found.append(("guided_json", _json_spec(guided_json, "guided_json")))
    if guided_regex is not None:
        found.append(("guided_regex", _regex_spec(guided_regex, "guided_regex")))
    if guided_choice is not None:
        found.append(("guided_choice", _choice_spec(guided_choice, "guided_choice")))
    if guided_grammar is not None:
        found.append(("guided_grammar", _grammar_spec(guided_grammar, "guided_grammar")))
    if response_format is not None:
        spec = _response_format_spec(response_format)
        if spec is not None:
            found.append((f"response_format ({spec.kind})", spec))
    if structured_outputs is not None:
        so = _as_mapping(structured_outputs, "structured_outputs")
        unknown = sorted(set(so) - _STRUCTURED_OPTIONS - set(_STRUCTURED_CONSTRAINTS))
        if unknown:
            raise ValueError(
                f"structured_outputs has unknown field(s) {', '.join(unknown)}; known: "
                + ", ".join(_STRUCTURED_CONSTRAINTS + tuple(sorted(_STRUCTURED_OPTIONS)))
            )
        found.extend(_structured_outputs_specs(so))
        if so.get("whitespace_pattern") is not None:
            if whitespace is not None and whitespace != so["whitespace_pattern"]:
                raise ValueError(
                    "guided_whitespace_pattern and structured_outputs.whitespace_pattern "
                    "disagree; give one"
                )
            whitespace = so["whitespace_pattern"]
    if len(found) > 1:
        raise ValueError(
            "more than one structured-output constraint in one request: "
            + ", ".join(name for name, _ in found)
            + "; give exactly one"
        )
    if not found:
        return None
    spec = found[0][1]
    if whitespace is not None:
        if not isinstance(whitespace, str):
            raise ValueError("guided_whitespace_pattern must be a string (a regex)")
        if spec.kind in ("json", "json_object"):
            spec = dataclasses.replace(spec, whitespace_pattern=whitespace)
    if structured_outputs is not None:
        spec = apply_options(spec, _as_mapping(structured_outputs, "structured_outputs"))
    return spec


def apply_options(spec: GuidedSpec, options: Mapping[str, Any]) -> GuidedSpec:
    """``spec`` with structured_outputs' disable_* options applied (ValueError for a
    non-boolean value or an option that contradicts the spec)."""
    flags = {}
    for name in ("disable_fallback", "disable_any_whitespace", "disable_additional_properties"):
        value = options.get(name)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"structured_outputs.{name} must be true or false")
        flags[name] = bool(value)
    if flags["disable_any_whitespace"] and spec.whitespace_pattern:
        raise ValueError("structured_outputs.disable_any_whitespace contradicts the whitespace "
                         "pattern given; give one")
    value = spec.value
    if flags["disable_additional_properties"] and spec.kind == "json":
        value = json.dumps(close_objects(json.loads(value)), separators=(",", ":"),
                           ensure_ascii=False)
    return dataclasses.replace(
        spec, value=value, disable_fallback=flags["disable_fallback"],
        disable_any_whitespace=flags["disable_any_whitespace"] and spec.kind in
        ("json", "json_object"),
    )


# keywords whose value is one subschema / a list of them / a map of them
_SUBSCHEMA = ("items", "not", "if", "then", "else", "contains", "additionalItems",
              "unevaluatedItems", "propertyNames")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                   "dependentSchemas")


def close_objects(schema: Any) -> Any:
    """The schema with ``"additionalProperties": false`` on every object schema (one with
    ``type`` object or ``properties``) that sets neither it nor ``unevaluatedProperties``."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA:
        if key in out:
            out[key] = close_objects(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [close_objects(s) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: close_objects(s) for k, s in out[key].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = close_objects(out["additionalProperties"])
    types = out.get("type")
    is_object = types == "object" or (isinstance(types, list) and "object" in types) \
        or "properties" in out
    if is_object and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out


def _json_spec(value: Any, field: str) -> GuidedSpec:
    """guided_json / structured_outputs.json / response_format schema -> kind "json"."""
    schema: Any
    if isinstance(value, (str, bytes)):
        try:
            schema = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{field} is not valid JSON: {e}") from None
    elif isinstance(value, type) and callable(getattr(value, "model_json_schema", None)):
        schema = value.model_json_schema()  # a pydantic (v2) model class
    elif isinstance(value, Mapping):
        schema = dict(value)
    else:
        raise ValueError(
            f"{field} must be a JSON schema: JSON text, a dict, or a pydantic model class "
            f"(got {type(value).__name__})"
        )
    if not isinstance(schema, dict):
        raise ValueError(f"{field} must be a JSON schema object, got {type(schema).__name__}")
    try:
        # Canonical text: the compile-cache key. Key order is kept on purpose: it is the order
        # in which backends emit object properties.
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{field} is not JSON-serialisable: {e}") from None
    return GuidedSpec("json", text)


def _regex_spec(value: Any, field: str) -> GuidedSpec:
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string (a regular expression)")
    return GuidedSpec("regex", value)


def _choice_spec(value: Any, field: str) -> GuidedSpec:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{field} must be a list of strings")
    if not value:
        raise ValueError(f"{field} must contain at least one choice")
    bad = [c for c in value if not isinstance(c, str)]
    if bad:
        raise ValueError(f"{field} must contain only strings (got {bad[0]!r})")
    # Duplicates removed, order kept: the same choice set compiles once.
    return GuidedSpec("choice", choices=tuple(dict.fromkeys(value)))


def _grammar_spec(value: Any, field: str) -> GuidedSpec:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field} must be a non-empty grammar string (EBNF / Lark)")
    return GuidedSpec("grammar", value)


def _as_mapping(value: Any, field: str) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    dump = getattr(value, "model_dump", None)  # a pydantic request object
    if callable(dump):
        return {k: v for k, v in dump().items() if v is not None}
    raise ValueError(f"{field} must be an object, got {type(value).__name__}")


def _response_format_spec(value: Any) -> GuidedSpec | None:
    rf = _as_mapping(value, "response_format")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GuidedSpec("json_object")
    if kind == "json_schema":
        js = rf.get("json_schema")
        if js is None:
            raise ValueError('response_format of type "json_schema" needs a "json_schema" field')
        js = _as_mapping(js, "response_format.json_schema")
        schema = js.get("schema", js.get("json_schema"))
        if schema is None:
            raise ValueError('response_format.json_schema needs a "schema" field')
        return _json_spec(schema, "response_format.json_schema.schema")
    raise ValueError(
        f"response_format.type must be one of text, json_object, json_schema (got {kind!r})"
    )


def _structured_outputs_specs(so: Mapping[str, Any]) -> list[tuple[str, GuidedSpec]]:
    found: list[tuple[str, GuidedSpec]] = []
    for key in _STRUCTURED_CONSTRAINTS:
        value = so.get(key)
        if value is None or value is False:
            continue
        field = f"structured_outputs.{key}"
        if key == "json":
            found.append((field, _json_spec(value, field)))
        elif key == "regex":
            found.append((field, _regex_spec(value, field)))
        elif key == "choice":
            found.append((field, _choice_spec(value, field)))
        elif key == "grammar":
            found.append((field, _grammar_spec(value, field)))
        elif key == "json_object":
            if value is not True:
                raise ValueError(f"{field} must be true or false")
            found.append((field, GuidedSpec("json_object")))
        else:
            raise ValueError(f"{field} is not supported by IronLM; use json, regex or grammar")
    return found
