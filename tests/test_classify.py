"""Sequence classifiers (vLLM's classify task) on SmolLM2's and Gemma 3's real weights with a
seeded ``score`` head (tests/classifier_models.py), against HF transformers'
``*ForSequenceClassification`` on the same folder: ``LLM.classify`` (probabilities and logits),
``LLM.score`` as a cross-encoder (one label), the server's /classify, /pooling, /score and
/rerank, a pipeline split, and what a classifier refuses (and what an LM refuses of it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from classifier_models import write_classifier
from server_utils import RemoteServer

from ironlm import LLM, PoolingParams

pytestmark = pytest.mark.real_model

LABELS = ["negative", "neutral", "positive"]
TEXTS = [
    "I loved this film, it was wonderful.",
    "The service was slow and the food cold.",
    "Paris is the capital of France.",
    "Bananas are rich in potassium, which the body needs for its muscles and nerves.",
    "ok",
]
QUERY = "What is the capital of France?"
DOCS = ["Bananas are rich in potassium.", "Paris is the capital of France.",
        "The Eiffel Tower stands in Paris."]
SMALL = {"device": "cpu", "dtype": "float32", "max_model_len": 256,
         "kv_cache_memory": 64 << 20}


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    return write_classifier(smollm2_dir, tmp_path_factory.mktemp("cls") / "m", LABELS, seed=1)


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    return write_classifier(smollm2_dir, tmp_path_factory.mktemp("xenc") / "m", ["relevant"],
                            seed=2)


def _hf_logits(folder: Path, texts: list[str] | list[list[int]], pairs: list[str] | None = None,
               **tokenizer_kwargs: Any) -> torch.Tensor:
    """HF transformers' class logits, one prompt (text, token ids, or text pair) at a time (no
    padding): (len, num_labels)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32)
    rows = []
    with torch.no_grad():
        for i, text in enumerate(texts):
            ids = text if isinstance(text, list) else tok(
                text, text_pair=None if pairs is None else pairs[i], **tokenizer_kwargs
            )["input_ids"]
            rows.append(model(input_ids=torch.tensor([ids])).logits[0])
    return torch.stack(rows)


def test_classify_matches_hf(classifier_dir: Path) -> None:
    ref = _hf_logits(classifier_dir, TEXTS)
    assert float(ref.std()) > 0.5  # the head separates the texts: the comparison means something
    # a budget of 8 tokens: the longer prompts run in chunks, the head reads the last one
    llm = LLM(str(classifier_dir), max_num_batched_tokens=8, max_num_seqs=4,
              enable_chunked_prefill=True, **SMALL)
    out = llm.classify(TEXTS, use_tqdm=False)
    probs = torch.tensor([o.outputs.probs for o in out])
    assert [o.outputs.num_classes for o in out] == [3] * len(TEXTS)
    assert torch.allclose(probs, torch.softmax(ref, dim=-1), atol=1e-4), (probs, ref)
    raw = llm.classify(TEXTS, use_tqdm=False,
                       pooling_params=PoolingParams(use_activation=False))
    logits = torch.tensor([o.outputs.probs for o in raw])
    assert torch.allclose(logits, ref, atol=2e-3), (logits, ref)
    assert out[0].prompt_token_ids == llm.get_tokenizer()(TEXTS[0])["input_ids"]
    encoded = llm.encode(TEXTS[:2], use_tqdm=False)  # the model's task: classify
    assert torch.allclose(torch.stack([e.outputs.data for e in encoded]), probs[:2])
    # the head reads the last row only: a cached prefix serves a classifier's prompt
    hits = llm.engine.stats()["prefix_cache_hits"]
    again = llm.classify(TEXTS[3], use_tqdm=False)[0]
    assert llm.engine.stats()["prefix_cache_hits"] >= hits + 16
    assert torch.allclose(torch.tensor(again.outputs.probs), probs[3], atol=1e-5)
    # the last tokens kept: the class of the prompt's tail, as HF gives for those tokens
    tail = llm.classify(TEXTS[3], truncate_prompt_tokens=5, use_tqdm=False)[0]
    ids = llm.get_tokenizer()(TEXTS[3])["input_ids"][-5:]
    assert tail.prompt_token_ids == ids
    assert torch.allclose(torch.tensor(tail.outputs.probs),
                          torch.softmax(_hf_logits(classifier_dir, [ids])[0], dim=-1), atol=1e-4)
    with pytest.raises(ValueError, match="is a sequence classifier: it classifies"):
        llm.generate("Hello", use_tqdm=False)
    with pytest.raises(ValueError, match="it has no embeddings"):
        llm.embed(TEXTS[0], use_tqdm=False)
    with pytest.raises(ValueError, match="one label"):
        llm.score(QUERY, DOCS, use_tqdm=False)
    with pytest.raises(ValueError, match="normalize applies to embeddings"):
        llm.classify(TEXTS[0], pooling_params=PoolingParams(normalize=True), use_tqdm=False)
    with pytest.raises(ValueError, match="it has no embeddings"):
        llm.encode(TEXTS[0], pooling_task="token_embed", use_tqdm=False)


