"""POST /v1/chat/completions: messages -> chat template -> one engine request with n choices.

Streaming sends, per choice: the role first, then reasoning / content / tool-call deltas,
exactly one finish_reason; then the usage chunk when asked, then ``data: [DONE]``.

With --reasoning-parser each choice's text is split first: the thinking goes out as
``reasoning`` (and its older name ``reasoning_content``), the answer as ``content``, and only
the answer is parsed for tool calls. A prompt that already closed the reasoning (Qwen3 with
enable_thinking false) makes the whole output the answer.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ironlm.engine.input_processor import output_room
from ironlm.entrypoints.openai.chat_prompt import render_chat_prompt, template_kwargs
from ironlm.entrypoints.openai.chat_reasoning import ReasoningPlan, plan_reasoning
from ironlm.entrypoints.openai.engine_response import respond
from ironlm.entrypoints.openai.errors import APIError, engine_error, from_value_error
from ironlm.entrypoints.openai.logprobs import TokenNamer, chat_logprobs, prompt_logprobs_json
from ironlm.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChatStreamChoice,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
    UsageInfo,
)
from ironlm.entrypoints.openai.request_inputs import (
    KNOWN_FIELDS,
    check_context_length,
    check_max_tokens,
    check_request,
    compile_guided,
    guided_field,
    guided_spec,
    sampling_params,
    tokenize_prompt,
)
from ironlm.entrypoints.openai.request_tracker import tracked
from ironlm.entrypoints.openai.serving_beam import beam_search, beam_search_params
from ironlm.entrypoints.openai.state import ServerState, data_parallel_rank, request_id_for
from ironlm.entrypoints.openai.streaming import close_all, sse
from ironlm.entrypoints.openai.tool_calls import ToolExtractor, ToolPlan, plan_tools, tool_call_id
from ironlm.interfaces.reasoning_parser import ReasoningDelta
from ironlm.interfaces.tool_parser import StreamDelta
from ironlm.outputs import RequestOutput


@dataclass
class _Ctx:
    state: ServerState
    req: ChatCompletionRequest
    request_id: str
    created: int
    role: str
    echo: str  # text prepended to each choice (echo=true), else ""
    plan: ToolPlan
    num_top: int | None  # top_logprobs per token, None without logprobs
    name: TokenNamer
    model: str  # reported in responses: the adapter's name, or the served model's
    reasoning: ReasoningPlan  # --reasoning-parser's split of each choice (chat_reasoning)


async def create_chat_completion(
    state: ServerState, request: Request, req: ChatCompletionRequest
) -> Response:
    lora = state.check_model(req.model)
    state.serves("Chat Completions API")
    state.need_tokenizer("messages")
    check_request(req)
    plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls,
                      state.options.enable_auto_tool_choice, state.tool_parser_cls)
    if plan.mode == "auto":
        req = ChatCompletionRequest.model_validate(
            plan.adjust_request(state.tokenizer, req.model_dump())
        )
    guided = guided_spec(req)
    tool_guided = plan.guided_spec()
    if guided is not None and tool_guided is not None:
        raise APIError(f'tool_choice "{plan.mode}" cannot be combined with response_format or '
                       "guided_* parameters", 400, param="tool_choice")
    if req.top_logprobs is not None:
        if req.top_logprobs < 0:
            raise APIError("top_logprobs must be a positive value.", 400, param="top_logprobs")
        if not req.logprobs:
            raise APIError("when using `top_logprobs`, `logprobs` must be set to true.", 400,
                           param="top_logprobs")
        limit = state.engine.engine.config.max_logprobs
        if limit != -1 and req.top_logprobs > limit:  # -1: no limit
            raise APIError(f"top_logprobs requested {req.top_logprobs} logprobs, which is more "
                           f"than max_logprobs={limit}.", 400, param="top_logprobs")
    max_tokens = _max_tokens(req)
    check_max_tokens(max_tokens, "max_completion_tokens"
                     if req.max_completion_tokens is not None else "max_tokens")
    assert state.tokenizers is not None
    # off the event loop: the template, the tokens, the reasoning plan
    text, prompt, reasoning = await state.tokenizers.run(_render, state, req)
    prompt.cache_salt = req.cache_salt
    num_top = (req.top_logprobs or 0) if req.logprobs and not reasoning.hides_logprobs \
        else None
    limit = check_context_length(len(prompt.token_ids), max_tokens, state.max_model_len,
                                 state.default_sampling.get("max_tokens"))
    beams = beam_search_params(req, limit, num_top is not None) if req.use_beam_search else None
    if beams is not None and tool_guided is not None:
        raise APIError(f'tool_choice "{plan.mode}" is not supported with use_beam_search', 400,
                       param="tool_choice")
    params = sampling_params(req, max_tokens=limit, logprobs=num_top,
                             guided=guided or tool_guided, defaults=state.default_sampling)
    reasoning.guided = (guided or tool_guided) is not None
    if reasoning.active and state.reasoning_markers_special:
        params.skip_special_tokens = False  # the split must see the markers
    await compile_guided(state, guided or tool_guided, req.guided_decoding_backend,
                         "tools" if tool_guided is not None else guided_field(req))
    role = state.options.response_role if req.add_generation_prompt \
        else str(req.messages[-1].get("role", "assistant"))
    last = req.messages[-1]
    echo = last["content"] if req.echo and last.get("role") == role \
        and isinstance(last.get("content"), str) else ""
    as_ids = bool(req.return_tokens_as_token_ids or state.options.return_tokens_as_token_ids)
    response_id, engine_id = request_id_for("chatcmpl", request, req.request_id)
    ctx = _Ctx(state, req, response_id, int(time.time()), role, echo, plan, num_top,
               TokenNamer(state.tokenizer, as_ids), state.response_model(lora, req.model),
               reasoning)
    state.log_request(engine_id, text, prompt.token_ids, params)
    dp_rank = data_parallel_rank(state, request)
    gen = tracked(
        beam_search(state, engine_id, prompt, beams, req.n, req.priority, lora, dp_rank)
        if beams is not None else
        state.engine.generate(engine_id, prompt.as_engine_prompt(), params,
                              priority=req.priority, lora_request=lora,
                              reasoning_ended=reasoning.engine_flag(),
                              data_parallel_rank=dp_rank),
        state.new_tracker(req.n, req.best_of, params.max_tokens),
    )
    return await respond(
        request, [gen],
        build=lambda finals: JSONResponse(_response(ctx, finals[0]).model_dump()),
        stream=(lambda firsts: _stream(ctx, firsts[0], gen)) if req.stream else None,
    )


def _max_tokens(req: ChatCompletionRequest) -> int | None:
    """The request's output limit: max_completion_tokens, else the older max_tokens."""
    return req.max_completion_tokens if req.max_completion_tokens is not None \
        else req.max_tokens


