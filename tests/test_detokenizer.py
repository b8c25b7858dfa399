"""Incremental detokenization on the real SmolLM2 and Gemma 3 tokenizers: the text streamed token
by token equals one decode of all tokens, on the fast path (the Rust backend) and through the
tokenizer's own ``decode``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from ironlm.engine.detokenizer import IncrementalDetokenizer, WholeDetokenizer

TEXT = "Hello, wörld! 你好 🙂 — naïve café\n\tdef f(x):\n    return x ** 2  # done"


def _stream(tok: Any, ids: list[int], skip_special: bool, stop: list[str] | None = None,
            ) -> IncrementalDetokenizer:  # fmt: skip
    detok = IncrementalDetokenizer(tok, [], stop or [], False, skip_special, True)
    for t in ids:
        if detok.add_token(t) is not None:
            break
    else:
        detok.flush()
    return detok


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    path: Path = request.getfixturevalue(f"{request.param}_dir")
    return AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("skip_special", [True, False])
def test_streamed_text_equals_one_decode(tokenizer: Any, skip_special: bool) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    ids = ids[:7] + [tokenizer.eos_token_id] + ids[7:]  # a special token inside
    detok = _stream(tokenizer, ids, skip_special)
    assert detok._backend is not None  # both are fast tokenizers without clean-up
    assert detok.text == tokenizer.decode(ids, skip_special_tokens=skip_special)
    assert "🙂" in detok.text and "café" in detok.text  # multi-byte pieces came through whole


@pytest.mark.parametrize("skip_special", [True, False])
def test_one_decode_at_the_end_gives_the_streamed_text(tokenizer: Any, skip_special: bool) -> None:
    """What a final-only output without stop strings uses (``WholeDetokenizer``): the same
    text as the stream, on the fast path and through ``decode``; an id cut in the middle of a
    multi-byte character renders as the stream's flush does."""
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    ids = ids[:7] + [tokenizer.eos_token_id] + ids[7:]
    for tok in (tokenizer, _SlowOnly(tokenizer)):
        for cut in (len(ids), len(ids) - 3, 5, 0):
            whole = WholeDetokenizer(tok, skip_special, True)
            for t in ids[:cut]:
                assert whole.add_token(t) is None
            assert whole.visible_text(True) == _stream(tok, ids[:cut], skip_special).text


class _SlowOnly:
    """The tokenizer's ``decode`` alone (no backend): the path a slow tokenizer takes."""

    def __init__(self, tok: Any) -> None:
        self.decode = tok.decode


def test_fast_path_matches_tokenizer_decode(tokenizer: Any) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    fast, slow = _stream(tokenizer, ids, True), _stream(_SlowOnly(tokenizer), ids, True)
    assert slow._backend is None
    assert fast.text == slow.text == tokenizer.decode(ids, skip_special_tokens=True)


def test_stop_string_truncates_the_stream(tokenizer: Any) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    detok = _stream(tokenizer, ids, True, stop=["café"])
    assert detok.text == TEXT[: TEXT.index("café")]
