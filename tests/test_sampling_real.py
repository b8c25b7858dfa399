"""Sampling parameters on the real model, each checked against a pure-torch reference of its
definition applied to HF transformers' logits for the same tokens; LLM.score against the cosine
of HF's mean-pooled hidden states."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from ironlm import (
    LLM,
    GuidedDecodingParams,
    PoolingParams,
    SamplingParams,
    StructuredOutputsParams,
)
from ironlm.sampling_params import BeamSearchParams

pytestmark = pytest.mark.real_model

PROMPT = "Write a short poem about the moon and the stars:"


@pytest.fixture(scope="module")
def llm(smollm2_dir: Path) -> LLM:
    # float32 whatever the CPU's auto dtype: compared with HF in float32
    return LLM(str(smollm2_dir), max_model_len=512, kv_cache_memory=64 << 20, dtype="float32")


@pytest.fixture(scope="module")
def hf(smollm2_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    return model.eval()


def _hf_logits(hf, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """(len(ids), V) float32: row i predicts token i + 1."""
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0].float()


Processor = Callable[[torch.Tensor, list[int], list[int]], torch.Tensor]


def _check_greedy_against(llm: LLM, hf, params: SamplingParams, ref: Processor) -> list[int]:  # type: ignore[no-untyped-def]
    """Generate greedily with ``params``; each token must be the argmax of the reference
    processor applied to HF's logits at that step."""
    out = llm.generate(PROMPT, params, use_tqdm=False)[0]
    prompt_ids, gen = out.prompt_token_ids, out.outputs[0].token_ids
    logits = _hf_logits(hf, prompt_ids + gen)
    for t, tok in enumerate(gen):
        row = ref(logits[len(prompt_ids) + t - 1].double(), prompt_ids, gen[:t])
        assert int(row.argmax()) == tok, f"step {t}"
    return gen


def test_penalties_follow_their_definitions(llm: LLM, hf) -> None:  # type: ignore[no-untyped-def]
    def rep(row: torch.Tensor, prompt: list[int], outs: list[int]) -> torch.Tensor:
        for t in set(prompt) | set(outs):
            row[t] = row[t] / 1.5 if row[t] > 0 else row[t] * 1.5
        return row

    def freq_pres(row: torch.Tensor, prompt: list[int], outs: list[int]) -> torch.Tensor:
        for t in set(outs):
            row[t] -= 0.8 * outs.count(t) + 0.5
        return row

    plain = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    a = _check_greedy_against(
        llm, hf, SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.5), rep)
    b = _check_greedy_against(
        llm, hf, SamplingParams(temperature=0, max_tokens=24, frequency_penalty=0.8,
                                presence_penalty=0.5), freq_pres)
    assert a != plain[0].outputs[0].token_ids or b != plain[0].outputs[0].token_ids


def test_bias_allowed_and_bad_words(llm: LLM, hf) -> None:  # type: ignore[no-untyped-def]
    tok = llm.get_tokenizer()
    plain = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    first = plain[0].outputs[0].token_ids[0]

    def bias(row: torch.Tensor, prompt: list[int], outs: list[int]) -> torch.Tensor:
        row[first] -= 100.0
        row[42] += 3.0
        return row

    gen = _check_greedy_against(
        llm, hf, SamplingParams(temperature=0, max_tokens=8, logit_bias={first: -100, 42: 3}),
        bias)
    assert first not in gen
    allowed = tok(" the moon stars night sky", add_special_tokens=False).input_ids

    def only(row: torch.Tensor, prompt: list[int], outs: list[int]) -> torch.Tensor:
        keep = torch.full_like(row, -math.inf)
        keep[allowed] = row[allowed]
        return keep

    gen = _check_greedy_against(
        llm, hf, SamplingParams(temperature=0, max_tokens=8, allowed_token_ids=allowed), only)
    assert set(gen) <= set(allowed)
    # bad_words: the first whole word the model would say is never produced
    word_tok = next(t for t in plain[0].outputs[0].token_ids if tok.decode([t]).strip().isalpha())
    word = tok.decode([word_tok]).strip()
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8, bad_words=[word]),
                       use_tqdm=False)[0].outputs[0]
    assert word_tok not in out.token_ids and word not in out.text.split()


