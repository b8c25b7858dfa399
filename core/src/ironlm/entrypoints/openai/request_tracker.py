"""Per-request observations for the server's metrics (``metrics.ServerMetrics``): a
``RequestTracker`` watches one engine request's outputs as they stream through an endpoint
(``tracked``) and records its latencies, token counts, sizes and phases."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from ironlm.entrypoints.openai.metrics import ServerMetrics
from ironlm.outputs import RequestOutput


class RequestTracker:
    """Observes one engine request's outputs: TTFT, inter-token latency, e2e, token counts,
    and at the end the request's sizes (prompt / generated tokens, n, best_of, max_tokens)."""

    def __init__(self, metrics: ServerMetrics, n: int = 1, best_of: int | None = None,
                 max_tokens: int | None = None,
                 on_finish: Callable[[RequestOutput], None] | None = None) -> None:
        self.metrics = metrics
        self.on_finish = on_finish  # told the request's last output (output logging)
        self.n = n
        self.best_of = best_of or n
        self.max_tokens = max_tokens  # the request's limit as the engine ran it
        self.arrival = time.monotonic()
        self.last: float | None = None
        self.num_tokens = 0
        self.prompt_counted = False

    def observe(self, out: RequestOutput) -> None:
        m, name = self.metrics, self.metrics.model_name
        now = time.monotonic()
        if not self.prompt_counted:
            self.prompt_counted = True
            m.prompt_tokens.labels(name).inc(out.num_prompt_tokens)
        total = sum(len(o.token_ids) for o in out.outputs)
        new = total - self.num_tokens
        if new > 0:
            if self.last is None:
                m.ttft.labels(name).observe(now - self.arrival)
            else:
                m.itl.labels(name).observe((now - self.last) / new)
            m.generation_tokens.labels(name).inc(new)
            self.num_tokens = total
            self.last = now
        if out.finished:
            if self.on_finish is not None:
                self.on_finish(out)
            m.e2e.labels(name).observe(now - self.arrival)
            m.request_prompt.labels(name).observe(out.num_prompt_tokens)
            m.request_generation.labels(name).observe(total)
            m.params_n.labels(name).observe(self.n)
            m.params_best_of.labels(name).observe(self.best_of)
            if self.max_tokens is not None:
                m.params_max_tokens.labels(name).observe(self.max_tokens)
            for phase, seconds in _phases(out.metrics).items():
                m.phases[phase].labels(name).observe(seconds)
            for o in out.outputs or [None]:
                reason = (o.finish_reason if o is not None else None) or "stop"
                m.requests.labels(name, reason).inc()

    def aborted(self) -> None:
        self.metrics.requests.labels(self.metrics.model_name, "abort").inc()


def _phases(times: dict[str, float]) -> dict[str, float]:
    """Seconds in each phase a finished request's engine timestamps cover (vLLM V1's)."""
    arrival, scheduled = times.get("arrival_time"), times.get("first_scheduled_time")
    first, last = times.get("first_token_time"), times.get("last_token_time")
    out: dict[str, float] = {}
    if arrival is not None and scheduled is not None:
        out["queue"] = scheduled - arrival
    if scheduled is not None and first is not None:
        out["prefill"] = first - scheduled
    if first is not None and last is not None:
        out["decode"] = last - first
    if scheduled is not None and last is not None:
        out["inference"] = last - scheduled
    return {phase: max(0.0, seconds) for phase, seconds in out.items()}


async def tracked(
    gen: AsyncIterator[RequestOutput], tracker: RequestTracker
) -> AsyncIterator[RequestOutput]:
    """``gen`` with every output observed by ``tracker``; closing this closes ``gen`` (which
    aborts the engine request when it has not finished)."""
    finished = False
    try:
        async for out in gen:
            tracker.observe(out)
            finished = out.finished
            yield out
    except (asyncio.CancelledError, GeneratorExit):  # client gone: counted as aborted
        if not finished:
            tracker.aborted()
        raise
    finally:
        await gen.aclose()  # type: ignore[attr-defined]
