"""Multi-LoRA through the real server: SmolLM2 with two adapters trained with peft in the test
set-up, one from ``--lora-modules name=path``, one from the JSON form. Adapters in /v1/models,
"model": adapter in completions (equal to HF + peft, several adapters in flight together),
chat with streaming, embeddings; 404 for an unknown model; dynamic loading and unloading behind
VLLM_ALLOW_RUNTIME_LORA_UPDATING and --api-key, bad adapters refused with 400 while the server
goes on serving, a load while a request streams losing nothing. Start-up errors and the
switch's absence on the tiny model."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from lora_adapters import MAX_TOKENS, PROMPTS
from server_utils import RemoteServer, run_serve_cli

pytestmark = [pytest.mark.server, pytest.mark.real_model]
KEY = "lora-key"
SECOND_KEY = "another-key"  # --api-key takes several (vLLM); either one is accepted
NAME = "smollm2"


@pytest.fixture(scope="module")
def server(smollm2_dir: Path, smollm2_loras) -> RemoteServer:  # type: ignore[no-untyped-def]
    paths = smollm2_loras.paths
    args = [
        "--served-model-name", NAME, "--max-model-len", "512", "--kv-cache-memory", "128MiB",
        "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "3",
        "--lora-modules", f"pirate={paths['pirate']}",
        json.dumps({"name": "french", "path": str(paths["french"]), "base_model_name": NAME}),
        "--dtype", "float32",  # whatever the CPU's auto dtype: streamed == non-streamed text
    ]
    with RemoteServer(smollm2_dir, args, api_key=KEY, more_keys=(SECOND_KEY,),
                      env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": " True "}) as srv:
        yield srv


def _post(server: RemoteServer, path: str, body: dict[str, Any],
          key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url(path), json=body, headers=headers, timeout=120)


def _greedy(client: Any, model: str, prompt: str, **kw: Any) -> Any:
    return client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                     temperature=0, logprobs=0, **kw)


def _token_ids(choice: Any) -> list[int]:
    return [int(t.split(":")[1]) for t in choice.logprobs.tokens]



def test_models_list_adapters_with_their_parent(server: RemoteServer) -> None:
    models = {m.id: m for m in server.openai_client().models.list().data}
    assert set(models) == {NAME, "pirate", "french"}
    assert models["pirate"].parent == NAME and models["french"].parent == NAME
    assert models[NAME].parent is None


def test_metrics_name_the_adapters(server: RemoteServer) -> None:
    text = httpx.get(server.url("/metrics"), timeout=30).text
    assert 'vllm:lora_requests_info{max_lora="2"' in text


def test_completions_per_adapter_equal_hf_peft_in_one_batch(  # type: ignore[no-untyped-def]
    server: RemoteServer, smollm2_loras
) -> None:
    client = server.async_openai_client()
    plan = [(a, i) for i in range(len(PROMPTS)) for a in (None, "pirate", "french")]

    async def run() -> list[Any]:  # all in flight together: mixed-adapter steps
        return await asyncio.gather(*[
            client.completions.create(model=a or NAME, prompt=PROMPTS[i], max_tokens=MAX_TOKENS,
                                      temperature=0, logprobs=0,
                                      extra_body={"return_tokens_as_token_ids": True})
            for a, i in plan
        ])

    for (adapter, i), resp in zip(plan, asyncio.run(run())):
        assert resp.model == (adapter or NAME)
        assert _token_ids(resp.choices[0]) == smollm2_loras.reference[(adapter, i)], (adapter, i)


def test_chat_streaming_with_an_adapter(server: RemoteServer) -> None:
    client = server.openai_client()
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    whole = client.chat.completions.create(model="pirate", messages=messages, max_tokens=16,
                                           temperature=0)
    chunks = list(client.chat.completions.create(model="pirate", messages=messages,
                                                 max_tokens=16, temperature=0, stream=True))
    assert {c.model for c in chunks} == {"pirate"} and whole.model == "pirate"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    base = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16,
                                          temperature=0)
    assert base.choices[0].message.content != text


def test_embeddings_with_an_adapter(server: RemoteServer) -> None:
    client = server.openai_client()
    base = client.embeddings.create(model=NAME, input="The treasure is on the island.")
    pirate = client.embeddings.create(model="pirate", input="The treasure is on the island.")
    assert pirate.model == "pirate"
    diff = max(abs(x - y) for x, y in zip(base.data[0].embedding, pirate.data[0].embedding))
    assert diff > 1e-3


def test_unknown_model_is_404(server: RemoteServer) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        server.openai_client().completions.create(model="no-such-adapter", prompt="x",
                                                  max_tokens=2)


def test_dynamic_load_needs_the_api_key(server: RemoteServer, smollm2_loras) -> None:  # type: ignore[no-untyped-def]
    body = {"lora_name": "x", "lora_path": str(smollm2_loras.paths["pirate"])}
    assert _post(server, "/v1/load_lora_adapter", body, key=None).status_code == 401
    assert _post(server, "/v1/unload_lora_adapter", {"lora_name": "pirate"},
                 key="wrong").status_code == 401
    # the second key is as good as the first: a bad body is refused (400), not the key (401)
    assert _post(server, "/v1/unload_lora_adapter", {}, key=SECOND_KEY).status_code == 400


def _rank32_adapter(smollm2_dir: Path, out: Path) -> Path:
    from transformers import AutoConfig

    from ironlm_bench.lora import write_random_adapter

    write_random_adapter(AutoConfig.from_pretrained(smollm2_dir), out, rank=32, seed=0)
    return out


def test_bad_adapters_get_400_and_the_server_keeps_serving(  # type: ignore[no-untyped-def]
    server: RemoteServer, smollm2_dir: Path, smollm2_loras, tmp_path: Path
) -> None:
    good = smollm2_loras.paths["french"]
    corrupt = tmp_path / "corrupt"
    shutil.copytree(good, corrupt)
    (corrupt / "adapter_model.safetensors").write_bytes(b"not a safetensors file" * 8)
    cases = {
        "rank": (_rank32_adapter(smollm2_dir, tmp_path / "r32"), "greater than max_lora_rank"),
        "missing": (tmp_path / "nowhere", "no such folder"),
        "corrupt": (corrupt, "unreadable"),
    }
    for name, (path, message) in cases.items():
        r = _post(server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        assert r.status_code == 400, r.text
        assert message in r.json()["error"]["message"]
    dup = _post(server, "/v1/load_lora_adapter", {"lora_name": "pirate", "lora_path": str(good)})
    assert dup.status_code == 400 and "already been loaded" in dup.json()["error"]["message"]
    models = {m.id for m in server.openai_client().models.list().data}
    assert models == {NAME, "pirate", "french"}  # nothing half-registered
    resp = _greedy(server.openai_client(), "french", PROMPTS[0],
                   extra_body={"return_tokens_as_token_ids": True})
    assert _token_ids(resp.choices[0]) == smollm2_loras.reference[("french", 0)]


def test_load_while_a_request_streams_then_unload(  # type: ignore[no-untyped-def]
    server: RemoteServer, smollm2_loras
) -> None:
    client = server.openai_client()
    stream = client.completions.create(model="pirate", prompt=PROMPTS[1], max_tokens=48,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    first = next(iter(stream))  # the request is running
    loaded = _post(server, "/v1/load_lora_adapter",
                   {"lora_name": "pirate2", "lora_path": str(smollm2_loras.paths["pirate"])})
    assert loaded.status_code == 200 and "added successfully" in loaded.text
    rest = list(stream)
    assert rest[-1].choices[0].finish_reason == "length"
    text = first.choices[0].text + "".join(c.choices[0].text for c in rest)
    assert text == client.completions.create(model="pirate", prompt=PROMPTS[1], max_tokens=48,
                                             temperature=0,
                                             extra_body={"ignore_eos": True}).choices[0].text
    models = {m.id: m for m in client.models.list().data}
    assert models["pirate2"].parent == NAME
    again = _greedy(client, "pirate2", PROMPTS[0],
                    extra_body={"return_tokens_as_token_ids": True})
    assert again.model == "pirate2"
    assert _token_ids(again.choices[0]) == smollm2_loras.reference[("pirate", 0)]
    gone = _post(server, "/v1/unload_lora_adapter", {"lora_name": "pirate2"})
    assert gone.status_code == 200 and "removed successfully" in gone.text
    with pytest.raises(openai.NotFoundError):
        _greedy(client, "pirate2", PROMPTS[0])
    missing = _post(server, "/v1/unload_lora_adapter", {"lora_name": "pirate2"})
    assert missing.status_code == 404


# -- the tiny model: the switch, start-up errors -----------------------------------------------
def test_runtime_endpoints_absent_without_the_switch(tiny_llama_dir: Path, tmp_path: Path) -> None:
    args = ["--max-model-len", "256", "--kv-cache-memory", "32MiB", "--enable-lora"]
    with RemoteServer(tiny_llama_dir, args, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0"}) as srv:
        r = httpx.post(srv.url("/v1/load_lora_adapter"),
                       json={"lora_name": "a", "lora_path": str(tmp_path)})
        assert r.status_code == 404


def test_startup_errors_for_lora_modules(tiny_llama_dir: Path, tmp_path: Path) -> None:
    base = [str(tiny_llama_dir), "--max-model-len", "256", "--kv-cache-memory", "32MiB",
            "--port", "0"]
    no_enable = run_serve_cli([*base, "--lora-modules", f"a={tmp_path}"])
    assert no_enable.returncode == 2 and "--lora-modules needs --enable-lora" in no_enable.stderr
    bad_json = run_serve_cli([*base, "--enable-lora", "--lora-modules", '{"name": "a"}'])
    assert bad_json.returncode == 2 and "Invalid fields for --lora-modules" in bad_json.stderr
    missing = run_serve_cli([*base, "--enable-lora", "--lora-modules",
                             f"a={tmp_path / 'nowhere'}"])
    assert missing.returncode == 2
    assert "--lora-modules a=" in missing.stderr and "no such folder" in missing.stderr
