"""Speculative decoding on SmolLM2-135M-Instruct: greedy outputs with n-gram drafts and with a
draft model (its first 4 layers) equal plain decoding, offline and streamed by the real server
(whose /metrics then report the speculation)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_utils import RemoteServer

from ironlm import LLM, SamplingParams

pytestmark = pytest.mark.real_model

PARAGRAPH = ("The lighthouse stood at the end of the pier, its white paint peeling in the salt "
             "wind. Every night the keeper climbed the ninety steps, trimmed the wick and watched "
             "the ships pass by on their way to the harbour.")
ASKS = [
    f"Repeat this paragraph exactly:\n\n{PARAGRAPH}",
    f"Rewrite this paragraph, replacing 'keeper' with 'guardian':\n\n{PARAGRAPH}",
    "Name three colours.",
    "def add(a, b):\n    return a + b\n\nWrite the same function for subtraction.",
]
# float32 whatever the CPU's auto dtype: greedy tokens are compared across batch shapes
KW: dict[str, Any] = {"max_model_len": 512, "kv_cache_memory": 96 << 20, "dtype": "float32"}
GREEDY = SamplingParams(temperature=0, max_tokens=48)


def _spec(kind: str, draft: Path) -> dict[str, Any]:
    """The engine arguments of each kind: n-gram drafts in the older flags' form, a draft model
    in vLLM's newer speculative_config (the server tests take the other form of each)."""
    if kind == "ngram":
        return {"speculative_model": "[ngram]", "num_speculative_tokens": 5,
                "ngram_prompt_lookup_max": 4}
    return {"speculative_config": {"method": "draft_model", "model": str(draft),
                                   "num_speculative_tokens": 3}}


def _chats() -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": a}] for a in ASKS]


@pytest.fixture(scope="module")
def plain(smollm2_dir: Path) -> list[Any]:
    return LLM(str(smollm2_dir), **KW).chat(_chats(), GREEDY, use_tqdm=False)


@pytest.mark.parametrize("kind", ["ngram", "draft"])
def test_greedy_offline_equals_plain(kind: str, smollm2_dir: Path, smollm2_draft_dir: Path,
                                     plain: list[Any]) -> None:
    llm = LLM(str(smollm2_dir), **KW, **_spec(kind, smollm2_draft_dir))
    got = llm.chat(_chats(), GREEDY, use_tqdm=False)
    for w, g in zip(plain, got):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.outputs[0].text == w.outputs[0].text
    stats = llm.engine.stats()
    assert stats["spec_decode_num_accepted_tokens"] > 0
    assert stats["spec_decode_mean_accepted_length"] > 1.0


@pytest.mark.server
@pytest.mark.parametrize("kind", ["ngram", "draft"])
def test_server_streams_the_plain_greedy_text(kind: str, smollm2_dir: Path,
                                              smollm2_draft_dir: Path, plain: list[Any]) -> None:
    args = ["--max-model-len", "512", "--kv-cache-memory", "96MiB", "--dtype", "float32",
            "--enable-force-include-usage"]
    if kind == "ngram":  # vLLM's JSON form (lookup from 4 tokens down to 4, vLLM's rule)
        args += ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5, '
                 '"prompt_lookup_max": 4}']
    else:  # the older flags
        args += ["--speculative-model", str(smollm2_draft_dir), "--num-speculative-tokens", "3"]
    with RemoteServer(smollm2_dir, args) as server:
        # before any request the counters are there at 0, as vLLM exports them
        fresh = httpx.get(server.url("/metrics")).text
        assert re.search(r"^vllm:spec_decode_num_accepted_tokens_total\{[^}]*\} 0\.0$", fresh,
                         re.M)
        client = server.openai_client()
        for chat, want in zip(_chats(), plain):
            chunks = list(client.chat.completions.create(
                model=str(smollm2_dir), messages=chat, max_tokens=48, temperature=0,
                stream=True))  # fmt: skip
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text == want.outputs[0].text
            # --enable-force-include-usage: a usage chunk ends the stream unasked (vLLM)
            assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
                len(want.outputs[0].token_ids)
        metrics = httpx.get(server.url("/metrics")).text
    values = {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^(?:vllm|ironlm):(spec_decode_\w+)\{[^}]*\} ([0-9.e+-]+)$", metrics, re.M)}
    # vLLM's spec-decode metrics under vLLM's names; IronLM's extras under ironlm:
    assert re.search(r"^vllm:spec_decode_draft_acceptance_rate\{", metrics, re.M)
    assert re.search(r"^ironlm:spec_decode_mean_accepted_length\{", metrics, re.M)
    assert values["spec_decode_num_draft_tokens_total"] > 0
    assert values["spec_decode_num_accepted_tokens_total"] > 0
    assert 0 < values["spec_decode_draft_acceptance_rate"] <= 1
    assert values["spec_decode_mean_accepted_length"] > 1
    assert values["spec_decode_target_time_seconds_total"] > 0


def test_sampled_drafts_stay_inside_each_rows_set(smollm2_dir: Path) -> None:
    """n-gram drafts verified by sampling with top-k, top-p and min-p (the platform's
    ``LayerOps.truncated_logits`` over the verification rows): every emitted token lies in its
    row's set, read from the raw log-probabilities the request reports (temperature 1, so the
    sets are those of the raw distribution), and drafts were accepted."""
    llm = LLM(str(smollm2_dir), **KW, **_spec("ngram", Path()))
    checks = [
        (SamplingParams(top_k=3, logprobs=20, seed=1, max_tokens=32),
         lambda lp, tid: lp[tid].rank <= 3),
        (SamplingParams(top_p=0.8, logprobs=20, seed=2, max_tokens=32),
         lambda lp, tid: sum(math.exp(v.logprob) for v in lp.values()
                             if v.rank is not None and v.rank < lp[tid].rank) < 0.8 + 1e-5),
        (SamplingParams(min_p=0.2, logprobs=20, seed=3, max_tokens=32),
         lambda lp, tid: math.exp(lp[tid].logprob) >= 0.2 * max(
             math.exp(v.logprob) for v in lp.values()) - 1e-6),
    ]
    for params, inside in checks:
        for out in llm.chat(_chats()[:2], params, use_tqdm=False):
            tokens, logprobs = out.outputs[0].token_ids, out.outputs[0].logprobs or []
            assert len(logprobs) == len(tokens) > 0
            for tid, lp in zip(tokens, logprobs):
                assert inside(lp, tid), params
    assert llm.engine.stats()["spec_decode_num_accepted_tokens"] > 0
