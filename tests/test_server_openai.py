"""The real server with SmolLM2 driven by the official ``openai`` client and httpx (issue 5):
completions and chat (streaming and not), n, logprobs, usage, stop, seeds, token-id prompts,
echo, tokenize, embeddings, /generate, /metrics, the API key, and bad input."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import openai
import pytest
from openapi_fuzz import NOT_AN_ERROR_OBJECT, fuzz
from server_utils import RemoteServer

pytestmark = [pytest.mark.server, pytest.mark.real_model]

API_KEY = "test-key"
MODEL = "smollm2"
MAX_MODEL_LEN = 1024
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name one colour."}]


@pytest.fixture(scope="module")
def server(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteServer]:
    # A small step budget keeps engine steps short on this 2-core CPU box, so aborts (applied
    # between steps) take effect quickly after the disconnect burst. Some flags come as vLLM
    # users write them: from a --config YAML file, in --snake_case, and the key in VLLM_API_KEY.
    config = tmp_path_factory.mktemp("config") / "serve.yaml"
    config.write_text(f"max_model_len: {MAX_MODEL_LEN}\nkv-cache-memory: 128MiB\n"
                      f"served-model-name: [{MODEL}, smollm2-alias]\n"
                      "disable-log-stats: true\nenable-prefix-caching: true\n"
                      "max-num-seqs: 999\n")  # the command line's --max_num_seqs wins
    args = [
        "--config", str(config), "--max_num_seqs", "32", "--max-num-batched-tokens", "64",
        "--max-request-body-size", "1MiB", "--max-log-len", "40", "--enable-log-requests",
        "--enable-prompt-tokens-details", "--trust-request-chat-template",
        "--enable-tokenizer-info-endpoint",
        "--default-chat-template-kwargs", '{"greeting": "Ahoy", "farewell": "Bye"}',
        "--middleware", "server_utils.header_middleware",
        "--dtype", "float32",  # whatever the CPU's auto dtype: embeddings compared across batches
    ]
    with RemoteServer(smollm2_dir, args, api_key=API_KEY, key_env="VLLM_API_KEY") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return server.openai_client(timeout=60)


@pytest.fixture(scope="module")
def http(server: RemoteServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, headers=server.headers(), timeout=60) as c:
        yield c


def metric(text: str, name: str, default: float | None = None) -> float:
    """Sum of a Prometheus sample over its label sets (``default`` when it has none yet)."""
    values = [float(m.group(1)) for m in
              re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)]
    if not values and default is not None:
        return default
    assert values, f"{name} not in /metrics"
    return sum(values)


# -- plain endpoints -----------------------------------------------------------------------
def test_health_version_models_plugins(server: RemoteServer, http: httpx.Client,
                                       client: openai.OpenAI) -> None:
    bare = httpx.get(server.url("/health"), timeout=5)  # no key needed
    assert bare.status_code == 200
    assert bare.headers["x-ironlm-test-middleware"] == "1"  # --middleware was loaded
    assert httpx.get(server.url("/ping"), timeout=5).status_code == 200  # vLLM's alias
    assert httpx.post(server.url("/ping"), timeout=5).status_code == 200
    assert http.get("/version").json()["version"]
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL, "smollm2-alias"]
    assert '"GET /v1/models' in server.log_text()  # uvicorn's access log is on by default
    card = http.get("/v1/models").json()["data"][0]
    assert card["max_model_len"] == MAX_MODEL_LEN
    assert card["permission"][0]["object"] == "model_permission"  # vLLM's card has one
    rows = http.get("/v1/plugins").json()["data"]
    assert any(r["plugin"] == "ironlm" for r in rows)
    assert any(item["kind"] == "platform" for r in rows for item in r["registered"])


# -- completions ---------------------------------------------------------------------------
def test_completion_basic_and_alias(client: openai.OpenAI) -> None:
    out = client.completions.create(model="smollm2-alias", prompt=PROMPT, max_tokens=5,
                                    temperature=0)
    assert out.id.startswith("cmpl-") and out.object == "text_completion"
    assert out.model == "smollm2-alias"  # as vLLM: the served name the request used
    assert len(out.choices) == 1 and out.choices[0].text
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 5
    assert out.usage.total_tokens == out.usage.prompt_tokens + 5


def test_completion_n2_logprobs(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, n=2,
                                    logprobs=2, temperature=1.0, seed=7)
    assert sorted(c.index for c in out.choices) == [0, 1]
    for c in out.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
        assert "".join(lp.tokens) == c.text
        assert all(v <= 0 for v in lp.token_logprobs)
        assert all(1 <= len(t) <= 3 for t in lp.top_logprobs)
    assert out.usage.completion_tokens == 8


def test_top_k_zero_is_no_top_k(client: openai.OpenAI) -> None:
    """Clients written for later vLLM send top_k 0 (its "disabled"): the same sampled text as
    top_k -1 for the same seed."""
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=11)
    texts = [client.completions.create(**kwargs, extra_body={"top_k": k}).choices[0].text
             for k in (0, -1)]
    assert texts[0] == texts[1]


def test_prompt_list_and_tokens_as_ids(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt=["Hello", "Goodbye"], max_tokens=2,
                                    temperature=0, logprobs=0,
                                    extra_body={"return_tokens_as_token_ids": True})
    assert sorted(c.index for c in out.choices) == [0, 1]
    for c in out.choices:
        assert all(re.fullmatch(r"token_id:\d+", t) for t in c.logprobs.tokens)


def test_completion_stream_equals_non_stream(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    full = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices
                and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_stop_string(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12,
                                     temperature=0).choices[0].text
    words = full.split()
    stop = " " + words[min(2, len(words) - 1)]
    cut = full[:full.index(stop)]
    # more than OpenAI's 4 stop strings: vLLM sets no limit, neither does IronLM
    decoys = [f"@@never{i}@@" for i in range(5)]
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                    stop=[*decoys, stop])
    assert out.choices[0].text == cut
    assert out.choices[0].finish_reason == "stop"


def test_seed_reproducible(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0,
                  top_p=0.95, seed=1234)
    a = client.completions.create(**kwargs).choices[0].text
    b = client.completions.create(**kwargs).choices[0].text
    assert a == b


def test_token_id_prompts(client: openai.OpenAI, http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    by_text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4,
                                        temperature=0).choices[0].text
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == by_text
    batch = client.completions.create(model=MODEL, prompt=[ids, ids[:3]], max_tokens=2,
                                      temperature=0)
    assert sorted(c.index for c in batch.choices) == [0, 1]
    assert batch.usage.prompt_tokens == len(ids) + 3


def test_echo_with_logprobs(client: openai.OpenAI, http: httpx.Client) -> None:
    n_prompt = http.post("/tokenize", json={"prompt": PROMPT}).json()["count"]
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                                    echo=True, logprobs=1)
    c = out.choices[0]
    assert c.text.startswith(PROMPT)
    assert len(c.logprobs.tokens) == n_prompt + 3
    assert c.logprobs.token_logprobs[0] is None  # nothing predicts the first prompt token
    assert all(v is not None for v in c.logprobs.token_logprobs[1:])
    assert c.logprobs.text_offset[0] == 0


def test_cached_prompt_tokens_in_usage_and_requests_logged(server: RemoteServer,
                                                           client: openai.OpenAI) -> None:
    # --enable-prompt-tokens-details: a prompt seen before names the tokens the prefix cache
    # served (whole 16-token blocks); --enable-log-requests logs it, cut at --max-log-len
    prompt = "Once upon a time, in a kingdom by the sea, " * 6
    kw = dict(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
    first = client.completions.create(**kw).usage
    again = client.completions.create(**kw).usage
    assert first.prompt_tokens_details is None or first.prompt_tokens_details.cached_tokens == 0
    assert again.prompt_tokens_details.cached_tokens >= 16
    chat = [{"role": "user", "content": prompt}]
    for _ in range(2):
        usage = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=1).usage
    assert usage.prompt_tokens_details.cached_tokens >= 16
    # vLLM's cache_salt: a salted prompt shares cached blocks only with the same salt
    salted = [client.completions.create(**kw, extra_body={"cache_salt": salt}).usage
              for salt in ("alice", "alice", "bob")]
    cached = [u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
              for u in salted]
    assert cached[0] == 0 and cached[1] >= 16 and cached[2] == 0
    with pytest.raises(openai.BadRequestError, match="cache_salt"):
        client.completions.create(**kw, extra_body={"cache_salt": ""})
    assert "Received request cmpl-" in server.log_text()
    assert repr(prompt[:40]) in server.log_text()


def test_echo_without_generation_scores_the_prompt(client: openai.OpenAI) -> None:
    # vLLM: echo with max_tokens 0 returns the prompt and its logprobs, nothing generated (the
    # legacy API's log-likelihood request); the prompt's logprobs are those of a generating echo
    kw = dict(model=MODEL, prompt=PROMPT, temperature=0, echo=True, logprobs=1)
    gen = client.completions.create(max_tokens=2, **kw).choices[0].logprobs
    out = client.completions.create(max_tokens=0, **kw)
    c = out.choices[0]
    n_prompt = len(gen.tokens) - 2
    assert c.text == PROMPT and c.finish_reason == "length"
    assert c.logprobs.tokens == gen.tokens[:n_prompt]
    assert c.logprobs.token_logprobs[0] is None
    assert c.logprobs.token_logprobs[1:] == pytest.approx(gen.token_logprobs[1:n_prompt], abs=1e-4)
    # usage counts the one token run for the logprobs (vLLM's count)
    assert out.usage.prompt_tokens == n_prompt and out.usage.completion_tokens == 1
    chunks = list(client.completions.create(max_tokens=0, stream=True, **kw))
    assert "".join(ch.choices[0].text for ch in chunks) == PROMPT
    assert sum(len(ch.choices[0].logprobs.tokens) for ch in chunks) == n_prompt
    assert chunks[-1].choices[0].finish_reason == "length"
    # n=3, streamed: each choice echoes the prompt once, whenever its first output comes
    three = list(client.completions.create(max_tokens=0, stream=True, n=3, **kw))
    for i in range(3):
        assert "".join(ch.choices[0].text for ch in three if ch.choices[0].index == i) == PROMPT
    with pytest.raises(openai.BadRequestError, match="max_tokens"):  # 0 needs echo
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)


# -- chat ----------------------------------------------------------------------------------
def test_chat_basic_logprobs(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6,
                                         temperature=0, logprobs=True, top_logprobs=2)
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion"
    msg = out.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str) and msg.refusal is None
    assert not msg.tool_calls
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    assert out.system_fingerprint


def test_chat_stream_n2_roles_and_usage(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=5, n=2, temperature=1.0, seed=3, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    per_choice: dict[int, list[Any]] = {0: [], 1: []}
    counts: dict[int, list[int]] = {0: [], 1: []}  # each chunk's usage, by its choice
    for c in chunks:
        for ch in c.choices:
            per_choice[ch.index].append(ch)
            counts[ch.index].append(c.usage.completion_tokens)
        assert c.usage is not None  # continuous usage stats: on every chunk
    for deltas in per_choice.values():
        assert deltas[0].delta.role == "assistant"  # the role comes first
        assert sum(1 for d in deltas if d.finish_reason) == 1
        assert deltas[-1].finish_reason in ("stop", "length")
    # as vLLM: a choice's chunk counts that choice's tokens, the last chunk every choice's
    assert all(n == sorted(n) and n[0] == 0 and 1 <= n[-1] <= 5 for n in counts.values())
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == counts[0][-1] + counts[1][-1]


def test_chat_stream_equals_non_stream(client: openai.OpenAI) -> None:
    kwargs = dict(model=MODEL, messages=CHAT, max_tokens=10, temperature=0)
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(stream=True, **kwargs) if c.choices)
    assert streamed == full


def test_chat_echo_and_max_completion_tokens(http: httpx.Client) -> None:
    body = {"model": MODEL, "max_completion_tokens": 2, "echo": True,
            "add_generation_prompt": False, "temperature": 0,
            "messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello", "extra": "tolerated"}]}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].startswith("Hello")
    assert r.json()["usage"]["completion_tokens"] <= 2


def test_chat_turns_without_text_render_as_vllm_does(http: httpx.Client) -> None:
    """An assistant turn with only tool calls (content absent or null) renders with empty
    content and a refusal part as its text, as vLLM does, instead of failing SmolLM2's
    template (which concatenates content)."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "c1", "content": None},
             {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
             {"role": "user", "content": "Name one colour."}]
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": turns,
                                                "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    tok = http.post("/tokenize", json={"messages": turns, "return_token_strs": True}).json()
    assert "No." in "".join(tok["token_strs"]).replace("\u0120", " ")


