"""``ironlm run-batch -i INPUT -o OUTPUT --model MODEL [flags]``: vLLM's batch runner (also
``python -m ironlm.entrypoints.openai.run_batch ...``, as vLLM's module).

Every line of an OpenAI batch file (``batch_file``) is answered by the server's own app,
called in process over ASGI (no socket): a line gets exactly what POSTing its body to
``ironlm serve`` would give, the same validation, 400s naming the field, ids and usage. The
engine runs at most ``2 x max_num_seqs`` requests per data-parallel engine at a time (vLLM's
bound), so a large file streams through in input order without queueing it all.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from ironlm.engine.async_engine import EngineDeadError
from ironlm.entrypoints.openai import serving_models
from ironlm.entrypoints.openai.api_server import (
    api_app,
    checked_settings,
    exit_status,
    make_engine_client,
)
from ironlm.entrypoints.openai.argv_expansion import expand_argv
from ironlm.entrypoints.openai.batch_args import DESCRIPTION, add_batch_args, with_server_defaults
from ironlm.entrypoints.openai.batch_file import (
    BatchLine,
    BatchOutput,
    read_batch_file,
    result_line,
)
from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.routes import metrics_router
from ironlm.entrypoints.openai.startup import bind_server_socket
from ironlm.entrypoints.openai.state import random_id

log = logging.getLogger("ironlm.run_batch")

# The endpoints a batch line may name: vLLM's (chat, embeddings, score, rerank) and OpenAI's
# Batch API's /v1/completions.
BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/score",
              "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank")
_PROGRESS_EVERY_S = 10.0
# The engine's queue limit (``--max-waiting-requests`` of the server): run-batch bounds what it
# sends itself, so the engine refuses nothing (a limit would turn lines with n > 1 into 503s).
_ENGINE_QUEUE = 1 << 20


def run_batch(args: argparse.Namespace) -> None:
    """Read and check the input, open the output, load the engine, answer every line, write
    the results. ValueError / OSError for a flag or file that cannot be honoured (before the
    model loads where they can be found then), EngineDeadError when the engine died."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no log line per batch request
    lines = read_batch_file(args.input_file)
    pm, platform, config = checked_settings(args)
    # before the engine's workers take ports (as ironlm serve binds first)
    metrics_sock = bind_server_socket(args.url, args.port) if args.enable_metrics else None
    output = BatchOutput(args.output_file, args.output_tmp_dir)
    engine = make_engine_client(config, pm, _ENGINE_QUEUE, lambda exc: None)
    platform.before_engine_thread()
    try:
        engine.start()
        app = api_app(engine, args, pm)
        serving_models.load_static_loras(app.state.server, app.state.server.options.lora_modules)
        in_flight = 2 * engine.engine.config.max_num_seqs * len(engine.engines)
        asyncio.run(_answer_all(app, lines, output, in_flight, metrics_sock))
    except BaseException:
        output.discard()  # no output file but a finished batch's
        raise
    finally:
        engine.shutdown()
        if metrics_sock is not None:
            metrics_sock.close()
    output.close()  # also with a dead engine: every line has its result
    log.info("batch done: %d results in %s", output.written, args.output_file)
    if engine.fatal_error is not None:
        raise EngineDeadError(f"the engine died: {engine.fatal_error}; the requests it had not "
                              f"answered have an error result in {args.output_file}")


async def _answer_all(app: FastAPI, lines: list[BatchLine], output: BatchOutput,
                      in_flight: int, metrics_sock: Any) -> None:
    """Every line through ``app``, at most ``in_flight`` at a time, results in input order."""
    metrics = None if metrics_sock is None else _MetricsServer(app, metrics_sock)
    slots = asyncio.Semaphore(in_flight)
    progress = _Progress(len(lines))
    engine = app.state.server.engine

    async def answer(index: int, line: BatchLine, client: httpx.AsyncClient) -> None:
        try:
            if engine.fatal_error is not None:  # the lines not sent yet: no engine to run them
                died = APIError(f"the engine died: {engine.fatal_error}", 500)
                result = result_line(line.custom_id, "", 500, died.body())
            else:
                result = await answer_line(client, line)
        except Exception as exc:  # every line gets its result, or the lines after it wait
            log.exception("run-batch: line %d (custom_id %r) failed", index + 1, line.custom_id)
            result = result_line(line.custom_id, "", 500, APIError(str(exc), 500).body())
        finally:
            slots.release()
        output.add(index, result)
        progress.done()

    # the app's unexpected errors are 500 answers (its handlers), not exceptions raised here
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    # lifespan: the periodic stats log line, as the server's
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=transport, base_url="http://run-batch", timeout=None
    ) as client:
        if metrics is not None:
            await metrics.start()
        try:
            tasks = []
            for index, line in enumerate(lines):
                await slots.acquire()
                tasks.append(asyncio.create_task(answer(index, line, client)))
            await asyncio.gather(*tasks)
        finally:
            if metrics is not None:
                await metrics.stop()


