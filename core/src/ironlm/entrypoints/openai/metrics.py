"""Prometheus metrics of one server (one CollectorRegistry per app, never the global one).

Engine gauges (running / waiting requests, KV usage and blocks, prefix-cache hit rate) are read
from the engine's stats at scrape time; request histograms (TTFT, inter-token latency, e2e)
and token counters are fed by ``RequestTracker`` as outputs stream through the server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ironlm.engine.async_engine import AsyncEngine
from ironlm.outputs import RequestOutput

log = logging.getLogger("ironlm.server")

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        labels = ["model_name"]
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg)

        self.running = gauge("ironlm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("ironlm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("ironlm:kv_cache_usage_perc", "KV-cache usage (1 = 100%).")
        self.kv_used = gauge("ironlm:kv_cache_used_blocks", "KV blocks in use.")
        self.kv_total = gauge("ironlm:kv_cache_total_blocks", "KV blocks in the cache.")
        self.prefix_hit_rate = gauge(
            "ironlm:prefix_cache_hit_rate", "Prefix-cache hits / queries, in prompt tokens."
        )
        self.prefix_queries = gauge(
            "ironlm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_hits = gauge("ironlm:prefix_cache_hits", "Of those, tokens found cached.")
        self.preemptions = gauge("ironlm:num_preemptions", "Preemptions since start.")
        # vLLM's lora_requests_info: adapters of running / waiting requests as labels (names,
        # comma-separated), the value the time they were read
        self.lora_info = Gauge(
            "ironlm:lora_requests_info", "Running and waiting LoRA adapters.",
            ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=reg,
        )
        self.prompt_tokens = Counter(
            "ironlm:prompt_tokens", "Prefill tokens processed.", labels, registry=reg
        )
        self.generation_tokens = Counter(
            "ironlm:generation_tokens", "Generated tokens.", labels, registry=reg
        )
        self.requests = Counter(
            "ironlm:request_success", "Finished requests by finish reason.",
            [*labels, "finished_reason"], registry=reg,
        )
        self.ttft = Histogram(
            "ironlm:time_to_first_token_seconds", "Time to first token.", labels,
            buckets=_TTFT_BUCKETS, registry=reg,
        )
        self.itl = Histogram(
            "ironlm:time_per_output_token_seconds", "Inter-token latency.", labels,
            buckets=_ITL_BUCKETS, registry=reg,
        )
        self.e2e = Histogram(
            "ironlm:e2e_request_latency_seconds", "End-to-end request latency.", labels,
            buckets=_E2E_BUCKETS, registry=reg,
        )

    def set_engine_stats(self, stats: dict[str, Any]) -> None:
        m = self.model_name
        self.running.labels(m).set(stats.get("num_running", 0))
        self.waiting.labels(m).set(stats.get("num_waiting", 0))
        self.kv_usage.labels(m).set(stats.get("kv_usage", 0.0))
        self.kv_used.labels(m).set(stats.get("num_used_blocks", 0))
        self.kv_total.labels(m).set(stats.get("num_kv_blocks", 0))
        queries, hits = stats.get("prefix_cache_queries", 0), stats.get("prefix_cache_hits", 0)
        self.prefix_queries.labels(m).set(queries)
        self.prefix_hits.labels(m).set(hits)
        self.prefix_hit_rate.labels(m).set(hits / queries if queries else 0.0)
        self.preemptions.labels(m).set(stats.get("num_preemptions", 0))
        if "max_lora" in stats:
            self.lora_info.clear()  # one sample: the current adapter sets
            self.lora_info.labels(
                str(stats["max_lora"]), ",".join(stats["waiting_lora_adapters"]),
                ",".join(stats["running_lora_adapters"]),
            ).set(stats.get("time", 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def fresh_stats(engine: AsyncEngine, timeout: float = 1.0) -> dict[str, Any]:
    """Engine stats taken on the engine thread (exact block counts); the last published
    stats when the engine does not answer within ``timeout`` (a long step)."""
    if not engine.is_alive:
        return engine.last_stats
    pending = asyncio.wrap_future(engine.call(lambda e: e.stats()))
    done, _ = await asyncio.wait({pending}, timeout=timeout)  # never cancels the call
    return pending.result() if done else engine.last_stats


class RequestTracker:
    """Observes one engine request's outputs: TTFT, inter-token latency, e2e, token counts."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.arrival = time.monotonic()
        self.last: float | None = None
        self.num_tokens = 0
        self.prompt_counted = False

    def observe(self, out: RequestOutput) -> None:
        m, name = self.metrics, self.metrics.model_name
        now = time.monotonic()
        if not self.prompt_counted:
            self.prompt_counted = True
            m.prompt_tokens.labels(name).inc(len(out.prompt_token_ids))
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
            m.e2e.labels(name).observe(now - self.arrival)
            for o in out.outputs or [None]:
                reason = (o.finish_reason if o is not None else None) or "stop"
                m.requests.labels(name, reason).inc()

    def aborted(self) -> None:
        self.metrics.requests.labels(self.metrics.model_name, "abort").inc()


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


async def log_stats_forever(engine: AsyncEngine, interval: float = 10.0) -> None:
    """vLLM's periodic stats line (off with --disable-log-stats)."""
    while True:
        await asyncio.sleep(interval)
        s = engine.last_stats
        log.info(
            "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, "
            "Prefix cache hit rate: %.1f%%",
            s.get("num_running", 0), s.get("num_waiting", 0), 100 * s.get("kv_usage", 0.0),
            100 * (s.get("prefix_cache_hits", 0) / max(1, s.get("prefix_cache_queries", 0))),
        )
