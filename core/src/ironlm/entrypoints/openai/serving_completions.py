"""POST /v1/completions: one engine request per prompt, n choices each, streamed or not.

Choice index = prompt index * n + sequence index (as OpenAI and vLLM number them).
``echo`` with ``max_tokens: 0`` scores the prompt (vLLM's echo without generation: the legacy
API's way to read a text's log-likelihood): the engine runs one step for the prompt's
logprobs, and each choice is the prompt alone (the one token that step made is left out of
the text, and counted in usage, as vLLM counts it).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ironlm.engine.input_processor import output_room
from ironlm.entrypoints.openai.embeds_prompts import embeds_prompts
from ironlm.entrypoints.openai.engine_response import respond
from ironlm.entrypoints.openai.errors import APIError, engine_error, from_value_error
from ironlm.entrypoints.openai.fim import fim_prompt
from ironlm.entrypoints.openai.logprobs import (
    TokenNamer,
    completion_logprobs,
    prompt_logprobs_json,
)
from ironlm.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
)
from ironlm.entrypoints.openai.request_inputs import (
    KNOWN_FIELDS,
    EnginePrompt,
    check_context_length,
    check_max_tokens,
    check_request,
    compile_guided,
    guided_field,
    guided_spec,
    sampling_params,
    split_prompts,
    tokenize_prompts,
)
from ironlm.entrypoints.openai.request_tracker import tracked
from ironlm.entrypoints.openai.serving_beam import beam_search, beam_search_params
from ironlm.entrypoints.openai.state import ServerState, data_parallel_rank, request_id_for
from ironlm.entrypoints.openai.streaming import close_all, merge, sse
from ironlm.outputs import CompletionOutput, RequestOutput
from ironlm.sampling_params import SamplingParams


@dataclass
class _Ctx:
    state: ServerState
    req: CompletionRequest
    request_id: str
    created: int
    prompts: list[EnginePrompt]
    name: TokenNamer
    model: str  # reported in responses: the adapter's name, or the served model's

    @property
    def echo_only(self) -> bool:
        return _echo_only(self.req)

    def prompt_text(self, i: int) -> str:
        p = self.prompts[i]
        return p.text if p.text is not None else self.state.tokenizer.decode(p.token_ids)


async def create_completion(
    state: ServerState, request: Request, req: CompletionRequest
) -> Response:
    lora = state.check_model(req.model)
    state.serves("Completions API")
    check_request(req)
    echo_only = _echo_only(req)
    if not echo_only:
        check_max_tokens(req.max_tokens)
    embedded = await embeds_prompts(state, req, output_room(req.max_tokens))
    if req.prompt is None and not embedded:
        raise APIError("either prompt or prompt_embeds is required", 400, param="prompt")
    # vLLM's: with prompt_embeds, an empty (or no) prompt adds nothing
    raw = split_prompts(req.prompt) if not embedded or req.prompt not in (None, "") else []
    for field, given in (("suffix", req.suffix is not None), ("echo", req.echo),
                         ("use_beam_search", req.use_beam_search)):
        if given:  # they read or write text
            state.need_tokenizer(field)
    if req.suffix is not None:
        if len(raw) != 1:
            raise APIError("suffix takes exactly one prompt", 400, param="suffix")
        assert state.tokenizers is not None
        ids = await state.tokenizers.run(fim_prompt, state.vocab_size, state.model_name, raw[0],
                                         req.suffix, req.add_special_tokens)
        prompts = [EnginePrompt(None, ids)]
    else:
        prompts = embedded + await tokenize_prompts(state, raw, req.add_special_tokens,
                                                    req.truncate_prompt_tokens,
                                                    room=output_room(req.max_tokens))
    for p in prompts:
        p.cache_salt = req.cache_salt
    guided = guided_spec(req)
    prompt_lps = req.prompt_logprobs or (req.logprobs if req.echo else None)
    limits = [check_context_length(p.num_tokens, 1 if echo_only else req.max_tokens,
                                   state.max_model_len,
                                   state.default_sampling.get("max_tokens"))
              for p in prompts]
    beams = [beam_search_params(req, m, req.logprobs is not None) for m in limits] \
        if req.use_beam_search else None
    params: list[SamplingParams] = [
        sampling_params(req, max_tokens=m, logprobs=req.logprobs, prompt_logprobs=prompt_lps,
                        guided=guided, defaults=state.default_sampling)
        for m in limits
    ]
    await compile_guided(state, guided, req.guided_decoding_backend, guided_field(req))
    as_ids = bool(req.return_tokens_as_token_ids or state.options.return_tokens_as_token_ids)
    response_id, engine_id = request_id_for("cmpl", request, req.request_id)
    ctx = _Ctx(state, req, response_id, int(time.time()), prompts,
               TokenNamer(state.tokenizer, as_ids or state.tokenizer is None),
               state.response_model(lora, req.model))
    gens = []
    dp_rank = data_parallel_rank(state, request)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        rid = f"{engine_id}-{i}"
        state.log_request(rid, p.text, p.token_ids, sp)
        gen = beam_search(state, rid, p, beams[i], req.n, req.priority, lora, dp_rank) \
            if beams is not None else state.engine.generate(
                rid, p.as_engine_prompt(), sp, priority=req.priority, lora_request=lora,
                data_parallel_rank=dp_rank)
        gens.append(tracked(gen, state.new_tracker(req.n, req.best_of, sp.max_tokens)))
    return await respond(
        request, gens,
        build=lambda finals: JSONResponse(_response(ctx, finals).model_dump()),
        stream=(lambda firsts: _stream(ctx, firsts, gens)) if req.stream else None,
    )


def _ids(ids: list[int] | None) -> list[int] | None:
    """A prompt's ids as return_token_ids gives them: None for an embedded prompt."""
    return list(ids) if ids is not None else None


