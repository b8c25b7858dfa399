"""Speculative decoding through the engine, on tiny random-weight models (fast): greedy outputs
equal plain decoding in every situation the scheduler meets (mixed batches, chunked prefill,
preemption, prefix caching, stop strings, max_tokens and max_model_len, logprobs, guided
decoding), sampling keeps the target's distribution (chi-square against HF transformers'
probabilities), speculation turns itself off above the batch-size limit, and a draft with
another vocabulary is refused at start-up naming both models. The real-model checks are in
test_spec_decode_real.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from test_spec_decode_unit import chi_square_pvalue

from ironlm import LLM, GuidedDecodingParams, SamplingParams
from ironlm.interfaces.truncation import truncate

NGRAM = {"speculative_model": "[ngram]", "num_speculative_tokens": 4,
         "ngram_prompt_lookup_max": 3}
BASE = {"max_model_len": 256, "kv_cache_memory": 32 << 20}
PROMPTS = [
    "Repeat: a b c d e f a b c d e f a b c",
    "hello world " * 6,
    "x",
    "The list: one, two, three, four, one, two, three, four, one, two,",
]


def _write_tiny(out: Path, tokenizer_dir: Path, seed: int, tied: bool, vocab: int = 49152) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=tied, eos_token_id=2, bos_token_id=1,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny_draft_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    """Another random tiny Llama, untied (its preferences unlike the target's), same tokenizer."""
    return _write_tiny(tmp_path_factory.mktemp("tiny-draft"), tiny_llama_dir, 1, tied=False)


def _generate(model: Path, prompts: list[Any], params: Any, **kwargs: Any) -> tuple[list[Any], dict]:
    llm = LLM(str(model), **{**BASE, **kwargs})
    outs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.engine.stats()
    assert stats["num_used_blocks"] == 0  # every block came back
    return outs, stats


def _ids(outs: list[Any]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def plain_greedy(tiny_llama_dir: Path) -> list[list[int]]:
    outs, _ = _generate(tiny_llama_dir, PROMPTS, SamplingParams(temperature=0, max_tokens=40,
                                                                ignore_eos=True))
    return _ids(outs)


@pytest.mark.parametrize("proposer", ["ngram", "self", "other"])
def test_greedy_equals_plain_decoding(
    proposer: str, tiny_llama_dir: Path, tiny_draft_dir: Path, plain_greedy: list[list[int]]
) -> None:
    spec = {"ngram": NGRAM,
            "self": {"speculative_model": str(tiny_llama_dir), "num_speculative_tokens": 3},
            "other": {"speculative_model": str(tiny_draft_dir), "num_speculative_tokens": 3}}
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outs, stats = _generate(tiny_llama_dir, PROMPTS, params, **spec[proposer])
    assert _ids(outs) == plain_greedy
    assert stats["spec_decode_num_draft_tokens"] > 0
    if proposer == "self":  # the target drafting for itself: every draft is kept
        assert stats["spec_decode_draft_acceptance_rate"] == 1.0
    assert 0 < stats["spec_decode_num_emitted_tokens"] <= 4 * 40


def test_chunked_prefill_preemption_and_prefix_cache(
    tiny_llama_dir: Path, tiny_draft_dir: Path, plain_greedy: list[list[int]]
) -> None:
    """A 24-token budget (chunked prompts, drafts cut to the budget), a KV cache too small for
    the batch (preemption drops drafts and the draft model's KV), then the same prompts again
    from the prefix cache: the tokens of plain decoding every time."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for spec in (NGRAM, {"speculative_model": str(tiny_draft_dir), "num_speculative_tokens": 3}):
        llm = LLM(str(tiny_llama_dir), max_model_len=192, num_kv_blocks=14, block_size=16,
                  max_num_batched_tokens=24, **spec)
        assert _ids(llm.generate(PROMPTS, params, use_tqdm=False)) == plain_greedy
        assert llm.engine.stats()["num_preemptions"] > 0
        assert _ids(llm.generate(PROMPTS, params, use_tqdm=False)) == plain_greedy
        stats = llm.engine.stats()
        assert stats["prefix_cache_hits"] > 0 and stats["num_used_blocks"] == 0


def test_stops_limits_logprobs_and_mixed_sampling(tiny_llama_dir: Path, tiny_draft_dir: Path) -> None:
    """Stop strings and stop tokens inside the accepted drafts, max_tokens and max_model_len
    reached mid-verification, logprobs of every kept token, and seeded sampling beside greedy
    requests in one batch."""
    plain_outs, _ = _generate(tiny_llama_dir, PROMPTS, SamplingParams(temperature=0, max_tokens=40,
                                                                      ignore_eos=True))
    texts = [o.outputs[0].text for o in plain_outs]
    long_prompt = {"prompt_token_ids": [7] * 230}  # 230 + 40 > max_model_len 256
    prompts = [*PROMPTS, PROMPTS[0], long_prompt, PROMPTS[1]]
    params = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[texts[0][9:13]]),
        SamplingParams(temperature=0, max_tokens=7, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=0, max_tokens=33, ignore_eos=True,
                       stop_token_ids=[plain_outs[2].outputs[0].token_ids[20]]),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                       stop=[texts[3][-9:-5]], include_stop_str_in_output=True),
        SamplingParams(temperature=0.8, seed=11, max_tokens=20, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=25, ignore_eos=True, min_tokens=20,
                       presence_penalty=0.5, frequency_penalty=0.3),
    ]
    want, _ = _generate(tiny_llama_dir, prompts, params)
    runs = []
    for spec in (NGRAM, {"speculative_model": str(tiny_draft_dir), "num_speculative_tokens": 3}):
        got, stats = _generate(tiny_llama_dir, prompts, params, **spec)
        runs.append(got)
        assert stats["spec_decode_num_draft_tokens"] > 0
        for i, (w, g) in enumerate(zip(want, got)):
            wo, go = w.outputs[0], g.outputs[0]
            if params[i].temperature > 0:  # seeded sampling: own stream, but well formed
                assert len(go.token_ids) == 20 and go.logprobs is not None
                assert all(len(lp) >= 1 for lp in go.logprobs)
                continue
            assert (go.token_ids, go.text, go.finish_reason, go.stop_reason) == (
                wo.token_ids, wo.text, wo.finish_reason, wo.stop_reason), i
            if wo.logprobs is not None:
                for a, b in zip(wo.logprobs, go.logprobs):
                    assert a.keys() == b.keys()
                    for t in a:
                        assert abs(a[t].logprob - b[t].logprob) < 1e-4
    assert want[5].outputs[0].finish_reason == "length"
    assert len(want[5].outputs[0].token_ids) == 256 - 230
    # the seeded request is reproducible with the same drafts
    again, _ = _generate(tiny_llama_dir, prompts, params, **NGRAM)
    assert again[4].outputs[0].token_ids == runs[0][4].outputs[0].token_ids


def test_guided_requests_verify_drafts_under_the_grammar(tiny_llama_dir: Path) -> None:
    """Drafts are cut at the first token the grammar refuses; each verification row is
    masked by the grammar advanced through the drafts before it."""
    pattern = "(ab|cd|ef)+\\."
    prompts = ["ab cd ef ab cd ef ab cd ef ", "cdcdcdcdcd", "efabef"]
    params = SamplingParams(temperature=0, max_tokens=30,
                            guided_decoding=GuidedDecodingParams(regex=pattern))
    want, _ = _generate(tiny_llama_dir, prompts, params, guided_decoding_backend="xgrammar")
    got, stats = _generate(tiny_llama_dir, prompts, params, guided_decoding_backend="xgrammar",
                           **NGRAM)
    assert _ids(got) == _ids(want)
    assert stats["spec_decode_num_accepted_tokens"] > 0
    import re

    for o in got:
        text = o.outputs[0].text
        assert re.fullmatch(pattern, text) or o.outputs[0].finish_reason == "length", text


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> tuple[Path, Path]:
    """A tied target and an untied draft of 1000 vocabulary rows (cheap full-vocabulary
    sampling); token ids below 1000 of the same tokenizer."""
    root = tmp_path_factory.mktemp("small-vocab")
    return (_write_tiny(root / "target", tiny_llama_dir, 0, tied=True, vocab=1000),
            _write_tiny(root / "draft", tiny_llama_dir, 1, tied=False, vocab=1000))


@pytest.mark.parametrize("limits", [{}, {"top_k": 4, "min_p": 0.1}], ids=["whole", "cut"])
def test_sampling_keeps_the_target_distribution(small_vocab_pair: tuple[Path, Path],
                                                limits: dict[str, Any]) -> None:
    """Four tokens from 6 allowed ones at temperature 0.5, over 800 seeded requests; the first
    token comes from the prompt's step, the next ones from one verification of 2 drafts. With
    n-gram drafts (point masses) and with a draft model (its own distribution, unlike the
    target's), the frequencies of (x1, x2) and (x2, x3) fit the target's exact probabilities
    (from HF transformers) by chi-square tests; plain sampling is checked the same way. Fixed
    seeds: the outcome is deterministic. "cut": each row's top-k / min-p set (the reference
    definition on HF's logits; the platform's ``LayerOps.truncated_logits`` in the engine),
    and no token outside it."""
    from transformers import LlamaForCausalLM

    target, draft = small_vocab_pair
    allowed = [100, 200, 300, 400, 500, 600]
    prompt = [1, 100, 200, 300, 100, 200, 300, 100, 200, 300]
    temp = 0.5
    hf = LlamaForCausalLM.from_pretrained(target).eval()

    def dist(contexts: list[list[int]]) -> torch.Tensor:  # (len(contexts), 6)
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + c for c in contexts])).logits[:, -1, allowed]
        rows = len(contexts)
        cut = truncate(logits / temp, [limits.get("top_k", -1)] * rows, [1.0] * rows,
                       [limits.get("min_p", 0.0)] * rows)
        return torch.softmax(cut, dim=-1)

    p1 = dist([[]])[0]
    p2 = dist([[a] for a in allowed])  # [x1, x2]
    p3 = dist([[a, b] for a in allowed for b in allowed]).reshape(6, 6, 6)  # [x1, x2, x3]
    joint12 = (p1[:, None] * p2).reshape(-1)
    joint23 = (p1[:, None, None] * p2[:, :, None] * p3).sum(dim=0).reshape(-1)
    n = 800
    params = [SamplingParams(temperature=temp, seed=i, max_tokens=4, ignore_eos=True,
                             allowed_token_ids=allowed, **limits) for i in range(n)]
    prompts = [{"prompt_token_ids": prompt}] * n
    configs = {"plain": {}, "ngram": {**NGRAM, "num_speculative_tokens": 2},
               "draft": {"speculative_model": str(draft), "num_speculative_tokens": 2}}
    for name, spec in configs.items():
        outs, stats = _generate(target, prompts, params, max_num_seqs=256, **spec)
        pairs12 = torch.zeros(36, dtype=torch.long)
        pairs23 = torch.zeros(36, dtype=torch.long)
        for o in outs:
            x = [allowed.index(t) for t in o.outputs[0].token_ids]
            pairs12[x[0] * 6 + x[1]] += 1
            pairs23[x[1] * 6 + x[2]] += 1
        # (chi_square_pvalue pools cells of probability 0 away: none may be drawn)
        assert int(pairs12[joint12 == 0].sum()) == 0 and int(pairs23[joint23 == 0].sum()) == 0
        assert chi_square_pvalue(pairs12, joint12) > 1e-3, (name, pairs12.tolist())
        assert chi_square_pvalue(pairs23, joint23) > 1e-3, (name, pairs23.tolist())
        if name != "plain":  # drafts were verified, and both verdicts happened
            rate = stats["spec_decode_draft_acceptance_rate"]
            assert stats["spec_decode_num_draft_tokens"] > n // 2 and 0.05 < rate < 0.95, rate


def test_speculation_is_off_above_the_batch_size_limit(tiny_llama_dir: Path) -> None:
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    four = [PROMPTS[0]] * 4  # same length: they run together from start to end
    spec = {**NGRAM, "speculative_disable_by_batch_size": 2}
    outs, stats = _generate(tiny_llama_dir, four, params, **spec)
    assert stats["spec_decode_num_draft_tokens"] == 0
    want, _ = _generate(tiny_llama_dir, four, params)
    assert _ids(outs) == _ids(want)
    _, alone = _generate(tiny_llama_dir, four[:1], params, **spec)
    assert alone["spec_decode_num_draft_tokens"] > 0


def test_a_draft_with_another_vocabulary_is_refused_naming_both(
    tmp_path: Path, tiny_llama_dir: Path
) -> None:
    small = _write_tiny(tmp_path / "small-vocab", tiny_llama_dir, 2, tied=True, vocab=1000)
    with pytest.raises(ValueError, match=r"draft model .*small-vocab.* does not share the target "
                                         r"model .*tiny-llama.*49152 vocabulary rows.*1000 rows"):
        LLM(str(tiny_llama_dir), speculative_model=str(small), num_speculative_tokens=2, **BASE)
    swapped = tmp_path / "swapped"
    shutil.copytree(tiny_llama_dir, swapped)
    tok = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[300], list(vocab)[301]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match=r"swapped.*does not share.*token .* is id 30[01] for "
                                         r"the target, 30[01] for the draft"):
        LLM(str(tiny_llama_dir), speculative_model=str(swapped), num_speculative_tokens=2, **BASE)
    with pytest.raises(ValueError, match="unknown speculative_model '\\[medusa\\]'"):
        LLM(str(tiny_llama_dir), speculative_model="[medusa]", num_speculative_tokens=2, **BASE)
