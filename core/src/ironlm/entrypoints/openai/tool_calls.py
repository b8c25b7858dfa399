"""Tool calling for chat completions (issue 7): validate tools, resolve tool_choice, and turn
generated text into tool calls, one shot or streaming.

- "none": text only.  "auto": the --tool-call-parser extracts calls from the model's text.
- "required" / a named function: generation is constrained by a guided JSON schema of the
  call(s), so arguments always parse and validate; no parser is needed.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.tool_call_scanner import CallArrayScanner
from ironlm.interfaces.guided import GuidedSpec
from ironlm.interfaces.tool_parser import DeltaToolCall, StreamDelta, ToolCall, ToolParser

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SCHEMA_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}

ToolMode = Literal["none", "auto", "required", "named"]


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


class ToolExtractor(Protocol):
    """Per choice: text -> (content, calls), or the same incrementally."""

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]: ...
    def feed(self, delta: str) -> StreamDelta: ...
    def finish(self) -> StreamDelta: ...


@dataclass
class ToolPlan:
    mode: ToolMode
    tools: list[dict[str, Any]]
    named: str | None = None
    parser_cls: type[ToolParser] | None = None
    parallel: bool = True

    def guided_spec(self) -> GuidedSpec | None:
        """The JSON schema that constrains "required" / named generation. Compact JSON (no
        whitespace between tokens, vLLM's disable_any_whitespace): a small model cannot stall
        in whitespace, and the arguments are the shortest text for the call. Closed within
        max_tokens (``close_at_budget``): a call the token limit would cut is completed by the
        shortest path the grammar allows, so every call parses."""
        if self.mode == "named":
            return GuidedSpec("json", json.dumps(_parameters(self._tool(self.named))),
                              disable_any_whitespace=True, close_at_budget=True)
        if self.mode == "required":
            defs: dict[str, Any] = {}
            options = []
            for i, t in enumerate(self.tools):
                params = _parameters(t)
                if _has_local_ref(params):  # its refs resolve from its own root: make it a def
                    defs[f"tool{i}"] = _rebase_refs(params, f"#/$defs/tool{i}")
                    params = {"$ref": f"#/$defs/tool{i}"}
                options.append({
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [t["function"]["name"]]},
                        "parameters": params,
                    },
                    "required": ["name", "parameters"],
                })
            schema: dict[str, Any] = {"type": "array", "minItems": 1,
                                      "items": {"anyOf": options}}
            if not self.parallel:
                schema["maxItems"] = 1
            if defs:
                schema["$defs"] = defs
            return GuidedSpec("json", json.dumps(schema), disable_any_whitespace=True,
                              close_at_budget=True)
        return None

    def _tool(self, name: str | None) -> dict[str, Any]:
        return next(t for t in self.tools if t["function"]["name"] == name)

    def adjust_request(self, tokenizer: Any, request: dict[str, Any]) -> dict[str, Any]:
        """Let the "auto" parser adjust the request (e.g. keep special tokens it parses)."""
        if self.mode == "auto" and self.parser_cls is not None:
            return self.parser_cls(tokenizer).adjust_request(request)
        return request

    def extractor(self, tokenizer: Any) -> ToolExtractor:
        if self.mode == "auto" and self.parser_cls is not None:
            return _ParserExtractor(self.parser_cls(tokenizer), self.parallel)
        if self.mode == "named":
            return _NamedExtractor(self.named or "")
        if self.mode == "required":
            return _RequiredExtractor()
        return _TextExtractor()


def plan_tools(
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    parallel: bool,
    auto_enabled: bool,
    parser_cls: type[ToolParser] | None,
) -> ToolPlan:
    """Validate the request's tools and tool_choice (400 naming the problem)."""
    if not tools:
        if tool_choice is not None:
            raise APIError("tool_choice is only allowed when tools are specified (tools is "
                           "missing or empty)", 400, param="tool_choice")
        return ToolPlan("none", [])
    _validate_tools(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice in ("none", "required"):
        return ToolPlan(choice, tools, parallel=parallel)  # type: ignore[arg-type]
    if choice == "auto":
        if not (auto_enabled and parser_cls is not None):
            raise APIError('"auto" tool choice requires --enable-auto-tool-choice and '
                           "--tool-call-parser to be set", 400, param="tool_choice")
        return ToolPlan("auto", tools, parser_cls=parser_cls, parallel=parallel)
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise APIError('tool_choice must be "none", "auto", "required" or {"type": '
                           '"function", "function": {"name": ...}}', 400, param="tool_choice")
        if name not in {t["function"]["name"] for t in tools}:
            raise APIError(f"tool_choice names function {name!r}, which is not in tools",
                           400, param="tool_choice")
        return ToolPlan("named", tools, named=name, parallel=parallel)
    raise APIError(f"invalid tool_choice {choice!r}: use none, auto, required or a named "
                   "function", 400, param="tool_choice")


def _validate_tools(tools: list[dict[str, Any]]) -> None:
    names = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise APIError(f"{where}.type must be 'function'", 400, param="tools")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise APIError(f"{where}.function must be an object", 400, param="tools")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise APIError(f"{where}.function.name must match ^[a-zA-Z0-9_-]{{1,64}}$, got "
                           f"{name!r}", 400, param="tools")
        if name in names:
            raise APIError(f"{where}: function {name!r} is defined twice", 400, param="tools")
        names.add(name)
        params = fn.get("parameters")
        if params is not None:
            problem = _schema_problem(params)
            if problem:
                raise APIError(f"{where}.function.parameters is not a valid JSON schema: "
                               f"{problem}", 400, param="tools")


def _schema_problem(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return f"expected an object, got {type(schema).__name__}"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    bad = [k for k in kinds if k not in _SCHEMA_TYPES]
    if bad:
        return f"unknown type {bad[0]!r}"
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            return "properties must be an object"
        for key, sub in props.items():
            problem = _schema_problem(sub)
            if problem:
                return f"properties.{key}: {problem}"
    required = schema.get("required")
    if required is not None and not (
        isinstance(required, list) and all(isinstance(r, str) for r in required)
    ):
        return "required must be a list of property names"
    if "items" in schema and not isinstance(schema["items"], (dict, bool)):
        return "items must be a schema object"
    if isinstance(schema.get("items"), dict):
        problem = _schema_problem(schema["items"])
        if problem:
            return f"items: {problem}"
    return None


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def _has_local_ref(schema: Any) -> bool:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            return True
        return any(_has_local_ref(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_local_ref(v) for v in schema)
    return False


def _rebase_refs(schema: Any, base: str) -> Any:
    """``schema`` with every local ``$ref`` ("#/..." from its own root) made relative to
    ``base``, the pointer where the schema now sits inside a larger one."""
    if isinstance(schema, dict):
        out = {k: _rebase_refs(v, base) for k, v in schema.items()}
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            out["$ref"] = base + ref[1:]
        return out
    if isinstance(schema, list):
        return [_rebase_refs(v, base) for v in schema]
    return schema


# -- extractors ----------------------------------------------------------------------------
class _TextExtractor:
    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        return text, []

    def feed(self, delta: str) -> StreamDelta:
        return StreamDelta(content=delta)

    def finish(self) -> StreamDelta:
        return StreamDelta()


class _ParserExtractor:
    def __init__(self, parser: ToolParser, parallel: bool) -> None:
        self.parser = parser
        self.parallel = parallel

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        got = self.parser.extract(text)
        if not got.tools_called:
            return text, []
        calls = got.tool_calls if self.parallel else got.tool_calls[:1]
        return got.content, calls

    def _keep(self, delta: StreamDelta) -> StreamDelta:
        if not self.parallel:
            delta.tool_calls = [c for c in delta.tool_calls if c.index == 0]
        return delta

    def feed(self, delta: str) -> StreamDelta:
        return self._keep(self.parser.extract_streaming(delta))

    def finish(self) -> StreamDelta:
        return self._keep(self.parser.finish_streaming())


class _NamedExtractor:
    """The whole output is the arguments object (surrounding blanks dropped)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = False  # the header fragment (id, name) was emitted
        self.seen_text = False
        self.held = ""  # trailing blanks: dropped unless more text follows

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        return None, [ToolCall(name=self.name, arguments=text.strip())]

    def feed(self, delta: str) -> StreamDelta:
        calls = []
        if not self.started:
            self.started = True
            calls.append(DeltaToolCall(index=0, name=self.name))
        text = self.held + delta
        if not self.seen_text:
            text = text.lstrip()
            self.seen_text = bool(text)
        body = text.rstrip()
        self.held = text[len(body):]
        if body:
            calls.append(DeltaToolCall(index=0, arguments=body))
        return StreamDelta(tool_calls=calls)

    def finish(self) -> StreamDelta:
        if self.started:
            return StreamDelta()
        return StreamDelta(tool_calls=[DeltaToolCall(index=0, name=self.name)])


class _RequiredExtractor:
    """Output is ``[{"name": ..., "parameters": {...}}, ...]`` (see tool_call_scanner)."""

    def __init__(self) -> None:
        self.scanner = CallArrayScanner()
        self.sent_header: list[bool] = []
        self.sent_args: list[int] = []  # chars of each call's arguments already emitted

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        scanner = CallArrayScanner()
        scanner.feed(text)
        calls = [
            ToolCall(name=c.name, arguments=scanner.text[c.args_start:c.args_end])
            for c in scanner.calls
            if c.name is not None and c.args_start is not None and c.args_end is not None
        ]
        return (None, calls) if calls else (text, [])

    def feed(self, delta: str) -> StreamDelta:
        self.scanner.feed(delta)
        out = []
        for i, call in enumerate(self.scanner.calls):
            if i == len(self.sent_header):
                self.sent_header.append(False)
                self.sent_args.append(0)
            if call.name is None:
                continue
            if not self.sent_header[i]:
                self.sent_header[i] = True
                out.append(DeltaToolCall(index=i, name=call.name))
            args = self.scanner.available_args(call)
            if len(args) > self.sent_args[i]:
                out.append(DeltaToolCall(index=i, arguments=args[self.sent_args[i]:]))
                self.sent_args[i] = len(args)
        return StreamDelta(tool_calls=out)

    def finish(self) -> StreamDelta:
        return StreamDelta()
