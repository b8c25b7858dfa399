"""Helpers for schema combinators: merging allOf parts / anyOf siblings, and proving that
oneOf options never overlap (so that oneOf can be enforced as anyOf)."""

from __future__ import annotations

from typing import Any, Callable

ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
     "readOnly", "writeOnly", "discriminator", "$defs", "definitions", "nullable",
     "contentEncoding", "contentMediaType", "$anchor"}
)


def disjoint(a: Any, b: Any, accepts: Callable[[Any, Any], bool]) -> bool:
    """Whether no JSON value can match both schemas, as far as cheap checks can prove:
    constants one side the other rejects, types that never meet, or a discriminator property
    (required on both sides with disjoint values). ``accepts(schema, value)`` validates."""
    for x, y in ((a, b), (b, a)):
        if isinstance(x, dict) and ("enum" in x or "const" in x):
            values = [x["const"]] if "const" in x else x["enum"]
            if not any(accepts(y, v) for v in values):
                return True
    ta, tb = type_set(a), type_set(b)
    if ta and tb and not (ta & tb):
        return True
    if ta == tb == {"object"}:
        pa, pb = a.get("properties", {}), b.get("properties", {})
        for name in set(a.get("required", [])) & set(b.get("required", [])):
            if name in pa and name in pb and disjoint(pa[name], pb[name], accepts):
                return True
    return False


def merge(a: dict[str, Any], b: Any, fail: Any) -> dict[str, Any]:
    """Conjunction of two schemas when their keywords do not interact (else ValueError).
    ``a`` is the outer schema (an allOf's own keywords so far, a union's siblings), ``b`` the
    part merged into it."""
    if b is True:
        return dict(a)
    if not isinstance(b, dict):
        raise fail("the schema `false` accepts nothing")
    clash = _interaction(a, b)
    if clash is not None:
        raise fail(clash)
    out = dict(a)
    for k, v in b.items():
        if k in ANNOTATIONS:
            continue
        if k in out and out[k] != v:
            if k == "required":
                out[k] = list(dict.fromkeys(list(out[k]) + list(v)))
            elif k == "properties":
                clash = set(out[k]) & set(v)
                if any(out[k][p] != v[p] for p in clash):
                    raise fail(f"allOf/anyOf parts both constrain properties {sorted(clash)}")
                out[k] = {**out[k], **v}
            else:
                raise fail(f"keyword {k!r} given twice with different values")
        else:
            out[k] = v
    return out


def _interaction(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Keywords whose meaning depends on their own schema object's siblings, split between
    the two: merged into one object they would mean something else. additionalProperties and
    items see only their own object's properties / prefixItems; unevaluatedProperties sees
    what its object's applicators evaluated, which merging allOf parts and anyOf options in
    turn (and parts of parts) does not follow exactly either (the JSON-Schema-Test-Suite's
    "in-place applicator siblings" cases), so it is refused too."""
    for x, y in ((a, b), (b, a)):
        for key in ("additionalProperties", "unevaluatedProperties"):
            if x.get(key, True) is not True and ("properties" in y or "patternProperties" in y):
                return f"{key} next to properties of another allOf/anyOf part"
        if "items" in x and "prefixItems" in y:
            return "items next to prefixItems of another allOf/anyOf part"
    return None


def type_set(s: Any) -> set[str]:
    if not isinstance(s, dict) or "type" not in s:
        return set()
    types = {s["type"]} if isinstance(s["type"], str) else set(s["type"])
    return types | {"number"} if "integer" in types else types


def same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b
