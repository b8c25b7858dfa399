"""Tool-calling validity over the function schemas of tests/data/tool_functions.json.

Each function gets one chat request per mode: ``required`` (also with parallel_tool_calls
false: ``required-single``) and ``auto`` offer it with two neighbours as distractors, ``named``
names it. A call is valid when the response holds at
least one tool call whose name is offered and whose arguments parse as JSON and validate
against that function's parameters (and, for named, the call is the named function). Greedy
small models can loop inside an unbounded string or number until ``max_tokens``; the engine
then closes the call within the limit (engine/guided_closing.py): such a response has
finish_reason "length" and valid calls, and is counted as ``closed``. A response with
finish_reason "length" whose calls do not validate is ``truncated`` (the closing path did not
fit the budget).

    python tests/tool_call_validity.py            # starts a server on SmolLM2, prints the table
    python tests/tool_call_validity.py --model gemma3 --max-tokens 256   # Gemma 3 270M

The test (tests/test_server_tools.py::test_tool_call_validity) runs required and named on a
subset, with the guided-decoding backend "auto", and asserts 100%.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Literal

import jsonschema
import openai

DATA = Path(__file__).parent / "data" / "tool_functions.json"
# A Hermes-style template (SmolLM2's own ignores tools): what "auto" with --tool-call-parser
# hermes reads back.
TEMPLATE = """\
{%- if tools %}<|im_start|>system
You can call functions. Tools: <tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>
Reply with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
# The same for Gemma 3 (its own template has no tool section; turns are user / model)
GEMMA_TEMPLATE = """\
{{ bos_token }}{%- for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}
{% if loop.first and tools %}You can call functions. Tools: <tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>
Reply with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.

{% endif %}{{ m.content }}<end_of_turn>
{% endfor %}{%- if add_generation_prompt %}<start_of_turn>model
{% endif %}"""
TEMPLATES = {"smollm2": TEMPLATE, "gemma3": GEMMA_TEMPLATE}
SERVER_ARGS = ["--max-model-len", "1024", "--kv-cache-memory", "128MiB", "--max-num-seqs", "64",
               "--enable-auto-tool-choice",
               "--tool-call-parser", "hermes", "--disable-log-stats"]
# "required-single": tool_choice "required" with parallel_tool_calls false (at most one call:
# the grammar's array takes one item, so the model cannot repeat its call until max_tokens)
MODES = ("required", "required-single", "named", "auto")


def load_functions() -> list[dict[str, Any]]:
    return json.loads(DATA.read_text())["functions"]


def _tools(functions: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    n = len(functions)
    picks = [i, (i + 1) % n, (i + 7) % n]
    return [{"type": "function", "function": functions[j]["function"]} for j in picks]


Outcome = Literal["valid", "closed", "invalid", "truncated"]


def _outcome(calls: list[tuple[str, str]], tools: list[dict[str, Any]], named: str | None,
             finish_reason: str | None) -> Outcome:
    ok = _valid(calls, tools, named)
    if finish_reason == "length":
        return "closed" if ok else "truncated"
    return "valid" if ok else "invalid"


def _valid(calls: list[tuple[str, str]], tools: list[dict[str, Any]],
           named: str | None) -> bool:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    if not calls:
        return False
    for name, arguments in calls:
        if name not in schemas or (named is not None and name != named):
            return False
        try:
            jsonschema.validate(json.loads(arguments), schemas[name])
        except (ValueError, jsonschema.ValidationError):
            return False
    return True


async def one(client: openai.AsyncOpenAI, functions: list[dict[str, Any]], i: int, mode: str,
              stream: bool, max_tokens: int, extra_body: dict[str, Any] | None = None,
              model: str = "smollm2") -> Outcome:
    tools = _tools(functions, i)
    name = functions[i]["function"]["name"]
    choice: Any = ({"type": "function", "function": {"name": name}} if mode == "named"
                   else mode.removesuffix("-single"))  # fmt: skip
    kwargs: dict[str, Any] = dict(
        model=model, messages=[{"role": "user", "content": functions[i]["query"]}],
        tools=tools, tool_choice=choice, max_tokens=max_tokens, temperature=0, stream=stream,
        extra_body=extra_body, parallel_tool_calls=not mode.endswith("-single"),
    )
    named = name if mode == "named" else None
    if not stream:
        out = await client.chat.completions.create(**kwargs)
        calls = [(c.function.name, c.function.arguments)
                 for c in out.choices[0].message.tool_calls or []]
        return _outcome(calls, tools, named, out.choices[0].finish_reason)
    joined: dict[int, list[str]] = {}
    finish_reason = None
    async for chunk in await client.chat.completions.create(**kwargs):
        if not chunk.choices:
            continue
        finish_reason = chunk.choices[0].finish_reason or finish_reason
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = joined.setdefault(delta.index, ["", ""])
            if delta.function and delta.function.name:
                call[0] += delta.function.name
            if delta.function and delta.function.arguments:
                call[1] += delta.function.arguments
    return _outcome([(n, a) for n, a in joined.values()], tools, named, finish_reason)


async def measure(client: openai.AsyncOpenAI, modes: tuple[str, ...] = MODES,
                  streams: tuple[bool, ...] = (False, True), every: int = 1, start: int = 0,
                  max_tokens: int = 256, concurrency: int = 32,
                  extra_body: dict[str, Any] | None = None, model: str = "smollm2",
                  ) -> dict[tuple[str, bool], list[Outcome]]:
    """(mode, stream) -> validity per function (every ``every``-th one from ``start``), all
    requests run concurrently (bounded), to the served model named ``model``."""
    functions = load_functions()
    gate = asyncio.Semaphore(concurrency)

    async def run(i: int, mode: str, stream: bool) -> Outcome:
        async with gate:
            return await one(client, functions, i, mode, stream, max_tokens, extra_body, model)

    keys = [(mode, stream) for mode in modes for stream in streams]
    picked = range(start, len(functions), every)
    results = await asyncio.gather(*(
        asyncio.gather(*(run(i, mode, stream) for i in picked)) for mode, stream in keys
    ))
    return dict(zip(keys, results))


def table(results: dict[tuple[str, bool], list[Outcome]]) -> str:
    """Per (tool_choice, streaming): responses whose calls parse and validate (ended by the
    model, or closed at max_tokens), of all; how many were closed at the limit; how many were
    cut there without a valid call."""
    lines = ["| tool_choice | streaming | parse and validate | rate | of them closed at "
             "max_tokens | cut by max_tokens |", "|---|---|---|---|---|---|"]
    for (mode, stream), got in results.items():
        closed, truncated = got.count("closed"), got.count("truncated")
        ok = got.count("valid") + closed
        lines.append(f"| {mode} | {'yes' if stream else 'no'} | {ok}/{len(got)} | "
                     f"{100 * ok / len(got):.0f}% | {closed} | {truncated}/{len(got)} |")
    return "\n".join(lines)


def main() -> None:
    import argparse
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    from server_utils import RemoteServer

    from ironlm.model_loader.downloads import ensure_test_model

    parser = argparse.ArgumentParser(description="tool-call validity table")
    parser.add_argument("--model", choices=sorted(TEMPLATES), default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "tools.jinja"
        template.write_text(TEMPLATES[args.model])
        server_args = [*SERVER_ARGS, "--served-model-name", args.model,
                       "--chat-template", str(template)]  # fmt: skip
        with RemoteServer(ensure_test_model(args.model), server_args) as server:
            client = server.async_openai_client(timeout=900)
            results = measure(client, max_tokens=args.max_tokens, model=args.model)
            print(table(asyncio.run(results)))


if __name__ == "__main__":
    main()
