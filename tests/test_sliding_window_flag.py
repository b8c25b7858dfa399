"""vLLM's ``--disable-sliding-window`` on the real Gemma 3 270M (sliding window 512 on five of
every six layers): the length is capped to the window, every layer attends to the whole
context, and within the window the output is the windowed model's."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from ironlm import LLM, SamplingParams
from ironlm.layers.attention import Attention

pytestmark = pytest.mark.real_model

PROMPT = [{"role": "user", "content": "Write one sentence about the sea."}]


def windows(llm: LLM) -> list[int | None]:
    model: Any = llm.engine.executor.worker.model_runner.model
    return [m.spec.sliding_window for m in model.modules() if isinstance(m, Attention)]


def run(folder: Path, **kwargs: Any) -> tuple[int, list[int | None], list[int]]:
    llm = LLM(str(folder), dtype="float32", **{"kv_cache_memory": 64 << 20, **kwargs})
    out = llm.chat(PROMPT, SamplingParams(max_tokens=24, temperature=0), use_tqdm=False)
    result = llm.engine.max_model_len, windows(llm), list(out[0].outputs[0].token_ids)
    llm.engine.shutdown()
    del llm
    gc.collect()
    return result


def test_gemma3_without_its_window(gemma3_dir: Path) -> None:
    length, win, want = run(gemma3_dir, max_model_len=512)
    assert length == 512 and set(win) == {512, None}  # the model as configured
    length, win, got = run(gemma3_dir, disable_sliding_window=True)  # no max_model_len
    assert length == 512  # capped to the window (the model takes 32768)
    assert set(win) == {None}
    assert got == want
    with pytest.raises(ValueError, match="sliding window"):
        LLM(str(gemma3_dir), disable_sliding_window=True, max_model_len=1024)


def test_a_model_without_a_window_is_unchanged(smollm2_dir: Path) -> None:
    length, win, _ = run(smollm2_dir, disable_sliding_window=True, kv_cache_memory=512 << 20)
    assert length == 8192 and set(win) == {None}