def _echo_only(req: CompletionRequest) -> bool:
    """echo without generation: choices hold the prompt, not the token run alongside it."""
    return req.echo and req.max_tokens == 0


def _choice(ctx: _Ctx, prompt_idx: int, final: RequestOutput, o: CompletionOutput) -> CompletionChoice:
    req = ctx.req
    text, token_ids, positions = o.text, list(o.token_ids), list(o.logprobs or [])
    if ctx.echo_only:
        text, token_ids, positions = "", [], []
    if req.echo:
        text = ctx.prompt_text(prompt_idx) + text
        token_ids = list(final.prompt_token_ids) + token_ids
        positions = list(final.prompt_logprobs or [None] * len(final.prompt_token_ids)) \
            + positions
    return CompletionChoice(
        index=prompt_idx * req.n + o.index,
        text=text,
        logprobs=completion_logprobs(token_ids, positions, req.logprobs, ctx.name)
        if req.logprobs is not None else None,
        finish_reason=o.finish_reason,
        stop_reason=o.stop_reason,
        prompt_logprobs=prompt_logprobs_json(final.prompt_logprobs)
        if req.prompt_logprobs is not None else None,
        sentence_length=0 if ctx.echo_only else len(o.text),
        cum_log_probs=None if ctx.echo_only else o.cumulative_logprob,
        prompt_token_ids=_ids(final.prompt_token_ids) if req.return_token_ids else None,
        token_ids=list(o.token_ids) if req.return_token_ids else None,
    )


def _response(ctx: _Ctx, finals: list[RequestOutput]) -> CompletionResponse:
    choices = [_choice(ctx, i, f, o) for i, f in enumerate(finals) for o in f.outputs]
    prompt_tokens = sum(f.num_prompt_tokens for f in finals)
    # echo without generation counts the token run for it, as vLLM does
    completion_tokens = sum(len(o.token_ids) for f in finals for o in f.outputs)
    return CompletionResponse(
        id=ctx.request_id,
        created=ctx.created,
        model=ctx.model,
        system_fingerprint=ctx.state.system_fingerprint,
        choices=choices,
        usage=UsageInfo.of(prompt_tokens, completion_tokens, ctx.state.cached_tokens(finals)),
    )


