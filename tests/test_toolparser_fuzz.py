"""Generated model outputs for every parser: random content and random calls whose arguments are
random nested JSON (quotes, backslashes, unicode, marker look-alikes inside strings), serialised
with random spacing. ``extract`` must recover exactly the generated calls and content, and random
chunkings must stream to the same result. Seeded: failures reproduce.
"""

from __future__ import annotations

import json
import random
from typing import Any, Callable

import pytest

from ironlm.interfaces.tool_parser import ToolParser
from ironlm_toolparsers.granite import GraniteToolParser
from ironlm_toolparsers.hermes import HermesToolParser
from ironlm_toolparsers.llama3_json import Llama3JsonToolParser
from ironlm_toolparsers.mistral import MistralToolParser
from ironlm_toolparsers.pythonic import PythonicToolParser
from ironlm_toolparsers.testing import assert_extracts, random_chunks, stream

DOCUMENTS = 60
CHUNKINGS = 15
STRING_PIECES = ['"', "\\", "}", "{", "]", "[", ",", ":", ";", "(", ")", "'", "\n", "\t", "é",
                 "你好", "🌍", "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>",
                 "a", "b", " ", "x y", "\u0000", "\u2028"]
WORDS = ["Sure", "let", "me", "check", "the", "weather", "<", "<tool", "[TOOL", "<|python",
         "[", "]", "{", "}", "é", "🌍", "\n", " ", "ok.", "<tool_c", "x<", "a [b]"]

Expected = tuple[str, list[tuple[str, str]], str | None]


def rand_string(rng: random.Random) -> str:
    return "".join(rng.choice(STRING_PIECES) for _ in range(rng.randint(0, 6)))


