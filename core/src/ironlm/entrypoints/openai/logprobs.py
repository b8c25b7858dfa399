"""Engine logprobs -> the two OpenAI formats (legacy completions, chat), and prompt logprobs.

Engine shape: one dict per position, ``{token_id: Logprob(logprob, rank, decoded_token)}``
holding the sampled (or prompt) token and the top-k alternatives.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ironlm.entrypoints.openai.protocol import (
    ChatLogProb,
    ChatLogProbs,
    ChatLogProbsContent,
    CompletionLogProbs,
)
from ironlm.outputs import Logprob, PositionLogprobs

_FLOOR = -9999.0  # OpenAI clients cannot parse -inf; vLLM clamps to this


def _lp(value: float) -> float:
    return _FLOOR if math.isnan(value) else max(value, _FLOOR)


class TokenNamer:
    """How a token is shown: its text, or ``token_id:<id>`` (--return-tokens-as-token-ids)."""

    def __init__(self, tokenizer: Any, as_token_ids: bool) -> None:
        self.tokenizer = tokenizer
        self.as_token_ids = as_token_ids

    def __call__(self, token_id: int, lp: Logprob | None = None) -> str:
        if self.as_token_ids:
            return f"token_id:{token_id}"
        if lp is not None and lp.decoded_token is not None:
            return lp.decoded_token
        return self.tokenizer.decode([token_id])


def _ranked(position: PositionLogprobs, k: int) -> list[tuple[int, Logprob]]:
    """The position's top ``k`` alternatives by rank."""
    items = sorted(position.items(), key=lambda kv: (kv[1].rank or 0, -kv[1].logprob))
    return items[:k]


def completion_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[PositionLogprobs | None],
    num_top: int,
    name: TokenNamer,
    text_offset: int = 0,
) -> CompletionLogProbs:
    """Legacy completions logprobs for ``token_ids``; a None position (the first prompt token
    when echoing) has no logprob. ``text_offset`` is the offset of the first token."""
    out = CompletionLogProbs()
    offset = text_offset
    for tid, pos in zip(token_ids, positions):
        lp = pos.get(tid) if pos else None
        token = name(tid, lp)
        out.tokens.append(token)
        out.text_offset.append(offset)
        offset += len(token)
        if pos is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(_lp(lp.logprob) if lp is not None else None)
        top = {name(t, alt): _lp(alt.logprob) for t, alt in _ranked(pos, num_top)}
        if lp is not None:
            top.setdefault(token, _lp(lp.logprob))
        out.top_logprobs.append(top)
    return out


def chat_logprobs(
    token_ids: Sequence[int], positions: Sequence[PositionLogprobs], num_top: int,
    name: TokenNamer,
) -> ChatLogProbs:
    content = []
    for tid, pos in zip(token_ids, positions):
        lp = pos.get(tid)
        token = name(tid, lp)
        content.append(
            ChatLogProbsContent(
                token=token,
                logprob=_lp(lp.logprob) if lp is not None else _FLOOR,
                bytes=list(token.encode("utf-8", errors="replace")),
                top_logprobs=[
                    ChatLogProb(
                        token=(t := name(alt_id, alt)),
                        logprob=_lp(alt.logprob),
                        bytes=list(t.encode("utf-8", errors="replace")),
                    )
                    for alt_id, alt in _ranked(pos, num_top)
                ],
            )
        )
    return ChatLogProbs(content=content)


def prompt_logprobs_json(
    positions: list[PositionLogprobs | None] | None,
) -> list[dict[int, dict[str, Any]] | None] | None:
    """vLLM's ``prompt_logprobs`` response field: per prompt position, token id -> logprob."""
    if positions is None:
        return None
    return [
        None if pos is None else {
            tid: {"logprob": _lp(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
            for tid, lp in pos.items()
        }
        for pos in positions
    ]
