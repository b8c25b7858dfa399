"""Prompt embeddings, vLLM's ``enable_prompt_embeds``: ``{"prompt_embeds": tensor}`` offline
and the Completions API's ``prompt_embeds`` (base64 of ``torch.save``'s bytes), on SmolLM2 and
Gemma 3 (float32).

The rows come from HF transformers' own embedding layer (``get_input_embeddings()``, Gemma's
scale included), so a prompt given as rows must generate what its tokens generate: the same
greedy tokens and logprobs, in batches mixed with token prompts, through chunked prefill and
preemption by recompute (the rows are sent again), and under tensor and pipeline parallelism
(the first stage alone runs them). HF fed the same rows (``inputs_embeds``) gives the same
logprobs. The prefix cache keys embedded blocks on their rows: the same rows hit, other rows
and the same positions as tokens do not (and a last row run alone after a hit goes through the
eager path, not a decode graph that would embed its placeholder id). Refused, naming the field:
rows of the wrong width, dtype, layout or values, a payload that is not a saved tensor, what
needs the prompt's token ids (prompt_logprobs, echo, suffix, beam search), the feature off,
speculative decoding at start-up, an architecture that does not take rows.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from parallel_utils import worker_pids
from real_prompts import PROMPTS
from server_utils import RemoteServer

from ironlm import LLM, SamplingParams
from ironlm.engine.input_processor import InputProcessor
from ironlm.engine.prompt_embeds import check_embeds_support, decode_embeds
from ironlm.entrypoints.beam_search import BeamSearchParams
from ironlm.entrypoints.openai.embeds_prompts import embeds_prompts
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.protocol import CompletionRequest
from ironlm.interfaces.model import ModelArchitecture

pytestmark = pytest.mark.real_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0)
# 12 blocks of 16 tokens for 8 sequences of ~35 tokens, a 24-token step budget: chunked
# prefill, and preemption by recompute (no swap space), so rows are sent again
ARGS: dict[str, Any] = {
    "dtype": "float32", "max_model_len": 192, "num_kv_blocks": 12, "block_size": 16,
    "enable_prefix_caching": True, "enable_chunked_prefill": True,
    "max_num_batched_tokens": 24, "swap_space": 0, "enable_prompt_embeds": True,
}
HIDDEN = 576  # SmolLM2-135M


class HF:
    """HF transformers' model: the rows of a prompt's tokens, and its logprobs for rows."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def ids(self, text: str) -> list[int]:
        return list(self.tok(text).input_ids)

    @torch.inference_mode()
    def rows(self, ids: list[int]) -> torch.Tensor:
        """(len(ids), hidden) float32: what the model's embedding layer makes of ``ids``."""
        return self.model.get_input_embeddings()(torch.tensor(ids)).clone()

    @torch.inference_mode()
    def logprobs(self, rows: torch.Tensor, tokens: list[int]) -> torch.Tensor:
        """(len(tokens), vocab) log-probabilities of each next token, the prompt given as
        ``rows`` and the tokens before it as their embeddings (teacher forcing)."""
        seq = torch.cat([rows, self.rows(tokens[:-1])]) if len(tokens) > 1 else rows
        logits = self.model(inputs_embeds=seq[None]).logits[0, len(rows) - 1:].float()
        return torch.log_softmax(logits, dim=-1)


def b64(tensor: torch.Tensor) -> str:
    buf = io.BytesIO()
    torch.save(tensor, buf)
    return base64.b64encode(buf.getvalue()).decode()


def run(llm: LLM, prompts: list[Any], params: SamplingParams = GREEDY) -> list[Any]:
    return llm.generate(prompts, params, use_tqdm=False)


def tokens_logprobs(outs: list[Any]) -> list[tuple[list[int], list[float]]]:
    result = []
    for out in outs:
        o = out.outputs[0]
        result.append((list(o.token_ids), [lp[t].logprob for t, lp in zip(o.token_ids,
                                                                           o.logprobs)]))
    return result


def assert_same(a: list[Any], b: list[Any]) -> None:
    """The same greedy tokens, and logprobs equal to float32 rounding."""
    for (ta, la), (tb, lb) in zip(tokens_logprobs(a), tokens_logprobs(b), strict=True):
        assert ta == tb
        assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-4


@pytest.fixture(scope="module")
def hf(smollm2_dir: Path) -> HF:
    return HF(smollm2_dir)


@pytest.fixture(scope="module")
def llm(smollm2_dir: Path) -> Iterator[LLM]:
    engine = LLM(str(smollm2_dir), **ARGS)
    yield engine
    engine.shutdown()