def test_stop_strings_tokens_min_tokens_and_lengths(llm: LLM) -> None:
    base = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40),
                        use_tqdm=False)[0].outputs[0]
    text, ids = base.text, base.token_ids
    stop = text[12:15]  # a 3-char stop string that may straddle tokens
    cut = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert cut.text == text[: text.index(stop)]
    assert (cut.finish_reason, cut.stop_reason) == ("stop", stop)
    kept = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40, stop=[stop],
                                               include_stop_str_in_output=True),
                        use_tqdm=False)[0].outputs[0]
    assert kept.text == text[: text.index(stop) + len(stop)]
    st = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40,
                                             stop_token_ids=[ids[5]]),
                      use_tqdm=False)[0].outputs[0]
    assert st.token_ids == ids[: ids.index(ids[5]) + 1] and st.stop_reason == ids[5]
    ln = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=7),
                      use_tqdm=False)[0].outputs[0]
    assert len(ln.token_ids) == 7 and ln.finish_reason == "length"
    eos = llm.get_tokenizer().eos_token_id
    mt = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, min_tokens=12,
                                             stop_token_ids=[ids[0]]),
                      use_tqdm=False)[0].outputs[0]
    assert len(mt.token_ids) == 12 and ids[0] not in mt.token_ids and eos not in mt.token_ids
    raw = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=5, detokenize=False),
                       use_tqdm=False)[0].outputs[0]
    assert raw.text == "" and raw.token_ids == ids[:5]
    tr = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=3,
                                             truncate_prompt_tokens=4), use_tqdm=False)[0]
    assert len(tr.prompt_token_ids) == 4


def test_stop_tokens_leave_their_text_out_and_min_tokens_hold_stop_strings(llm: LLM) -> None:
    """As vLLM: a stop token id or EOS ends the request without its text unless
    include_stop_str_in_output; stop strings count only after min_tokens tokens."""
    tok = llm.get_tokenizer()
    base = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24),
                        use_tqdm=False)[0].outputs[0]
    text, ids = base.text, base.token_ids
    i = ids.index(ids[5])  # its first occurrence
    for include in (False, True):
        st = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24,
                                                 stop_token_ids=[ids[5]],
                                                 include_stop_str_in_output=include),
                          use_tqdm=False)[0].outputs[0]
        assert st.token_ids == ids[: i + 1] and st.stop_reason == ids[5]
        assert st.text == tok.decode(ids[: i + 1 if include else i])
    eos = tok.eos_token_id
    for include in (False, True):
        e = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4,
                                                logit_bias={eos: 100.0},
                                                skip_special_tokens=False,
                                                include_stop_str_in_output=include),
                         use_tqdm=False)[0].outputs[0]
        assert e.token_ids == [eos] and e.finish_reason == "stop"
        assert e.text == (tok.decode([eos]) if include else "")
    free = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24, stop=[" "]),
                        use_tqdm=False)[0].outputs[0]
    held = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=24, stop=[" "],
                                               min_tokens=3), use_tqdm=False)[0].outputs[0]
    assert free.text == text[: text.index(" ")]
    # the first space at or after the first 3 tokens' text ends it
    assert held.text == text[: text.index(" ", len(tok.decode(ids[:3])))]
    assert held.finish_reason == "stop" and len(held.token_ids) > 3


