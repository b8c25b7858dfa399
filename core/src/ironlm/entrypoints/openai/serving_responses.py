"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API, run through
the chat endpoint (responses_api.py translates). A streamed response is the chat stream's
deltas re-told as the Responses events: response.created, output items added, text /
reasoning / function-call argument deltas, items done, then response.completed (or
response.incomplete when max_output_tokens cut it, response.failed on an engine error).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ironlm.entrypoints.openai import serving_chat
from ironlm.entrypoints.openai.errors import APIError, from_value_error, validation_error
from ironlm.entrypoints.openai.protocol import ChatCompletionRequest
from ironlm.entrypoints.openai.request_inputs import KNOWN_FIELDS
from ironlm.entrypoints.openai.responses_api import (
    ResponsesRequest,
    StoredResponse,
    call_item,
    chat_body,
    conversation_after,
    message_item,
    new_id,
    now,
    output_items,
    reasoning_item,
    response_object,
    responses_param,
    text_part,
    usage_of,
)
from ironlm.entrypoints.openai.state import ServerState


async def create_response(state: ServerState, request: Request,
                          req: ResponsesRequest) -> Response:  # fmt: skip
    state.serves("Responses API")
    history = state.responses.get(req.previous_response_id, "previous_response_id") \
        .conversation if req.previous_response_id else []  # fmt: skip
    body, conversation = chat_body(req, history)
    if req.stream:
        body.update(stream=True, stream_options={"include_usage": True})
    try:
        try:
            chat_req = ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:
            raise validation_error(exc.errors()) from None
        # the name the reply goes under (the request may name none): the chat endpoint's
        model = state.response_model(state.check_model(chat_req.model), chat_req.model)
        reply = await serving_chat.create_chat_completion(state, request, chat_req)
    except APIError as exc:  # named as the Responses request names the field
        exc.param = responses_param(exc.param)
        raise
    except ValueError as exc:
        error = from_value_error(exc, KNOWN_FIELDS)
        error.param = responses_param(error.param)
        raise error from exc
    if reply.status_code != 200:  # 499: the client left while the engine ran
        return reply
    response_id, created = new_id("resp"), now()
    if not isinstance(reply, StreamingResponse):
        data = json.loads(bytes(reply.body))
        choice = data["choices"][0]
        output = output_items(choice["message"], (choice.get("logprobs") or {}).get("content"))
        status = "incomplete" if choice["finish_reason"] == "length" else "completed"
        final = response_object(req, model, response_id, created, status, output,
                                usage_of(data.get("usage")))  # fmt: skip
        if req.store:
            state.responses.put(StoredResponse(final, conversation_after(conversation, output)))
        return JSONResponse(final)
    events = _Events(state, req, model, response_id, created, conversation)
    return StreamingResponse(events.run(reply), media_type="text/event-stream")


def retrieve_response(state: ServerState, response_id: str) -> dict[str, Any]:
    return state.responses.get(response_id).response


def delete_response(state: ServerState, response_id: str) -> dict[str, Any]:
    state.responses.delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


