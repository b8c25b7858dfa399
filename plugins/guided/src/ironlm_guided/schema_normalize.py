"""JSON schema -> a small normal form every backend here enforces exactly, or ValueError.

The libraries silently ignore what they do not understand (outlines-core drops ``minimum``,
lm-format-enforcer drops ``format``, xgrammar drops ``uniqueItems``), which would let a 200
response violate the schema it accepted. So each schema is first checked against the JSON
Schema meta-schema and then rewritten into this normal form; anything outside it is refused
with the keyword and its location. Every normal-form node is one of::

    {}                                      any JSON value
    {"enum": [v, ...]}                      values already checked against their node
    {"$ref": "#/$defs/dN"}                  definitions are normalised into the root $defs
    {"anyOf": [n, ...]}                     oneOf only when its options provably never overlap
    {"type": "object", "properties": {..}, "required": [..]}      no other keys ever emitted
    {"type": "object", "additionalProperties": n | False}          a dictionary
    {"type": "array", "items": n, "minItems"?, "maxItems"?} | {"type": "array", "prefixItems": [..]}
    {"type": "string", one of: "minLength"/"maxLength" | "pattern" | "format"}
    {"type": "integer" | "number", "minimum"?, "maximum"?, "exclusiveMinimum"?, ...}
    {"type": "boolean"} | {"type": "null"}

Each output is a subset of what the input schema accepts, so enforcing the normal form exactly
keeps every generated value valid.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ironlm.interfaces.guided import UnsupportedFeatureError
from ironlm_guided.schema_union import ANNOTATIONS, disjoint, merge, same

_TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties", "minProperties",
               "maxProperties", "unevaluatedProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}
_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


@dataclass(frozen=True)
class SchemaSupport:
    """What a backend enforces beyond the always-supported core of the normal form."""

    backend: str
    numeric_bounds: bool  # minimum / maximum / exclusive* on integer and number
    multiple_of: bool  # multipleOf on integer
    formats: frozenset[str]  # string formats enforced exactly
    pattern: bool  # string pattern


def normalize_schema(text: str, support: SchemaSupport) -> dict[str, Any]:
    """Parse, meta-validate and normalise a JSON schema text. ValueError names the problem."""
    import jsonschema  # not at module import: the plugin hook imports this module

    try:
        root = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
    if not isinstance(root, dict):
        raise ValueError("the JSON schema must be a JSON object")
    cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(root)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise ValueError(f"invalid JSON schema at {where}: {e.message}") from None
    try:
        return _Normalizer(root, cls(root), support).run()
    except RecursionError:
        raise ValueError("the JSON schema nests too deeply (or an allOf refers to itself)") \
            from None


class _Normalizer:
    def __init__(self, root: dict[str, Any], validator: Any, support: SchemaSupport) -> None:
        self.root = root
        self.validator = validator
        self.support = support
        self.defs: dict[str, Any] = {}
        self.def_names: dict[str, str] = {}  # JSON pointer -> normalised def name

    def run(self) -> dict[str, Any]:
        out = self.node(self.root, "#")
        if "#" in self.def_names:  # the root refers to itself
            out = {"$ref": f"#/$defs/{self.def_names['#']}"}
        if self.defs:
            out = {**out, "$defs": self.defs}
        return out

    def fail(self, where: str, problem: str) -> ValueError:
        return UnsupportedFeatureError(
            f"JSON schema at {where}: {problem}; the {self.support.backend!r} guided-decoding "
            "backend cannot enforce this"
        )

    def resolve(self, ref: str, where: str) -> Any:
        if not ref.startswith("#"):
            raise self.fail(where, f"$ref {ref!r} is not local (only '#/...' refs are supported)")
        target: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise ValueError(f"JSON schema at {where}: $ref {ref!r} does not resolve")
        return target

    def ref(self, ref: str, where: str) -> dict[str, Any]:
        pointer = "#" + ref[1:].rstrip("/") if ref != "#" else "#"
        if pointer not in self.def_names:
            name = f"d{len(self.def_names)}"
            self.def_names[pointer] = name
            self.defs[name] = {}  # placeholder while recursing (cycles)
            self.defs[name] = self.node(self.resolve(ref, where), pointer)
        return {"$ref": f"#/$defs/{self.def_names[pointer]}"}

    def node(self, s: Any, where: str) -> dict[str, Any]:
        if s is True:
            return {}
        if s is False or not isinstance(s, dict):
            raise self.fail(where, "the schema `false` accepts nothing")
        keys = {k for k in s if k not in ANNOTATIONS}
        if "$ref" in keys:
            if keys != {"$ref"}:
                raise self.fail(where, f"$ref with sibling keywords {sorted(keys - {'$ref'})}")
            return self.ref(s["$ref"], where)
        if "allOf" in keys:
            merged = {k: v for k, v in s.items() if k != "allOf"}
            for i, part in enumerate(s["allOf"]):
                if isinstance(part, dict) and set(part) == {"$ref"}:
                    part = self.resolve(part["$ref"], where)
                merged = merge(merged, part, lambda k: self.fail(f"{where}/allOf/{i}", k))
            return self.node(merged, where)
        if "enum" in keys or "const" in keys:
            return self.enum(s, where)
        for comb in ("anyOf", "oneOf"):
            if comb in keys:
                return self.union(s, comb, where)
        types = s.get("type")
        if isinstance(types, list):
            if len(types) == 1:
                return self.node({**s, "type": types[0]}, where)
            return {"anyOf": [self.node({**s, "type": t}, f"{where}/type/{t}") for t in types]}
        if types is None:
            types = next((t for t in ("object", "array", "string", "number")
                          if keys & _TYPE_KEYWORDS[t]), None)
            if types is None:
                rest = keys - {"type"}
                if rest:
                    raise self.fail(where, f"unsupported keyword(s) {sorted(rest)}")
                return {}
        return self.typed(s, types, keys, where)

    def enum(self, s: dict[str, Any], where: str) -> dict[str, Any]:
        values = [s["const"]] if "const" in s else list(s["enum"])
        check = self.validator.evolve(schema=s)
        kept: list[Any] = []
        for v in values:  # keep only the values the whole node accepts, without duplicates
            if check.is_valid(v) and not any(same(v, k) for k in kept):
                kept.append(v)
        if not kept:
            raise ValueError(f"JSON schema at {where}: no enum/const value satisfies the schema")
        return {"enum": kept}

    def union(self, s: dict[str, Any], comb: str, where: str) -> dict[str, Any]:
        siblings = {k: v for k, v in s.items() if k != comb and k not in ANNOTATIONS}
        options = [self.resolve(o["$ref"], where) if isinstance(o, dict) and set(o) == {"$ref"}
                   and siblings else o for o in s[comb]]
        if comb == "oneOf":
            self.check_disjoint(s[comb], f"{where}/oneOf")
        out: list[dict[str, Any]] = []
        for i, opt in enumerate(options):
            sub = f"{where}/{comb}/{i}"
            merged = merge(siblings, opt, lambda k, sub=sub: self.fail(sub, k)) if siblings \
                else opt
            n = self.node(merged, sub)
            out.extend(n["anyOf"] if set(n) == {"anyOf"} else [n])
        return out[0] if len(out) == 1 else {"anyOf": out}

    def accepts(self, schema: Any, value: Any) -> bool:
        """Whether ``value`` validates against ``schema`` (refs resolved in the root)."""
        return bool(self.validator.evolve(schema=schema).is_valid(value))

    def check_disjoint(self, options: list[Any], where: str) -> None:
        """oneOf = exactly one option; enforced as anyOf only when no value can match two."""
        resolved = [self.resolve(o["$ref"], where) if isinstance(o, dict) and "$ref" in o
                    else o for o in options]
        for i in range(len(resolved)):
            for j in range(i + 1, len(resolved)):
                if not disjoint(resolved[i], resolved[j], self.accepts):
                    raise self.fail(f"{where}", f"options {i} and {j} of oneOf may both match "
                                    "(use anyOf, or a const discriminator property)")

    def typed(self, s: dict[str, Any], t: str, keys: set[str], where: str) -> dict[str, Any]:
        if t not in _TYPES:
            raise self.fail(where, f"unknown type {t!r}")
        allowed = _TYPE_KEYWORDS.get("number" if t == "integer" else t, set()) | {"type"}
        # keywords of other types do not apply to this type's values: dropping them is exact
        foreign = set().union(*(v for k, v in _TYPE_KEYWORDS.items()
                                if k != ("number" if t == "integer" else t)))
        unknown = keys - allowed - foreign
        if unknown:
            raise self.fail(where, f"unsupported keyword(s) {sorted(unknown)}")
        if t == "object":
            return self.object(s, where)
        if t == "array":
            return self.array(s, where)
        if t == "string":
            return self.string(s, where)
        if t in ("integer", "number"):
            return self.numeric(s, t, where)
        return {"type": t}

    def object(self, s: dict[str, Any], where: str) -> dict[str, Any]:
        props = s.get("properties") or {}
        required = list(s.get("required", []))
        missing = [r for r in required if r not in props]
        if missing:
            raise self.fail(where, f"required properties {missing} are not listed in properties")
        if props:
            if s.get("minProperties", 0) > len(required):
                raise self.fail(where, "minProperties exceeds the number of required properties")
            if s.get("maxProperties", len(props)) < len(props):
                raise self.fail(where, "maxProperties is below the number of properties")
            out_props = {k: self.node(v, f"{where}/properties/{k}") for k, v in props.items()}
            return {"type": "object", "properties": out_props, "required": required}
        if s.get("minProperties", 0) > 0 or "maxProperties" in s:
            raise self.fail(where, "minProperties / maxProperties on a dictionary")
        extra = s.get("additionalProperties", s.get("unevaluatedProperties", True))
        if extra is False:
            return {"type": "object", "properties": {}, "required": []}
        value = self.node(extra, f"{where}/additionalProperties")
        return {"type": "object", "additionalProperties": value}

    def array(self, s: dict[str, Any], where: str) -> dict[str, Any]:
        lo, hi = _count(s, "minItems", where), _count(s, "maxItems", where)
        lo = lo or 0
        if hi is not None and lo > hi:
            raise ValueError(f"JSON schema at {where}: minItems > maxItems accepts nothing")
        if s.get("uniqueItems") and (hi is None or hi > 1):
            raise self.fail(where, "uniqueItems")
        if "prefixItems" in s:
            prefix = s["prefixItems"]
            if not (lo <= len(prefix) and (hi is None or len(prefix) <= hi)):
                raise self.fail(where, "prefixItems with minItems/maxItems that exclude them")
            return {"type": "array", "prefixItems": [
                self.node(p, f"{where}/prefixItems/{i}") for i, p in enumerate(prefix)]}
        items = s.get("items", True)
        if items is False:
            hi = 0
            items = True
        out: dict[str, Any] = {"type": "array", "items": self.node(items, f"{where}/items")}
        if lo:
            out["minItems"] = lo
        if hi is not None:
            out["maxItems"] = hi
        return out

    def string(self, s: dict[str, Any], where: str) -> dict[str, Any]:
        lo, hi = _count(s, "minLength", where), _count(s, "maxLength", where)
        lo = lo or 0
        if hi is not None and lo > hi:
            raise ValueError(f"JSON schema at {where}: minLength > maxLength accepts nothing")
        if "format" in s and s["format"] not in self.support.formats:
            raise self.fail(where, f"string format {s['format']!r} (enforced formats: "
                            f"{', '.join(sorted(self.support.formats)) or 'none'})")
        if "pattern" in s and not self.support.pattern:
            raise self.fail(where, "string pattern")
        if sum(("pattern" in s, "format" in s, bool(lo) or hi is not None)) > 1:
            raise self.fail(where, "pattern / format combined with each other or with lengths")
        out: dict[str, Any] = {"type": "string"}
        for k in ("pattern", "format"):
            if k in s:
                out[k] = s[k]
        if lo:
            out["minLength"] = lo
        if hi is not None:
            out["maxLength"] = hi
        return out

    def numeric(self, s: dict[str, Any], t: str, where: str) -> dict[str, Any]:
        bounds = {k: s[k] for k in ("minimum", "maximum", "exclusiveMinimum",
                                    "exclusiveMaximum") if k in s}
        for key in ("exclusiveMinimum", "exclusiveMaximum"):  # draft 4: a flag on the bound
            if isinstance(bounds.get(key), bool):
                flag, plain = bounds.pop(key), "minimum" if key == "exclusiveMinimum" else "maximum"
                if flag and plain in bounds:
                    bounds[key] = bounds.pop(plain)
        lo = hi = None
        if t == "integer":
            lo = max([math.ceil(bounds[k]) for k in ("minimum",) if k in bounds]
                     + [math.floor(bounds[k]) + 1 for k in ("exclusiveMinimum",) if k in bounds],
                     default=None)
            hi = min([math.floor(bounds[k]) for k in ("maximum",) if k in bounds]
                     + [math.ceil(bounds[k]) - 1 for k in ("exclusiveMaximum",) if k in bounds],
                     default=None)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"JSON schema at {where}: no integer within the bounds")
        if bounds and not self.support.numeric_bounds:
            raise self.fail(where, f"numeric bounds {sorted(bounds)}")
        if "multipleOf" in s and not (self.support.multiple_of and t == "integer"
                                      and float(s["multipleOf"]).is_integer()):
            raise self.fail(where, "multipleOf")
        out: dict[str, Any] = {"type": t}
        if t == "integer":
            out.update({k: v for k, v in (("minimum", lo), ("maximum", hi)) if v is not None})
            if "multipleOf" in s:
                out["multipleOf"] = int(s["multipleOf"])
            return out
        out.update(bounds)
        return out


def _count(s: dict[str, Any], key: str, where: str) -> int | None:
    """A length or item-count keyword as an int (JSON Schema takes 2.0 for 2: backends would
    read a float bound as no bound), None when absent. The metaschema check has already
    refused negative and fractional values; this names them again if it is ever skipped."""
    value = s.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
            or value != int(value):
        raise ValueError(f"JSON schema at {where}: {key} must be a non-negative integer, "
                         f"got {value!r}")
    return int(value)
