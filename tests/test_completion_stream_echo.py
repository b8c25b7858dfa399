"""The completions stream's echo, fed hand-made engine outputs: with n > 1 an output can list a
choice before its first token (its child request was scheduled a step later); the prompt then
goes out once for that choice, not again with its first token (vLLM's has_echoed)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator

from ironlm.entrypoints.openai.logprobs import TokenNamer
from ironlm.entrypoints.openai.protocol import CompletionRequest, StreamOptions
from ironlm.entrypoints.openai.request_inputs import EnginePrompt
from ironlm.entrypoints.openai.serving_completions import _Ctx, _stream
from ironlm.outputs import CompletionOutput, RequestOutput

PROMPT = "Say hi:"


@dataclass
class _State:
    """What the stream reads of the server's state: no usage chunk, a fingerprint."""

    system_fingerprint: str = "fp"

    def stream_usage(self, opts: StreamOptions | None) -> tuple[bool, bool]:
        return False, False

    def cached_tokens(self, outputs: list[RequestOutput]) -> int | None:
        return None


def _out(texts: list[str], finished: bool) -> RequestOutput:
    return RequestOutput(
        request_id="r", prompt=PROMPT, prompt_token_ids=[1, 2], finished=finished,
        outputs=[CompletionOutput(index=i, text=t, token_ids=[7] * len(t),
                                  cumulative_logprob=None,
                                  finish_reason="length" if finished else None)
                 for i, t in enumerate(texts)],
    )


async def _later(items: list[RequestOutput]) -> AsyncIterator[RequestOutput]:
    for item in items:
        yield item


def _texts(max_tokens: int, outputs: list[RequestOutput]) -> dict[int, str]:
    req = CompletionRequest(model="m", prompt=PROMPT, n=2, echo=True, stream=True,
                            max_tokens=max_tokens)
    ctx = _Ctx(_State(), req, "cmpl-1", 0, [EnginePrompt(PROMPT, [1, 2])],  # type: ignore[arg-type]
               TokenNamer(None, False), "m")

    async def run() -> list[str]:
        return [c async for c in _stream(ctx, outputs[:1], [_later(outputs[1:])])]

    texts: dict[int, str] = {0: "", 1: ""}
    for event in asyncio.run(run()):
        body = event.removeprefix("data: ").strip()
        if body != "[DONE]":
            for choice in json.loads(body)["choices"]:
                texts[choice["index"]] += choice["text"]
    return texts


def test_a_choice_listed_before_its_first_token_echoes_once() -> None:
    # choice 1 has no token in the first output, one in the second
    outputs = [_out(["a", ""], False), _out(["ab", "x"], False), _out(["abc", "xy"], True)]
    assert _texts(3, outputs) == {0: PROMPT + "abc", 1: PROMPT + "xy"}
    # echo without generation: the prompt alone, once per choice
    assert _texts(0, [_out(["", ""], False), _out(["a", "x"], True)]) == {0: PROMPT, 1: PROMPT}
