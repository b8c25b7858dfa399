"""Prometheus metrics of one server (one CollectorRegistry per app, never the global one),
under vLLM's names (``vllm:*``): dashboards, alerts and autoscalers written for vLLM work as
they are. A few IronLM extras with no vLLM equivalent keep the ``ironlm:`` prefix.

Engine gauges (running / waiting / swapped requests, device and host KV usage, prefix-cache
hit rate) and the preemption and prefix-cache counters are read from the engine's stats at
scrape time; request histograms (TTFT, inter-token latency, e2e, prompt / generation tokens,
n, best_of, max_tokens, and V1's queue / prefill / decode / inference phases from the
engine's timestamps) and token counters are fed by ``request_tracker.RequestTracker`` as
outputs stream through the server.
With speculative decoding, vLLM's speculative metrics (draft acceptance rate, efficiency,
drafted / accepted / emitted token counters) plus IronLM's mean accepted length, number of
verifications and the seconds spent drafting and in the target are read from the engine's
stats too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from ironlm.engine.data_parallel import merge_stats
from ironlm.engine.engine_client import EngineClient

log = logging.getLogger("ironlm.server")

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # vLLM V1's
# vLLM's 1-2-5 series up to the context length (here: up to 128k tokens)
_TOKEN_BUCKETS = tuple(m * 10**e for e in range(6) for m in (1, 2, 5) if m * 10**e <= 200_000)
_N_BUCKETS = (1, 2, 5, 10, 20)


# engine statistics vLLM exports (the other speculative-decoding ones are IronLM's own)
_VLLM_SPEC = frozenset({
    "spec_decode_draft_acceptance_rate", "spec_decode_efficiency",
    "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
    "spec_decode_num_emitted_tokens",
    "external_prefix_cache_queries", "external_prefix_cache_hits",
})


def _spec_prefix(key: str) -> str:
    return "vllm" if key in _VLLM_SPEC else "ironlm"


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        labels = ["model_name"]
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.swapped = gauge("vllm:num_requests_swapped",
                             "Requests preempted to the host swap space.")
        self.kv_usage = gauge("vllm:gpu_cache_usage_perc",
                              "Device KV-cache usage (1 = 100%; the KV cache of the platform's "
                              "device, the CPU too).")
        # the same reading under the name vLLM exports since 0.10 (the one above is its older)
        self.kv_usage_v1 = gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = 100%).")
        self.cpu_kv_usage = gauge("vllm:cpu_cache_usage_perc",
                                  "Host swap-space usage (1 = 100%).")
        self.prefix_hit_rate = gauge("vllm:gpu_prefix_cache_hit_rate",
                                     "Prefix-cache hits / queries, in prompt tokens.")
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative preemptions.", labels,
                                   registry=reg)
        self._preemptions_seen = 0
        # vLLM's prefix-cache counters (prompt tokens looked up / found), following the
        # engine's totals as the preemption counter does
        self.prefix_query_counter = Counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
            labels, registry=reg)
        self.prefix_hit_counter = Counter(
            "vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", labels,
            registry=reg)
        self._prefix_queries_seen = self._prefix_hits_seen = 0
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels,
                                     registry=reg)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", labels,
                                         registry=reg)
        self.requests = Counter(
            "vllm:request_success", "Finished requests by finish reason.",
            [*labels, "finished_reason"], registry=reg,
        )
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                              _TTFT_BUCKETS)
        self.itl = histogram("vllm:time_per_output_token_seconds", "Inter-token latency.",
                             _ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.",
                             _E2E_BUCKETS)
        self.request_prompt = histogram("vllm:request_prompt_tokens",
                                        "Prompt tokens per finished request.", _TOKEN_BUCKETS)
        self.request_generation = histogram("vllm:request_generation_tokens",
                                            "Generated tokens per finished request.",
                                            _TOKEN_BUCKETS)
        # vLLM V1's phases of a finished request, from the engine's timestamps: waiting
        # (arrival -> first scheduled), prefill (-> first token), decode (-> last token),
        # inference (first scheduled -> last token)
        self.phases = {
            phase: histogram(f"vllm:request_{phase}_time_seconds", doc, _E2E_BUCKETS)
            for phase, doc in (
                ("queue", "Seconds requests waited before they were first scheduled."),
                ("prefill", "Seconds from first scheduled to first token."),
                ("decode", "Seconds from first token to last token."),
                ("inference", "Seconds from first scheduled to last token."),
            )
        }
        self.params_n = histogram("vllm:request_params_n", "The n of finished requests.",
                                  _N_BUCKETS)
        self.params_best_of = histogram("vllm:request_params_best_of",
                                        "The best_of of finished requests.", _N_BUCKETS)
        self.params_max_tokens = histogram("vllm:request_params_max_tokens",
                                           "The max_tokens of finished requests.",
                                           _TOKEN_BUCKETS)
        for counter in (self.preemptions, self.prompt_tokens, self.generation_tokens,
                        self.prefix_query_counter, self.prefix_hit_counter):
            counter.labels(model_name)  # exported as 0 from the start, as vLLM does
        for reason in ("stop", "length", "abort"):
            self.requests.labels(model_name, reason)
        # IronLM extras (no vLLM equivalent)
        self.kv_used = gauge("ironlm:kv_cache_used_blocks", "KV blocks in use.")
        self.kv_total = gauge("ironlm:kv_cache_total_blocks", "KV blocks in the cache.")
        self.prefix_queries = gauge(
            "ironlm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_hits = gauge("ironlm:prefix_cache_hits", "Of those, tokens found cached.")
        # speculative decoding: gauges, and counters advanced by the engine counters' growth
        self.spec_gauges = {
            key: gauge(f"{_spec_prefix(key)}:{key}", doc) for key, doc in (
                ("spec_decode_draft_acceptance_rate", "Accepted / drafted tokens."),
                ("spec_decode_efficiency",
                 "Emitted tokens / the most verifications could emit (k + 1 each)."),
                ("spec_decode_mean_accepted_length",
                 "Tokens one verification emits on average (1 + accepted drafts)."),
            )
        }
        # counters that follow the engine's totals, exported once the engine reports them
        self.engine_counters = {
            key: Counter(f"{_spec_prefix(key)}:{key}", doc, labels, registry=reg) for key, doc in (
                ("spec_decode_num_drafts", "Verifications of at least one draft."),
                ("spec_decode_num_draft_tokens", "Draft tokens verified."),
                ("spec_decode_num_accepted_tokens", "Draft tokens accepted."),
                ("spec_decode_num_emitted_tokens", "Tokens emitted by verifications."),
                ("spec_decode_draft_time_seconds", "Seconds spent drafting."),
                ("spec_decode_target_time_seconds",
                 "Seconds in the target's forward and verification."),
                ("external_prefix_cache_queries",
                 "Prompt tokens looked up in the KV connector's store."),
                ("external_prefix_cache_hits", "Of those, tokens loaded from the store."),
            )
        }
        self._counted: dict[str, float] = {}
        # vLLM's tokens-per-step histogram: the engine keeps the cumulative counts
        self.iteration_tokens = _EngineHistogram(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
            model_name)
        reg.register(self.iteration_tokens)
        # vLLM's lora_requests_info: adapters of running / waiting requests as labels (names,
        # comma-separated), the value the time they were read
        self.lora_info = Gauge(
            "vllm:lora_requests_info", "Running and waiting LoRA adapters.",
            ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=reg,
        )

    def set_engine_stats(self, stats: dict[str, Any]) -> None:
        m = self.model_name
        self.running.labels(m).set(stats.get("num_running", 0))
        self.waiting.labels(m).set(stats.get("num_waiting", 0))
        self.swapped.labels(m).set(stats.get("num_swapped", 0))
        self.kv_usage.labels(m).set(stats.get("kv_usage", 0.0))
        self.kv_usage_v1.labels(m).set(stats.get("kv_usage", 0.0))
        self.cpu_kv_usage.labels(m).set(stats.get("swap_usage", 0.0))
        self.kv_used.labels(m).set(stats.get("num_used_blocks", 0))
        self.kv_total.labels(m).set(stats.get("num_kv_blocks", 0))
        queries, hits = stats.get("prefix_cache_queries", 0), stats.get("prefix_cache_hits", 0)
        self.prefix_queries.labels(m).set(queries)
        self.prefix_hits.labels(m).set(hits)
        self.prefix_hit_rate.labels(m).set(hits / queries if queries else 0.0)
        if queries > self._prefix_queries_seen:
            self.prefix_query_counter.labels(m).inc(queries - self._prefix_queries_seen)
            self._prefix_queries_seen = queries
        if hits > self._prefix_hits_seen:
            self.prefix_hit_counter.labels(m).inc(hits - self._prefix_hits_seen)
            self._prefix_hits_seen = hits
        total = stats.get("num_preemptions", 0)
        if total > self._preemptions_seen:  # the engine counts; the counter follows
            self.preemptions.labels(m).inc(total - self._preemptions_seen)
            self._preemptions_seen = total
        if "iteration_tokens" in stats:
            self.iteration_tokens.latest = stats["iteration_tokens"]
        if "spec_decode_num_draft_tokens" in stats:
            for key, g in self.spec_gauges.items():
                g.labels(m).set(stats[key])
        for key, c in self.engine_counters.items():
            if key not in stats:
                continue
            c.labels(m)  # exported from the first scrape on, 0 until it grows (vLLM)
            grown = stats[key] - self._counted.get(key, 0)
            if grown > 0:
                c.labels(m).inc(grown)
                self._counted[key] = stats[key]
        if "max_lora" in stats:
            self.lora_info.clear()  # one sample: the current adapter sets
            self.lora_info.labels(
                str(stats["max_lora"]), ",".join(stats["waiting_lora_adapters"]),
                ",".join(stats["running_lora_adapters"]),
            ).set(stats.get("time", 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineHistogram(Collector):
    """A histogram the engine counts (cumulative buckets, sum, count in its stats: the
    engine's IterationTokens.to_dict), exported as read at the last scrape."""

    def __init__(self, name: str, doc: str, model_name: str) -> None:
        self.name, self.doc, self.model_name = name, doc, model_name
        self.latest: dict[str, Any] | None = None

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.doc, labels=["model_name"])
        if self.latest is not None:
            buckets = [(_le(bound), count) for bound, count in self.latest["buckets"]]
            family.add_metric([self.model_name], buckets, sum_value=self.latest["sum"])
        yield family


