"""OpenAI's Responses API in terms of the chat endpoint: the request model, its translation
into a chat request (instructions, input items, function tools, text.format, reasoning
effort, the previous response's conversation), the chat reply turned into a Response object,
and the store that keeps responses for ``previous_response_id`` and GET /v1/responses/{id}.

What the Responses API has and IronLM does not (background mode, built-in tools such as web
or file search, image input) is refused with a 400 naming the field.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.protocol import ChatCompletionRequest
from ironlm.entrypoints.openai.request_base import OpenAIRequest

# the request fields the translation owns; other chat fields (vLLM's extras: top_k, seed,
# stop, ...) pass to the chat request as they are
OWN_FIELDS = frozenset({
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream",
    "store", "previous_response_id", "tools", "tool_choice", "parallel_tool_calls", "text",
    "reasoning", "metadata", "user", "background", "include", "truncation", "top_logprobs",
    "service_tier", "prompt_cache_key", "safety_identifier", "max_tool_calls", "stream_options",
})  # fmt: skip
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
# chat fields with a Responses counterpart or no meaning for one reply: refused when sent
NOT_PASSED = frozenset({"messages", "n", "best_of", "use_beam_search", "echo", "logprobs",
                        "max_tokens", "max_completion_tokens", "response_format",
                        "functions", "function_call"})


class ResponsesRequest(OpenAIRequest):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    background: bool = False
    truncation: str | None = "disabled"
    top_logprobs: int | None = None


@dataclass
class StoredResponse:
    response: dict[str, Any]
    conversation: list[dict[str, Any]]  # chat messages up to and with its output (no instructions)


@dataclass
class ResponseStore:
    """The last ``capacity`` stored responses (oldest dropped first), in memory."""

    capacity: int = 1024
    items: OrderedDict[str, StoredResponse] = field(default_factory=OrderedDict)

    def put(self, stored: StoredResponse) -> None:
        self.items[stored.response["id"]] = stored
        while len(self.items) > self.capacity:
            self.items.popitem(last=False)

    def get(self, response_id: str, param: str = "response_id") -> StoredResponse:
        stored = self.items.get(response_id)
        if stored is None:
            raise APIError(f"Response with id '{response_id}' not found.", 404, param=param)
        return stored

    def delete(self, response_id: str) -> None:
        """Forget ``response_id`` (404 when it is not stored)."""
        self.get(response_id)
        del self.items[response_id]


def chat_body(req: ResponsesRequest,
              history: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the chat request doing what ``req`` asks, the conversation without the instructions):
    ``history`` (a previous response's conversation) comes before the input. 400 naming the
    field for what is not supported."""
    if req.background:
        raise APIError("background mode is not supported", 400, param="background")
    if req.truncation not in (None, "disabled"):
        raise APIError("truncation 'auto' is not supported: a prompt longer than the context "
                       "is refused", 400, param="truncation")  # fmt: skip
    extras = {k: v for k, v in req.model_dump(exclude_unset=True).items()
              if k not in OWN_FIELDS and k in ChatCompletionRequest.model_fields}  # fmt: skip
    for key in sorted(NOT_PASSED & set(extras)):  # the first by name: the same each time
        raise APIError(f"{key} is a chat completions parameter the Responses API does not "
                       "take", 400, param=key)  # fmt: skip
    conversation = [*history, *input_messages(req.input)]
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body: dict[str, Any] = {**extras, "model": req.model, "messages": system + conversation}
    for key, value in (("temperature", req.temperature), ("top_p", req.top_p),
                       ("max_completion_tokens", req.max_output_tokens), ("user", req.user)):
        if value is not None:
            body[key] = value
    if req.top_logprobs:
        body.update(logprobs=True, top_logprobs=req.top_logprobs)
    if req.tools:
        body["tools"] = [_chat_tool(t, i) for i, t in enumerate(req.tools)]
        body["parallel_tool_calls"] = req.parallel_tool_calls
        body["tool_choice"] = _chat_tool_choice(req.tool_choice)
    fmt = (req.text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise APIError("text.format must be an object with a type", 400, param="text.format")
    if fmt and fmt.get("type") == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt and fmt.get("type") == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    elif fmt and fmt.get("type") != "text":
        raise APIError(f"text.format type {fmt.get('type')!r} is not one of text, json_object, "
                       "json_schema", 400, param="text.format")  # fmt: skip
    effort = (req.reasoning or {}).get("effort")
    if effort is not None:
        body["reasoning_effort"] = effort
    return body, conversation


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of a Responses input: text, messages, function calls and their outputs
    (a model's own reasoning items are left out, as chat templates take no such turn)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role", "user"),
                        "content": _text(item.get("content", ""), i)})
        elif kind == "function_call":
            _require_strings(item, i, "call_id", "name")
            call = {"id": item["call_id"], "type": "function", "function": {
                "name": item["name"], "arguments": item.get("arguments", "")}}
            # calls right after an assistant turn are that turn's: one reply's text and
            # parallel calls, as output_items makes them
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            _require_strings(item, i, "call_id")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": _text(item.get("output", ""), i, "output")})
        elif kind != "reasoning":
            raise APIError(f"input[{i}].type {kind!r} is not supported (message, function_call, "
                           "function_call_output, reasoning)", 400, param=f"input[{i}]")
    return out