def test_rows_generate_what_their_tokens_do_batched_chunked_and_preempted(
    llm: LLM, hf: HF
) -> None:
    ids = [hf.ids(p) for p in PROMPTS]
    by_ids = run(llm, [{"prompt_token_ids": i} for i in ids])
    preempted = llm.engine.stats()["num_preemptions"]
    by_rows = run(llm, [{"prompt_embeds": hf.rows(i)} for i in ids])
    assert llm.engine.stats()["num_preemptions"] > preempted  # recomputed from the rows
    assert_same(by_rows, by_ids)
    for out, i in zip(by_rows, ids):  # vLLM's: no prompt text or ids; counted by rows
        assert out.prompt is None and out.prompt_token_ids is None
        assert out.num_prompt_tokens == len(i)
    # rows and tokens in one batch (every other prompt), (1, n, hidden) taken as (n, hidden)
    mixed = [{"prompt_embeds": hf.rows(i)[None]} if k % 2 else {"prompt_token_ids": i}
             for k, i in enumerate(ids)]
    assert_same(run(llm, mixed), by_ids)
    assert llm.engine.stats()["num_used_blocks"] == 0


def test_logprobs_match_hf_fed_the_same_rows(llm: LLM, hf: HF) -> None:
    for text in PROMPTS[:3]:
        rows = hf.rows(hf.ids(text))
        [(tokens, logprobs)] = tokens_logprobs(run(llm, [{"prompt_embeds": rows}]))
        ref = hf.logprobs(rows, tokens)  # (len(tokens), vocab)
        for j, (t, lp) in enumerate(zip(tokens, logprobs)):
            assert abs(lp - float(ref[j, t])) < 1e-3
            assert float(ref[j].max()) - float(ref[j, t]) < 1e-3  # greedy under HF too


def test_prefix_cache_keys_blocks_on_their_rows(llm: LLM, hf: HF) -> None:
    text = "You are a helpful assistant who answers briefly and precisely. " * 4
    ids = hf.ids(text)[:33]  # two full 16-token blocks, then one position
    rows = hf.rows(ids)
    first = run(llm, [{"prompt_embeds": rows}])[0]
    again = run(llm, [{"prompt_embeds": rows.clone()}])[0]
    # both blocks from the cache; the last row runs alone (eagerly, not through a decode
    # graph, which would embed the placeholder id): the same tokens
    assert again.num_cached_tokens == 32
    assert_same([again], [first])
    other = rows.clone()
    other[20] += 0.01  # the second block differs: only the first is shared
    assert run(llm, [{"prompt_embeds": other}])[0].num_cached_tokens == 16
    # the same positions as tokens (or as the placeholder ids) share nothing with the rows
    as_ids = run(llm, [{"prompt_token_ids": ids}])[0]
    assert as_ids.num_cached_tokens == 0
    assert_same([as_ids], [first])
    assert run(llm, [{"prompt_token_ids": [0] * 33}])[0].num_cached_tokens == 0


def test_truncation_pooling_and_what_is_refused(llm: LLM, hf: HF) -> None:
    ids = hf.ids(PROMPTS[4])
    rows = hf.rows(ids)
    # truncate_prompt_tokens keeps the last rows, as it keeps the last tokens
    cut = SamplingParams(temperature=0.0, max_tokens=8, logprobs=0, truncate_prompt_tokens=5)
    out = run(llm, [{"prompt_embeds": rows}], cut)[0]
    assert out.num_prompt_tokens == 5
    assert_same([out], run(llm, [{"prompt_token_ids": ids[-5:]}], cut))
    # an embedding request (mean-pooled hidden states) over rows equals one over the tokens
    [by_rows, by_ids] = llm.embed([{"prompt_embeds": rows}, {"prompt_token_ids": ids}],
                                  use_tqdm=False)
    torch.testing.assert_close(torch.tensor(by_rows.outputs.embedding),
                               torch.tensor(by_ids.outputs.embedding), atol=1e-5, rtol=1e-5)
    bad: list[tuple[Any, str]] = [
        (rows[:, :10], "hidden size 10 does not match the model's hidden_size 576"),
        (rows.long(), "not a floating-point type"),
        (rows[None, None], r"shape \(seq_len, hidden_size\)"),
        (rows[0], r"shape \(seq_len, hidden_size\)"),
        (torch.full((3, HIDDEN), float("nan")), "NaN or infinite"),
        (rows.to_sparse(), "dense tensor"),
        (rows.tolist(), "must be a torch.Tensor"),
        (rows[:0], "cannot be empty"),
    ]
    for value, message in bad:
        with pytest.raises(ValueError, match=message):
            run(llm, [{"prompt_embeds": value}])
    with pytest.raises(ValueError, match="^prompt_logprobs"):
        run(llm, [{"prompt_embeds": rows}], SamplingParams(max_tokens=2, prompt_logprobs=1))
    with pytest.raises(ValueError, match="beam search"):
        llm.beam_search([{"prompt_embeds": rows}], BeamSearchParams(beam_width=2, max_tokens=2))
    with pytest.raises(ValueError, match="score takes text or token prompts"):
        llm.score({"prompt_embeds": rows}, PROMPTS[0], use_tqdm=False)
    assert llm.engine.stats()["num_used_blocks"] == 0  # nothing refused was queued


