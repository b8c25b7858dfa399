"""use_beam_search over HTTP (vLLM 0.6's completions and chat parameter): the beams of one
request are advanced token by token through the AsyncEngine, ``best_of`` (else ``n``) beams
wide, and the ``n`` best by length-penalised score are returned, as one final output (a
stream gets it as its chunks at the end, as in vLLM)."""

from __future__ import annotations

from typing import AsyncIterator

from ironlm.entrypoints.beam_search import BeamSearch, completion_text
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.protocol import SamplingFields
from ironlm.entrypoints.openai.request_inputs import EnginePrompt, guided_field, guided_spec
from ironlm.entrypoints.openai.state import ServerState
from ironlm.entrypoints.openai.streaming import close_all, gather_or_cancel, last_item
from ironlm.lora.request import LoRARequest
from ironlm.outputs import CompletionOutput, RequestOutput
from ironlm.sampling_params import BeamSearchParams


def beam_search_params(req: SamplingFields, max_tokens: int, logprobs: bool) -> BeamSearchParams:
    """The request's beam search (400 naming the field for what beams cannot honour)."""
    if req.n < 1:
        raise APIError(f"n must be at least 1, got {req.n}.", 400, param="n")
    width = req.best_of if req.best_of is not None else req.n
    if width < req.n:
        raise APIError(f"best_of must be greater than or equal to n, got n={req.n} and "
                       f"best_of={width}.", 400, param="best_of")
    if req.temperature:
        raise APIError("temperature must be 0 with use_beam_search (beams are ranked by the "
                       "model's log-probabilities)", 400, param="temperature")
    unsupported = [name for name, on in (
        ("logprobs", logprobs), ("stop", bool(req.stop)), ("stop_token_ids", bool(req.stop_token_ids)),
        ("guided_decoding", req.guided_decoding_backend is not None),
    ) if on]
    if not unsupported and guided_spec(req) is not None:  # beams would drop the constraint
        unsupported = [guided_field(req)]
    if unsupported:
        raise APIError(f"{unsupported[0]} is not supported with use_beam_search", 400,
                       param=unsupported[0])
    return BeamSearchParams(
        beam_width=width, max_tokens=max_tokens, ignore_eos=req.ignore_eos,
        length_penalty=1.0 if req.length_penalty is None else req.length_penalty,
        include_stop_str_in_output=req.include_stop_str_in_output,
    )


async def beam_search(
    state: ServerState, request_id: str, prompt: EnginePrompt, params: BeamSearchParams, n: int,
    priority: int = 0, lora_request: LoRARequest | None = None, dp_rank: int | None = None,
) -> AsyncIterator[RequestOutput]:
    """Run the beams to the end (every beam with the request's adapter, on data-parallel
    engine ``dp_rank`` when the request names one); yield one finished RequestOutput with the
    ``n`` best."""
    search = BeamSearch([prompt.token_ids], params, state.tokenizer.eos_token_id)
    step = 0
    while flat := search.pending():
        gens = [
            state.engine.generate(f"{request_id}-s{step}-b{j}",
                                  EnginePrompt(None, beam.tokens, prompt.cache_salt)
                                  .as_engine_prompt(), search.step_params.clone(),
                                  priority=priority, lora_request=lora_request,
                                  data_parallel_rank=dp_rank)
            for j, (_, beam) in enumerate(flat)
        ]
        try:
            outs = await gather_or_cancel([last_item(g) for g in gens])
        finally:
            await close_all(gens)
        search.advance(flat, outs)
        step += 1
    best = search.results(state.tokenizer)[0].sequences[:n]
    start = len(prompt.token_ids)
    yield RequestOutput(
        request_id=request_id, prompt=prompt.text, prompt_token_ids=prompt.token_ids,
        outputs=[CompletionOutput(index=i, text=completion_text(state.tokenizer, s, start),
                                  token_ids=s.tokens[start:],
                                  cumulative_logprob=s.cum_logprob, finish_reason=s.finish_reason)
                 for i, s in enumerate(best)],
        finished=True,
    )
