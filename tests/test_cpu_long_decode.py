"""SmolLM2 decoding after a long prompt on the cpu platform: the C decode attention, whose rows
of 256+ keys run in pieces on both threads and are merged by their max scores and sums
(``decode_split_src``), against torch's decode attention on the same model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ironlm import LLM, SamplingParams

# ~800 tokens of SmolLM2's tokenizer: one decode row with hundreds of keys, split in pieces
PROMPT = " ".join(
    f"Step {i}: the engine reads every weight once per token, so a decode step costs the bytes "
    f"it reads; the cache of sequence {i % 7} grows by one row." for i in range(24)
) + " Summary:"


def _greedy(model: Path, kernels: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[int],
                                                                                 list[float]]:
    monkeypatch.setenv("IRONLM_CPU_KERNELS", kernels)
    llm = LLM(str(model), device="cpu", dtype="float32", max_model_len=1024,
              kv_cache_memory=64 * 2**20)  # fmt: skip
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)
    out = llm.generate([PROMPT], params, use_tqdm=False)[0]
    assert len(out.prompt_token_ids) > 512, len(out.prompt_token_ids)
    c = out.outputs[0]
    return list(c.token_ids), [next(iter(p.values())).logprob for p in c.logprobs]


def test_smollm2_long_prompt_split_rows_match_torch(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the rows split over threads: two, whatever an earlier test left (the engine sets them)
    monkeypatch.setenv("IRONLM_CPU_THREADS", "2")
    before = torch.get_num_threads()
    try:
        got_ids, got_lps = _greedy(smollm2_dir, "decode_attention=c", monkeypatch)
        assert torch.get_num_threads() == 2
        want_ids, want_lps = _greedy(smollm2_dir, "decode_attention=torch", monkeypatch)
    finally:
        torch.set_num_threads(before)
    assert got_ids == want_ids
    assert got_lps == pytest.approx(want_lps, abs=2e-3)
