"""Chat messages -> prompt text through the chat template (request's, --chat-template's, or
the tokenizer's own), with template errors answered as 400. A request's own template runs
only with --trust-request-chat-template (vLLM's rule: the template is code the server runs);
--default-chat-template-kwargs lie under the request's chat_template_kwargs."""

from __future__ import annotations

from typing import Any

import jinja2
from pydantic import BaseModel

from ironlm.entrypoints.chat_utils import apply_chat_template
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.request_base import log
from ironlm.entrypoints.openai.state import ServerOptions

# fields whose checks in apply_chat_template start their message with the field's name
_CHECKED_FIELDS = ("messages", "continue_final_message")
# apply_chat_template's own parameters: a chat_template_kwargs entry may not set them
_RESERVED_KWARGS = frozenset({
    "add_generation_prompt", "continue_final_message", "tokenize", "chat_template", "tools",
    "documents", "conversation", "return_dict", "return_assistant_tokens_mask",
})


# request fields that shape the chat (messages) form alone
CHAT_ONLY_FIELDS = frozenset({"add_generation_prompt", "continue_final_message",
                              "chat_template", "chat_template_kwargs", "tools"})


def warn_chat_fields(req: BaseModel) -> None:
    """A plain-prompt request that set chat-form fields: named in the warning vLLM logs for
    fields it ignores (its prompt-form request models lack them)."""
    given = sorted(CHAT_ONLY_FIELDS & req.model_fields_set)
    if given:
        log.warning("The following fields were present in the request but ignored: %s "
                    "(they shape the messages form only)", given)


def reserved_kwargs(kwargs: dict[str, Any]) -> list[str]:
    """The names in ``kwargs`` that are parameters of the template call itself."""
    return sorted(_RESERVED_KWARGS & set(kwargs))


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
    reasoning_effort: str | None = None,
) -> str:
    # a request's null values leave the server's defaults (vLLM's merge)
    request_kwargs = {k: v for k, v in (chat_template_kwargs or {}).items() if v is not None}
    if request_template is None:
        request_template = request_kwargs.pop("chat_template", None)
    if not options.trust_request_chat_template and (
            request_template is not None or "chat_template" in request_kwargs):
        raise APIError("Chat template is passed with request, but --trust-request-chat-template "
                       "is not set. Refused request with untrusted chat template.", 400,
                       param="chat_template")
    reserved = reserved_kwargs(request_kwargs)
    if reserved:
        raise APIError(f"chat_template_kwargs: {reserved} are parameters of the request itself",
                       400, param="chat_template_kwargs")
    kwargs = template_kwargs(options, request_kwargs, reasoning_effort)
    # a request's template is its text, never a path on this server
    template = request_template if request_template is not None else options.chat_template
    try:
        return apply_chat_template(
            tokenizer, messages, template, add_generation_prompt, continue_final_message,
            tools, documents, kwargs, options.chat_template_content_format,
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


def template_kwargs(options: ServerOptions, chat_template_kwargs: dict[str, Any] | None,
                    reasoning_effort: str | None = None) -> dict[str, Any]:
    """The template's extra variables: the server's defaults under the request's (its nulls
    leave a default), then vLLM's ``reasoning_effort`` (which, as "none", also turns Qwen3's
    ``enable_thinking`` off unless the request set it)."""
    request_kwargs = {k: v for k, v in (chat_template_kwargs or {}).items() if v is not None}
    kwargs = {**options.default_chat_template_kwargs, **request_kwargs}
    if reasoning_effort is not None:
        kwargs["reasoning_effort"] = reasoning_effort
        if "enable_thinking" not in request_kwargs:
            kwargs["enable_thinking"] = reasoning_effort != "none"
    return kwargs