class _Events:
    """One streamed response: the chat chunks in, the Responses events out. One output item
    is open at a time (reasoning, then the message or the function calls, as they come)."""

    def __init__(self, state: ServerState, req: ResponsesRequest, model: str, response_id: str,
                 created: int, conversation: list[dict[str, Any]]) -> None:  # fmt: skip
        self.state, self.req, self.model = state, req, model
        self.id, self.created = response_id, created
        self.conversation = conversation
        self.seq = itertools.count()
        self.output: list[dict[str, Any]] = []  # finished items
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.call_index: int | None = None  # the chat tool call the open item is

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": next(self.seq), **fields}
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    async def run(self, reply: StreamingResponse) -> AsyncIterator[str]:
        shell = self.response("in_progress", None)
        yield self.event("response.created", response=shell)
        yield self.event("response.in_progress", response=shell)
        usage, finish = None, None
        try:
            async for data in _chunks(reply):
                if "error" in data:
                    for out in self.close():
                        yield out
                    failed = self.response("failed", None)
                    failed["error"] = {"code": str(data["error"].get("code") or "server_error"),
                                       "message": data["error"].get("message", "")}
                    yield self.event("response.failed", response=failed)
                    return
                usage = data.get("usage") or usage
                for choice in data.get("choices") or []:
                    logprobs = (choice.get("logprobs") or {}).get("content") or []
                    for out in self.delta(choice.get("delta") or {}, logprobs):
                        yield out
                    finish = choice.get("finish_reason") or finish
        finally:
            await reply.body_iterator.aclose()  # type: ignore[attr-defined]
        if finish is None:  # the chat stream stopped short (the client left): nothing to keep
            return
        for out in self.close():
            yield out
        status = "incomplete" if finish == "length" else "completed"
        final = self.response(status, usage_of(usage))
        if self.req.store:
            self.state.responses.put(StoredResponse(
                final, conversation_after(self.conversation, self.output)))
        yield self.event(f"response.{status}", response=final)

    def response(self, status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
        """The Response object with the items finished so far."""
        return response_object(self.req, self.model, self.id, self.created, status,
                               self.output, usage)  # fmt: skip

    def delta(self, delta: dict[str, Any], logprobs: list[dict[str, Any]]) -> list[str]:
        out: list[str] = []
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if reasoning:
            if self.open is None or self.open["type"] != "reasoning":
                out += self.close() + self.start(reasoning_item(new_id("rs"), "", "in_progress"))
            self.open["content"][0]["text"] += reasoning  # type: ignore[index]
            out.append(self.event("response.reasoning_text.delta", **self.where(),
                                  content_index=0, delta=reasoning))  # fmt: skip
        if delta.get("content"):
            if self.open is None or self.open["type"] != "message":
                out += self.close() + self.start(message_item(new_id("msg"), None, "in_progress"))
                out.append(self.event("response.content_part.added", **self.where(),
                                      content_index=0, part=text_part("")))  # fmt: skip
                self.open["content"] = [text_part("")]  # type: ignore[index]
            self.open["content"][0]["text"] += delta["content"]  # type: ignore[index]
            self.open["content"][0]["logprobs"] += logprobs  # type: ignore[index]
            out.append(self.event("response.output_text.delta", **self.where(),
                                  content_index=0, delta=delta["content"], logprobs=logprobs))
        for call in delta.get("tool_calls") or []:
            if self.open is None or self.call_index != call.get("index"):
                function = call.get("function") or {}
                out += self.close() + self.start(call_item(
                    new_id("fc"), call.get("id") or new_id("call"), function.get("name", ""), "",
                    "in_progress"))  # fmt: skip
                self.call_index = call.get("index")
            arguments = (call.get("function") or {}).get("arguments") or ""
            if arguments:
                self.open["arguments"] += arguments  # type: ignore[index]
                out.append(self.event("response.function_call_arguments.delta",
                                      **self.where(), delta=arguments))  # fmt: skip
        return out

    def where(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.output)}

    def start(self, item: dict[str, Any]) -> list[str]:
        self.open = item
        return [self.event("response.output_item.added", output_index=len(self.output),
                           item=json.loads(json.dumps(item)))]  # a copy: later deltas grow it

    def close(self) -> list[str]:
        item, out = self.open, []
        if item is None:
            return out
        if item["type"] == "reasoning":
            out.append(self.event("response.reasoning_text.done", **self.where(),
                                  content_index=0, text=item["content"][0]["text"]))
        elif item["type"] == "message":
            part = item["content"][0]
            out.append(self.event("response.output_text.done", **self.where(), content_index=0,
                                  text=part["text"], logprobs=part["logprobs"]))  # fmt: skip
            out.append(self.event("response.content_part.done", **self.where(),
                                  content_index=0, part=part))  # fmt: skip
        else:
            out.append(self.event("response.function_call_arguments.done", **self.where(),
                                  name=item["name"], arguments=item["arguments"]))
        item["status"] = "completed"
        out.append(self.event("response.output_item.done", output_index=len(self.output),
                              item=item))  # fmt: skip
        self.output.append(item)
        self.open, self.call_index = None, None
        return out


async def _chunks(reply: StreamingResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of the chat stream's server-sent events ([DONE] ends it)."""
    buffer = ""
    async for piece in reply.body_iterator:
        buffer += piece if isinstance(piece, str) else bytes(piece).decode()
        while "\n\n" in buffer:
            raw, buffer = buffer.split("\n\n", 1)
            for line in raw.splitlines():
                if line.startswith("data: ") and line[6:].strip() != "[DONE]":
                    yield json.loads(line[6:])