def test_cross_encoder_score_matches_hf(cross_encoder_dir: Path) -> None:
    ref = _hf_logits(cross_encoder_dir, [QUERY] * len(DOCS), DOCS)[:, 0]
    llm = LLM(str(cross_encoder_dir), **SMALL)
    scored = llm.score(QUERY, DOCS, use_tqdm=False)  # 1:N
    scores = torch.tensor([s.outputs.score for s in scored])
    assert torch.allclose(scores, torch.sigmoid(ref), atol=1e-4), (scores, ref)
    assert scored[1].prompt_token_ids == \
        llm.get_tokenizer()(QUERY, text_pair=DOCS[1])["input_ids"]
    pairwise = llm.score([QUERY, DOCS[0]], [DOCS[1], DOCS[2]], use_tqdm=False)  # N:N
    ref2 = _hf_logits(cross_encoder_dir, [QUERY, DOCS[0]], [DOCS[1], DOCS[2]])[:, 0]
    assert torch.allclose(torch.tensor([s.outputs.score for s in pairwise]),
                          torch.sigmoid(ref2), atol=1e-4)
    probs = llm.classify(DOCS, use_tqdm=False)  # one label: a sigmoid, as vLLM's
    assert torch.allclose(torch.tensor([p.outputs.probs for p in probs]),
                          torch.sigmoid(_hf_logits(cross_encoder_dir, DOCS)), atol=1e-4)
    # a pair longer than the truncation is cut as the tokenizer cuts a pair: the query stays
    cut = llm.score(QUERY, DOCS[2], truncate_prompt_tokens=9, use_tqdm=False)[0]
    tok = llm.get_tokenizer()
    assert cut.prompt_token_ids == tok(QUERY, text_pair=DOCS[2], truncation=True,
                                       max_length=9)["input_ids"]
    assert tok(QUERY)["input_ids"][:2] == cut.prompt_token_ids[:2]
    ref_cut = _hf_logits(cross_encoder_dir, [cut.prompt_token_ids])[0, 0]
    assert abs(cut.outputs.score - float(torch.sigmoid(ref_cut))) < 1e-4
    with pytest.raises(ValueError, match="text prompts"):
        llm.score({"prompt_token_ids": [1, 2, 3]}, DOCS[0], use_tqdm=False)


def test_activation_follows_the_config(tmp_path: Path, smollm2_dir: Path) -> None:
    """vLLM's choice from the config: a regression head's logits as they are, a multi-label
    head's sigmoids, a sentence-transformers cross-encoder's named activation for scores."""
    regression = write_classifier(
        smollm2_dir, tmp_path / "r", ["value"], seed=4, problem_type="regression",
        sentence_transformers={"activation_fn": "torch.nn.modules.linear.Identity"})
    ref = _hf_logits(regression, TEXTS[:2])
    llm = LLM(str(regression), **SMALL)
    out = torch.tensor([o.outputs.probs for o in llm.classify(TEXTS[:2], use_tqdm=False)])
    assert torch.allclose(out, ref, atol=2e-3), (out, ref)
    score = llm.score(TEXTS[0], TEXTS[1], use_tqdm=False)[0].outputs.score
    assert abs(score - float(_hf_logits(regression, [TEXTS[0]], [TEXTS[1]])[0, 0])) < 2e-3
    del llm
    multi = write_classifier(smollm2_dir, tmp_path / "m", LABELS, seed=5,
                             problem_type="multi_label_classification")
    probs = LLM(str(multi), **SMALL).classify(TEXTS[:2], use_tqdm=False)
    assert torch.allclose(torch.tensor([o.outputs.probs for o in probs]),
                          torch.sigmoid(_hf_logits(multi, TEXTS[:2])), atol=1e-4)
    bad = write_classifier(smollm2_dir, tmp_path / "b", ["x"],
                           sbert_ce_default_activation_function="os.system")
    with pytest.raises(ValueError, match="cross-encoder activation 'os.system'"):
        LLM(str(bad), **SMALL)
    tanh = write_classifier(smollm2_dir, tmp_path / "t", ["x"], seed=6,
                            sbert_ce_default_activation_function="torch.nn.modules.activation.Tanh")
    score = LLM(str(tanh), **SMALL).score(QUERY, DOCS[1], use_tqdm=False)[0].outputs.score
    assert abs(score - float(torch.tanh(_hf_logits(tanh, [QUERY], [DOCS[1]])[0, 0]))) < 1e-4


