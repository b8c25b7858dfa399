"""POST /tokenize, POST /detokenize, GET /tokenizer_info (vLLM's shapes)."""

from __future__ import annotations

from typing import Any

from ironlm.entrypoints.openai.chat_prompt import render_chat_prompt, warn_chat_fields
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.protocol import DetokenizeRequest, TokenizeRequest
from ironlm.entrypoints.openai.state import ServerState


async def tokenize(state: ServerState, req: TokenizeRequest) -> dict[str, Any]:
    """``{"count", "max_model_len", "tokens", "token_strs"}`` (the strings null unless asked
    for, as vLLM), computed on the tokenizer
    pool (a huge prompt never stalls the event loop)."""
    state.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError("give exactly one of prompt and messages", 400, param="prompt")
    state.need_tokenizer("prompt" if req.prompt is not None else "messages")
    assert state.tokenizers is not None
    return await state.tokenizers.run(_tokenize, state, req)


def _tokenize(tokenizer: Any, state: ServerState, req: TokenizeRequest) -> dict[str, Any]:
    if req.messages is not None:
        text = render_chat_prompt(
            tokenizer, req.messages, state.options,
            request_template=req.chat_template, add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message, tools=req.tools,
            chat_template_kwargs=req.chat_template_kwargs,
        )
        add_special = bool(req.add_special_tokens)  # the template already holds them
    else:
        warn_chat_fields(req)
        text = req.prompt or ""
        add_special = True if req.add_special_tokens is None else req.add_special_tokens
    ids = list(tokenizer(text, add_special_tokens=add_special).input_ids)
    body: dict[str, Any] = {"count": len(ids), "max_model_len": state.max_model_len,
                            "tokens": ids, "token_strs": None}
    if req.return_token_strs:
        body["token_strs"] = tokenizer.convert_ids_to_tokens(ids)
    return body


async def detokenize(state: ServerState, req: DetokenizeRequest) -> dict[str, Any]:
    """``{"prompt": text}``; 400 for ids outside the vocabulary."""
    state.check_model(req.model)
    vocab = state.engine.engine.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise APIError(f"tokens contains token id {bad[0]} outside the vocabulary [0, {vocab})",
                       400, param="tokens")
    state.need_tokenizer("tokens")
    assert state.tokenizers is not None
    return {"prompt": await state.tokenizers.run(lambda tok: tok.decode(req.tokens))}


def tokenizer_info(state: ServerState) -> dict[str, Any]:
    state.need_tokenizer(None)
    tok = state.tokenizer
    info: dict[str, Any] = {
        "tokenizer_class": type(tok).__name__,
        "vocab_size": state.engine.engine.vocab_size,
        "model_max_length": state.max_model_len,
        "chat_template": state.options.chat_template or getattr(tok, "chat_template", None),
    }
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = getattr(tok, name, None)
        info[name] = value if isinstance(value, str) or value is None else str(value)
        info[f"{name}_id"] = getattr(tok, f"{name}_id", None)
    info["added_tokens_decoder"] = {
        str(i): str(t) for i, t in (getattr(tok, "added_tokens_decoder", None) or {}).items()
    }
    return info
