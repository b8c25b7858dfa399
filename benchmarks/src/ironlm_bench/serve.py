"""``ironlm bench serve``: stream completions from any OpenAI-compatible server and time them.

    ironlm serve M --port 8000 &
    ironlm bench serve --base-url http://127.0.0.1:8000 --model M --tokenizer M \\
        --num-prompts 32 --input-len 64 --output-len 64 --max-concurrency 8

Requests are sent at ``--request-rate`` (Poisson arrivals, seeded; default: all at once), at
most ``--max-concurrency`` in flight. Each streams (SSE) and is timed on the client: TTFT
(first content chunk), ITL (between content chunks), TPOT ((e2e - TTFT) / (tokens - 1)) and
end-to-end latency. Output token counts come from the final usage chunk when the server sends
one, else from the number of content chunks. Failed requests are counted, never retried.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ironlm_bench.machine import describe_machine
from ironlm_bench.prompts import random_token_prompts
from ironlm_bench.results import args_dict, result_path, write_result
from ironlm_bench.stats import summarize


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    parser.add_argument("--endpoint", default="/v1/completions",
                        help="/v1/completions or /v1/chat/completions (default: %(default)s)")
    parser.add_argument("--model", required=True, help="model name the server serves")
    parser.add_argument("--tokenizer", default=None,
                        help="HF tokenizer folder for random prompts (default: --model, when "
                        "it is a local folder)")
    parser.add_argument("--api-key", default=None, help="sent as a Bearer token")
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--input-len", type=int, default=64, help="random prompt tokens")
    parser.add_argument("--output-len", type=int, default=64, help="max_tokens per request")
    parser.add_argument("--dataset", default=None, help="text file, one prompt per line")
    parser.add_argument("--prompt-format", choices=("ids", "text"), default="ids",
                        help="send random prompts as token ids (exact lengths) or as decoded "
                        "text, for servers that take text only (chat always sends text)")
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="requests per second, Poisson arrivals (default: all at once)")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="most requests in flight (default: no limit)")
    parser.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                        help="send ignore_eos (vLLM extension), so every request makes "
                        "--output-len tokens (default: %(default)s)")
    parser.add_argument("--extra-body", type=json.loads, default=None,
                        help="JSON object merged into every request body")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result-dir", default="benchmarks/results")
    parser.add_argument("--result-file", default=None, help="JSON result path")


@dataclass
class RequestResult:
    ok: bool = False
    error: str | None = None
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None


def _content(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return choice["delta"].get("content") or ""
    return choice.get("text") or ""


async def send_request(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                       headers: dict[str, str]) -> RequestResult:
    res = RequestResult()
    chunks = 0
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                res.error = f"HTTP {resp.status_code}: {text[:300]}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = json.dumps(chunk["error"])[:300]
                    return res
                usage = chunk.get("usage")
                if usage:
                    res.output_tokens = int(usage.get("completion_tokens") or 0)
                    res.prompt_tokens = usage.get("prompt_tokens")
                if _content(chunk):
                    now = time.perf_counter()
                    if chunks == 0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last, chunks = now, chunks + 1
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    res.e2e = time.perf_counter() - start
    res.output_tokens = res.output_tokens or chunks
    res.ok = chunks > 0
    if not res.ok:
        res.error = "the stream held no content"
    return res


def request_body(args: argparse.Namespace, prompt: list[int] | str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": args.model, "max_tokens": args.output_len, "temperature": 0.0,
        "stream": True, "stream_options": {"include_usage": True},
    }
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.endpoint.rstrip("/").endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(args.extra_body or {})
    return body


def make_prompts(args: argparse.Namespace) -> list[list[int]] | list[str]:
    if args.dataset:
        lines = [ln.strip() for ln in Path(args.dataset).read_text().splitlines() if ln.strip()]
        if not lines:
            raise ValueError(f"{args.dataset}: no prompts")
        return [lines[i % len(lines)] for i in range(args.num_prompts)]
    name = args.tokenizer or args.model
    if not Path(name).exists():
        raise ValueError("random prompts need a tokenizer: pass --tokenizer (an HF folder) "
                         "or --dataset prompts.txt")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name)
    ids = random_token_prompts(args.num_prompts, args.input_len, tokenizer, args.seed)
    chat = args.endpoint.rstrip("/").endswith("chat/completions")
    if args.prompt_format == "text" or chat:
        return [tokenizer.decode(p) for p in ids]
    return ids


async def run_requests(
    args: argparse.Namespace, prompts: list[Any]
) -> tuple[list[RequestResult], float]:
    url = args.base_url.rstrip("/") + args.endpoint
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limit = args.max_concurrency or len(prompts)
    gate = asyncio.Semaphore(limit)
    rng = random.Random(args.seed)
    timeout = httpx.Timeout(args.timeout, connect=30.0)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(
            max_connections=limit, max_keepalive_connections=limit)) as client:

        async def gated(prompt: Any) -> RequestResult:
            async with gate:
                return await send_request(client, url, request_body(args, prompt), headers)

        start = time.perf_counter()
        tasks = []
        for i, prompt in enumerate(prompts):
            if i and args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
            tasks.append(asyncio.create_task(gated(prompt)))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def summarize_results(results: list[RequestResult], duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    ms = 1000.0
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) * ms for r in ok if r.output_tokens > 1]
    pct = (50, 90, 99)
    prompt_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return {
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "error_messages": sorted({r.error for r in results if r.error})[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_tok_s": out_tokens / duration,
        "total_output_tokens": out_tokens,
        "total_prompt_tokens": sum(prompt_tokens) if prompt_tokens else None,
        "ttft_ms": summarize([r.ttft * ms for r in ok], pct),
        "tpot_ms": summarize(tpot, pct),
        "itl_ms": summarize([x * ms for r in ok for x in r.itl], pct),
        "e2e_ms": summarize([r.e2e * ms for r in ok], pct),
    }


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"successful requests:      {s['completed']}",
        f"failed requests:          {s['errors']}",
        f"duration (s):             {s['duration_s']:.2f}",
        f"request throughput (/s):  {s['request_throughput']:.3f}",
        f"output tok/s:             {s['output_tok_s']:.2f}",
    ]
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"),
                       ("e2e_ms", "E2E")):
        v = s[key]
        lines.append(f"{label + ' (ms)':<26}mean {v['mean']:.1f}  p50 {v['p50']:.1f}  "
                     f"p90 {v['p90']:.1f}  p99 {v['p99']:.1f}")
    lines += [f"error: {m}" for m in s["error_messages"]]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    try:
        prompts = make_prompts(args)
    except (ValueError, OSError) as exc:
        print(f"ironlm bench serve: {exc}", file=sys.stderr)
        return 2
    machine = describe_machine(threads=None)  # the client's machine; the server's may differ
    results, duration = asyncio.run(run_requests(args, prompts))
    summary = summarize_results(results, duration)
    print(format_summary(summary))
    payload = {"kind": "serve", "machine": machine, "args": args_dict(args), **summary}
    path = write_result(args.result_file or result_path(args.result_dir, "serve", args.model),
                        payload)
    print(f"result: {path}")
    return 0 if summary["completed"] else 1