def test_gemma3_classifier_matches_hf(tmp_path: Path, gemma3_dir: Path) -> None:
    folder = write_classifier(gemma3_dir, tmp_path / "g", LABELS, seed=3, scale=0.02)
    ref = _hf_logits(folder, TEXTS[:3])
    llm = LLM(str(folder), **SMALL)
    logits = torch.tensor([o.outputs.probs for o in llm.classify(
        TEXTS[:3], use_tqdm=False, pooling_params=PoolingParams(use_activation=False))])
    assert float(ref.std()) > 0.5
    assert torch.allclose(logits, ref, atol=5e-3, rtol=1e-3), (logits, ref)


def test_classifier_on_two_pipeline_stages(classifier_dir: Path) -> None:
    """The head on the last stage only (the first skips score.weight); same probabilities."""
    one = LLM(str(classifier_dir), **SMALL).classify(TEXTS[:3], use_tqdm=False)
    llm = LLM(str(classifier_dir), pipeline_parallel_size=2,
              distributed_executor_backend="mp", **SMALL)
    try:
        two = llm.classify(TEXTS[:3], use_tqdm=False)
    finally:
        llm.shutdown()
    assert torch.allclose(torch.tensor([o.outputs.probs for o in two]),
                          torch.tensor([o.outputs.probs for o in one]), atol=1e-5)


def test_what_a_language_model_refuses(tiny_llama_dir: Path) -> None:
    llm = LLM(str(tiny_llama_dir), **SMALL)
    with pytest.raises(ValueError, match="needs a sequence classifier"):
        llm.classify("Hello", use_tqdm=False)
    with pytest.raises(ValueError, match="use_activation applies to a classification head"):
        llm.embed("Hello", pooling_params=PoolingParams(use_activation=True), use_tqdm=False)
    assert len(llm.embed("Hello", use_tqdm=False)[0].outputs.embedding) == 64


def test_speculative_decoding_refused(classifier_dir: Path) -> None:
    with pytest.raises(ValueError, match="needs a generative model"):
        LLM(str(classifier_dir), speculative_config={"method": "ngram",
                                                     "num_speculative_tokens": 2,
                                                     "prompt_lookup_max": 2}, **SMALL)


# -- the server -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def http(classifier_dir: Path) -> Iterator[httpx.Client]:
    args = ["--max-model-len", "128", "--kv-cache-memory", "32MiB", "--served-model-name", "c",
            "--dtype", "float32"]
    with RemoteServer(classifier_dir, args) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=60) as client:
        yield client


