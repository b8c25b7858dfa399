"""Chat messages -> prompt text through the chat template (request's, --chat-template's, or
the tokenizer's own), with template errors answered as 400."""

from __future__ import annotations

from typing import Any

import jinja2

from ironlm.entrypoints.chat_utils import apply_chat_template, load_chat_template
from ironlm.entrypoints.openai.errors import APIError


def render_chat_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    server_template: str | None,
    request_template: str | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    try:
        template = load_chat_template(request_template) if request_template else server_template
        return apply_chat_template(
            tokenizer, messages, template, add_generation_prompt, continue_final_message,
            tools, documents, chat_template_kwargs,
        )
    except ValueError as exc:
        message = str(exc)
        param = "messages" if message.startswith("messages") else "chat_template"
        raise APIError(message, 400, param=param) from None
    except (jinja2.TemplateError, TypeError, KeyError) as exc:
        raise APIError(f"the chat template could not render these messages: {exc}", 400,
                       param="messages") from None
