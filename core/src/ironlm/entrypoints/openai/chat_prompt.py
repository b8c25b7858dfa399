"""Chat messages -> prompt text through the chat template (request's, --chat-template's, or
the tokenizer's own), with template errors answered as 400. A request's own template runs
only with --trust-request-chat-template (vLLM's rule: the template is code the server runs);
--default-chat-template-kwargs lie under the request's chat_template_kwargs."""

from __future__ import annotations

from typing import Any

import jinja2

from ironlm.entrypoints.chat_utils import apply_chat_template, load_chat_template
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.state import ServerOptions

# fields whose checks in apply_chat_template start their message with the field's name
_CHECKED_FIELDS = ("messages", "continue_final_message")


def render_chat_prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    options: ServerOptions,
    *,
    request_template: str | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    if not options.trust_request_chat_template and (
            request_template is not None
            or (chat_template_kwargs or {}).get("chat_template") is not None):
        raise APIError("Chat template is passed with request, but --trust-request-chat-template "
                       "is not set. Refused request with untrusted chat template.", 400,
                       param="chat_template")
    chat_template_kwargs = {**options.default_chat_template_kwargs,
                            **(chat_template_kwargs or {})}
    try:
        template = load_chat_template(request_template) if request_template \
            else options.chat_template
    except ValueError as exc:
        raise APIError(str(exc), 400, param="chat_template") from None
    try:
        return apply_chat_template(
            tokenizer, messages, template, add_generation_prompt, continue_final_message,
            tools, documents, chat_template_kwargs,
        )
    except ValueError as exc:  # the helper's own checks name their field first
        message = str(exc)
        param = next((p for p in _CHECKED_FIELDS if message.startswith(p)), "messages")
        if message.startswith("the tokenizer has no chat template"):
            param = "chat_template"
        raise APIError(message, 400, param=param) from None
    except jinja2.TemplateSyntaxError as exc:  # the template itself is broken
        raise APIError(f"the chat template is not valid Jinja: {exc}", 400,
                       param="chat_template") from None
    except Exception as exc:  # noqa: BLE001 - anything the template raises is the request's
        # (jinja's TemplateError and raise_exception(), but also a ZeroDivisionError, ...
        # from a request's own chat_template): a 400 naming messages, as vLLM does
        raise APIError(f"the chat template could not render these messages: "
                       f"{type(exc).__name__}: {exc}", 400, param="messages") from None

