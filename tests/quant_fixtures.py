"""What the quantization tests on the real model share: the SmolLM2 variants that
``ironlm quantize`` writes (made once per session by conftest.py's ``quantized_smollm2``
fixture), and perplexity on the fixed text the tests ship (tests/data/perplexity_text.txt, an
original story, 2341 tokens)."""

from __future__ import annotations

import gc
import math
from dataclasses import replace
from pathlib import Path

from ironlm import LLM, SamplingParams
from ironlm.quantization.offline.quantizer import QuantizeOptions, quantize_model

TEXT = Path(__file__).resolve().parent / "data" / "perplexity_text.txt"
GROUP = 64  # 128 does not divide SmolLM2's hidden size (576)
CALIB_TOKENS = 4096  # all of the built-in text sample (about 3300 tokens)
WINDOW = 1024  # perplexity windows (each scored on its own)

# name -> the tool's options (everything else unquantized in float32, like the reference)
VARIANTS: dict[str, QuantizeOptions] = {
    "weight_only_int8": QuantizeOptions("weight_only_int8"),
    "int8_lm_head": QuantizeOptions("weight_only_int8", lm_head=True),  # + the tied LM head
    "smooth_quant": QuantizeOptions("smooth_quant", alpha=0.5),
    "fp8": QuantizeOptions("fp8"),
    "awq": QuantizeOptions("awq", group_size=GROUP),
    "gptq": QuantizeOptions("gptq", group_size=GROUP),
    "rtn_int4_sym": QuantizeOptions("weight_only_int4", group_size=GROUP, zero_points=False),
    "rtn_int4_asym": QuantizeOptions("weight_only_int4", group_size=GROUP, zero_points=True),
}

def quantize_variant(src: Path, out: Path, name: str) -> Path:
    """Write SmolLM2 (``src``) quantized as the variant ``name`` into ``out`` with the tool's
    code path (the session fixture ``quantized_smollm2`` in conftest.py caches the folders)."""
    base = VARIANTS[name]
    opts = replace(base, dtype="fp32", progress=False, calib_tokens=CALIB_TOKENS)
    return quantize_model(src, out, opts)


def perplexity(model: Path, quantization: str | None = None) -> float:
    """exp(mean negative log-likelihood) of the text's tokens under ``model``, scored in
    independent windows of WINDOW tokens through the prompt logprobs of ``LLM``."""
    # float32 activations whatever the CPU's auto dtype (bf16 on avx512_bf16 CPUs): the table
    # compares each method's weights against the float32 model
    llm = LLM(str(model), quantization=quantization, max_model_len=WINDOW + 16,
              kv_cache_memory=128 << 20, enable_prefix_caching=False, dtype="float32")  # fmt: skip
    try:
        ids = llm.get_tokenizer()(TEXT.read_text()).input_ids
        windows = [ids[i : i + WINDOW] for i in range(0, len(ids), WINDOW)]
        outs = llm.generate(
            [{"prompt_token_ids": w} for w in windows],
            SamplingParams(max_tokens=1, prompt_logprobs=0),
            use_tqdm=False,
        )
        logprobs = [
            entry[tok].logprob
            for out, window in zip(outs, windows)
            for entry, tok in zip(out.prompt_logprobs[1:], window[1:])
        ]
    finally:
        del llm
        gc.collect()
    return math.exp(-sum(logprobs) / len(logprobs))
