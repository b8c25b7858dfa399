"""ToolParser: turns a model's text into OpenAI tool calls, in one shot or while streaming."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class ToolCall:
    """One complete call. ``arguments`` is a JSON object serialised as a string."""

    name: str
    arguments: str
    id: str = ""


@dataclass
class ExtractedToolCalls:
    tools_called: bool
    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None  # text outside the calls; None when there is none


@dataclass
class DeltaToolCall:
    """A streamed fragment of call ``index``. The first fragment of a call carries ``id`` and
    ``name``; later ones carry only ``arguments`` text to append."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class StreamDelta:
    content: str | None = None
    tool_calls: list[DeltaToolCall] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not self.content and not self.tool_calls


class ToolParser(ABC):
    """Registered through ``register_tool_parsers``. One instance per request (it holds the
    streaming state), constructed as ``Parser(tokenizer)``."""

    name: ClassVar[str]

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def adjust_request(self, request: dict[str, Any]) -> dict[str, Any]:
        """Adjust a chat request before generation (e.g. keep special tokens the parser needs
        in the detokenized text). Default: unchanged."""
        return request

    @abstractmethod
    def extract(self, model_output: str) -> ExtractedToolCalls:
        """Parse a finished generation."""

    @abstractmethod
    def extract_streaming(self, delta_text: str) -> StreamDelta:
        """Feed the next piece of generated text; return what can be emitted now (possibly
        empty while a call is still ambiguous)."""

    @abstractmethod
    def finish_streaming(self) -> StreamDelta:
        """The stream ended: flush whatever is held back. The concatenation of all emitted
        content and argument fragments equals what ``extract`` returns for the whole text."""
