"""``ironlm chat`` and ``ironlm complete``: vLLM's command-line clients of a running server.

    ironlm chat [--url http://localhost:8000/v1] [--model-name M] [--system-prompt S] [-q MSG]
    ironlm complete [--url ...] [--model-name M] [--max-tokens N] [-q PROMPT]

Each answer streams to standard output as it is generated; ``--stats`` adds its time to
first token and tokens per second. Without ``-q`` they read one message (or prompt) per line
from standard input until end of file; ``chat`` keeps the conversation. The model is the
server's first (``GET /models``) unless ``--model-name`` names one; the key is ``--api-key``,
else ``OPENAI_API_KEY`` (as vLLM's, which use the ``openai`` client; these speak HTTP with
httpx, a dependency of the core).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx


class ServerError(Exception):
    """The server could not be reached or refused a call (the message says which)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    chat = sub.add_parser("chat", help="chat with a running server (vLLM's `vllm chat`)",
                          description="Chat completions from a running OpenAI-compatible "
                          "server, streamed to the terminal.")
    _add_query_options(chat)
    chat.add_argument("--system-prompt", default=None,
                      help="a system message put before the conversation")
    chat.add_argument("-q", "--quick", metavar="MESSAGE", default=None,
                      help="send this one message, print the answer, exit")
    chat.set_defaults(func=run_chat)
    complete = sub.add_parser("complete",
                              help="complete prompts on a running server (vLLM's `vllm "
                              "complete`)",
                              description="Text completions from a running OpenAI-compatible "
                              "server, streamed to the terminal.")
    _add_query_options(complete)
    complete.add_argument("--max-tokens", type=int, default=None,
                          help="most tokens per completion (default: the server's)")
    complete.add_argument("-q", "--quick", metavar="PROMPT", default=None,
                          help="complete this one prompt, print it, exit")
    complete.set_defaults(func=run_complete)


def _add_query_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://localhost:8000/v1",
                   help="the server's OpenAI API base URL (default: %(default)s)")
    p.add_argument("--model-name", default=None,
                   help="the model to ask (default: the first the server lists)")
    p.add_argument("--api-key", default=None,
                   help="the server's API key (default: OPENAI_API_KEY, else none)")
    p.add_argument("--stats", action="store_true",
                   help="print the time to first token and tokens per second of each answer")


class ServerClient:
    """Streaming calls to ``url`` (the OpenAI API base: ``.../v1``)."""

    def __init__(self, url: str, api_key: str | None) -> None:
        key = api_key or os.environ.get("OPENAI_API_KEY")
        self.base = url.rstrip("/")
        self.http = httpx.Client(headers={"Authorization": f"Bearer {key}"} if key else {},
                                 timeout=httpx.Timeout(None, connect=10.0))

    def first_model(self) -> str:
        models = self._checked(lambda: self.http.get(f"{self.base}/models")).json()["data"]
        if not models:
            raise ServerError(f"{self.base}/models lists no model")
        return str(models[0]["id"])

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The chunks of a streamed ``POST path`` (server-sent events up to ``[DONE]``)."""
        url = f"{self.base}{path}"
        try:
            with self.http.stream("POST", url, json={**body, "stream": True}) as resp:
                if resp.status_code != 200:
                    resp.read()
                    raise ServerError(_error_text(resp))
                for line in resp.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    payload = line[len("data: "):]
                    if payload == "[DONE]":
                        return
                    chunk = json.loads(payload)
                    if "error" in chunk:  # an error after the stream began (vLLM's event)
                        raise ServerError(str(chunk["error"].get("message", chunk["error"])))
                    yield chunk
        except httpx.HTTPError as exc:
            raise ServerError(f"cannot reach the server at {url}: {exc}") from exc

    def _checked(self, call: Callable[[], httpx.Response]) -> httpx.Response:
        try:
            resp = call()
        except httpx.HTTPError as exc:
            raise ServerError(f"cannot reach the server at {self.base}: {exc}") from exc
        if resp.status_code != 200:
            raise ServerError(_error_text(resp))
        return resp


def _error_text(resp: httpx.Response) -> str:
    try:
        message = resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = resp.text[:500]
    return f"HTTP {resp.status_code}: {message}"


def print_stream(chunks: Iterator[dict[str, Any]], text_of: Callable[[dict[str, Any]], str],
                 stats: bool) -> str:
    """Print each chunk's text as it arrives; the whole text. With ``stats``, then the time
    to first token and the tokens per second (from the final usage chunk)."""
    start = time.perf_counter()
    first: float | None = None
    tokens = 0
    parts: list[str] = []
    for chunk in chunks:
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        if not chunk.get("choices"):
            continue
        text = text_of(chunk["choices"][0])
        if text:
            first = first if first is not None else time.perf_counter() - start
            parts.append(text)
            print(text, end="", flush=True)
    print()
    total = time.perf_counter() - start
    if stats and first is not None and total > 0:
        print(f"TTFT: {first * 1000:.2f} ms")
        print(f"TPS:  {tokens / total:.2f} tokens/s ({tokens} tokens in {total:.2f}s)")
    return "".join(parts)


def run_chat(args: argparse.Namespace) -> int:
    conversation: list[dict[str, str]] = []
    if args.system_prompt is not None:
        conversation.append({"role": "system", "content": args.system_prompt})

    def answer(client: ServerClient, body: dict[str, Any], message: str) -> None:
        conversation.append({"role": "user", "content": message})
        try:
            text = print_stream(client.stream("/chat/completions",
                                              {**body, "messages": conversation}),
                                lambda choice: choice.get("delta", {}).get("content") or "",
                                args.stats)
        except ServerError:
            conversation.pop()  # the next message goes on from the last answered one
            raise
        conversation.append({"role": "assistant", "content": text})

    return _run(args, "chat", "Please enter a message for the chat model:", answer)


def run_complete(args: argparse.Namespace) -> int:
    def answer(client: ServerClient, body: dict[str, Any], prompt: str) -> None:
        if args.max_tokens is not None:
            body = {**body, "max_tokens": args.max_tokens}
        print_stream(client.stream("/completions", {**body, "prompt": prompt}),
                     lambda choice: choice.get("text") or "", args.stats)

    return _run(args, "complete", "Please enter prompt to complete:", answer)


def _run(args: argparse.Namespace, command: str, invitation: str,
         answer: Callable[[ServerClient, dict[str, Any], str], None]) -> int:
    """``answer`` for ``-q``'s text, else for each line of standard input. Exit status 1 when
    the server cannot be reached or refuses (printed as one line; the loop goes on after a
    refused line), 0 otherwise (end of input or Ctrl-C)."""
    client = ServerClient(args.url, args.api_key)
    try:
        model = args.model_name or client.first_model()
        print(f"Using model: {model}")
        body: dict[str, Any] = {"model": model}
        if args.stats:
            body["stream_options"] = {"include_usage": True}
        if args.quick is not None:
            answer(client, body, args.quick)
            return 0
        print(invitation)
        failed = False
        while True:
            try:
                line = input("> ")
            except EOFError:
                return 1 if failed else 0
            try:
                answer(client, body, line)
            except ServerError as exc:
                print(f"ironlm {command}: error: {exc}", file=sys.stderr)
                failed = True
    except ServerError as exc:
        print(f"ironlm {command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print()
        return 0
    finally:
        client.http.close()