def _require_strings(item: dict[str, Any], i: int, *keys: str) -> None:
    for key in keys:
        if not isinstance(item.get(key), str):
            raise APIError(f"input[{i}].{key} must be a string", 400, param=f"input[{i}].{key}")


def _text(content: Any, i: int, key: str = "content") -> str:
    """The text of an item's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    where = f"input[{i}].{key}"
    if not isinstance(content, list):
        raise APIError(f"{where} must be a string or a list of text parts", 400, param=where)
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text", ""), str):
            raise APIError(f"{where} part of type {kind!r} is not supported (text only)", 400,
                           param=where)  # fmt: skip
        parts.append(part.get("text", ""))
    return "".join(parts)


def _chat_tool(tool: dict[str, Any], i: int) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise APIError(f"tools[{i}].type {tool.get('type')!r} is not supported (function tools "
                       "only)", 400, param=f"tools[{i}].type")  # fmt: skip
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


# the chat request's fields, as the Responses request names them (errors name the latter)
_PARAM_NAMES = {"max_completion_tokens": "max_output_tokens", "reasoning_effort":
                "reasoning.effort", "messages": "input", "response_format": "text.format"}


def responses_param(param: str | None) -> str | None:
    """The Responses field an error of the chat request's field ``param`` is about. A renamed
    field is named as a whole: its parts are laid out otherwise (``messages.3`` counts the
    instructions and the previous response's turns, ``response_format.json_schema`` nests
    what text.format holds flat)."""
    if param is None:
        return None
    return _PARAM_NAMES.get(param.partition(".")[0], param)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_object(req: ResponsesRequest, model: str, response_id: str, created: int,
                    status: str, output: list[dict[str, Any]],
                    usage: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """A Response object (OpenAI's fields) for ``req`` with ``output`` items; ``model`` is the
    name the server answers under (the request may name none)."""
    return {
        "id": response_id, "object": "response", "created_at": created, "model": model,
        "status": status, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {}, "output": output,
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": None},
        "store": req.store, "temperature": req.temperature,
        "text": req.text or {"format": {"type": "text"}}, "tool_choice": req.tool_choice,
        "tools": req.tools or [], "top_p": req.top_p, "truncation": req.truncation or "disabled",
        "usage": usage, "user": req.user,
    }  # fmt: skip


def usage_of(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if chat_usage is None:
        return None
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    # counted with --reasoning-parser (vLLM's), else absent: 0
    thinking = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": thinking},
            "total_tokens": chat_usage["total_tokens"]}  # fmt: skip


def output_items(message: dict[str, Any], logprobs: list[dict[str, Any]] | None = None
                 ) -> list[dict[str, Any]]:  # fmt: skip
    """The output items of a chat reply's message (and its ``logprobs.content``, which go
    with the text): its reasoning, its text, its calls."""
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if reasoning:
        items.append(reasoning_item(new_id("rs"), reasoning, "completed"))
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append(message_item(new_id("msg"), message.get("content") or "", "completed"))
        items[-1]["content"][0]["logprobs"] = logprobs or []
    for call in calls:
        items.append(call_item(new_id("fc"), call["id"], call["function"]["name"],
                               call["function"]["arguments"], "completed"))
    return items


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [text_part(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: str) -> dict[str, Any]:  # fmt: skip
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def conversation_after(conversation: list[dict[str, Any]],
                       output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored conversation: the one the response answered, then its output as the
    assistant's turn, read as input_messages reads the same items passed back as input (an
    output of reasoning alone, or none, is an empty turn)."""
    return [*conversation, *(input_messages(output) or [{"role": "assistant", "content": ""}])]


def now() -> int:
    return int(time.time())
