"""The real test models (SmolLM2-135M-Instruct, Gemma 3 270M) through our layers, the paged KV
cache and the reference attention backend, against HF transformers' forward on the same tokens
(float32): one prefill, then single-token decode steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_models_helpers import assert_logits_close, hf_logits, load_ours, run_prefill_then_decode
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from ironlm.model_loader import resolve_model
from ironlm.model_loader.gguf_weights import load_gguf_config
from ironlm.model_loader.downloads import ensure_test_gguf

pytestmark = pytest.mark.real_model

PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs every evening, counting the steps as his "
    "father had done before him. From the lamp room he could see the fishing boats returning, "
    "their lights scattered across the dark water like sparks from a fire. "
)


def _chat_ids(folder: Path, question: str) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False).input_ids


def _hf(folder: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> tuple[Any, Any]:
    return _hf(smollm2_dir), load_ours(smollm2_dir)


@pytest.fixture(scope="module")
def gemma3(gemma3_dir: Path) -> tuple[Any, Any]:
    return _hf(gemma3_dir), load_ours(gemma3_dir)


def test_smollm2_matches_hf(smollm2_dir: Path, smollm2: tuple[Any, Any]) -> None:
    hf, ours = smollm2
    ids = _chat_ids(smollm2_dir, "What is the capital of France? Answer in one word.")
    assert_logits_close(run_prefill_then_decode(ours, ids, num_decode=4), hf_logits(hf, ids))


def test_gemma3_matches_hf(gemma3_dir: Path, gemma3: tuple[Any, Any]) -> None:
    hf, ours = gemma3
    ids = _chat_ids(gemma3_dir, "Write one sentence about the sea.")
    assert_logits_close(run_prefill_then_decode(ours, ids, num_decode=4), hf_logits(hf, ids))


def test_gemma3_beyond_sliding_window_matches_hf(gemma3_dir: Path, gemma3: tuple[Any, Any]) -> None:
    """A prompt longer than Gemma's 512-token window: the sliding layers must drop the oldest
    keys, in prefill and in the decode steps after it."""
    hf, ours = gemma3
    window = hf.config.sliding_window
    tokenizer = AutoTokenizer.from_pretrained(gemma3_dir)
    ids = tokenizer(PARAGRAPH * 20).input_ids[: window + 24]
    assert len(ids) == window + 24
    # only the last positions see a truncated window: compare those (and a few before); the
    # LM head over 262k tokens dominates the cost, so logits are computed for those rows only
    ours_logits = run_prefill_then_decode(ours, ids, num_decode=4, block_size=16, last=40)
    assert_logits_close(ours_logits, hf_logits(hf, ids, last=40))


def test_smollm2_gguf_equals_converted_folder(smollm2_dir: Path) -> None:
    """Loading the .gguf directly gives the weights (hence logits) of the converted folder."""
    gguf_path = ensure_test_gguf("smollm2")
    source = resolve_model(str(gguf_path))
    assert source.gguf_file == gguf_path and source.architectures == ["LlamaForCausalLM"]
    assert source.checkpoint_dtype == torch.float32
    ids = _chat_ids(smollm2_dir, "Name a colour.")
    from_gguf = run_prefill_then_decode(load_ours(source), ids, num_decode=2)
    from_folder = run_prefill_then_decode(load_ours(smollm2_dir), ids, num_decode=2)
    torch.testing.assert_close(from_gguf, from_folder, rtol=0, atol=1e-5)
    # the tokenizer converted from the GGUF metadata tokenizes like the folder's
    gguf_tokenizer = source.load_tokenizer()
    assert (
        gguf_tokenizer("Hello, world!").input_ids
        == AutoTokenizer.from_pretrained(smollm2_dir)("Hello, world!").input_ids
    )


def test_gemma3_gguf_equals_converted_folder(gemma3_dir: Path, gemma3: tuple[Any, Any]) -> None:
    gguf_path = ensure_test_gguf("gemma3")
    source = resolve_model(str(gguf_path))
    assert source.architectures == ["Gemma3ForCausalLM"]
    ids = _chat_ids(gemma3_dir, "Name a colour.")
    from_gguf = run_prefill_then_decode(load_ours(source), ids, num_decode=2)
    from_folder = run_prefill_then_decode(gemma3[1], ids, num_decode=2)
    torch.testing.assert_close(from_gguf, from_folder, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_gguf_config_equals_transformers(name: str) -> None:
    """Our one-pass GGUF config reader gives the config transformers' GGUF reader gives."""
    gguf_path = ensure_test_gguf(name)
    ours = load_gguf_config(gguf_path).to_dict()
    ref = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name).to_dict()
    for volatile in ("_name_or_path", "architectures"):  # architectures: filled in by us only
        ours.pop(volatile, None)
        ref.pop(volatile, None)
    assert ours == ref


def test_smollm2_dummy_weights(smollm2_dir: Path) -> None:
    """load_format=dummy: the real shapes, random finite weights, no checkpoint read."""
    ours = load_ours(smollm2_dir, load_format="dummy", seed=3)
    logits = run_prefill_then_decode(ours, [1, 2, 3, 4, 5], num_decode=1)
    assert logits.shape == (5, 49152) and torch.isfinite(logits).all()