def test_off_by_default_and_start_up_refusals(smollm2_dir: Path) -> None:
    inputs = InputProcessor(None, vocab_size=100, max_model_len=16, max_logprobs=5)
    with pytest.raises(ValueError, match="--enable-prompt-embeds"):
        inputs.process({"prompt_embeds": torch.zeros(2, 8)}, SamplingParams())
    with pytest.raises(ValueError, match="speculative decoding"):
        LLM(str(smollm2_dir), enable_prompt_embeds=True, max_model_len=128,
            speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                "prompt_lookup_max": 3})

    class TokensOnly(ModelArchitecture):  # a third-party architecture (contract 1.3 default)
        pass

    with pytest.raises(ValueError, match="TokensOnly does not take prompt embeddings"):
        check_embeds_support(TokensOnly, None)


def test_base64_payloads_are_decoded_or_refused() -> None:
    rows = torch.randn(4, 8, dtype=torch.bfloat16)
    torch.testing.assert_close(decode_embeds(b64(rows), 8), rows.float())
    assert decode_embeds(b64(rows[None]), 8).shape == (4, 8)

    buf = io.BytesIO()  # an arbitrary pickled object: weights_only loading refuses it
    torch.save(types.SimpleNamespace(rows=rows), buf)
    # a torch.save zip whose pickle is cut short: torch's unpickler raises IndexError
    src = zipfile.ZipFile(io.BytesIO(base64.b64decode(b64(rows))))
    broken = io.BytesIO()
    with zipfile.ZipFile(broken, "w") as z:
        for info in src.infolist():
            z.writestr(info, b"\x80\x02R." if info.filename.endswith("data.pkl")
                       else src.read(info.filename))
    for payload, message in [
        ("not base64!", "not valid base64"),
        (base64.b64encode(b"plain bytes").decode(), "not a tensor saved with torch.save"),
        (base64.b64encode(buf.getvalue()).decode(), "not a tensor saved with torch.save"),
        (b64({"rows": rows}), "must be a torch.Tensor, got dict"),  # type: ignore[arg-type]
        (b64(rows.to_sparse()), "dense tensor"),
        (base64.b64encode(broken.getvalue()).decode(), r"torch.save \(IndexError\)"),
        # 1.6 kB that would be 32 MB of rows: an expanded view is refused before any copy
        (b64(torch.zeros(1, 8).expand(10**6, 8)), "must hold its values"),
        (b64(torch.zeros(3, 8, device="meta")), "could not be read as rows"),
    ]:
        with pytest.raises(ValueError, match=message):
            decode_embeds(payload, 8)
    # the server's front end: off without the flag, and what needs the prompt's tokens
    off = types.SimpleNamespace(embeds_hidden_size=None, max_model_len=64)
    on = types.SimpleNamespace(embeds_hidden_size=8, max_model_len=64)
    for state, body, param in [
        (off, {}, "prompt_embeds"), (on, {"echo": True}, "echo"),
        (on, {"suffix": "x"}, "suffix"), (on, {"use_beam_search": True}, "use_beam_search"),
        (on, {"prompt_embeds": []}, "prompt_embeds"),
        (on, {"truncate_prompt_tokens": 99}, "truncate_prompt_tokens"),
    ]:
        req = CompletionRequest(model="m", **{"prompt_embeds": b64(rows), **body})
        with pytest.raises(APIError) as info:
            asyncio.run(embeds_prompts(state, req, 1))  # type: ignore[arg-type]
        assert info.value.param == param


def test_gemma3_scaled_rows_match_its_tokens_and_hf(gemma3_dir: Path) -> None:
    # Gemma scales its embedding rows by sqrt(hidden): HF's get_input_embeddings() includes
    # the scale, and so must the rows IronLM takes (vLLM's and HF's inputs_embeds)
    hf = HF(gemma3_dir)
    llm = LLM(str(gemma3_dir), dtype="float32", max_model_len=128, kv_cache_memory=32 << 20,
              enable_prompt_embeds=True)
    try:
        ids = [hf.ids(p) for p in PROMPTS[:4]]
        by_rows = run(llm, [{"prompt_embeds": hf.rows(i)} for i in ids])
        assert_same(by_rows, run(llm, [{"prompt_token_ids": i} for i in ids]))
        [(tokens, logprobs)] = tokens_logprobs(by_rows[:1])
        ref = hf.logprobs(hf.rows(ids[0]), tokens)
        assert max(abs(lp - float(ref[j, t])) for j, (t, lp) in
                   enumerate(zip(tokens, logprobs))) < 1e-3
    finally:
        llm.shutdown()


