"""vLLM's ``logprobs_mode`` on the real SmolLM2: raw_logprobs (the model's distribution, the
default), raw_logits, and processed_logprobs / processed_logits (what the draw used: here at
temperature 0.5 with top-k 3), checked against each other position by position."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from ironlm import LLM, SamplingParams

pytestmark = pytest.mark.real_model

PROMPT = "The capital of France is"


def run(model: Path, mode: str, **params: Any) -> Any:
    llm = LLM(str(model), dtype="float32", max_model_len=256, kv_cache_memory=64 << 20,
              logprobs_mode=mode)  # fmt: skip
    sp = SamplingParams(max_tokens=6, logprobs=5, prompt_logprobs=2, seed=7, **params)
    out = llm.generate([PROMPT], sp, use_tqdm=False)[0]
    llm.engine.shutdown()
    return out


def values(entry: dict[int, Any]) -> dict[int, float]:
    return {tok: lp.logprob for tok, lp in entry.items()}


def shifted(a: dict[int, float], b: dict[int, float], scale: float = 1.0) -> None:
    """a's finite values are scale x b's plus one constant (a normaliser) on shared tokens."""
    shared = [t for t in a if t in b and math.isfinite(a[t])]
    assert len(shared) >= 2
    base = shared[0]
    for t in shared[1:]:
        assert a[t] - a[base] == pytest.approx(scale * (b[t] - b[base]), abs=2e-3)


def test_logprobs_modes(smollm2_dir: Path) -> None:
    raw, logits = run(smollm2_dir, "raw_logprobs", temperature=0), \
        run(smollm2_dir, "raw_logits", temperature=0)
    assert raw.outputs[0].token_ids == logits.outputs[0].token_ids
    for r, g in zip(raw.outputs[0].logprobs, logits.outputs[0].logprobs):
        r_vals, g_vals = values(r), values(g)
        assert set(r_vals) == set(g_vals)  # the same top tokens
        shifted(g_vals, r_vals)  # logits = logprobs + logsumexp
        assert max(g_vals.values()) > max(r_vals.values())  # not normalised
    # prompt logprobs are the model's logprobs in every mode (vLLM's)
    for r, g in zip(raw.prompt_logprobs[1:], logits.prompt_logprobs[1:]):
        assert values(g) == pytest.approx(values(r), abs=1e-5)
        assert all(v <= 0 for v in values(g).values())

    sample = {"temperature": 0.5, "top_k": 3}
    raw_s = run(smollm2_dir, "raw_logprobs", **sample)
    proc = run(smollm2_dir, "processed_logprobs", **sample)
    proc_logits = run(smollm2_dir, "processed_logits", **sample)
    raw_logits_s = run(smollm2_dir, "raw_logits", **sample)
    tokens = raw_s.outputs[0].token_ids
    assert proc.outputs[0].token_ids == tokens == proc_logits.outputs[0].token_ids
    for i, tok in enumerate(tokens):
        p, r = values(proc.outputs[0].logprobs[i]), values(raw_s.outputs[0].logprobs[i])
        kept = [t for t in p if math.isfinite(p[t])]
        assert len(kept) == 3 and tok in kept  # top-k 3: the rest cannot be drawn
        assert sum(math.exp(p[t]) for t in kept) == pytest.approx(1.0, abs=1e-4)
        shifted(p, r, scale=2.0)  # temperature 0.5 doubles the differences
        pl, rl = values(proc_logits.outputs[0].logprobs[i]), \
            values(raw_logits_s.outputs[0].logprobs[i])
        for t in kept:
            assert pl[t] == pytest.approx(rl[t] / 0.5, abs=2e-3)  # logits at the temperature
    # the sampled token's reported value comes from the same tensor
    assert proc.outputs[0].cumulative_logprob == pytest.approx(
        sum(values(e)[t] for e, t in zip(proc.outputs[0].logprobs, tokens)), abs=1e-3)


def test_raw_modes_see_the_grammar(smollm2_dir: Path) -> None:
    # vLLM applies a guided request's grammar mask before the sampler: the raw distribution
    # is the model's over the tokens the grammar allows
    from ironlm import GuidedDecodingParams

    guided = GuidedDecodingParams(choice=["Paris", "London"])
    out = run(smollm2_dir, "raw_logprobs", temperature=0, guided_decoding=guided)
    free = run(smollm2_dir, "raw_logprobs", temperature=0)
    assert out.outputs[0].text in ("Paris", "London", " Paris", " London")
    first, unguided = values(out.outputs[0].logprobs[0]), values(free.outputs[0].logprobs[0])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    # the top tokens are starts of the choices only, none of the model's free favourites
    assert all(any(c.startswith(tok.decode([t])) for c in ("Paris", "London")) for t in first)
    assert sum(math.exp(v) for v in first.values()) <= 1.0 + 1e-4
    shared = [t for t in first if t in unguided]
    for t in shared:  # the same logits, renormalised over fewer tokens
        assert first[t] > unguided[t]
    if len(shared) >= 2:
        shifted(first, unguided)


def test_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="logprobs_mode 'processed'"):
        LLM("unused", logprobs_mode="processed")
