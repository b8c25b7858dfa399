"""vLLM's token pooling tasks on SmolLM2's real weights, against HF transformers on the same
folder: "token_embed" (every prompt token's final hidden state), "token_classify" /
``LLM.reward`` (a sequence classifier's head on every token), offline and through the
server's /pooling, prompts run whole and in chunks."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from classifier_models import write_classifier
from ironlm import LLM, PoolingParams
from server_utils import RemoteServer

pytestmark = pytest.mark.real_model

TEXTS = ["The capital of France is Paris, a city on the Seine.",
         "Bananas are rich in potassium, which the body needs for its muscles and nerves."]
SMALL = {"device": "cpu", "dtype": "float32", "max_model_len": 256, "kv_cache_memory": 64 << 20}
LABELS = ["bad", "fine", "good"]


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    return write_classifier(smollm2_dir, tmp_path_factory.mktemp("tok") / "m", LABELS, seed=3)


def hf_rows(folder: Path, texts: list[str], classifier: bool) -> list[torch.Tensor]:
    """HF's final hidden states (an LM) or per-token class logits (a classifier), a prompt
    at a time: (num_tokens, hidden_size | num_labels) each."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    cls = AutoModelForSequenceClassification if classifier else AutoModelForCausalLM
    model = cls.from_pretrained(folder, dtype=torch.float32)
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tok(text)["input_ids"]])
            hidden = model.model(input_ids=ids).last_hidden_state[0]
            rows.append(model.score(hidden) if classifier else hidden)
    return rows


@pytest.fixture(scope="module")
def lm_rows(smollm2_dir: Path) -> list[torch.Tensor]:
    return hf_rows(smollm2_dir, TEXTS, classifier=False)


@pytest.mark.parametrize("budget", [None, 8])  # 8: every prompt runs in chunks
def test_token_embed_matches_hf(smollm2_dir: Path, lm_rows: list[torch.Tensor],
                                budget: int | None) -> None:
    chunked = {} if budget is None else {"max_num_batched_tokens": budget, "max_num_seqs": 2}
    llm = LLM(str(smollm2_dir), **SMALL, **chunked)
    try:
        outs = llm.encode(TEXTS, pooling_task="token_embed", use_tqdm=False)
        for out, ref in zip(outs, lm_rows):
            assert out.outputs.data.shape == ref.shape == (len(out.prompt_token_ids), 576)
            assert torch.allclose(out.outputs.data, ref, atol=5e-4), \
                (out.outputs.data - ref).abs().max()
        # a second run takes no cached prefix: every row again
        again = llm.encode(TEXTS, pooling_task="token_embed", use_tqdm=False)
        for out, first in zip(again, outs):
            assert torch.allclose(out.outputs.data, first.outputs.data, atol=1e-5)
        # the rows' mean is the embed task's vector
        embedded = llm.encode(TEXTS, pooling_task="embed", use_tqdm=False)
        for out, emb in zip(outs, embedded):
            assert torch.allclose(out.outputs.data.mean(0), emb.outputs.data, atol=1e-5)
        unit = llm.encode(TEXTS[:1], PoolingParams(normalize=True), pooling_task="token_embed",
                          use_tqdm=False)[0].outputs.data
        assert torch.allclose(unit.norm(dim=-1), torch.ones(len(unit)), atol=1e-5)
        assert torch.allclose(unit, torch.nn.functional.normalize(lm_rows[0], dim=-1),
                              atol=1e-4)
    finally:
        llm.shutdown()


def test_token_classify_and_reward_match_hf(classifier_dir: Path) -> None:
    ref = hf_rows(classifier_dir, TEXTS, classifier=True)
    assert float(ref[0].std()) > 0.1  # the head tells the tokens apart
    llm = LLM(str(classifier_dir), **SMALL, max_num_batched_tokens=8, max_num_seqs=2)
    try:
        rewards = llm.reward(TEXTS, use_tqdm=False)
        logits = llm.encode(TEXTS, PoolingParams(use_activation=False),
                            pooling_task="token_classify", use_tqdm=False)
        classified = llm.classify(TEXTS, use_tqdm=False)
        for r, lg, c, want in zip(rewards, logits, classified, ref):
            assert r.outputs.data.shape == (len(r.prompt_token_ids), len(LABELS))
            assert torch.allclose(lg.outputs.data, want, atol=2e-3)
            assert torch.allclose(r.outputs.data, torch.softmax(want, dim=-1), atol=1e-4)
            # the last token's row is the sequence's classification
            assert torch.allclose(r.outputs.data[-1], torch.tensor(c.outputs.probs), atol=1e-5)
        with pytest.raises(ValueError, match="normalize applies to embeddings"):
            llm.reward(TEXTS, pooling_params=PoolingParams(normalize=True), use_tqdm=False)
    finally:
        llm.shutdown()


def test_token_classify_on_two_pipeline_stages(classifier_dir: Path) -> None:
    """The last stage's rows come back through the mp executor: the same as one rank's."""
    llm = LLM(str(classifier_dir), **SMALL)
    try:
        one = [o.outputs.data for o in llm.reward(TEXTS, use_tqdm=False)]
    finally:
        llm.shutdown()
    llm = LLM(str(classifier_dir), **SMALL, pipeline_parallel_size=2,
              distributed_executor_backend="mp", enforce_eager=True)
    try:
        two = [o.outputs.data for o in llm.reward(TEXTS, use_tqdm=False)]
    finally:
        llm.shutdown()
    for a, b in zip(one, two):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


@pytest.mark.server
def test_pooling_route_token_tasks(smollm2_dir: Path, classifier_dir: Path,
                                   lm_rows: list[torch.Tensor]) -> None:
    args = ["--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "64MiB"]
    with RemoteServer(smollm2_dir, args) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=60) as http:
        body = {"input": TEXTS, "task": "token_embed"}
        data = http.post("/pooling", json=body).json()["data"]
        for item, ref in zip(data, lm_rows):
            assert torch.allclose(torch.tensor(item["data"]), ref, atol=5e-4)
        raw = http.post("/pooling", json={**body, "encoding_format": "base64"}).json()["data"]
        rows = np.frombuffer(base64.b64decode(raw[0]["data"]), dtype="<f4").reshape(-1, 576)
        assert np.allclose(rows, data[0]["data"], atol=1e-6)
        refused = http.post("/pooling", json={**body, "task": "token_classify"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "task"
    ref = hf_rows(classifier_dir, TEXTS[:1], classifier=True)[0]
    with RemoteServer(classifier_dir, args) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=60) as http:
        (item,) = http.post("/pooling", json={"input": TEXTS[0], "task": "token_classify"}
                            ).json()["data"]
        assert torch.allclose(torch.tensor(item["data"]), torch.softmax(ref, dim=-1), atol=1e-4)
        refused = http.post("/pooling", json={"input": TEXTS[0], "task": "token_embed"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "task"