def test_a_request_template_is_text_never_a_server_path(http: httpx.Client,
                                                        tmp_path: Path) -> None:
    # even where requests may bring templates, a path is rendered as the text it is (before,
    # a path to a server file rendered that file)
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    tok = http.post("/tokenize", json={"messages": CHAT, "chat_template": str(secret)}).json()
    text = http.post("/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"]
    assert text == str(secret)
    # the template call's own parameters are not chat_template_kwargs
    bad = http.post("/tokenize", json={"messages": CHAT,
                                       "chat_template_kwargs": {"tokenize": True}})
    assert _error(bad, 400)["param"] == "chat_template_kwargs"


def test_default_chat_template_kwargs_lie_under_the_requests(http: httpx.Client) -> None:
    # --default-chat-template-kwargs reach the template; a request's own kwargs win; the
    # request's template runs because this server trusts request templates
    body = {"messages": CHAT, "chat_template": "{{ greeting }} {{ farewell }}",
            "chat_template_kwargs": {"farewell": "Later", "greeting": None}}  # null: default
    tok = http.post("/tokenize", json=body).json()
    assert http.post("/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"] \
        == "Ahoy Later"


def test_content_as_parts_for_a_template_that_loops_over_them(http: httpx.Client) -> None:
    """--chat-template-content-format auto (vLLM's default): a template that loops over a
    message's content gets it as a list of parts, a string content included."""
    parts = ("{% for m in messages %}{{ m.role }}:{% for p in m['content'] %}[{{ p.text }}]"
             "{% endfor %};{% endfor %}")
    messages = [{"role": "user", "content": "hi"},
                {"role": "user", "content": [{"type": "text", "text": "a"},
                                             {"type": "text", "text": "b"}]}]
    tok = http.post("/tokenize", json={"messages": messages, "chat_template": parts,
                                       "add_generation_prompt": False}).json()
    assert http.post("/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"] \
        == "user:[hi];user:[a][b];"
    joined = http.post("/tokenize", json={"messages": messages, "add_generation_prompt": False,
                                          "chat_template": "{{ messages[1].content }}"}).json()
    assert http.post("/detokenize", json={"tokens": joined["tokens"]}).json()["prompt"] \
        == "a\nb"  # a template that does not loop gets the text, parts joined by newlines