def test_vllm_names_of_the_engine_and_argument_checks(llm: LLM) -> None:
    assert llm.llm_engine is llm.engine  # vLLM's attribute name
    assert llm.llm_engine.get_tokenizer() is llm.get_tokenizer()
    with pytest.raises(ValueError, match="priority"):
        llm.generate([PROMPT, PROMPT], SamplingParams(max_tokens=2), priority=[0],
                     use_tqdm=False)
    with pytest.raises(ValueError, match="^truncate_prompt_tokens value"):
        llm.generate(PROMPT, SamplingParams(max_tokens=2, truncate_prompt_tokens=513),
                     use_tqdm=False)
    # -1 keeps what the context leaves beside max_tokens (vLLM's max_input_tokens); an
    # embedding keeps the whole context
    long = {"prompt_token_ids": list(range(100, 700))}
    cut = llm.generate(long, SamplingParams(max_tokens=12, truncate_prompt_tokens=-1),
                       use_tqdm=False)[0]
    assert cut.prompt_token_ids == long["prompt_token_ids"][-500:]
    assert len(cut.outputs[0].token_ids) == 12
    assert len(llm.encode(long, truncate_prompt_tokens=-1)[0].prompt_token_ids) == 512
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        SamplingParams(truncate_prompt_tokens=-2)
    # the newer name of guided_decoding, and never both
    with pytest.raises(ValueError, match="give one"):
        SamplingParams(structured_outputs=StructuredOutputsParams(choice=["a"]),
                       guided_decoding=GuidedDecodingParams(choice=["a"]))
    moved = SamplingParams(structured_outputs=StructuredOutputsParams(choice=["a"],
                                                                      backend="outlines"))
    assert moved.structured_outputs is None and moved.guided_decoding is not None
    assert moved.guided_decoding_backend == "outlines"
    # max_logprobs -1 (no limit) is an engine argument; 20 (the default) limits here
    with pytest.raises(ValueError, match="max_logprobs=20"):
        llm.generate(PROMPT, SamplingParams(max_tokens=1, logprobs=21), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_top_k_top_p_min_p_keep_samples_inside_their_sets(llm: LLM) -> None:
    for params, inside in [
        (SamplingParams(temperature=1.0, top_k=3, logprobs=20, seed=1, max_tokens=16),
         lambda lp, tid: lp[tid].rank <= 3),
        (SamplingParams(temperature=1.0, top_p=0.5, logprobs=20, seed=2, max_tokens=16),
         lambda lp, tid: sum(math.exp(v.logprob) for v in lp.values()
                             if v.rank is not None and v.rank < lp[tid].rank
                             and v is not lp[tid]) < 0.5 + 1e-6),
        (SamplingParams(temperature=1.0, min_p=0.3, logprobs=20, seed=3, max_tokens=16),
         lambda lp, tid: math.exp(lp[tid].logprob) >= 0.3 * max(
             math.exp(v.logprob) for v in lp.values()) - 1e-6),
    ]:
        out = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
        for tid, lp in zip(out.token_ids, out.logprobs or []):
            assert inside(lp, tid), params


def test_logprobs_match_hf_and_prompt_logprobs_cover_the_prompt(llm: LLM, hf) -> None:  # type: ignore[no-untyped-def]
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=10, logprobs=5,
                                              prompt_logprobs=2), use_tqdm=False)[0]
    ids = out.prompt_token_ids + out.outputs[0].token_ids
    ref = torch.log_softmax(_hf_logits(hf, ids), dim=-1)
    P = len(out.prompt_token_ids)
    for t, (tid, lp) in enumerate(zip(out.outputs[0].token_ids, out.outputs[0].logprobs)):
        assert lp[tid].logprob == pytest.approx(float(ref[P + t - 1, tid]), abs=1e-3)
        assert len(lp) == 5 or len(lp) == 6  # top-5 plus the sampled token when outside them
        for other, v in lp.items():
            assert v.logprob == pytest.approx(float(ref[P + t - 1, other]), abs=1e-3)
    assert out.outputs[0].cumulative_logprob == pytest.approx(
        sum(out.outputs[0].logprobs[t][tid].logprob
            for t, tid in enumerate(out.outputs[0].token_ids)), abs=1e-4)
    plp = out.prompt_logprobs
    assert plp is not None and len(plp) == P and plp[0] is None
    for pos in range(1, P):
        tid = out.prompt_token_ids[pos]
        assert plp[pos][tid].logprob == pytest.approx(float(ref[pos - 1, tid]), abs=1e-3)


def test_cumulative_logprob_only_when_reported(llm: LLM) -> None:
    """As vLLM: outputs carry the sampled tokens' log-probabilities (and their sum) only when
    the request asks for logprobs (or best_of ranks by them); the same tokens either way."""
    plain = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=6),
                         use_tqdm=False)[0].outputs[0]
    asked = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=6, logprobs=0),
                         use_tqdm=False)[0].outputs[0]
    assert plain.cumulative_logprob is None and plain.logprobs is None
    assert plain.token_ids == asked.token_ids
    assert asked.cumulative_logprob is not None and asked.cumulative_logprob < 0
    assert asked.cumulative_logprob == pytest.approx(
        sum(lp[t].logprob for lp, t in zip(asked.logprobs, asked.token_ids)), abs=1e-4)


