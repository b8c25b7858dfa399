"""``ironlm run-batch`` (vLLM's batch runner): an OpenAI batch file answered offline by the
server's own app. The real model's answers are checked against HF transformers' greedy tokens;
bad lines get the server's 400s (naming the field) in their result line, a file that is not a
batch file is refused before the model loads, URL input and output go over loopback HTTP, and
results come out in input order."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from parallel_utils import worker_pids

from ironlm.cli import Cli
from ironlm.entrypoints.openai.batch_file import BatchOutput

TINY_FLAGS = ["--max-model-len", "256", "--kv-cache-memory", "32MiB", "--served-model-name", "t",
              "--disable-log-stats"]  # fmt: skip


def _line(custom_id: str, url: str, body: dict[str, Any], method: str = "POST") -> str:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


def _results(text: str) -> dict[str, dict[str, Any]]:
    return {r["custom_id"]: r for r in map(json.loads, text.splitlines())}


def _hf_chat_greedy(model_dir: Path, messages: list[dict[str, str]], new_tokens: int
                    ) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy new ids) of HF transformers for the chat template's prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, pad_token_id=tok.eos_token_id)
    return ids[0].tolist(), out[0, ids.shape[1]:].tolist()


@pytest.mark.real_model
def test_real_model_batch_matches_hf_and_answers_bad_lines_as_the_server(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    lines = [
        _line("chat", "/v1/chat/completions", {"model": "smollm2", "messages": question,
              "max_tokens": 12, "temperature": 0, "return_token_ids": True}),
        _line("bad-field", "/v1/chat/completions", {"model": "smollm2", "messages": question,
              "temperature": "hot"}),
        "",  # blank lines are skipped
        _line("streamed", "/v1/chat/completions", {"messages": question, "stream": True}),
        _line("not-an-endpoint", "/v1/models", {}),
        _line("get", "/v1/completions", {"prompt": "x"}, method="GET"),
        _line("other-model", "/v1/completions", {"model": "gpt-4", "prompt": "x"}),
        _line("embed", "/v1/embeddings", {"model": "smollm2", "input": "hello"}),
        _line("completion", "/v1/completions", {"model": "smollm2", "max_tokens": 6,
              "prompt": "The capital of France is", "temperature": 0, "n": 2}),
    ]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    proc = subprocess.run(
        # vLLM's module form (the other tests run the ironlm command)
        [sys.executable, "-m", "ironlm.entrypoints.openai.run_batch", "--model", str(smollm2_dir),
         "-i", str(source), "-o", str(out), "--served-model-name", "smollm2",
         "--dtype", "float32", "--max-model-len", "512", "--kv-cache-memory", "128MiB",
         "--disable-log-stats"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    ids = [json.loads(row)["custom_id"] for row in text.splitlines()]
    assert ids == ["chat", "bad-field", "streamed", "not-an-endpoint", "get", "other-model",
                   "embed", "completion"]  # input order, one result per request
    results = _results(text)

    chat = results["chat"]
    assert chat["error"] is None and chat["response"]["status_code"] == 200
    body = chat["response"]["body"]
    prompt_ids, want = _hf_chat_greedy(smollm2_dir, question, 12)
    assert body["prompt_token_ids"] == prompt_ids
    assert body["choices"][0]["token_ids"] == want
    assert body["usage"] == {**body["usage"], "prompt_tokens": len(prompt_ids),
                             "completion_tokens": len(want)}
    assert body["model"] == "smollm2" and body["object"] == "chat.completion"
    assert body["id"].endswith(chat["response"]["request_id"])

    def error_of(custom_id: str, status: int) -> dict[str, Any]:
        result = results[custom_id]
        assert result["response"]["status_code"] == status
        assert result["response"]["body"] is None
        return result["error"]["error"]

    assert error_of("bad-field", 400)["param"] == "temperature"
    assert error_of("streamed", 400)["param"] == "stream"
    assert error_of("not-an-endpoint", 400)["param"] == "url"
    assert error_of("get", 400)["param"] == "method"
    assert error_of("other-model", 404)["code"] == "model_not_found"
    embedding = results["embed"]["response"]["body"]["data"][0]["embedding"]
    assert len(embedding) == 576  # SmolLM2-135M's hidden size
    choices = results["completion"]["response"]["body"]["choices"]
    assert [c["index"] for c in choices] == [0, 1] and choices[0]["text"] == choices[1]["text"]
    assert choices[0]["text"].strip().startswith("Paris")


@pytest.mark.parametrize(("line", "says"), [
    ("{not json", "line 2"),
    (json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}), "line 2: custom_id"),
    (_line("a", "/v1/completions", {"prompt": "y"}), "also the custom_id of line 1"),
    (json.dumps({"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": [1]}),
     "line 2: body"),
])
def test_a_file_that_is_not_a_batch_file_is_refused_before_the_model_loads(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str,
    says: str,
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(_line("a", "/v1/completions", {"prompt": "x"}) + "\n" + line + "\n")
    out = tmp_path / "out.jsonl"
    code = Cli().run(["run-batch", str(tiny_llama_dir), "-i", str(source), "-o", str(out)])
    assert code == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


def test_an_output_that_cannot_be_written_is_refused_before_the_model_loads(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(_line("a", "/v1/completions", {"prompt": "x"}) + "\n")
    out = tmp_path / "missing-folder" / "out.jsonl"
    assert Cli().run(["run-batch", str(tiny_llama_dir), "-i", str(source), "-o", str(out)]) == 2
    assert "missing-folder" in capsys.readouterr().err


def test_results_are_written_in_input_order_as_they_finish(tmp_path: Path) -> None:
    out = BatchOutput(str(tmp_path / "out.jsonl"))
    out.add(2, {"custom_id": "c"})
    out.add(1, {"custom_id": "b"})
    assert out.local.read_text() == ""  # waiting for line 0
    assert not (tmp_path / "out.jsonl").exists()  # until the batch has finished
    out.add(0, {"custom_id": "a"})
    out.add(3, {"custom_id": "d"})
    out.close()
    rows = [json.loads(r)["custom_id"] for r in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert rows == ["a", "b", "c", "d"] and out.written == 4


class _Files(BaseHTTPRequestHandler):
    """GET serves ``files[path]``; PUT stores the body there, or answers ``put_status``."""

    files: dict[str, bytes] = {}
    put_status = 200

    def do_GET(self) -> None:
        data = self.files.get(self.path)
        self.send_response(200 if data is not None else 404)
        self.end_headers()
        self.wfile.write(data or b"")

    def do_PUT(self) -> None:
        data = self.rfile.read(int(self.headers["Content-Length"]))
        if self.put_status == 200:
            self.files[self.path] = data
        self.send_response(self.put_status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def file_server() -> Iterator[tuple[str, type[_Files]]]:
    handler = type("Files", (_Files,), {"files": {}, "put_status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_url_input_and_output(tiny_llama_dir: Path, tmp_path: Path,
                              file_server: tuple[str, type[_Files]]) -> None:
    base, files = file_server
    # the first request runs longest: the results still come in input order
    lines = [_line("long", "/v1/completions", {"prompt": "Once", "max_tokens": 40,
                   "ignore_eos": True}),
             *(_line(f"short-{i}", "/v1/completions", {"prompt": f"{i}", "max_tokens": 2,
                     "ignore_eos": True, "n": 3}) for i in range(6))]
    files.files["/in.jsonl"] = ("\n".join(lines) + "\n").encode()
    code = Cli().run(["run-batch", str(tiny_llama_dir), *TINY_FLAGS, "-i", f"{base}/in.jsonl",
                      "-o", f"{base}/out.jsonl", "--output-tmp-dir", str(tmp_path)])
    assert code == 0
    rows = [json.loads(r) for r in files.files["/out.jsonl"].decode().splitlines()]
    assert [r["custom_id"] for r in rows] == ["long", *(f"short-{i}" for i in range(6))]
    assert rows[0]["response"]["body"]["usage"]["completion_tokens"] == 40
    assert all(len(r["response"]["body"]["choices"]) == 3 for r in rows[1:])
    assert list(tmp_path.iterdir()) == []  # the local copy is gone once uploaded


def test_a_failed_upload_keeps_the_results_and_says_where(
    tiny_llama_dir: Path, tmp_path: Path, file_server: tuple[str, type[_Files]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    base, files = file_server
    files.put_status = 500
    source = tmp_path / "in.jsonl"
    source.write_text(_line("a", "/v1/completions", {"prompt": "x", "max_tokens": 2}) + "\n")
    kept = tmp_path / "kept"
    kept.mkdir()
    code = Cli().run(["run-batch", str(tiny_llama_dir), *TINY_FLAGS, "-i", str(source),
                      "-o", f"{base}/out.jsonl", "--output-tmp-dir", str(kept)])
    assert code == 2
    (local,) = kept.iterdir()
    assert str(local) in capsys.readouterr().err
    assert json.loads(local.read_text())["response"]["status_code"] == 200


def test_metrics_server_serves_the_batch_engine_metrics(tiny_llama_dir: Path) -> None:
    from ironlm.entrypoints.openai.api_server import api_app, checked_settings, make_engine_client
    from ironlm.entrypoints.openai.cli_args import make_parser
    from ironlm.entrypoints.openai.run_batch import _MetricsServer
    from ironlm.entrypoints.openai.startup import bind_server_socket

    args = make_parser().parse_args([str(tiny_llama_dir), *TINY_FLAGS])
    pm, _, config = checked_settings(args)
    engine = make_engine_client(config, pm, 16, lambda exc: None)
    engine.start()
    sock = bind_server_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    try:
        metrics = _MetricsServer(api_app(engine, args, pm), sock)

        async def scrape() -> tuple[httpx.Response, httpx.Response]:
            await metrics.start()
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                    return await client.get("/metrics"), await client.get("/v1/models")
            finally:
                await metrics.stop()

        got, other = asyncio.run(scrape())
    finally:
        sock.close()
        engine.shutdown()
    assert got.status_code == 200
    assert 'vllm:num_requests_running{model_name="t"}' in got.text
    assert other.status_code == 404  # the metrics server has no other route


def test_an_existing_output_is_kept_when_the_engine_cannot_start(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(_line("a", "/v1/completions", {"prompt": "x"}) + "\n")
    out = tmp_path / "out.jsonl"
    out.write_text("the last run's results\n")
    code = Cli().run(["run-batch", str(tiny_llama_dir), "-i", str(source), "-o", str(out),
                      "--kv-cache-memory", "1KiB"])
    assert code == 2 and "KV cache" in capsys.readouterr().err
    assert out.read_text() == "the last run's results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]  # no partial


def test_a_line_separator_in_a_string_and_the_body_request_id(tiny_llama_dir: Path,
                                                              tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    lines = [json.dumps({"custom_id": "sep", "method": "POST", "url": "/v1/completions",
                         "body": {"prompt": "a\u2028b\u0085c", "max_tokens": 2}},
                        ensure_ascii=False),  # raw U+2028 / U+0085: still one line
             _line("named", "/v1/completions", {"prompt": "x", "max_tokens": 2,
                   "request_id": "my-request"})]
    source.write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")  # CRLF ends lines too
    out = tmp_path / "out.jsonl"
    code = Cli().run(["run-batch", str(tiny_llama_dir), *TINY_FLAGS, "-i", str(source), "-o",
                      str(out)])
    assert code == 0
    results = _results(out.read_text(encoding="utf-8"))
    assert results["sep"]["response"]["status_code"] == 200
    named = results["named"]["response"]
    assert named["request_id"] == "my-request"  # the body's id names the request, as served
    assert named["body"]["id"] == "cmpl-my-request"


def test_a_dead_engine_gives_every_line_a_result_and_exit_1(tiny_llama_dir: Path,
                                                             tmp_path: Path) -> None:
    """A worker killed mid-batch: the lines in flight fail, the lines not sent yet are not
    sent (a 500 naming the death), every line has its result, the command exits 1."""
    source = tmp_path / "in.jsonl"
    lines = [_line("first", "/v1/completions", {"prompt": "x", "max_tokens": 1})]
    lines += [_line(f"long-{i}", "/v1/completions", {"prompt": "x", "max_tokens": 240,
                    "ignore_eos": True}) for i in range(40)]
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ironlm.cli", "run-batch", str(tiny_llama_dir), *TINY_FLAGS,
         "-tp", "2", "--distributed-executor-backend", "mp", "--max-num-seqs", "8",
         "-i", str(source), "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        # the first result is written once it is done; the long lines are running then
        while not any(p.read_text() for p in tmp_path.glob(".out.jsonl.*.partial")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        (worker,) = worker_pids(proc.pid)
        os.kill(worker, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-2000:]
    assert "the engine died" in err
    rows = [json.loads(r) for r in out.read_text().splitlines()]
    assert [r["custom_id"] for r in rows] == ["first", *(f"long-{i}" for i in range(40))]
    assert rows[0]["response"]["status_code"] == 200
    assert all(r["response"]["status_code"] >= 500 and r["error"] for r in rows[1:])


@pytest.mark.real_model
def test_exclude_tools_when_tool_choice_none(smollm2_dir: Path, tmp_path: Path) -> None:
    """vLLM's --exclude-tools-when-tool-choice-none (a flag run-batch shares with the
    server): tool_choice "none" renders no tool definitions; "auto" still does."""
    from test_server_tools import TEMPLATE, TOOLS

    from transformers import AutoTokenizer

    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = {"messages": ask, "tools": TOOLS, "max_tokens": 1, "return_token_ids": True}
    source = tmp_path / "in.jsonl"
    source.write_text(
        _line("none", "/v1/chat/completions", {**body, "tool_choice": "none"}) + "\n"
        + _line("auto", "/v1/chat/completions", {**body, "tool_choice": "auto"}) + "\n")
    out = tmp_path / "out.jsonl"
    # in a process of its own: the suite's process keeps what engines leave on its heap
    proc = subprocess.run(
        [sys.executable, "-m", "ironlm.cli", "run-batch", str(smollm2_dir), "-i", str(source),
         "-o", str(out), "--chat-template", TEMPLATE, "--exclude-tools-when-tool-choice-none",
         "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-model-len", "1024",
         "--kv-cache-memory", "64MiB", "--disable-log-stats"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    prompts = {cid: tok.decode(r["response"]["body"]["prompt_token_ids"])
               for cid, r in _results(out.read_text()).items()}
    assert "get_weather" in prompts["auto"] and "<tools>" in prompts["auto"]
    assert "get_weather" not in prompts["none"] and "<tools>" not in prompts["none"]
    assert prompts["auto"].endswith(prompts["none"])  # the same turns after the tools block
