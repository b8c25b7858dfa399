"""The Completions API's ``prompt_embeds`` (vLLM's, with ``--enable-prompt-embeds``): one
prompt per base64 payload of a ``torch.save``'d (num_tokens, hidden_size) tensor, ahead of
the request's text or token prompts (vLLM's order)."""

from __future__ import annotations

import asyncio

import torch

from ironlm.engine.input_processor import check_truncation
from ironlm.engine.prompt_embeds import decode_embeds
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.protocol import CompletionRequest
from ironlm.entrypoints.openai.request_inputs import EnginePrompt
from ironlm.entrypoints.openai.state import ServerState


async def embeds_prompts(
    state: ServerState, req: CompletionRequest, room: int
) -> list[EnginePrompt]:
    """The request's embedded prompts, decoded off the event loop and truncated as its token
    prompts are (``room``: output positions beside them); 400 naming the field for a payload
    that does not decode to (num_tokens, hidden_size) floats, or for what needs the prompt's
    tokens (echo, suffix, beam search)."""
    given = req.prompt_embeds
    if given is None:
        return []
    hidden = state.embeds_hidden_size
    if hidden is None:
        raise APIError("You must set `--enable-prompt-embeds` to input `prompt_embeds`.", 400,
                       param="prompt_embeds")
    for field, used in (("echo", req.echo), ("suffix", req.suffix is not None),
                        ("use_beam_search", req.use_beam_search)):
        if used:
            raise APIError(f"{field} cannot be used with prompt_embeds (an embedded prompt has "
                           "no tokens)", 400, param=field)
    payloads = [given] if isinstance(given, str) else list(given)
    if not payloads:
        raise APIError("prompt_embeds is an empty list", 400, param="prompt_embeds")
    try:
        keep = check_truncation(req.truncate_prompt_tokens, state.max_model_len, room)
    except ValueError as exc:
        raise APIError(str(exc), 400, param="truncate_prompt_tokens") from None

    def decode() -> list[torch.Tensor]:
        return [decode_embeds(p, hidden) for p in payloads]

    try:
        tensors = await asyncio.to_thread(decode)
    except ValueError as exc:
        raise APIError(str(exc), 400, param="prompt_embeds") from None
    prompts: list[EnginePrompt] = []
    for rows in tensors:
        if keep is not None and keep >= 1:
            rows = rows[-keep:]
        if len(rows) == 0:
            raise APIError("prompt_embeds holds a tensor of 0 rows", 400, param="prompt_embeds")
        prompts.append(EnginePrompt(None, [], embeds=rows))
    return prompts