def test_seed_reproducible_alone_or_in_a_batch(llm: LLM) -> None:
    p = SamplingParams(temperature=1.0, seed=1234, max_tokens=16)
    alone = llm.generate(PROMPT, p, use_tqdm=False)[0].outputs[0].text
    others = [f"Story number {i}:" for i in range(16)]
    batch = llm.generate([PROMPT] + others, [p] + [SamplingParams(temperature=1.0,
                                                                  max_tokens=16)] * 16,
                         use_tqdm=False)
    assert batch[0].outputs[0].text == alone
    other_seed = llm.generate(PROMPT, SamplingParams(temperature=1.0, seed=99, max_tokens=16),
                              use_tqdm=False)[0].outputs[0].text
    assert other_seed != alone


def test_n_and_best_of(llm: LLM) -> None:
    out = llm.generate(PROMPT, SamplingParams(n=4, best_of=6, temperature=1.0, seed=7,
                                              max_tokens=8), use_tqdm=False)[0]
    assert len(out.outputs) == 4 and [o.index for o in out.outputs] == [0, 1, 2, 3]
    scores = [o.cumulative_logprob for o in out.outputs]
    assert scores == sorted(scores, reverse=True)
    n2 = llm.generate(PROMPT, SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=8),
                      use_tqdm=False)[0]
    assert len(n2.outputs) == 2 and n2.outputs[0].text != n2.outputs[1].text
    assert llm.engine.block_manager.num_used_blocks == 0


def _reference_beam_search(hf, prompt_ids: list[int], width: int, steps: int,  # type: ignore[no-untyped-def]
                           eos: int, length_penalty: float) -> list[tuple[list[int], float]]:
    """Textbook beam search over HF logits: expand every beam by its 2*width best tokens,
    keep the best `width` by cumulative logprob, retire beams that end in EOS."""
    live = [(list(prompt_ids), 0.0)]
    done: list[tuple[list[int], float]] = []
    for _ in range(steps):
        cands = []
        for toks, score in live:
            lp = torch.log_softmax(_hf_logits(hf, toks)[-1], dim=-1)
            vals, idx = lp.topk(2 * width)
            cands += [(toks + [int(i)], score + float(v)) for v, i in zip(vals, idx)]
        cands.sort(key=lambda c: -c[1])
        live = []
        for c in cands[:width]:
            (done if c[0][-1] == eos else live).append(c)
        if not live:
            break

    def norm(c: tuple[list[int], float]) -> float:
        n = len(c[0]) - (1 if c[0][-1] == eos else 0)
        return c[1] / n**length_penalty

    return sorted(done + live, key=lambda c: -norm(c))[:width]


def test_beam_search_equals_reference(llm: LLM, hf) -> None:  # type: ignore[no-untyped-def]
    prompts = ["The moon is", "My favourite food is", "In 1969,", "Python is a"]
    params = BeamSearchParams(beam_width=4, max_tokens=6, length_penalty=1.0)
    outs = llm.beam_search(prompts, params)
    eos = llm.get_tokenizer().eos_token_id
    for prompt, out in zip(prompts, outs):
        ids = llm.get_tokenizer()(prompt).input_ids
        ref = _reference_beam_search(hf, ids, 4, 6, eos, 1.0)
        assert [s.tokens for s in out.sequences] == [r[0] for r in ref]
        for s, r in zip(out.sequences, ref):
            assert s.cum_logprob == pytest.approx(r[1], abs=2e-3)
    assert llm.engine.block_manager.num_used_blocks == 0


def test_use_beam_search_in_sampling_params_runs_beam_search(llm: LLM) -> None:
    prompt = "The moon is"
    beams = llm.beam_search([prompt], BeamSearchParams(beam_width=3, max_tokens=5))[0]
    out = llm.generate(prompt, SamplingParams(use_beam_search=True, best_of=3, n=2,
                                              temperature=0.0, max_tokens=5), use_tqdm=False)[0]
    best = beams.sequences[:2]
    assert [o.token_ids for o in out.outputs] == [s.tokens[len(out.prompt_token_ids):] for s in best]
    # as vLLM's LLM.beam_search, a beam's text is its whole sequence's, prompt included
    assert [prompt + o.text for o in out.outputs] == [s.text for s in best]


def _hf_mean_hidden(hf, tok, text: str) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """HF's mean-pooled last hidden state (after the final norm) of ``text``."""
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        return hf(ids, output_hidden_states=True).hidden_states[-1][0].mean(0)


