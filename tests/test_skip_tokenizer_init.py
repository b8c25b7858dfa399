"""vLLM's skip_tokenizer_init on SmolLM2: no tokenizer is loaded; token-id prompts generate
the same tokens as with one (text empty, logprobs undecoded), and what needs the tokenizer is
refused naming it, offline (ValueError) and through the real server (400)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ironlm import LLM, SamplingParams
from server_utils import RemoteServer

pytestmark = pytest.mark.real_model

PROMPT = "The capital of France is"
SMALL: dict[str, Any] = {"max_model_len": 256, "kv_cache_memory": 32 << 20, "dtype": "float32"}


@pytest.fixture(scope="module")
def ref(smollm2_dir: Path) -> LLM:
    return LLM(str(smollm2_dir), **SMALL)


@pytest.fixture(scope="module")
def prompt_ids(ref: LLM) -> list[int]:
    return ref.get_tokenizer()(PROMPT).input_ids


def test_offline_token_ids_in_and_out(smollm2_dir: Path, ref: LLM,
                                      prompt_ids: list[int]) -> None:
    llm = LLM(str(smollm2_dir), skip_tokenizer_init=True, **SMALL)
    with pytest.raises(ValueError, match="skip_tokenizer_init=True"):
        llm.get_tokenizer()  # vLLM's error
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=2)
    got = llm.generate({"prompt_token_ids": prompt_ids}, params, use_tqdm=False)[0]
    want = ref.generate({"prompt_token_ids": prompt_ids}, params, use_tqdm=False)[0]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    assert got.outputs[0].text == "" and want.outputs[0].text
    assert got.outputs[0].finish_reason == "length"
    first = got.outputs[0].logprobs[0]
    assert all(lp.decoded_token is None for lp in first.values())
    assert {t: lp.logprob for t, lp in first.items()} == pytest.approx(
        {t: lp.logprob for t, lp in want.outputs[0].logprobs[0].items()}, abs=1e-4)
    # the model's end-of-sequence id still ends a reply (from the generation config)
    eos = ref.get_tokenizer().eos_token_id
    assert llm.engine.eos_token_id == eos
    with pytest.raises(ValueError, match="cannot pass text prompts"):
        llm.generate(PROMPT, params, use_tqdm=False)
    for field, value in (("stop", ["."]), ("bad_words", ["Paris"])):
        with pytest.raises(ValueError, match=f"^{field} needs the tokenizer"):
            llm.generate({"prompt_token_ids": prompt_ids},
                         SamplingParams(max_tokens=2, **{field: value}), use_tqdm=False)
    with pytest.raises(ValueError, match="chat needs the tokenizer"):
        llm.chat([{"role": "user", "content": "Hi"}], use_tqdm=False)
    with pytest.raises(ValueError, match="reasoning_parser needs the tokenizer"):
        LLM(str(smollm2_dir), skip_tokenizer_init=True, reasoning_parser="deepseek_r1",
            **SMALL)


def test_offline_draft_model_speculation(smollm2_dir: Path, smollm2_draft_dir: Path,
                                         ref: LLM, prompt_ids: list[int]) -> None:
    """A draft model is checked by its vocabulary's size alone; greedy output unchanged."""
    llm = LLM(str(smollm2_dir), skip_tokenizer_init=True, speculative_config={
        "method": "draft_model", "model": str(smollm2_draft_dir), "num_speculative_tokens": 3,
    }, **SMALL)  # fmt: skip
    params = SamplingParams(max_tokens=12, temperature=0)
    got = llm.generate({"prompt_token_ids": prompt_ids}, params, use_tqdm=False)[0]
    want = ref.generate({"prompt_token_ids": prompt_ids}, params, use_tqdm=False)[0]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids


@pytest.fixture(scope="module")
def http(smollm2_dir: Path) -> Iterator[httpx.Client]:
    args = ["--max-model-len", "256", "--kv-cache-memory", "32MiB", "--served-model-name", "s",
            "--skip-tokenizer-init", "--dtype", "float32"]
    with RemoteServer(smollm2_dir, args) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=60) as client:
        yield client


def test_server_completes_token_ids(http: httpx.Client, ref: LLM,
                                    prompt_ids: list[int]) -> None:
    body = {"model": "s", "prompt": prompt_ids, "max_tokens": 6, "temperature": 0,
            "logprobs": 1, "return_token_ids": True}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    want = ref.generate({"prompt_token_ids": prompt_ids},
                        SamplingParams(max_tokens=6, temperature=0), use_tqdm=False)[0]
    assert choice["text"] == "" and choice["token_ids"] == want.outputs[0].token_ids
    # tokens are named by id where no tokenizer can spell them
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in want.outputs[0].token_ids]
    emb = http.post("/v1/embeddings", json={"model": "s", "input": prompt_ids})
    assert emb.status_code == 200 and len(emb.json()["data"][0]["embedding"]) == 576


def _param(r: httpx.Response) -> str:
    assert r.status_code == 400, r.text
    assert "skip-tokenizer-init" in r.json()["error"]["message"] or \
        "needs the tokenizer" in r.json()["error"]["message"]
    return r.json()["error"]["param"]


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/v1/completions", {"prompt": PROMPT}, "prompt"),
    ("/v1/completions", {"prompt": [1, 2], "echo": True}, "echo"),
    ("/v1/completions", {"prompt": [1, 2], "stop": ["."]}, "stop"),
    ("/v1/completions", {"prompt": [1, 2], "response_format": {"type": "json_object"}},
     "response_format"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}, "messages"),
    ("/v1/embeddings", {"input": "text"}, "input"),
    ("/tokenize", {"prompt": "text"}, "prompt"),
    ("/detokenize", {"tokens": [1, 2]}, "tokens"),
    ("/score", {"text_1": "a", "text_2": "b"}, "text_1"),
])  # fmt: skip
def test_server_refuses_what_needs_the_tokenizer(http: httpx.Client, route: str,
                                                 body: dict[str, Any], param: str) -> None:
    assert _param(http.post(route, json={"model": "s", **body})) == param