def _render(tokenizer: Any, state: ServerState, req: ChatCompletionRequest
            ) -> tuple[str, Any, ReasoningPlan]:
    """The request's prompt text through the chat template, its token ids, and the plan of
    its reasoning (which renders the earlier turns once more when a parser is on)."""
    tools = req.tools or None
    if req.tool_choice == "none" and state.options.exclude_tools_when_tool_choice_none:
        tools = None  # vLLM's --exclude-tools-when-tool-choice-none

    def render(messages: list[dict[str, Any]], add_generation_prompt: bool,
               continue_final_message: bool) -> str:
        return render_chat_prompt(
            tokenizer, messages, state.options, request_template=req.chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tools=tools,
            documents=req.documents, chat_template_kwargs=req.chat_template_kwargs,
            reasoning_effort=req.reasoning_effort,
        )

    text = render(req.messages, req.add_generation_prompt, req.continue_final_message)
    reasoning = plan_reasoning(
        state.engine.engine.reasoning_parser, tokenizer, req,
        template_kwargs(state.options, req.chat_template_kwargs, req.reasoning_effort), text,
        lambda messages: render(messages, False, False))
    return text, tokenize_prompt(tokenizer, text, req.add_special_tokens,
                                 req.truncate_prompt_tokens, max_model_len=state.max_model_len,
                                 room=output_room(_max_tokens(req))), reasoning