# -- other endpoints -----------------------------------------------------------------------
def test_tokenize_round_trip(http: httpx.Client) -> None:
    tok = http.post("/tokenize", json={"prompt": PROMPT, "return_token_strs": True}).json()
    assert tok["count"] == len(tok["tokens"]) == len(tok["token_strs"])
    assert tok["max_model_len"] == MAX_MODEL_LEN
    text = http.post("/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"]
    assert text == PROMPT
    chat = http.post("/tokenize", json={"messages": CHAT}).json()
    assert chat["count"] > tok["count"]
    assert chat["token_strs"] is None  # not asked for: null, as vLLM (the key is there)
    info = http.get("/tokenizer_info").json()
    assert info["eos_token"] and info["model_max_length"] == MAX_MODEL_LEN


def test_embeddings(client: openai.OpenAI, http: httpx.Client) -> None:
    out = client.embeddings.create(model=MODEL, input=["hello world", "a b c d"])  # base64
    assert [d.index for d in out.data] == [0, 1]
    assert all(len(d.embedding) == 576 for d in out.data)  # SmolLM2-135M hidden size
    assert out.usage.prompt_tokens > 0
    floats = http.post("/v1/embeddings", json={"model": MODEL, "input": "hello world",
                                               "encoding_format": "float"}).json()
    vec = np.asarray(floats["data"][0]["embedding"], dtype=np.float32)
    assert np.allclose(vec, np.asarray(out.data[0].embedding), atol=1e-5)
    raw = http.post("/v1/embeddings", json={"model": MODEL, "input": "hello world",
                                            "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, vec)
    assert floats["id"].startswith("embd-") and floats["created"] > 0
    assert floats["usage"]["completion_tokens"] == 0
    unit = http.post("/v1/embeddings", json={"model": MODEL, "input": "hello world",
                                             "normalize": True}).json()["data"][0]["embedding"]
    assert np.allclose(unit, vec / np.linalg.norm(vec), atol=1e-5)


def test_embeddings_chat_form_full_context_and_truncation(server: RemoteServer,
                                                          http: httpx.Client) -> None:
    # vLLM's chat form: the messages through the template, no special tokens added on top
    chat = http.post("/v1/embeddings", json={"model": MODEL, "messages": CHAT}).json()
    text = http.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": False}).json()
    same = http.post("/v1/embeddings", json={"model": MODEL, "input": text["tokens"]}).json()
    assert chat["usage"]["prompt_tokens"] == text["count"]
    assert np.allclose(chat["data"][0]["embedding"], same["data"][0]["embedding"], atol=1e-4)
    both = http.post("/v1/embeddings", json={"model": MODEL, "messages": CHAT, "input": "x"})
    assert _error(both, 400)["param"] == "input"
    # chat-form fields with input do nothing: logged as ignored, as vLLM logs unknown fields
    chat_only = {"model": MODEL, "input": "x", "add_generation_prompt": True}
    assert http.post("/v1/embeddings", json=chat_only).status_code == 200
    assert "ignored: ['add_generation_prompt']" in server.log_text()
    # an input may fill the context (nothing is generated after it), and -1 truncates to it
    full = http.post("/v1/embeddings", json={"model": MODEL, "input": [1792] * MAX_MODEL_LEN})
    assert full.status_code == 200, full.text
    long = {"model": MODEL, "input": [1792] * (MAX_MODEL_LEN + 5)}
    assert _error(http.post("/v1/embeddings", json=long), 400)["param"] == "input"
    cut = http.post("/v1/embeddings", json={**long, "truncate_prompt_tokens": -1}).json()
    assert cut["usage"]["prompt_tokens"] == MAX_MODEL_LEN
    bad = http.post("/v1/embeddings", json={**long, "truncate_prompt_tokens": -2})
    assert _error(bad, 400)["param"] == "truncate_prompt_tokens"


def test_generate_legacy(http: httpx.Client) -> None:
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    text = r.json()["text"]
    assert len(text) == 1 and text[0].startswith(PROMPT) and len(text[0]) > len(PROMPT)
    with http.stream("POST", "/generate", json={**body, "stream": True}) as s:
        lines = [json.loads(line) for line in s.iter_lines() if line]
    assert lines[-1]["text"] == text
    bad = http.post("/generate", json={**body, "bogus": 1})
    assert bad.status_code == 400 and "bogus" in bad.json()["error"]["message"]


def test_metrics_counters_move(server: RemoteServer, client: openai.OpenAI) -> None:
    before = httpx.get(server.url("/metrics"), timeout=10).text  # no key needed
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
    after = httpx.get(server.url("/metrics"), timeout=10).text
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_count",
                 "vllm:e2e_request_latency_seconds_count",
                 "vllm:request_queue_time_seconds_count",
                 "vllm:request_prefill_time_seconds_count",
                 "vllm:request_decode_time_seconds_count",
                 "vllm:request_inference_time_seconds_count"):
        assert metric(after, name) > metric(before, name, 0), name
    assert metric(after, "vllm:generation_tokens_total") - \
        metric(before, "vllm:generation_tokens_total", 0) == 3
    for name in ("vllm:request_prompt_tokens_count", "vllm:request_generation_tokens_count",
                 "vllm:request_params_n_count", "vllm:request_params_best_of_count",
                 "vllm:request_params_max_tokens_count"):
        assert metric(after, name) == metric(before, name, 0) + 1, name
    assert metric(after, "vllm:request_generation_tokens_sum") - \
        metric(before, "vllm:request_generation_tokens_sum", 0) == 3
    assert metric(after, "vllm:request_params_max_tokens_sum") - \
        metric(before, "vllm:request_params_max_tokens_sum", 0) == 3
    # vLLM's tokens-per-step histogram: the prompt's step(s), then two decode steps
    steps = metric(after, "vllm:iteration_tokens_total_count") - \
        metric(before, "vllm:iteration_tokens_total_count", 0)
    assert steps >= 3 and metric(after, "vllm:iteration_tokens_total_sum") - \
        metric(before, "vllm:iteration_tokens_total_sum", 0) >= steps
    # the prompt was looked up in the prefix cache (vLLM's counters, in tokens)
    assert metric(after, "vllm:prefix_cache_queries_total") > \
        metric(before, "vllm:prefix_cache_queries_total")
    assert metric(after, "vllm:prefix_cache_hits_total") >= \
        metric(before, "vllm:prefix_cache_hits_total")
    assert re.search(r'^vllm:request_success_total\{finished_reason="abort",[^}]*\} ', after,
                     re.M)  # every finish reason is exported from the start, as vLLM
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:num_requests_swapped", "vllm:num_preemptions_total",
                 "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc",
                 "vllm:cpu_cache_usage_perc",
                 "vllm:gpu_prefix_cache_hit_rate", "ironlm:kv_cache_total_blocks",
                 "vllm:time_per_output_token_seconds_count"):
        metric(after, name)


