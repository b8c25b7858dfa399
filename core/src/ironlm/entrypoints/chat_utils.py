"""Chat templates: OpenAI-style messages -> prompt text through the tokenizer's template."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ironlm.entrypoints.chat_content_format import resolve_content_format


def load_chat_template(template: str | None) -> str | None:
    """``--chat-template`` accepts a file path or the template text itself."""
    if template is None:
        return None
    path = Path(template)
    try:
        if path.is_file():
            return path.read_text()
    except OSError:
        pass
    if "{" not in template:
        raise ValueError(f"chat template {template!r} is neither a file nor a Jinja template")
    return template


def _content_text(content: Any) -> str:
    """OpenAI content may be absent / null (an assistant turn with only tool calls), a string
    or a list of parts: text and refusal parts are joined as text, others are rejected. Absent
    content is the empty string, as vLLM renders it (templates concatenate it)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("text", "refusal"):
                texts.append(part.get(kind) or "")
            else:
                raise ValueError(f"messages: content part of type {kind!r} is not supported "
                                 "(text only)")
        return "\n".join(texts)
    raise ValueError("messages: content must be a string or a list of content parts")


def _content_parts(content: Any) -> list[dict[str, Any]]:
    """The "openai" content format: a list of parts (a string is one text part; absent
    content, none). Parts are checked as for the text form (text only)."""
    _content_text(content)
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [dict(part) for part in content]


def normalize_messages(messages: list[dict[str, Any]],
                       content_format: str = "string") -> list[dict[str, Any]]:
    """Messages as the template reads them: content as text ("string") or as a list of parts
    ("openai", see chat_content_format), tool-call arguments as objects."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError("messages: each message needs a 'role'")
        msg = dict(m)
        msg["content"] = _content_parts(m.get("content")) if content_format == "openai" \
            else _content_text(m.get("content"))
        if msg.get("tool_calls"):
            # Templates expect arguments as objects; OpenAI sends JSON strings.
            import json

            calls = []
            for c in msg["tool_calls"]:
                c = dict(c)
                fn = dict(c.get("function", {}))
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass
                c["function"] = fn
                calls.append(c)
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def apply_chat_template(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    content_format: str = "auto",
) -> str:
    """The prompt text for a conversation (special tokens included by the template).
    ``content_format``: how message content reaches the template (chat_content_format)."""
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    template = chat_template if chat_template is not None \
        else getattr(tokenizer, "chat_template", None)
    if template is None:
        raise ValueError(
            "the tokenizer has no chat template; pass chat_template (or --chat-template)"
        )
    kwargs = dict(chat_template_kwargs or {})
    return tokenizer.apply_chat_template(
        normalize_messages(messages, resolve_content_format(content_format, template)),
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        chat_template=chat_template,
        tools=tools,
        documents=documents,
        **kwargs,
    )


def reply_part(prompt: str, render: Callable[[list[dict[str, Any]]], str],
               messages: list[dict[str, Any]], continue_final_message: bool) -> str:
    """The end of a chat prompt that belongs to the reply being generated: the continued final
    message's own text, or what the template appended after the conversation's earlier turns
    (its generation prompt). ``render(messages)`` renders the conversation without a
    generation prompt; where that rendering is not a prefix of the prompt (a template that
    ends a conversation otherwise without a generation prompt, Phi-3's EOS), the reply is the
    prompt past their common start."""
    if continue_final_message:
        return _content_text(messages[-1].get("content"))
    try:
        before = render(messages)
    except Exception:  # noqa: BLE001 - a template may refuse a conversation ending so
        return ""
    return prompt[len(os.path.commonprefix([before, prompt])):]
