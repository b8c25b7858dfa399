"""Tokens per engine step, bucketed as vLLM's ``vllm:iteration_tokens_total`` histogram.

The engine observes each step's scheduled tokens (prompt chunks, decodes, drafts): the work
of the step, which is what the histogram's name says. vLLM V1 observes, per step with outputs,
the whole prompt of each request whose prefill finished in it (cached tokens included) plus
the tokens generated, so the two differ with prefix-cache hits, chunked prefill and drafts.
The server exports the cumulative counts from the engine's stats at scrape time (no
observation is lost to a stats reading in between).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

# vLLM V1's buckets (upper bounds; a last one, +Inf, takes the rest)
BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class IterationTokens:
    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # per bucket, the last one +Inf
        self.total = 0  # tokens over all steps
        self.steps = 0

    def observe(self, num_tokens: int) -> None:
        self.counts[bisect_left(BUCKETS, num_tokens)] += 1
        self.total += num_tokens
        self.steps += 1

    def to_dict(self) -> dict[str, Any]:
        """{"buckets": [[upper bound, steps at or below it], ...] (cumulative, +Inf as
        float("inf") last), "sum": tokens, "count": steps}."""
        cumulative, running = [], 0
        for bound, count in zip([*BUCKETS, float("inf")], self.counts):
            running += count
            cumulative.append([bound, running])
        return {"buckets": cumulative, "sum": self.total, "count": self.steps}


def merge_iteration_tokens(histograms: list[dict[str, Any]]) -> dict[str, Any]:
    """Several engines' ``to_dict`` histograms as one (counts, sums and steps added; every
    engine has BUCKETS' bounds)."""
    buckets = [[bound, sum(h["buckets"][i][1] for h in histograms)]
               for i, (bound, _) in enumerate(histograms[0]["buckets"])]
    return {"buckets": buckets, "sum": sum(h["sum"] for h in histograms),
            "count": sum(h["count"] for h in histograms)}
