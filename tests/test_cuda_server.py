"""The server on a real GPU: ``ironlm serve --device cuda`` driven by the official ``openai``
client and httpx, its greedy tokens checked against HF transformers on the same GPU. Skipped
without a CUDA GPU (CI has none; benchmarks/gpu/run.sh runs it on a lent one)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest
import torch
from server_utils import RemoteServer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.server,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PROMPTS = ["The capital of France is", "def fib(n):", "Once upon a time", "1, 2, 3,"]


@pytest.fixture(scope="module")
def sharp_llama_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A 2-layer seeded Llama whose logits are far from uniform (initializer_range 0.2), so a
    greedy token is no near-tie that float32 rounding could flip between implementations."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("sharp-llama")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=True, eos_token_id=2, bos_token_id=1, initializer_range=0.2,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def server(sharp_llama_dir: Path) -> Iterator[RemoteServer]:
    args = ["--device", "cuda", "--dtype", "float32", "--max-model-len", "512",
            "--gpu-memory-utilization", "0.2", "--served-model-name", "sharp"]  # fmt: skip
    with RemoteServer(sharp_llama_dir, args) as srv:
        yield srv


def hf_greedy(model_dir: Path, prompt: str, n: int) -> list[int]:
    """HF transformers' greedy continuation on the GPU, float32 without TF32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.backends.cuda.matmul.allow_tf32 = False
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    ids = torch.tensor([tok(prompt).input_ids], device="cuda")
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, pad_token_id=0)  # fmt: skip
    return out[0, ids.shape[1]:].tolist()


def test_completions_match_hf_greedy(server: RemoteServer, sharp_llama_dir: Path) -> None:
    client = server.openai_client(timeout=120)
    for prompt in PROMPTS:
        extra = {"ignore_eos": True, "return_tokens_as_token_ids": True}
        res = client.completions.create(model="sharp", prompt=prompt, max_tokens=24,
                                        temperature=0, logprobs=0, extra_body=extra)
        got = [int(t.removeprefix("token_id:")) for t in res.choices[0].logprobs.tokens]
        assert got == hf_greedy(sharp_llama_dir, prompt, 24), prompt
        assert res.usage.completion_tokens == 24


def test_chat_stream_equals_whole_and_concurrency(server: RemoteServer) -> None:
    client = server.openai_client(timeout=120)
    chat = [{"role": "user", "content": "Name one colour."}]
    whole = client.chat.completions.create(model="sharp", messages=chat, max_tokens=32,
                                           temperature=0)  # fmt: skip
    stream = client.chat.completions.create(model="sharp", messages=chat, max_tokens=32,
                                            temperature=0, stream=True)  # fmt: skip
    parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(parts) == whole.choices[0].message.content

    async def many() -> list[str]:
        aclient = server.async_openai_client(timeout=120)
        outs = await asyncio.gather(*(aclient.completions.create(
            model="sharp", prompt=PROMPTS[i % 4], max_tokens=16, temperature=0)
            for i in range(48)))  # fmt: skip
        return [o.choices[0].text for o in outs]

    texts = asyncio.run(many())  # 48 at once: batched decode steps through the graphs
    for i, text in enumerate(texts):
        assert text == texts[i % 4]


def test_bad_input_is_400_and_server_keeps_serving(server: RemoteServer) -> None:
    r = httpx.post(server.url("/v1/completions"), timeout=30,
                   json={"model": "sharp", "prompt": "x", "max_tokens": -3})  # fmt: skip
    assert r.status_code == 400 and "max_tokens" in r.text
    with pytest.raises(openai.BadRequestError):
        server.openai_client().completions.create(model="sharp", prompt="x", temperature=-1)
    assert httpx.get(server.url("/health"), timeout=5).status_code == 200
    metrics = httpx.get(server.url("/metrics"), timeout=5).text
    assert "vllm:generation_tokens_total" in metrics