# -- bad input -----------------------------------------------------------------------------
def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_malformed_json_and_content_type(http: httpx.Client) -> None:
    r = http.post("/v1/completions", content=b'{"model": "smollm2", "prompt": ',
                  headers={"content-type": "application/json"})
    assert "Invalid JSON" in _error(r, 400)["message"]
    r = http.post("/v1/chat/completions", content=b"model=smollm2",
                  headers={"content-type": "application/x-www-form-urlencoded"})
    assert "Content-Type" in _error(r, 400)["message"]
    r = http.post("/v1/completions", json=["not", "an", "object"])
    _error(r, 400)
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT,
                                           "temperature": "hot"})
    assert _error(r, 400)["param"] == "temperature"
    r = http.post("/v1/chat/completions", json={"model": MODEL})
    assert _error(r, 400)["param"] == "messages"


def test_unknown_model_and_route(client: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-99", prompt=PROMPT, max_tokens=2)
    assert "gpt-99" in err.value.message
    _error(http.get("/v1/nope"), 404)


# (field, value, extra request fields): each must be a 400 whose param names the field.
OUT_OF_RANGE = [
    ("temperature", -1.0, {}),
    ("top_p", 0.0, {}),
    ("top_p", 1.5, {}),
    ("top_k", -2, {}),
    ("min_p", 1.5, {}),
    ("presence_penalty", 2.5, {}),
    ("frequency_penalty", -2.5, {}),
    ("repetition_penalty", 0.0, {}),
    ("n", 0, {}),
    ("best_of", 1, {"n": 2}),
    ("max_tokens", 0, {}),
    ("max_tokens", -5, {}),
    ("min_tokens", 10, {"max_tokens": 5}),
    ("seed", 2**64, {}),
    ("logprobs", 100, {}),
    ("prompt_logprobs", 100, {}),
    ("stop", [""], {}),
    ("logit_bias", {"999999": 1.0}, {}),
    ("allowed_token_ids", [], {}),
    ("allowed_token_ids", [10**7], {}),
    ("stop_token_ids", [-1], {}),
    ("truncate_prompt_tokens", 0, {}),
    ("truncate_prompt_tokens", -2, {}),  # vLLM: -1 (the model's length) or >= 1
    ("truncate_prompt_tokens", MAX_MODEL_LEN + 1, {}),  # vLLM: more than max_model_len
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("field", "value", "extra"), OUT_OF_RANGE)
def test_out_of_range_completion_params(client: openai.OpenAI, field: str, value: Any,
                                        extra: dict[str, Any], stream: bool) -> None:
    body = {"max_tokens": 2, **extra, field: value}
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=PROMPT, stream=stream, extra_body=body)
    assert err.value.status_code == 400
    assert err.value.body["param"] == field, err.value.body  # type: ignore[index]


