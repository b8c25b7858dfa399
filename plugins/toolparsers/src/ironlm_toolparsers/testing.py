"""Helpers to check any ToolParser's streaming against its one-shot ``extract``.

Useful to third-party parser authors as much as to this plugin's tests::

    from ironlm_toolparsers.testing import assert_stream_matches_extract
    assert_stream_matches_extract(MyParser, model_output, trials=300, seed=0)

:func:`reassemble` also checks the delta protocol: a call's first delta carries index, id and
name, later ones only argument text; indices count up from 0; ids are unique.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Iterable

from ironlm.interfaces.tool_parser import ExtractedToolCalls, StreamDelta, ToolCall, ToolParser


@dataclass
class Reassembled:
    """What a client rebuilds from a stream."""

    calls: list[ToolCall] = field(default_factory=list)
    content: str = ""

    @property
    def tools_called(self) -> bool:
        return bool(self.calls)


def reassemble(deltas: Iterable[StreamDelta]) -> Reassembled:
    """Join streamed deltas as an OpenAI client does, asserting the delta protocol."""
    out = Reassembled()
    for delta in deltas:
        out.content += delta.content or ""
        for piece in delta.tool_calls:
            if piece.index == len(out.calls):  # a new call: its first delta
                assert piece.id and piece.name, f"first delta of call {piece.index}: {piece}"
                assert piece.id not in {c.id for c in out.calls}, f"duplicate id {piece.id}"
                out.calls.append(ToolCall(piece.name, piece.arguments, piece.id))
            else:
                assert 0 <= piece.index < len(out.calls), f"index out of order: {piece}"
                assert piece.id is None and piece.name is None, f"repeated id/name: {piece}"
                out.calls[piece.index].arguments += piece.arguments
    return out


def stream(
    parser_cls: type[ToolParser], chunks: Iterable[str], tokenizer: Any = None
) -> Reassembled:
    """Feed ``chunks`` to a fresh parser, finish, and reassemble what it emitted."""
    parser = parser_cls(tokenizer)
    deltas = [parser.extract_streaming(chunk) for chunk in chunks]
    deltas.append(parser.finish_streaming())
    return reassemble(deltas)


def random_chunks(text: str, rng: random.Random) -> list[str]:
    """Split ``text`` at random points; chunk lengths mostly small (1 to 8), sometimes long."""
    chunks, i = [], 0
    while i < len(text):
        size = rng.randint(1, 8) if rng.random() < 0.8 else rng.randint(1, max(1, len(text) // 2))
        chunks.append(text[i : i + size])
        i += size
    return chunks


def chunkings(text: str, trials: int, seed: int) -> Iterable[list[str]]:
    """The whole text, one character at a time, then ``trials`` random chunkings."""
    yield [text]
    yield list(text)
    rng = random.Random(seed)
    for _ in range(trials):
        yield random_chunks(text, rng)


def same_result(streamed: Reassembled, extracted: ExtractedToolCalls) -> bool:
    """Calls (name, arguments), whether tools were called, and content (None as "") agree."""
    return (
        streamed.tools_called == extracted.tools_called
        and [(c.name, c.arguments) for c in streamed.calls]
        == [(c.name, c.arguments) for c in extracted.tool_calls]
        and streamed.content == (extracted.content or "")
    )


def assert_stream_matches_extract(
    parser_cls: type[ToolParser], text: str, trials: int = 300, seed: int = 0
) -> ExtractedToolCalls:
    """Assert every chunking of ``text`` streams to the one-shot result; return that result."""
    expected = parser_cls(None).extract(text)
    for chunks in chunkings(text, trials, seed):
        got = stream(parser_cls, chunks)
        assert same_result(got, expected), (
            f"{parser_cls.__name__}: chunks {chunks!r}\nstreamed {got}\nextract  {expected}"
        )
    return expected


def assert_extracts(
    parser_cls: type[ToolParser],
    text: str,
    calls: list[tuple[str, str]],
    content: str | None,
    trials: int = 300,
    seed: int = 0,
) -> None:
    """Assert ``extract(text)`` gives ``calls`` (name, exact arguments string) and ``content``,
    that every arguments string is a JSON object, and that every chunking streams the same."""
    result = assert_stream_matches_extract(parser_cls, text, trials, seed)
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls, result
    assert result.content == content, result
    assert result.tools_called == bool(calls), result
    for call in result.tool_calls:
        assert isinstance(json.loads(call.arguments), dict), call


def assert_malformed(parser_cls: type[ToolParser], text: str, trials: int = 300) -> None:
    """A malformed call: the whole text is content, no calls, in one shot and streamed."""
    assert_extracts(parser_cls, text, [], text, trials)


def assert_unretractable(
    parser_cls: type[ToolParser], text: str, name: str, trials: int = 100, seed: int = 0
) -> int:
    """A call is cut off or malformed after its name (the only failing call of its text).
    ``extract`` reports it as content. A stream that had already sent the name (it depends on
    the chunking) cannot take the call back: it keeps it, with the raw argument text sent so
    far, and otherwise agrees: same content, same other calls. Returns how many chunkings did
    send the name."""
    expected = parser_cls(None).extract(text)
    assert name not in [c.name for c in expected.tool_calls]
    sent = 0
    for chunks in chunkings(text, trials, seed):
        got = stream(parser_cls, chunks)
        if same_result(got, expected):
            continue
        sent += 1
        assert got.calls and got.calls[-1].name == name, (chunks, got)
        arguments = got.calls[-1].arguments  # raw text sent so far, or complete arguments
        assert arguments in text or _is_json_object(arguments), (chunks, got)
        assert [(c.name, c.arguments) for c in got.calls[:-1]] == [
            (c.name, c.arguments) for c in expected.tool_calls
        ], (chunks, got)
        assert got.content == (expected.content or ""), (chunks, got, expected)
    return sent


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