async def answer_line(client: httpx.AsyncClient, line: BatchLine) -> dict[str, Any]:
    """The output line for ``line``: the app's answer, or a 400 for a line no endpoint takes
    (a method other than POST, an endpoint run-batch does not serve, a streamed body)."""
    given = line.body.get("request_id")  # the body's own id names the request, as served
    request_id = given if isinstance(given, str) and given else random_id("ironlm-batch")
    refused = _refusal(line)
    if refused is not None:
        return result_line(line.custom_id, request_id, refused.status, refused.body())
    headers = {} if request_id == given else {"X-Request-Id": request_id}
    resp = await client.post(line.url, json=line.body, headers=headers)
    try:
        body = resp.json()
    except ValueError:  # not JSON: no endpoint of the list answers so; kept as text
        body = APIError(resp.text, resp.status_code).body()
    return result_line(line.custom_id, request_id, resp.status_code, body)


def _refusal(line: BatchLine) -> APIError | None:
    if line.method.upper() != "POST":
        return APIError(f"method {line.method!r}: batch requests are POST", 400, param="method")
    if line.url not in BATCH_URLS:
        return APIError(f"URL {line.url} was used. Supported endpoints: "
                        f"{', '.join(BATCH_URLS)}.", 400, param="url")
    if line.body.get("stream"):
        return APIError("Request must not be sent in stream mode", 400, param="stream")
    return None


class _Progress:
    """A log line every ``_PROGRESS_EVERY_S`` seconds and at the end (vLLM shows a bar)."""

    def __init__(self, total: int) -> None:
        self.total, self.finished = total, 0
        self.started = self.last = time.monotonic()

    def done(self) -> None:
        self.finished += 1
        now = time.monotonic()
        if self.finished == self.total or now - self.last >= _PROGRESS_EVERY_S:
            self.last = now
            log.info("run-batch: %d/%d requests done (%.1f s)", self.finished, self.total,
                     now - self.started)


class _MetricsServer:
    """``--enable-metrics``: GET /metrics of the batch's engine at ``--url:--port`` (vLLM's
    Prometheus server of run-batch) while the batch runs; no other route."""

    def __init__(self, app: FastAPI, sock: Any) -> None:
        metrics_app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
        metrics_app.state.server = app.state.server
        metrics_app.include_router(metrics_router)
        self._server = uvicorn.Server(uvicorn.Config(metrics_app, log_level="warning",
                                                     access_log=False))
        self._sock = sock
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve until ``stop``; OSError when the server does not start."""
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if not self._server.started:
            failure = self._task.exception() if not self._task.cancelled() else None
            raise OSError(f"--enable-metrics: the metrics server did not start ({failure!r})")

    async def stop(self) -> None:
        """Stop serving (a failure while it served is logged: the batch's results stand)."""
        self._server.should_exit = True
        if self._task is None:
            return
        try:
            await self._task
        except Exception:
            log.exception("the metrics server failed")


def run_cli(args: argparse.Namespace, prog: str = "ironlm run-batch") -> int:
    """The parsed flags (``batch_args``) run, errors printed as one line (exit status 2 for a
    flag or file, 1 when the engine died)."""
    return exit_status(run_batch, with_server_defaults(args), prog)


def main(argv: list[str] | None = None) -> int:
    """``python -m ironlm.entrypoints.openai.run_batch``: ``ironlm run-batch``'s flags."""
    prog = "python -m ironlm.entrypoints.openai.run_batch"
    parser = add_batch_args(argparse.ArgumentParser(prog=prog, description=DESCRIPTION))
    try:  # vLLM's --foo_bar spelling and --config FILE
        argv = expand_argv(sys.argv[1:] if argv is None else list(argv), parser)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    return run_cli(parser.parse_args(argv), prog)


if __name__ == "__main__":
    sys.exit(main())