@pytest.mark.parametrize(("body", "param"), [
    ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs=true
    ({"logprobs": True, "top_logprobs": 100}, "top_logprobs"),  # over --max-logprobs
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"truncate_prompt_tokens": MAX_MODEL_LEN + 1}, "truncate_prompt_tokens"),
    ({"temperature": 9.0, "top_p": 0.0}, "top_p"),
    ({"messages": [{"content": "no role"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    # what the chat template cannot render is the request's error (vLLM: 400), never a 500:
    # a role the template refuses, a Python error inside it, malformed tool_calls
    ({"messages": [{"role": "narrator", "content": "hi"}],
      "chat_template": "{% for m in messages %}{% if m.role not in ('user', 'assistant') %}"
                       "{{ raise_exception('unknown role ' + m.role) }}{% endif %}"
                       "{{ m.content }}{% endfor %}"}, "messages"),
    ({"chat_template": "{{ (messages | length) // 0 }}"}, "messages"),
    ({"chat_template": "{{ messages[0].content.upper(1, 2, 3) }}"}, "messages"),
    ({"messages": [{"role": "assistant", "content": "x", "tool_calls": ["not an object"]}]},
     "messages"),
    ({"chat_template": "{% for m in messages %}"}, "chat_template"),  # not a template
])
def test_bad_chat_params(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    full = {"model": MODEL, "messages": CHAT, "max_tokens": 2, **body}
    for stream in (False, True):
        assert _error(http.post("/v1/chat/completions", json={**full, "stream": stream}),
                      400)["param"] == param


def test_context_length_and_suffix(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_MODEL_LEN)
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in err.value.message
    long_prompt = list(range(100, 100 + MAX_MODEL_LEN + 5))
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=1)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=PROMPT, suffix="x", max_tokens=2)
    assert err.value.body["param"] == "suffix"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=[10**7], max_tokens=2)
    assert "vocabulary" in err.value.message


