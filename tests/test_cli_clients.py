"""``ironlm chat`` and ``ironlm complete`` (vLLM's command-line clients) against the real server
with SmolLM2: what they print is what the same request answers without streaming (greedy by
the server's generation-config override), the chat keeps its conversation, and an unknown
model, a missing key or an unreachable server are one error line and exit status 1."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_utils import RemoteServer, free_port

pytestmark = [pytest.mark.server, pytest.mark.real_model]

KEY = "sesame"


@pytest.fixture(scope="module")
def server(smollm2_dir: Path) -> Iterator[RemoteServer]:
    args = ["--max-model-len", "512", "--kv-cache-memory", "64MiB", "--dtype", "float32",
            "--served-model-name", "smollm2", "--disable-log-stats",
            "--disable-uvicorn-access-log",
            "--override-generation-config", '{"temperature": 0, "max_new_tokens": 16}']
    with RemoteServer(smollm2_dir, args, api_key=KEY) as srv:
        yield srv


def _client(server: RemoteServer, *args: str, stdin: str = "",
            key: str | None = KEY) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    if key is not None:
        env["OPENAI_API_KEY"] = key
    return subprocess.run([sys.executable, "-m", "ironlm.cli", *args,
                           "--url", server.url("/v1")],
                          input=stdin, capture_output=True, text=True, env=env, timeout=120)


def test_chat_quick_prints_the_answer_and_its_stats(server: RemoteServer) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    want = server.openai_client().chat.completions.create(model="smollm2", messages=messages)
    proc = _client(server, "chat", "-q", messages[0]["content"], "--stats")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "Using model: smollm2"  # the server's first model
    answer = proc.stdout.split("\n", 1)[1].split("TTFT:")[0]
    assert answer == want.choices[0].message.content + "\n"
    assert f"({want.usage.completion_tokens} tokens in" in proc.stdout


def test_chat_keeps_the_conversation(server: RemoteServer) -> None:
    client = server.openai_client()
    conversation = [{"role": "system", "content": "You are terse."}]
    answers = []
    for message in ("Name a fruit.", "And its colour?"):
        conversation.append({"role": "user", "content": message})
        text = client.chat.completions.create(model="smollm2",
                                              messages=conversation).choices[0].message.content
        conversation.append({"role": "assistant", "content": text})
        answers.append(text)
    proc = _client(server, "chat", "--system-prompt", "You are terse.", "--model-name",
                   "smollm2", stdin="Name a fruit.\nAnd its colour?\n", key=None)
    assert proc.returncode == 1  # no key: both lines refused, the loop went on
    assert proc.stderr.count("HTTP 401") == 2
    proc = _client(server, "chat", "--system-prompt", "You are terse.", "--api-key", KEY,
                   stdin="Name a fruit.\nAnd its colour?\n", key="wrong")
    assert proc.returncode == 0, proc.stderr
    # input() writes its "> " prompt to stdout, before each answer
    assert proc.stdout.split("> ")[1:] == [answers[0] + "\n", answers[1] + "\n", ""]


def test_complete_quick_with_max_tokens(server: RemoteServer) -> None:
    want = server.openai_client().completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=8)
    proc = _client(server, "complete", "-q", "The capital of France is", "--max-tokens", "8")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"Using model: smollm2\n{want.choices[0].text}\n"


def test_errors_are_one_line_and_exit_1(server: RemoteServer) -> None:
    proc = _client(server, "complete", "-q", "x", "--model-name", "nope")
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("ironlm complete: error: HTTP 404: The model `nope` does "
                                   "not exist.")
    proc = _client(server, "chat", "-q", "x", key="wrong")  # GET /v1/models refused
    assert proc.returncode == 1 and "HTTP 401" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "ironlm.cli", "chat", "-q", "x", "--url",
                           f"http://127.0.0.1:{free_port()}/v1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "cannot reach the server" in proc.stderr