def _finish_reason(reason: str | None, called: bool, mode: str) -> str | None:
    """"tool_calls" where calls came out: always in auto mode (vLLM: also when the text ran
    into max_tokens after a complete call), on a stop for a required or named call (one cut
    by max_tokens and closed stays "length", docs/structured-output.md)."""
    if reason is None or not called:
        return reason
    return "tool_calls" if reason == "stop" or mode == "auto" else reason


def _response(ctx: _Ctx, final: RequestOutput) -> ChatCompletionResponse:
    choices = []
    for o in final.outputs:
        parser = ctx.reasoning.split()
        reasoning, answer = parser.extract(o.text) if parser is not None else (None, o.text)
        content, calls = ctx.plan.extractor(ctx.state.tokenizer).extract(answer or "")
        if ctx.echo:
            content = ctx.echo + (content or "")
        if answer is None and not ctx.echo:
            content = None  # cut off while thinking: no answer (vLLM's null content)
        reasoning = ctx.reasoning.shown(reasoning)
        message = ChatMessage(
            role=ctx.role,
            reasoning=reasoning,
            reasoning_content=reasoning,
            content=content if (content or not calls) else None,
            tool_calls=[
                ToolCall(id=c.id or tool_call_id(),
                         function=FunctionCall(name=c.name, arguments=c.arguments))
                for c in calls
            ],
        )
        choices.append(ChatChoice(
            index=o.index,
            message=message,
            logprobs=chat_logprobs(o.token_ids, o.logprobs or [], ctx.num_top, ctx.name)
            if ctx.num_top is not None else None,
            finish_reason=_finish_reason(o.finish_reason, bool(calls), ctx.plan.mode),
            stop_reason=o.stop_reason,
            sentence_length=len(o.text),
            cum_log_probs=o.cumulative_logprob,
            token_ids=list(o.token_ids) if ctx.req.return_token_ids else None,
        ))
    prompt_tokens = final.num_prompt_tokens
    completion_tokens = sum(len(o.token_ids) for o in final.outputs)
    return ChatCompletionResponse(
        id=ctx.request_id,
        created=ctx.created,
        model=ctx.model,
        system_fingerprint=ctx.state.system_fingerprint,
        choices=choices,
        usage=UsageInfo.of(prompt_tokens, completion_tokens, ctx.state.cached_tokens([final]),
                           ctx.reasoning.tokens(final.outputs)),
        prompt_logprobs=prompt_logprobs_json(final.prompt_logprobs)
        if ctx.req.prompt_logprobs is not None else None,
        prompt_token_ids=list(final.prompt_token_ids) if ctx.req.return_token_ids else None,
    )


class _ChoiceStream:
    """Streaming state of one choice: what was sent, and its tool-call extractor."""

    def __init__(self, ctx: _Ctx) -> None:
        self.ctx = ctx
        self.parser = ctx.reasoning.split()
        self.extractor: ToolExtractor = ctx.plan.extractor(ctx.state.tokenizer)
        self.sent_text = 0
        self.sent_tokens = 0
        self.ids: dict[int, str] = {}  # tool-call index -> id
        self.done = False

    def delta(self, text: str, finished: bool) -> DeltaMessage:
        thought = ReasoningDelta(content=text)
        if self.parser is not None:
            thought = self.parser.extract_streaming(text) if text else ReasoningDelta()
            if finished:
                tail = self.parser.finish_streaming()
                thought = ReasoningDelta(
                    (thought.reasoning or "") + (tail.reasoning or "") or None,
                    (thought.content or "") + (tail.content or "") or None)
        text = thought.content or ""
        reasoning = self.ctx.reasoning.shown(thought.reasoning)
        got = self.extractor.feed(text) if text else StreamDelta()
        if finished:
            tail = self.extractor.finish()
            got = StreamDelta((got.content or "") + (tail.content or "") or None,
                              got.tool_calls + tail.tool_calls)
        calls = []
        for c in got.tool_calls:
            first = c.index not in self.ids
            if first:
                self.ids[c.index] = c.id or tool_call_id()
            calls.append(DeltaToolCall(
                index=c.index,
                id=self.ids[c.index] if first else None,
                type="function" if first else None,
                function=DeltaFunctionCall(name=c.name if first else None,
                                           arguments=c.arguments if (c.arguments or first)
                                           else None),
            ))
        return DeltaMessage(reasoning=reasoning, reasoning_content=reasoning,
                            content=got.content or None, tool_calls=calls or None)