def _le(bound: float) -> str:
    """A bucket's le label as prometheus_client writes it ("8.0", "+Inf")."""
    return "+Inf" if bound == float("inf") else str(float(bound))


async def fresh_stats(engine: EngineClient, timeout: float = 1.0) -> dict[str, Any]:
    """Engine stats taken on the engine thread (exact block counts); the last published
    stats when the engine does not answer within ``timeout`` (a long step)."""
    if not engine.is_alive:
        return engine.last_stats
    pending = asyncio.wrap_future(engine.call_all(lambda e: e.stats()))
    done, _ = await asyncio.wait({pending}, timeout=timeout)  # never cancels the call
    return merge_stats(pending.result()) if done else engine.last_stats


async def log_stats_forever(engine: EngineClient, interval: float = 10.0) -> None:
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
        if "spec_decode_num_draft_tokens" in s:
            log.info(
                "Speculative metrics: Draft acceptance rate: %.3f, Mean accepted length: %.2f, "
                "System efficiency: %.3f, Number of accepted tokens: %d, Number of draft "
                "tokens: %d, Number of emitted tokens: %d, Draft time: %.1f s, Target time: "
                "%.1f s",
                s["spec_decode_draft_acceptance_rate"], s["spec_decode_mean_accepted_length"],
                s["spec_decode_efficiency"], s["spec_decode_num_accepted_tokens"],
                s["spec_decode_num_draft_tokens"], s["spec_decode_num_emitted_tokens"],
                s["spec_decode_draft_time_seconds"], s["spec_decode_target_time_seconds"],
            )