def test_oversized_body(http: httpx.Client) -> None:
    big = {"model": MODEL, "prompt": "x" * (2 * 1024 * 1024), "max_tokens": 1}
    assert _error(http.post("/v1/completions", json=big), 413)["code"] == "request_too_large"


def test_health_answers_during_huge_tokenize(server: RemoteServer) -> None:
    """A body just under --max-request-body-size (1 MiB here) to /tokenize is parsed and
    tokenized off the event loop: /health answers while it is being processed."""
    prompt = "lorem ipsum dolor sit amet, " * (1000 * 1024 // 28)

    async def run() -> tuple[dict, int]:  # type: ignore[type-arg]
        async with httpx.AsyncClient(timeout=120, headers=server.headers()) as h:
            big = asyncio.ensure_future(h.post(server.url("/tokenize"), json={"prompt": prompt}))
            answered = 0
            while not big.done():
                r = await h.get(server.url("/health"))
                if not big.done():
                    assert r.status_code == 200
                    answered += 1
                await asyncio.sleep(0.01)
            return (await big).json(), answered

    body, answered = asyncio.run(run())
    assert body["count"] > 100_000
    assert answered > 0  # /health was served while the big request was still in work


def test_api_key(server: RemoteServer) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        for path in ("/v1/completions", "/generate"):
            r = httpx.post(server.url(path), json=body, headers=headers, timeout=10)
            assert _error(r, 401)["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url("/v1"), api_key="wrong", max_retries=0).models.list()
    assert httpx.get(server.url("/health"), timeout=5).status_code == 200
    assert httpx.get(server.url("/metrics"), timeout=5).status_code == 200


def test_openapi_spec_cases_get_no_server_error(server: RemoteServer) -> None:
    """schemathesis cases drawn from OpenAI's OpenAPI description of the implemented routes,
    a few per operation in positive (valid) and negative (invalid) mode: never a 5xx."""
    result = fuzz(server.url("/v1"), server.headers(), MODEL, examples=8)
    print("openapi fuzz (mode, operation, status): count", dict(result.statuses),
          "no negative case:", result.no_negative_case, "refused valid cases:",
          dict(result.refused))
    assert not result.server_errors, "\n".join(result.server_errors)
    assert result.count("positive", ok=True) > 0  # valid cases reach the handlers
    # the valid cases refused ask for what vLLM refuses too or a text-only engine lacks
    # (audio, images, web search, a null prompt, token ids outside the vocabulary, ...): each
    # refusal is an OpenAI error object whose message says what
    assert not [m for (_, m) in result.refused if m.startswith(NOT_AN_ERROR_OBJECT)]


def test_server_still_serves_after_bad_input(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0)
    assert out.choices[0].text


# -- disconnects under load ----------------------------------------------------------------
async def _one_abandoned(server: RemoteServer, i: int, timeout: float) -> str:
    """One request over a raw socket (a load generator's cost, not httpx's: 200 httpx
    requests take the client itself seconds here) that the client abandons after
    ``timeout`` seconds by closing the connection."""
    common = {"model": MODEL, "max_tokens": 300, "ignore_eos": True, "temperature": 1.0,
              "stream": i % 4 >= 2}
    if i % 2:
        path, body = "/v1/chat/completions", {
            **common, "messages": [{"role": "user", "content": f"Story {i}, please."}]}
    else:
        path, body = "/v1/completions", {**common, "prompt": f"Story number {i}:"}
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in server.headers().items())
    request = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
               f"\r\nContent-Length: {len(data)}\r\nConnection: close\r\n{head}\r\n").encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request + data)
        await writer.drain()
        try:
            await asyncio.wait_for(reader.read(), timeout)
            return "done"
        except asyncio.TimeoutError:
            return "timeout"
    finally:
        writer.close()
        try:  # the socket really closes only when the loop runs the close: wait for it
            await writer.wait_closed()
        except OSError:
            pass