async def _stream(
    ctx: _Ctx, first: RequestOutput, gen: AsyncIterator[RequestOutput]
) -> AsyncIterator[str]:
    req = ctx.req
    include_usage, continuous = ctx.state.stream_usage(req.stream_options)
    choices = [_ChoiceStream(ctx) for _ in range(req.n)]
    prompt_tokens = first.num_prompt_tokens

    latest = first  # the newest output: its count of prompt tokens the cache served

    def usage(completion_tokens: int, reasoning_tokens: int | None = None) -> dict[str, Any]:
        return UsageInfo.of(prompt_tokens, completion_tokens, ctx.state.cached_tokens([latest]),
                            reasoning_tokens).model_dump()

    def chunk(choice: ChatStreamChoice | None, **top: Any) -> str:
        body: dict[str, Any] = {
            "id": ctx.request_id, "object": "chat.completion.chunk", "created": ctx.created,
            "model": ctx.model, "system_fingerprint": ctx.state.system_fingerprint,
            "choices": [choice.model_dump()] if choice is not None else [], **top,
        }
        if include_usage:  # as vLLM: a choice's chunk counts its own tokens, the last all
            if choice is None:  # the last chunk: reasoning tokens counted once, at the end
                body["usage"] = usage(sum(ch.sent_tokens for ch in choices),
                                      ctx.reasoning.tokens(latest.outputs))
            else:
                body["usage"] = usage(choices[choice.index].sent_tokens) if continuous else None
        return sse(body)

    async def outputs() -> AsyncIterator[RequestOutput]:
        yield first
        async for out in gen:
            yield out

    try:
        for i in range(req.n):
            # vLLM's return_token_ids: the prompt's ids go with the first chunk
            top = {"prompt_token_ids": list(first.prompt_token_ids)} \
                if i == 0 and req.return_token_ids else {}
            yield chunk(ChatStreamChoice(index=i, delta=DeltaMessage(role=ctx.role, content="")),
                        **top)
            if ctx.echo:
                yield chunk(ChatStreamChoice(index=i, delta=DeltaMessage(content=ctx.echo)))
        async for out in outputs():
            latest = out
            for o in out.outputs:
                ch = choices[o.index]
                if ch.done:
                    continue
                new_text = o.text[ch.sent_text:]
                new_ids = o.token_ids[ch.sent_tokens:]
                finished = o.finish_reason is not None
                if not new_text and not new_ids and not finished:
                    continue
                logprobs = None
                if ctx.num_top is not None and new_ids:
                    positions = (o.logprobs or [])[ch.sent_tokens:]
                    logprobs = chat_logprobs(new_ids, positions, ctx.num_top, ctx.name)
                delta = ch.delta(new_text, finished)
                ch.sent_text = len(o.text)
                if not finished and delta.content is None and delta.tool_calls is None \
                        and delta.reasoning is None and new_text:
                    continue  # a parser holds the text back (or it is reasoning left out):
                    # no empty chunk (vLLM); its tokens' logprobs go out with the next chunk
                ch.sent_tokens, ch.done = len(o.token_ids), finished
                yield chunk(ChatStreamChoice(
                    index=o.index, delta=delta, logprobs=logprobs,
                    finish_reason=_finish_reason(o.finish_reason, bool(ch.ids), ctx.plan.mode),
                    stop_reason=o.stop_reason if finished else None,
                    token_ids=list(new_ids) if req.return_token_ids else None,
                ))
        if include_usage:
            yield chunk(None)
    except ValueError as exc:
        yield sse(from_value_error(exc, KNOWN_FIELDS).body())
    except RuntimeError as exc:  # the engine step or this request failed, or shutdown
        yield sse(engine_error(exc).body())
    finally:
        await close_all([gen])
    yield sse("[DONE]")
