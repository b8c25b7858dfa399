"""Reasoning parsers for models that think between tags: ``<think>`` ... ``</think>``.

Text before the end marker is reasoning, text after it the answer; a start marker found
before the end marker is dropped (DeepSeek-R1's and Qwen3's templates put it in the prompt,
older ones let the model write it). Output that never closes its reasoning is all reasoning:
the model was cut off while thinking (vLLM's reading for both models). Where vLLM differs:
text the model writes before a start marker stays reasoning here (vLLM drops it; a stream
cannot take back what it sent), and Qwen3's ``<tool_call>`` does not end the reasoning
(newer vLLM's implicit end for Qwen3.5).
"""

from __future__ import annotations

from typing import Any, ClassVar

from ironlm.interfaces.reasoning_parser import ReasoningDelta, ReasoningParser


class ThinkTagReasoningParser(ReasoningParser):
    """Splits at ``start_marker`` / ``end_marker``; subclasses name the markers."""

    start_marker: ClassVar[str] = "<think>"
    end_marker: ClassVar[str] = "</think>"

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, chat_template_kwargs)
        self._answering = False  # the end marker went by: the rest is the answer
        self._started = False  # the start marker went by (or the end did)
        self._held = ""  # streamed text that may be the beginning of a marker

    def extract(self, model_output: str) -> tuple[str | None, str | None]:
        """(reasoning, answer) as vLLM's think-tag parsers: the reasoning is text even when
        empty, an empty answer is None; a parser that starts answering (Qwen3 not thinking)
        returns no reasoning."""
        got = self.__class__(self.tokenizer, self.chat_template_kwargs)
        if got._answering:
            return None, model_output or None
        first, last = got.extract_streaming(model_output), got.finish_streaming()
        reasoning = (first.reasoning or "") + (last.reasoning or "")
        content = (first.content or "") + (last.content or "")
        return reasoning, content or None

    def extract_streaming(self, delta_text: str) -> ReasoningDelta:
        text, self._held = self._held + delta_text, ""
        reasoning: list[str] = []
        while text and not self._answering:
            markers = [self.end_marker] + ([self.start_marker] if self.start_marker
                                           and not self._started else [])
            found = [(text.find(m), m) for m in markers if m in text]
            if not found:
                keep = _marker_prefix_len(text, markers)
                reasoning.append(text[: len(text) - keep])
                self._held = text[len(text) - keep:]
                text = ""
                break
            at, marker = min(found)
            reasoning.append(text[:at])
            text = text[at + len(marker):]
            self._started = True
            self._answering = marker == self.end_marker
        return ReasoningDelta("".join(reasoning) or None, text or None)

    def finish_streaming(self) -> ReasoningDelta:
        held, self._held = self._held, ""
        return ReasoningDelta(reasoning=held or None)


def _marker_prefix_len(text: str, markers: list[str]) -> int:
    """Length of the longest end of ``text`` that begins some marker (held back: the next
    piece may complete it)."""
    best = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best


class DeepSeekR1ReasoningParser(ThinkTagReasoningParser):
    """DeepSeek-R1 and its distills: the template opens ``<think>``, the model closes it."""

    name = "deepseek_r1"


class Qwen3ReasoningParser(ThinkTagReasoningParser):
    """Qwen3. With ``chat_template_kwargs: {"enable_thinking": false}`` (or vLLM's
    ``reasoning_effort: "none"``) the model does not think: everything generated is the answer,
    and structured output constrains it from the first token, whether or not the template
    wrote the empty think block it uses for that."""

    name = "qwen3"

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, chat_template_kwargs)
        if not self.thinking:
            self._answering = self._started = True

    @property
    def thinking(self) -> bool:
        return self.chat_template_kwargs.get("enable_thinking", True) is not False

    def prompt_ends_reasoning(self, reply: str) -> bool:
        return not self.thinking or super().prompt_ends_reasoning(reply)