def test_score_is_the_cosine_of_hf_mean_pooled_states(llm: LLM, hf) -> None:  # type: ignore[no-untyped-def]
    tok = llm.get_tokenizer()
    query = "What is the capital of France?"
    docs = ["Paris is the capital of France.", "Bananas are rich in potassium.",
            "The Eiffel Tower stands in Paris."]
    out = llm.score(query, docs, use_tqdm=False)  # 1:N
    q = _hf_mean_hidden(hf, tok, query)
    want = [float(F.cosine_similarity(q, _hf_mean_hidden(hf, tok, d), dim=0)) for d in docs]
    got = [o.outputs.score for o in out]
    assert got == pytest.approx(want, abs=2e-4)
    assert len({round(s, 3) for s in got}) == 3  # the pairs differ
    # vLLM's token count of a pair: first text, the pad token, second text
    q_ids, d_ids = tok(query).input_ids, tok(docs[0]).input_ids
    assert out[0].prompt_token_ids == q_ids + [tok.pad_token_id] + d_ids
    # N:N pairs the i-th with the i-th; a 1-element first side is the 1:N form
    pairwise = llm.score([query, docs[1]], [docs[0], docs[2]], use_tqdm=False)
    assert pairwise[0].outputs.score == pytest.approx(got[0], abs=1e-5)
    cross = float(F.cosine_similarity(_hf_mean_hidden(hf, tok, docs[1]),
                                       _hf_mean_hidden(hf, tok, docs[2]), dim=0))
    assert pairwise[1].outputs.score == pytest.approx(cross, abs=2e-4)
    assert [o.outputs.score for o in llm.score([query], docs, use_tqdm=False)] == \
        pytest.approx(got, abs=1e-5)
    with pytest.raises(ValueError, match="1:1, 1:N or N:N"):
        llm.score([query, docs[0]], docs, use_tqdm=False)
    with pytest.raises(ValueError, match="text_pair"):
        llm.score(query, [], use_tqdm=False)


def test_encode_and_embed_in_vllm_shapes(llm: LLM, hf) -> None:  # type: ignore[no-untyped-def]
    tok = llm.get_tokenizer()
    texts = ["The quick brown fox.", "Hello"]
    pooled = llm.encode(texts, use_tqdm=False)
    want = [_hf_mean_hidden(hf, tok, t) for t in texts]
    for out, ref, text in zip(pooled, want, texts):
        assert out.finished and out.prompt_token_ids == tok(text).input_ids
        assert out.outputs.data.dtype == torch.float32 and out.outputs.data.shape == (576,)
        assert torch.allclose(out.outputs.data, ref, atol=2e-3, rtol=1e-3)
    embedded = llm.embed(texts, use_tqdm=False)
    for e, p in zip(embedded, pooled):
        assert e.outputs.embedding == pytest.approx(p.outputs.data.tolist(), abs=1e-5)
    unit = llm.embed(texts[0], pooling_params=PoolingParams(normalize=True), use_tqdm=False)
    assert unit[0].outputs.embedding == pytest.approx(
        F.normalize(want[0], dim=0).tolist(), abs=1e-4)
    cut = llm.embed(texts[0], pooling_params=PoolingParams(truncate_prompt_tokens=2),
                    use_tqdm=False)  # fmt: skip
    assert cut[0].prompt_token_ids == tok(texts[0]).input_ids[-2:]
    # one PoolingParams per prompt
    each = llm.embed(texts, pooling_params=[PoolingParams(normalize=True), PoolingParams()],
                     use_tqdm=False)  # fmt: skip
    assert each[0].outputs.embedding == pytest.approx(unit[0].outputs.embedding, abs=1e-5)
    assert each[1].outputs.embedding == pytest.approx(embedded[1].outputs.embedding, abs=1e-5)
    with pytest.raises(ValueError, match="1 pooling params for 2 prompts"):
        llm.embed(texts, pooling_params=[PoolingParams()], use_tqdm=False)
    with pytest.raises(ValueError, match="dimensions"):
        PoolingParams(dimensions=8)
    for task, why in (("classify", "needs a sequence classifier"),
                      ("token_classify", "needs a sequence classifier"),
                      ("encode", "unknown pooling_task")):
        with pytest.raises(ValueError, match=why):
            llm.encode(texts, pooling_task=task, use_tqdm=False)