def _error(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    return r.json()["error"]


@pytest.mark.server
def test_server_classify(http: httpx.Client, classifier_dir: Path) -> None:
    ref = torch.softmax(_hf_logits(classifier_dir, TEXTS[:3]), dim=-1)
    r = http.post("/classify", json={"model": "c", "input": TEXTS[:3]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("classify-") and body["object"] == "list"
    assert body["model"] == "c"
    probs = torch.tensor([d["probs"] for d in body["data"]])
    assert torch.allclose(probs, ref, atol=1e-4)
    assert [d["label"] for d in body["data"]] == [LABELS[int(i)] for i in ref.argmax(dim=-1)]
    assert {d["num_classes"] for d in body["data"]} == {3}
    tokens = http.post("/tokenize", json={"model": "c", "prompt": TEXTS[0]}).json()["count"]
    one = http.post("/classify", json={"model": "c", "input": TEXTS[0]}).json()
    assert one["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens,
                            "completion_tokens": 0}
    ref_logits = _hf_logits(classifier_dir, TEXTS[:1])[0]
    for name in ("use_activation", "activation", "softmax"):  # vLLM's name, its older ones
        raw = http.post("/classify", json={"input": TEXTS[0], name: False}).json()
        assert torch.allclose(torch.tensor(raw["data"][0]["probs"]), ref_logits, atol=2e-3)
    pooled = http.post("/pooling", json={"model": "c", "input": TEXTS[:3]}).json()
    assert pooled["id"].startswith("pool-")
    assert torch.allclose(torch.tensor([d["data"] for d in pooled["data"]]), probs)
    inv = http.post("/invocations", json={"input": TEXTS[0], "encoding_format": "float"}).json()
    # an embedding body's default field; 1e-5: a later request may reuse cached prefix blocks
    assert inv["data"][0]["probs"] == pytest.approx(one["data"][0]["probs"], abs=1e-5)
    chat = [{"role": "user", "content": TEXTS[0]}]
    by_messages = http.post("/classify", json={"messages": chat}).json()
    assert by_messages["data"][0]["num_classes"] == 3
    inv = http.post("/invocations", json={"messages": chat}).json()["data"][0]
    assert inv["probs"] == pytest.approx(by_messages["data"][0]["probs"], abs=1e-5)


@pytest.mark.server
@pytest.mark.parametrize(("path", "body", "param"), [
    ("/classify", {"input": []}, "input"),
    ("/classify", {"input": [-1]}, "input"),
    ("/classify", {"input": "x" * 2000}, "input"),
    ("/classify", {"input": "x", "messages": [{"role": "user", "content": "x"}]}, "input"),
    ("/pooling", {"input": "x", "task": "embed"}, "task"),
    ("/pooling", {"input": "x", "normalize": True}, "normalize"),
    ("/classify", {"input": "x", "normalize": True}, "normalize"),
    ("/classify", {"input": "x", "encoding_format": "base64"}, "encoding_format"),
    ("/classify", {"input": "x", "use_activation": "maybe"}, "use_activation"),
])
def test_server_bad_classify_requests(http: httpx.Client, path: str, body: dict[str, Any],
                                      param: str) -> None:
    assert _error(http.post(path, json=body))["param"] == param


@pytest.mark.server
@pytest.mark.parametrize(("path", "body", "api"), [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, "Completions API"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]},
     "Chat Completions API"),
    ("/v1/embeddings", {"input": "Hi"}, "Embeddings API"),
    ("/v1/responses", {"input": "Hi"}, "Responses API"),
    ("/generate", {"prompt": "Hi"}, "Generate API"),
    ("/score", {"text_1": QUERY, "text_2": DOCS}, "Score API"),
])
def test_server_refuses_what_a_classifier_does_not_serve(
    http: httpx.Client, path: str, body: dict[str, Any], api: str
) -> None:
    assert f"The model does not support {api}" in _error(http.post(path, json=body))["message"]
    assert http.post("/classify", json={"input": "still serving"}).status_code == 200


@pytest.mark.server
def test_server_cross_encoder_score_and_rerank(cross_encoder_dir: Path) -> None:
    ref = torch.sigmoid(_hf_logits(cross_encoder_dir, [QUERY] * len(DOCS), DOCS)[:, 0])
    args = ["--max-model-len", "128", "--kv-cache-memory", "32MiB", "--dtype", "float32"]
    with RemoteServer(cross_encoder_dir, args) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=60) as http:
        score = http.post("/score", json={"text_1": QUERY, "text_2": DOCS}).json()
        assert torch.allclose(torch.tensor([d["score"] for d in score["data"]]), ref,
                              atol=1e-4), score
        rerank = http.post("/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2})
        results = rerank.json()["results"]
        assert [r["index"] for r in results] == ref.argsort(descending=True)[:2].tolist()
        raw = http.post("/score", json={"text_1": QUERY, "text_2": DOCS[0], "activation": False})
        assert abs(raw.json()["data"][0]["score"] - float(torch.logit(ref[0]))) < 2e-3
        cut = http.post("/score", json={"text_1": QUERY, "text_2": DOCS[2],
                                        "truncate_prompt_tokens": 9}).json()
        ref_cut = _hf_logits(cross_encoder_dir, [QUERY], [DOCS[2]], truncation=True,
                             max_length=9)[0, 0]
        assert abs(cut["data"][0]["score"] - float(torch.sigmoid(ref_cut))) < 1e-4
        assert cut["usage"]["prompt_tokens"] == 9
        assert _error(http.post("/v1/completions", json={"prompt": "x"}))["message"] \
            == "The model does not support Completions API"
