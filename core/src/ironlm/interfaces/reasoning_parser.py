"""ReasoningParser: splits a reasoning model's output into its reasoning and its answer.

Models such as DeepSeek-R1 and Qwen3 think before they answer, between markers
(``<think>`` ... ``</think>``). With ``--reasoning-parser NAME`` the chat endpoint returns the
thinking as ``reasoning`` (also under its older name ``reasoning_content``) and only the
answer as ``content``; tool-call parsing applies to the answer, and the engine starts a chat
request's structured-output grammar once ``end_marker`` has been generated
(``engine/reasoning_gate.py``).

Markers are text, found in the detokenized output, so a parser works whatever the tokenizer
makes of them: one added token in Qwen3's and DeepSeek-R1's vocabularies, several pieces in
others (the gate then also checks the text a token carries past the marker).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass
class ReasoningDelta:
    """What a streamed piece of text adds: reasoning, answer, or (a marker held back) neither."""

    reasoning: str | None = None
    content: str | None = None


class ReasoningParser(ABC):
    """Registered through ``register_reasoning_parsers``. One instance per choice of a request
    (it holds the streaming state), constructed as ``Parser(tokenizer, chat_template_kwargs)``:
    the request's template switches (Qwen3's ``enable_thinking``) may change the parse."""

    name: ClassVar[str]
    start_marker: ClassVar[str] = ""  # text that opens the reasoning ("" when none)
    end_marker: ClassVar[str]  # text that closes the reasoning; the answer follows it

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def prompt_ends_reasoning(self, reply: str) -> bool:
        """True when the prompt already closed this reply's reasoning, so that everything
        generated is the answer. ``reply`` is the prompt's part after the conversation's
        earlier turns (what the template appended for the reply: Qwen3's template with
        ``enable_thinking: false`` appends an empty think block; or the assistant prefix
        continued with ``continue_final_message``), so an earlier reply's think block does
        not count. Default: its last end marker comes after its last start marker."""
        end = reply.rfind(self.end_marker)
        return end >= 0 and not (self.start_marker and reply.rfind(self.start_marker) > end)

    def count_reasoning_tokens(self, token_ids: list[int]) -> int:
        """How many of a finished output's tokens are reasoning (usage's
        ``completion_tokens_details.reasoning_tokens``): those before the token that completes
        the end marker, less the markers' own tokens; all of them when the marker never came;
        none when ``extract`` finds no reasoning."""
        if not token_ids:
            return 0

        def text(k: int) -> str:
            return self.tokenizer.decode(token_ids[:k], skip_special_tokens=False)

        def size(marker: str) -> int:
            return len(self.tokenizer.encode(marker, add_special_tokens=False)) if marker else 0

        whole = text(len(token_ids))
        if self.extract(whole)[0] is None:
            return 0
        count = len(token_ids)
        if self.end_marker in whole:
            lo, hi = 1, len(token_ids)  # the first prefix whose text holds the marker
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if self.end_marker in text(mid) else (mid + 1, hi)
            count = lo - size(self.end_marker)
        if self.start_marker and whole.lstrip().startswith(self.start_marker):
            count -= size(self.start_marker)
        return max(0, count)

    @abstractmethod
    def extract(self, model_output: str) -> tuple[str | None, str | None]:
        """A finished generation -> (reasoning, content). None for a part the output does
        not have (the answer of a model cut off while thinking)."""

    @abstractmethod
    def extract_streaming(self, delta_text: str) -> ReasoningDelta:
        """Feed the next piece of generated text; return what can be emitted now (text that may
        be the start of a marker is held back)."""

    @abstractmethod
    def finish_streaming(self) -> ReasoningDelta:
        """The stream ended: flush what is held back. The concatenations of all reasoning and
        all content fragments equal what ``extract`` returns for the whole text (where that
        is None, nothing was emitted)."""
