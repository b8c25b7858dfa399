"""Reasoning in chat responses (--reasoning-parser): one plan per request.

The plan says whether each choice's text is split (a parser is configured and the prompt's
reply did not already close the reasoning), whether the reasoning goes out
(``include_reasoning``), what the engine is told (``reasoning_ended``: the grammar of a guided
request then waits for the model's end marker, or constrains from the first token), and the
usage count of reasoning tokens. Where the parser's markers are special tokens of the
tokenizer the request keeps special tokens in its text, or the split could not see them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ironlm.entrypoints.chat_utils import reply_part
from ironlm.entrypoints.openai.protocol import ChatCompletionRequest
from ironlm.interfaces.reasoning_parser import ReasoningParser


@dataclass
class ReasoningPlan:
    parser_cls: type[ReasoningParser] | None  # the server's parser; None without one
    tokenizer: Any = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # the parser's view too
    include: bool = True  # include_reasoning
    prompt_closed: bool = False  # the prompt's reply closed the reasoning: all is answer
    guided: bool = False  # the request is constrained (response_format, guided_*, tools)

    @property
    def answer_only(self) -> bool:
        """Everything generated is the answer: the prompt closed the reasoning, or a guided
        request leaves its reasoning out, so the grammar constrains from the first token
        (newer vLLM) and the model writes no thinking to split off."""
        return self.prompt_closed or (self.guided and not self.include)

    @property
    def active(self) -> bool:
        return self.parser_cls is not None

    def split(self) -> ReasoningParser | None:
        """A fresh parser for one choice; None when the text is all answer."""
        if self.parser_cls is None or self.answer_only:
            return None
        return self.parser_cls(self.tokenizer, self.template_kwargs)

    def shown(self, reasoning: str | None) -> str | None:
        """The reasoning as the response carries it (None with include_reasoning false)."""
        return reasoning if self.include else None

    @property
    def hides_logprobs(self) -> bool:
        """include_reasoning false: no logprobs, which would show the hidden reasoning
        token by token (vLLM suppresses them too)."""
        return self.active and not self.include

    def engine_flag(self) -> bool | None:
        """``add_request(reasoning_ended=...)``: None without a parser (no gate); True when
        the answer starts at once (``answer_only``)."""
        if self.parser_cls is None:
            return None
        return self.answer_only

    def tokens(self, outputs: list[Any]) -> int | None:
        """usage's completion_tokens_details.reasoning_tokens over ``outputs``
        (CompletionOutputs): None without a parser, 0 when the prompt closed the reasoning."""
        if self.parser_cls is None:
            return None
        total = 0
        for o in outputs:
            parser = self.split()
            if parser is not None:
                total += parser.count_reasoning_tokens(list(o.token_ids))
        return total


def plan_reasoning(parser_cls: type[ReasoningParser] | None, tokenizer: Any,
                   req: ChatCompletionRequest, template_kwargs: dict[str, Any], prompt: str,
                   render_plain: Callable[[list[dict[str, Any]]], str]) -> ReasoningPlan:
    """The request's plan (``guided`` is set by the caller). ``render_plain(messages)``
    renders the conversation without a generation prompt (the reply is what the prompt has
    beyond it: chat_utils.reply_part); called on a tokenizer thread."""
    if parser_cls is None:
        return ReasoningPlan(None)
    parser = parser_cls(tokenizer, template_kwargs)
    reply = reply_part(prompt, render_plain, req.messages, req.continue_final_message)
    return ReasoningPlan(parser_cls, tokenizer, template_kwargs, req.include_reasoning,
                         parser.prompt_ends_reasoning(reply))


def markers_are_special(parser_cls: type[ReasoningParser] | None, tokenizer: Any) -> bool:
    """Whether a marker of the parser is a special token (kept in the text only with
    skip_special_tokens false)."""
    if parser_cls is None:
        return False
    special = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    return bool({parser_cls.end_marker, parser_cls.start_marker} & special)