async def _abandon_while_timing_health(
    server: RemoteServer, n: int, timeout: float, health_after: float | None = None
) -> tuple[list[str], list[float]]:
    """``n`` concurrent abandoned requests (completions / chat, streamed or not); with
    ``health_after``, /health is timed a few times from then on (while the engine is busy)."""

    async def health_times() -> list[float]:
        if health_after is None:
            return []
        times = []
        await asyncio.sleep(health_after)
        async with httpx.AsyncClient(timeout=5) as h:
            for _ in range(5):
                t0 = time.monotonic()
                assert (await h.get(server.url("/health"))).status_code == 200
                times.append(time.monotonic() - t0)
                await asyncio.sleep(0.1)
        return times

    results, times = await asyncio.gather(
        asyncio.gather(*(_one_abandoned(server, i, timeout) for i in range(n))), health_times()
    )
    return list(results), times


def _wait_until_idle(server: RemoteServer, seconds: float) -> str:
    """/metrics once no request runs or waits and no KV block is in use (else fail)."""
    deadline = time.monotonic() + seconds
    while True:
        text = httpx.get(server.url("/metrics"), timeout=5).text
        used = metric(text, "ironlm:kv_cache_used_blocks")
        busy = metric(text, "vllm:num_requests_running") + \
            metric(text, "vllm:num_requests_waiting")
        if used == 0 and busy == 0:
            return text
        assert time.monotonic() < deadline, f"{used} KV blocks still used, {busy} requests"
        time.sleep(0.25)


def test_health_answers_while_engine_busy(server: RemoteServer) -> None:
    # 16 long generations keep the engine stepping for seconds; /health is timed meanwhile.
    results, health = asyncio.run(_abandon_while_timing_health(server, 16, 4.0, 1.0))
    assert results.count("timeout") == 16
    assert max(health) < 1.0, health  # the engine loop does not run on the event loop
    _wait_until_idle(server, 15)


def test_disconnects_abort_and_free_kv_blocks(server: RemoteServer,
                                               client: openai.OpenAI) -> None:
    aborted = 'vllm:request_success_total{finished_reason="abort",model_name="smollm2"}'
    before = httpx.get(server.url("/metrics"), timeout=5).text
    results, _ = asyncio.run(_abandon_while_timing_health(server, 200, 0.5))
    assert results.count("timeout") == 200, results
    t0 = time.monotonic()
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0,
                                    timeout=5)
    assert out.choices[0].text and time.monotonic() - t0 < 5.0
    text = _wait_until_idle(server, 15)
    # The abandoned requests reached the engine and were aborted (not left to run on).
    assert _sample(text, aborted) - _sample(before, aborted) >= 150


def _sample(text: str, line_prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.split()[-1])
    return 0.0