def test_gemma3_rows_under_tensor_and_pipeline_parallelism(gemma3_dir: Path) -> None:
    # tp=2 x pp=2 on the mp executor: every rank embeds the step's ids (the vocabulary-
    # parallel embedding's all-reduce), the first stage's ranks splice the rows in
    hf = HF(gemma3_dir)
    ids = [hf.ids(p) for p in PROMPTS[:3]]
    short = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
    one = LLM(str(gemma3_dir), dtype="float32", max_model_len=128, kv_cache_memory=32 << 20,
              enforce_eager=True)
    try:
        want = run(one, [{"prompt_token_ids": i} for i in ids], short)
    finally:
        one.shutdown()
    split = LLM(str(gemma3_dir), dtype="float32", max_model_len=128, kv_cache_memory=32 << 20,
                enforce_eager=True, enable_prompt_embeds=True, tensor_parallel_size=2,
                pipeline_parallel_size=2, distributed_executor_backend="mp")
    try:
        got = run(split, [{"prompt_embeds": hf.rows(i)} for i in ids], short)
    finally:
        split.shutdown()
    assert worker_pids(os.getpid()) == [], "a worker process outlived its engine"
    for (ta, la), (tb, lb) in zip(tokens_logprobs(got), tokens_logprobs(want), strict=True):
        assert ta == tb
        assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-3  # reductions split 2 ways


def test_server_completions_take_base64_rows(smollm2_dir: Path, hf: HF) -> None:
    ids = hf.ids(PROMPTS[0])
    rows = hf.rows(ids)
    args = ["--enable-prompt-embeds", "--dtype", "float32", "--max-model-len", "128",
            "--kv-cache-memory", "32MiB"]
    with RemoteServer(smollm2_dir, args) as srv:
        client = srv.openai_client()
        model = client.models.list().data[0].id

        def complete(**kwargs: Any) -> Any:
            return client.completions.create(model=model, max_tokens=12, temperature=0.0,
                                             **kwargs)

        by_ids = complete(prompt=ids)
        # vLLM's client form: an empty prompt, the rows in extra_body
        by_rows = complete(prompt="", extra_body={"prompt_embeds": b64(rows)})
        assert by_rows.choices[0].text == by_ids.choices[0].text
        assert by_rows.usage.prompt_tokens == len(ids)
        # several payloads and a text prompt: the rows' choices first (vLLM's order)
        both = complete(prompt=PROMPTS[2], extra_body={
            "prompt_embeds": [b64(rows), b64(rows[None])], "return_token_ids": True})
        texts = [c.text for c in sorted(both.choices, key=lambda c: c.index)]
        assert texts == [by_ids.choices[0].text] * 2 + [complete(prompt=PROMPTS[2])
                                                         .choices[0].text]
        extra = [c.model_extra for c in sorted(both.choices, key=lambda c: c.index)]
        assert [e["prompt_token_ids"] is None for e in extra] == [True, True, False]
        assert both.usage.prompt_tokens == 2 * len(ids) + len(hf.ids(PROMPTS[2]))
        stream = complete(prompt="", stream=True, stream_options={"include_usage": True},
                          extra_body={"prompt_embeds": b64(rows)})
        chunks = list(stream)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == \
            by_ids.choices[0].text
        assert chunks[-1].usage.prompt_tokens == len(ids)
        url = srv.url("/v1/completions")
        for body, param in [
            ({"prompt_embeds": "not base64!"}, "prompt_embeds"),
            ({"prompt_embeds": b64(rows[:, :7])}, "prompt_embeds"),
            ({"prompt_embeds": b64(torch.full((2, HIDDEN), float("inf")))}, "prompt_embeds"),
            ({"prompt_embeds": b64(torch.zeros(1, HIDDEN).expand(4096, HIDDEN))},
             "prompt_embeds"),
            ({"prompt_embeds": b64(rows), "echo": True}, "echo"),
            ({"prompt_embeds": b64(rows), "prompt_logprobs": 1}, "prompt_logprobs"),
            ({"prompt_embeds": b64(torch.zeros(126, HIDDEN))}, "max_tokens"),
            ({}, "prompt"),
        ]:
            res = httpx.post(url, json={"model": model, "max_tokens": 4, **body}, timeout=60)
            assert res.status_code == 400, (body.keys(), res.text)
            assert res.json()["error"]["param"] == param
        # the server goes on serving
        assert complete(prompt="", extra_body={"prompt_embeds": b64(rows)}).choices[0].text \
            == by_ids.choices[0].text
