"""vLLM server options on SmolLM2: GET /load with --enable-server-load-tracking, SageMaker's
POST /invocations (the body's shape picks chat, completion or embedding), --enable-log-outputs,
--uds (a Unix domain socket instead of a TCP port), and --api-server-count refused above 1."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from server_utils import RemoteServer, run_serve_cli

pytestmark = pytest.mark.real_model

BASE = ["--max-model-len", "256", "--kv-cache-memory", "32MiB", "--served-model-name", "s"]


@pytest.fixture(scope="module")
def server(smollm2_dir: Path) -> Iterator[RemoteServer]:
    args = [*BASE, "--enable-server-load-tracking", "--enable-log-requests",
            "--enable-log-outputs"]  # fmt: skip
    with RemoteServer(smollm2_dir, args) as srv:
        yield srv


def test_load_counts_requests_in_flight(server: RemoteServer) -> None:
    body = {"model": "s", "prompt": "Count:", "max_tokens": 60, "ignore_eos": True,
            "stream": True}  # fmt: skip

    async def during() -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            async with client.stream("POST", "/v1/completions", json=body) as streaming:
                lines = streaming.aiter_lines()
                await anext(lines)  # running
                load = (await client.get("/load")).json()["server_load"]
                async for _ in lines:
                    pass
            after = (await client.get("/load")).json()["server_load"]
        return load, after

    assert httpx.get(server.url("/load"), timeout=10).json() == {"server_load": 0}
    assert asyncio.run(during()) == (1, 0)


def test_invocations_route_by_body(server: RemoteServer) -> None:
    def post(body: dict) -> httpx.Response:
        return httpx.post(server.url("/invocations"), json=body, timeout=60)

    chat = post({"model": "s", "messages": [{"role": "user", "content": "Hi"}],
                 "max_tokens": 3})  # fmt: skip
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
    text = post({"model": "s", "prompt": "The capital of France is", "max_tokens": 3,
                 "temperature": 0})  # fmt: skip
    want = httpx.post(server.url("/v1/completions"), timeout=60, json={
        "model": "s", "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0})
    assert text.json()["object"] == "text_completion"
    assert text.json()["choices"][0]["text"] == want.json()["choices"][0]["text"]
    emb = post({"model": "s", "input": "hello"})
    assert emb.json()["object"] == "list" and len(emb.json()["data"][0]["embedding"]) == 576
    bad = post({"model": "s", "neither": 1})
    assert bad.status_code == 400 and "Cannot find suitable handler" in bad.json()["error"][
        "message"]
    wrong = post({"model": "s", "prompt": "x", "max_tokens": "many"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "max_tokens"
    assert httpx.get(server.url("/health"), timeout=10).status_code == 200


def test_outputs_are_logged(server: RemoteServer) -> None:
    reply = httpx.post(server.url("/v1/completions"), timeout=60, json={
        "model": "s", "prompt": "Say hi", "max_tokens": 4, "temperature": 0,
        "request_id": "logged-1"})  # fmt: skip
    text = reply.json()["choices"][0]["text"]
    deadline = time.monotonic() + 10
    while "Generated response cmpl-logged-1" not in server.log_text():
        assert time.monotonic() < deadline, server.log_text()[-2000:]
        time.sleep(0.2)
    line = next(x for x in server.log_text().splitlines()
                if "Generated response cmpl-logged-1" in x)  # fmt: skip
    assert f"output: {text!r}" in line and "finish_reason: length" in line


def test_unix_domain_socket(smollm2_dir: Path, tmp_path: Path) -> None:
    path = str(tmp_path / "ironlm.sock")
    proc = subprocess.Popen([sys.executable, "-m", "ironlm.entrypoints.openai.api_server",
                             str(smollm2_dir), *BASE, "--uds", path],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            env=dict(os.environ))  # fmt: skip
    try:
        client = httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://x",
                              timeout=60)  # fmt: skip
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        reply = client.post("/v1/completions", json={"model": "s", "prompt": "Hi",
                                                      "max_tokens": 2})  # fmt: skip
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
        assert oct(Path(path).stat().st_mode & 0o777) == "0o666"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not Path(path).exists()  # removed at shutdown


def test_one_api_server_only(smollm2_dir: Path) -> None:
    done = run_serve_cli([str(smollm2_dir), "--api-server-count", "2"])
    assert done.returncode == 2 and "--api-server-count 2" in done.stderr


def test_return_token_ids(server: RemoteServer, smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    client = server.openai_client(timeout=60)
    extra = {"return_token_ids": True}
    prompt = "The capital of France is"
    want_prompt = tok(prompt).input_ids
    done = client.completions.create(model="s", prompt=prompt, max_tokens=8, temperature=0,
                                     extra_body=extra).model_dump()  # fmt: skip
    choice = done["choices"][0]
    assert choice["prompt_token_ids"] == want_prompt
    assert tok.decode(choice["token_ids"]) == choice["text"] and len(choice["token_ids"]) == 8
    chunks = [c.model_dump() for c in client.completions.create(
        model="s", prompt=prompt, max_tokens=8, temperature=0, stream=True, extra_body=extra)]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == want_prompt
    assert all("prompt_token_ids" not in c["choices"][0] or c["choices"][0]["prompt_token_ids"]
               is None for c in chunks[1:])  # fmt: skip
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == choice["token_ids"]

    messages = [{"role": "user", "content": "Name one colour."}]
    chat = client.chat.completions.create(model="s", messages=messages, max_tokens=6,
                                          temperature=0, extra_body=extra).model_dump()
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    templated = tok(text, add_special_tokens=False).input_ids
    assert chat["prompt_token_ids"] == list(templated)
    ids = chat["choices"][0]["token_ids"]
    assert tok.decode(ids) == chat["choices"][0]["message"]["content"] and len(ids) == 6
    stream = [c.model_dump() for c in client.chat.completions.create(
        model="s", messages=messages, max_tokens=6, temperature=0, stream=True,
        extra_body=extra)]
    assert stream[0]["prompt_token_ids"] == list(templated)
    assert [t for c in stream if c["choices"] for t in c["choices"][0]["token_ids"] or []] == ids
    # not asked: no ids
    plain = client.completions.create(model="s", prompt=prompt, max_tokens=2).model_dump()
    assert plain["choices"][0]["token_ids"] is None
