"""vLLM's /score and /rerank on SmolLM2 through the real server: each score is the cosine of
the two texts' /v1/embeddings vectors, in every spelling of the request (text_1 / text_2,
data_1 / data_2, queries / documents or items; /rerank, /v1/rerank, /v2/rerank, and the
SageMaker /invocations route), with vLLM's pairing, usage counts and top_n; bad bodies are 400s
naming the field. vLLM's /pooling gives the /v1/embeddings vectors in its own items."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from server_utils import RemoteServer

pytestmark = [pytest.mark.server, pytest.mark.real_model]

QUERY = "What is the capital of France?"
DOCS = ["Bananas are rich in potassium.", "Paris is the capital of France.",
        "The Eiffel Tower stands in Paris."]
TOL = 2e-3  # the server's auto dtype (bf16 where the CPU has it), batches of other sizes


@pytest.fixture(scope="module")
def http(smollm2_dir: Path) -> Iterator[httpx.Client]:
    args = ["--max-model-len", "64", "--kv-cache-memory", "32MiB", "--served-model-name", "s"]
    with RemoteServer(smollm2_dir, args) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=60) as client:
        yield client


def _cosines(http: httpx.Client, first: list[str], second: list[str]) -> list[float]:
    vecs = [np.asarray(d["embedding"]) for d in http.post(
        "/v1/embeddings", json={"model": "s", "input": first + second,
                                "encoding_format": "float"}).json()["data"]]  # fmt: skip
    a, b = vecs[: len(first)], vecs[len(first) :]
    a = a * len(b) if len(a) == 1 else a
    return [float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)) for x, y in zip(a, b)]


def _count(http: httpx.Client, text: str) -> int:
    return http.post("/tokenize", json={"model": "s", "prompt": text}).json()["count"]


def _error(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    return r.json()["error"]


def test_score_is_the_cosine_of_the_embeddings(http: httpx.Client) -> None:
    r = http.post("/score", json={"model": "s", "text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("score-") and body["object"] == "list"
    assert body["model"] == "s" and body["created"] > 0
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert {d["object"] for d in body["data"]} == {"score"}
    scores = [d["score"] for d in body["data"]]
    assert scores == pytest.approx(_cosines(http, [QUERY], DOCS), abs=TOL)
    # vLLM's usage: each pair's tokens, joined by the pad token
    tokens = sum(_count(http, QUERY) + 1 + _count(http, d) for d in DOCS)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == tokens
    # the other spellings, and the /v1 route
    for first, second in (("data_1", "data_2"), ("queries", "documents"), ("queries", "items")):
        same = http.post("/v1/score", json={"model": "s", first: [QUERY], second: DOCS}).json()
        assert [d["score"] for d in same["data"]] == pytest.approx(scores, abs=TOL)
    # N:N pairs the i-th text with the i-th
    pairwise = http.post("/score", json={"text_1": [QUERY, DOCS[0]], "text_2": DOCS[1:]}).json()
    assert [d["score"] for d in pairwise["data"]] == pytest.approx(
        _cosines(http, [QUERY, DOCS[0]], DOCS[1:]), abs=TOL)


def test_rerank_orders_documents_by_score(http: httpx.Client) -> None:
    scores = [d["score"] for d in http.post(
        "/score", json={"text_1": QUERY, "text_2": DOCS}).json()["data"]]  # fmt: skip
    order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    for route in ("/rerank", "/v1/rerank", "/v2/rerank"):
        r = http.post(route, json={"model": "s", "query": QUERY, "documents": DOCS})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["id"].startswith("rerank-") and body["model"] == "s"
        assert [x["index"] for x in body["results"]] == order
        assert [x["document"]["text"] for x in body["results"]] == [DOCS[i] for i in order]
        assert [x["relevance_score"] for x in body["results"]] == pytest.approx(
            [scores[i] for i in order], abs=TOL)
        tokens = sum(_count(http, QUERY) + 1 + _count(http, d) for d in DOCS)
        assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    top = http.post("/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2}).json()
    assert [x["index"] for x in top["results"]] == order[:2]
    for top_n in (9, -1):  # more than the documents, or <= 0: all of them (vLLM's)
        everything = http.post("/rerank", json={"query": QUERY, "documents": DOCS,
                                                "top_n": top_n})  # fmt: skip
        assert len(everything.json()["results"]) == 3


def test_invocations_route_score_and_rerank(http: httpx.Client) -> None:
    score = http.post("/invocations", json={"text_1": QUERY, "text_2": DOCS[:1]}).json()
    assert score["object"] == "list" and score["data"][0]["object"] == "score"
    rerank = http.post("/invocations", json={"query": QUERY, "documents": DOCS[:2]}).json()
    assert len(rerank["results"]) == 2


@pytest.mark.parametrize(("body", "param"), [
    ({"text_1": [QUERY, QUERY], "text_2": DOCS}, "text_1"),  # neither 1:N nor N:N
    ({"text_1": [], "text_2": DOCS}, "text_1"),
    ({"text_1": QUERY, "text_2": []}, "text_2"),
    ({"text_1": QUERY}, "text_2"),
    ({"items": DOCS}, "queries"),
    ({}, "text_1"),
    ({"data_1": QUERY, "data_2": DOCS, "text_1": QUERY}, "text_1"),
    ({"text_1": QUERY, "text_2": DOCS, "use_activation": True}, "use_activation"),
    ({"text_1": 5, "text_2": DOCS}, "text_1"),
    ({"text_1": QUERY, "text_2": "x " * 80}, "text_2"),  # longer than the context (64)
    ({"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
])  # fmt: skip
def test_bad_score_requests(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    error = _error(http.post("/score", json=body))
    assert error["param"] == param
    if "context length" in error["message"]:
        assert "tokens in the input for score." in error["message"]  # vLLM's wording


@pytest.mark.parametrize(("body", "param"), [
    ({"query": QUERY, "documents": []}, "documents"),
    ({"query": QUERY, "documents": "one document"}, "documents"),
    ({"documents": DOCS}, "query"),
    ({"query": "x " * 80, "documents": DOCS}, "query"),
])  # fmt: skip
def test_bad_rerank_requests(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    assert _error(http.post("/rerank", json=body))["param"] == param


def test_pooling_route_gives_the_embeddings(http: httpx.Client) -> None:
    body = {"model": "s", "input": DOCS[:2], "encoding_format": "float"}
    pooled = http.post("/pooling", json=body).json()
    embedded = http.post("/v1/embeddings", json=body).json()
    assert pooled["id"].startswith("pool-") and pooled["object"] == "list"
    assert [d["object"] for d in pooled["data"]] == ["pooling", "pooling"]
    for p, e in zip(pooled["data"], embedded["data"]):
        assert p["data"] == pytest.approx(e["embedding"], abs=1e-5)
    assert pooled["usage"] == embedded["usage"]
    assert http.post("/pooling", json={**body, "task": "embed"}).status_code == 200
    # what needs a classification head is refused, not answered with embeddings
    for extra, param in (({"task": "classify"}, "task"), ({"task": "token_classify"}, "task"),
                         ({"use_activation": True}, "use_activation")):
        assert _error(http.post("/pooling", json={**body, **extra}))["param"] == param


def test_unknown_model_is_a_404(http: httpx.Client) -> None:
    r = http.post("/score", json={"model": "nope", "text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 404