async def _stream(
    ctx: _Ctx, firsts: list[RequestOutput], gens: list[AsyncIterator[RequestOutput]]
) -> AsyncIterator[str]:
    req = ctx.req
    include_usage, continuous = ctx.state.stream_usage(req.stream_options)
    num_choices = len(ctx.prompts) * req.n
    sent_text = [0] * num_choices  # chars of o.text already sent
    sent_tokens = [0] * num_choices
    offset = [0] * num_choices  # text offset of the next token (logprobs)
    done = [False] * num_choices
    ids_sent: list[int | None] = [None] * num_choices  # return_token_ids: None before any
    # the prompt goes out once per choice (vLLM's has_echoed): an output can list a choice
    # before its first token, and it must not be echoed again with that token
    echoed = [False] * num_choices
    prompt_tokens = [p.num_tokens for p in ctx.prompts]
    generated = [0] * num_choices

    latest = list(firsts)  # per prompt, its newest output (cached prompt tokens)

    def usage() -> dict[str, Any]:
        return UsageInfo.of(sum(prompt_tokens), sum(generated),
                            ctx.state.cached_tokens(latest)).model_dump()

    def chunk(choice: dict[str, Any]) -> str:
        body: dict[str, Any] = {
            "id": ctx.request_id, "object": "text_completion", "created": ctx.created,
            "model": ctx.model, "system_fingerprint": ctx.state.system_fingerprint,
            "choices": [choice],
        }
        if include_usage:  # as vLLM: a choice's chunk counts its prompt and its own tokens
            idx = choice["index"]
            body["usage"] = UsageInfo.of(prompt_tokens[idx // req.n], generated[idx]
                                         ).model_dump() if continuous else None
        return sse(body)

    async def outputs() -> AsyncIterator[tuple[int, RequestOutput]]:
        for i, out in enumerate(firsts):
            yield i, out
        async for item in merge(gens):
            yield item

    try:
        async for pi, out in outputs():
            latest[pi] = out
            for o in out.outputs:
                idx = pi * req.n + o.index
                if done[idx]:
                    continue
                text, lp_ids, lp_pos = "", [], []
                if req.echo and not echoed[idx]:
                    echoed[idx] = True
                    text = ctx.prompt_text(pi)
                    lp_ids = list(out.prompt_token_ids)
                    lp_pos = list(out.prompt_logprobs or [None] * len(lp_ids))
                if not ctx.echo_only:
                    text += o.text[sent_text[idx]:]
                    lp_ids += o.token_ids[sent_tokens[idx]:]
                    lp_pos += (o.logprobs or [])[sent_tokens[idx]:]
                if not text and not lp_ids and not o.finish_reason:
                    continue
                logprobs = None
                if req.logprobs is not None:
                    logprobs = completion_logprobs(
                        lp_ids, lp_pos, req.logprobs, ctx.name, offset[idx]
                    ).model_dump()
                offset[idx] += len(text)
                sent_text[idx], sent_tokens[idx] = len(o.text), len(o.token_ids)
                generated[idx] = len(o.token_ids)
                done[idx] = o.finish_reason is not None
                choice = {"index": idx, "text": text, "logprobs": logprobs,
                          "finish_reason": o.finish_reason, "stop_reason": o.stop_reason}
                if req.return_token_ids:  # the prompt's ids with a choice's first chunk
                    if ids_sent[idx] is None:
                        choice["prompt_token_ids"] = _ids(out.prompt_token_ids)
                    choice["token_ids"] = list(o.token_ids[ids_sent[idx] or 0:])
                    ids_sent[idx] = len(o.token_ids)
                if done[idx] and not ctx.echo_only:
                    choice.update(sentence_length=len(o.text),
                                  cum_log_probs=o.cumulative_logprob)
                yield chunk(choice)
        if include_usage:
            yield sse({
                "id": ctx.request_id, "object": "text_completion", "created": ctx.created,
                "model": ctx.model,
                "system_fingerprint": ctx.state.system_fingerprint, "choices": [],
                "usage": usage(),
            })
    except ValueError as exc:
        yield sse(from_value_error(exc, KNOWN_FIELDS).body())
    except RuntimeError as exc:  # the engine step or this request failed, or shutdown
        yield sse(engine_error(exc).body())
    finally:
        await close_all(gens)
    yield sse("[DONE]")