def rand_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randint(0, 7 if depth < 3 else 4)
    if kind == 0:
        return rand_string(rng)
    if kind == 1:
        return rng.randint(-(10**6), 10**6)
    if kind == 2:
        return rng.choice([0.5, -1e-7, 3.25e10, 0.0])
    if kind == 3:
        return rng.choice([True, False])
    if kind == 4:
        return None
    if kind in (5, 6):
        return rand_object(rng, depth + 1)
    return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def rand_object(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    return {rand_string(rng) + str(i): rand_value(rng, depth) for i in range(rng.randint(0, 4))}


def dumps(rng: random.Random, value: Any) -> str:
    return json.dumps(
        value,
        ensure_ascii=rng.random() < 0.5,
        indent=rng.choice([None, None, 2]),
        separators=rng.choice([None, (",", ":"), (", ", ": ")]),
    )


def rand_name(rng: random.Random) -> str:
    return rng.choice(["get_weather", "f", "search_web", "calc2", "a_b_c"])


def rand_content(rng: random.Random, banned: tuple[str, ...]) -> str:
    while True:
        text = "".join(rng.choice(WORDS) for _ in range(rng.randint(0, 5)))
        if not any(b in text for b in banned):
            return text


def json_call(rng: random.Random, arguments_key: str = "arguments") -> tuple[str, tuple[str, str]]:
    """Text of one JSON call object and its expected (name, arguments)."""
    name, args = rand_name(rng), rand_object(rng)
    raw = dumps(rng, args)
    if rng.random() < 0.2:  # arguments given as a JSON-encoded string
        return dumps(rng, {"name": name, arguments_key: raw}), (name, raw)
    sep = rng.choice([", ", ",", ",\n  "])
    return f'{{"name": {json.dumps(name)}{sep}"{arguments_key}": {raw}}}', (name, raw)


def finish(pieces: list[str], calls: list[tuple[str, str]], content: list[str]) -> Expected:
    joined = "".join(content)
    return "".join(pieces), calls, joined if joined.strip() else None


def hermes_doc(rng: random.Random) -> Expected:
    pieces, calls, content = [], [], []
    for _ in range(rng.randint(0, 3)):
        text = rand_content(rng, ("<tool_call>",))
        body, expected = json_call(rng)
        ws = rng.choice(["", "\n", " \n"])
        pieces += [text, "<tool_call>", ws, body, ws, "</tool_call>"]
        content.append(text)
        calls.append(expected)
    tail = rand_content(rng, ("<tool_call>",))
    return finish(pieces + [tail], calls, content + [tail])


def list_doc(rng: random.Random, markers: tuple[str, ...], v11: bool) -> Expected:
    banned = markers + ("[ARGS]",)
    head = rand_content(rng, banned)
    pieces, calls = [head, rng.choice(markers), rng.choice(["", " "])], []
    if v11 and rng.random() < 0.5:  # name[ARGS]{...} form, one marker per call
        for i in range(rng.randint(1, 3)):
            name, raw = rand_name(rng), dumps(rng, rand_object(rng))
            pieces += ([markers[0]] if i else []) + [name, rng.choice(["[ARGS]", ""]), raw]
            calls.append((name, raw))
    else:
        bodies = []
        for _ in range(rng.randint(1, 3)):
            body, expected = json_call(rng)
            bodies.append(body)
            calls.append(expected)
        pieces.append("[" + rng.choice([", ", ",\n"]).join(bodies) + "]")
    tail = rand_content(rng, banned)
    return finish(pieces + [tail], calls, [head, tail])


def llama_doc(rng: random.Random) -> Expected:
    head = rng.choice(["", " ", rand_content(rng, ("<|python_tag|>", "{")) + "<|python_tag|>"])
    content = [head.removesuffix("<|python_tag|>")]
    bodies, calls = [], []
    for _ in range(rng.randint(1, 3)):
        body, expected = json_call(rng, rng.choice(["parameters", "arguments"]))
        bodies.append(body)
        calls.append(expected)
    tail = rng.choice(["", " Done <|python", "\nok"])
    content.append(tail)
    return finish([head, rng.choice(["; ", ";", " ;\n"]).join(bodies), tail], calls, content)


def py_value(rng: random.Random, depth: int = 0) -> tuple[str, Any]:
    """Python source of a random literal and its JSON value."""
    kind = rng.randint(0, 6 if depth < 3 else 3)
    if kind == 0:
        s = rand_string(rng).replace("\u0000", "")
        return repr(s), s
    if kind == 1:
        n = rng.randint(-1000, 1000)
        return repr(n), n
    if kind == 2:
        v = rng.choice([True, False, None])
        return repr(v), v
    if kind == 3:
        f = rng.choice([0.5, -2.25, 1e-5])
        return repr(f), f
    items = [py_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == 4:
        return "[" + ", ".join(s for s, _ in items) + "]", [v for _, v in items]
    if kind == 5:
        return "(" + "".join(s + ", " for s, _ in items) + ")", [v for _, v in items]
    keys = [f"k{i}{rand_string(rng)}" for i in range(len(items))]
    src = "{" + ", ".join(f"{k!r}: {s}" for k, (s, _) in zip(keys, items)) + "}"
    return src, {k: v for k, (_, v) in zip(keys, items)}


def pythonic_doc(rng: random.Random) -> Expected:
    head = rand_content(rng, ("(",))
    sources, calls = [], []
    for _ in range(rng.randint(1, 3)):
        name, kwargs = rand_name(rng), {}
        parts = []
        for i in range(rng.randint(0, 3)):
            src, value = py_value(rng)
            kwargs[f"p{i}"] = value
            parts.append(f"p{i}={src}")
        sources.append(f"{name}({', '.join(parts)})")
        calls.append((name, json.dumps(kwargs, ensure_ascii=False)))
    tail = rand_content(rng, ("(",))
    body = "[" + rng.choice([", ", ",\n "]).join(sources) + "]"
    return finish([head, body, tail], calls, [head, tail])


GENERATORS: dict[str, tuple[type[ToolParser], Callable[[random.Random], Expected]]] = {
    "hermes": (HermesToolParser, hermes_doc),
    "mistral": (MistralToolParser, lambda rng: list_doc(rng, ("[TOOL_CALLS]",), True)),
    "granite": (
        GraniteToolParser,
        lambda rng: list_doc(rng, ("<|tool_call|>", "<tool_call>"), False),
    ),
    "llama3_json": (Llama3JsonToolParser, llama_doc),
    "pythonic": (PythonicToolParser, pythonic_doc),
}


@pytest.mark.parametrize("name", GENERATORS)
def test_generated_outputs(name: str) -> None:
    parser_cls, generate = GENERATORS[name]
    rng = random.Random(f"fuzz-{name}")
    for doc in range(DOCUMENTS):
        text, calls, content = generate(rng)
        assert_extracts(parser_cls, text, calls, content, trials=CHUNKINGS, seed=doc)


GARBAGE = ["<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>",
           "<|tool_call|>", '{"name": "f"', '"arguments": ', '{"a": 1}', '"{\\"b\\": 2}"', "{",
           "}", "[", "]", ",", ";", ":", '"', "\\", "f(", "(a=1)", ")", "'x'", " ", "\n", "null",
           "1", "-", "e", "tru", "é", "🌍", "[f(a=1)]", "name", "x"]


@pytest.mark.parametrize("name", GENERATORS)
def test_garbage_never_raises_and_keeps_the_protocol(name: str) -> None:
    """Random fragments of every format: no exception, the delta protocol holds (checked by
    ``stream``), and every extracted call has a JSON object as arguments."""
    parser_cls = GENERATORS[name][0]
    rng = random.Random(f"garbage-{name}")
    for _ in range(300):
        text = "".join(rng.choice(GARBAGE) for _ in range(rng.randint(1, 25)))
        result = parser_cls(None).extract(text)
        for call in result.tool_calls:
            assert isinstance(json.loads(call.arguments), dict), (text, result)
        if not result.tools_called:
            assert result.content == (text if text.strip() else None), (text, result)
        for chunks in ([text], list(text), random_chunks(text, rng)):
            stream(parser_cls, chunks)


def test_deep_nesting_is_content_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    text = '<tool_call>{"name": "f", "arguments": {"a": ' + deep + "}}</tool_call>"
    result = HermesToolParser(None).extract(text)
    assert result.tool_calls == [] and result.content == text
