"""DataParallelEngine: vLLM's data parallelism with internal load balancing (``serve -dp N``).

N engines of one model behind one server, each an ``AsyncEngine`` with its own engine thread,
scheduler, KV cache and prefix cache, and its own ``tensor_parallel_size x
pipeline_parallel_size`` workers (``EngineConfig.data_parallel_rank`` tells them apart). Their
workers all run out of this process (``mp`` child processes, or Ray actors), so the engines'
forward passes run in parallel; what they share here is scheduling and output processing.

A request goes to the engine with the fewest sequences in flight (ties: the one after the
engine last chosen), vLLM's balancing on its engines' running and waiting queues, counted as
requests enter and leave (no stats round trip). Calls that change what the model serves (LoRA
adapters, sleep and wake-up, prefix-cache resets, ``collective_rpc``) run on every engine
(``call_all``); statistics are summed over the engines (``merge_stats``). The server reads the
model's facts (tokenizer, limits, config) from engine 0: every engine loads the same model.
If any engine dies, the group is dead and the server exits, as vLLM's does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

from ironlm.engine.async_engine import AsyncEngine
from ironlm.engine.futures import gather
from ironlm.engine.iteration_tokens import merge_iteration_tokens
from ironlm.engine.llm_engine import LLMEngine
from ironlm.engine.speculation import SpecDecodeStats
from ironlm.outputs import RequestOutput

# LLMEngine.stats keys that are totals over the engines (the rest: derived again below, or
# engine 0's: the same on every engine); a new stats key needs its place here or below
_SUMMED = ("num_running", "num_waiting", "num_kv_blocks", "num_used_blocks",
           "prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "num_swap_outs",
           "num_swapped", "num_swap_blocks", "external_prefix_cache_queries",
           "external_prefix_cache_hits")
_SPEC_COUNTERS = {"spec_decode_num_drafts": "num_drafts",
                  "spec_decode_num_draft_tokens": "num_draft_tokens",
                  "spec_decode_num_accepted_tokens": "num_accepted_tokens",
                  "spec_decode_num_emitted_tokens": "num_emitted_tokens",
                  "spec_decode_draft_time_seconds": "draft_time",
                  "spec_decode_target_time_seconds": "target_time"}


class DataParallelEngine:
    def __init__(
        self,
        builds: list[Callable[[], LLMEngine]],
        max_waiting: int = 1024,
        on_dead: Callable[[BaseException], None] | None = None,
    ) -> None:
        # one AsyncEngine per data-parallel rank; builds[i] builds rank i's LLMEngine
        self.ranks = [AsyncEngine(build, max_waiting, on_dead) for build in builds]
        self._last = -1  # the rank the last request went to

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Build every engine at once (each on its own thread, its workers loading in
        parallel); if one fails, the others are shut down and its error is raised."""
        for rank in self.ranks:
            rank.begin_start()
        errors: list[BaseException] = []
        for rank in self.ranks:
            try:
                rank.wait_started()
            except BaseException as exc:
                errors.append(exc)
        if errors:
            self.shutdown()
            raise errors[0]

    def shutdown(self) -> None:
        for rank in self.ranks:
            rank.shutdown()

    @property
    def engine(self) -> LLMEngine:
        """Engine 0's LLMEngine: the model's facts (tokenizer, limits, config) for the server."""
        return self.ranks[0].engine

    @property
    def engines(self) -> list[LLMEngine]:
        return [rank.engine for rank in self.ranks]

    @property
    def is_alive(self) -> bool:
        return all(rank.is_alive for rank in self.ranks)

    @property
    def fatal_error(self) -> BaseException | None:
        return next((r.fatal_error for r in self.ranks if r.fatal_error is not None), None)

    @property
    def draining(self) -> bool:
        return self.ranks[0].draining

    @draining.setter
    def draining(self, value: bool) -> None:
        for rank in self.ranks:
            rank.draining = value

    # -- requests --------------------------------------------------------------------------
    async def generate(
        self, request_id: str, prompt: Any, params: Any, data_parallel_rank: int | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[RequestOutput]:
        """``AsyncEngine.generate`` on engine ``data_parallel_rank`` (vLLM's pinning, for a
        router that knows better), else on the least loaded one (see the module's text),
        picked when the first output is asked for: the engine counts the request as in flight
        before anything awaits, so a burst of requests spreads over the engines."""
        if data_parallel_rank is None:
            data_parallel_rank = self._pick()
        elif not 0 <= data_parallel_rank < len(self.ranks):
            raise ValueError(f"data_parallel_rank {data_parallel_rank} is out of range "
                             f"[0, {len(self.ranks)})")
        inner = self.ranks[data_parallel_rank].generate(request_id, prompt, params, **kwargs)
        try:
            async for out in inner:
                yield out
        finally:
            await inner.aclose()  # its abort-on-disconnect now, not at garbage collection

    def _pick(self) -> int:
        n = len(self.ranks)
        order = [(self._last + 1 + i) % n for i in range(n)]  # ties: round robin
        self._last = min(order, key=lambda i: self.ranks[i].num_in_flight)
        return self._last

    @property
    def num_in_flight(self) -> int:
        return sum(rank.num_in_flight for rank in self.ranks)

    def check_num_seqs(self, params: Any) -> int:
        return self.ranks[0].check_num_seqs(params)  # every engine has the same capacity

    async def compile_guided(self, spec: Any, backend: str | None) -> None:
        """Validate a guided spec (engine 0 compiles it; the engine a request goes to compiles
        it again into its own cache when the request is added)."""
        await self.ranks[0].compile_guided(spec, backend)

    def abort_all(self, err: Exception) -> None:
        for rank in self.ranks:
            rank.abort_all(err)

    # -- calls on the engines ----------------------------------------------------------------
    def call_all(self, fn: Callable[[LLMEngine], Any]) -> Future[list[Any]]:
        """``fn(engine)`` on every engine's thread; the results in rank order, or the first
        error once every call has ended."""
        return gather([rank.call(fn) for rank in self.ranks])

    @property
    def last_stats(self) -> dict[str, Any]:
        return merge_stats([rank.last_stats for rank in self.ranks])


def merge_stats(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine-stats dict (``LLMEngine.stats``) for several engines: counts and counters
    summed, usage fractions over the summed blocks, the tokens-per-step histogram and the
    speculative-decoding counters summed (their rates derived again), the LoRA adapters in
    use on any engine."""
    if len(stats) == 1:
        return stats[0]
    if not all(stats):  # an engine not built yet: no total to give
        return {}
    out = dict(stats[0])
    for key in _SUMMED:
        if key in out:
            out[key] = sum(s[key] for s in stats)
    out["kv_usage"] = out["num_used_blocks"] / max(1, out["num_kv_blocks"])
    out["swap_usage"] = sum(s["swap_usage"] * s["num_swap_blocks"] for s in stats) / max(
        1, out["num_swap_blocks"])
    out["time"] = max(s["time"] for s in stats)
    out["iteration_tokens"] = merge_iteration_tokens([s["iteration_tokens"] for s in stats])
    if "spec_decode_num_drafts" in out:
        spec = SpecDecodeStats(**{field: sum(s[key] for s in stats)
                                  for key, field in _SPEC_COUNTERS.items()})
        out.update(spec.to_dict())
    for key in ("running_lora_adapters", "waiting_lora_adapters"):
        if key in out:
            out[key] = sorted({name for s in stats for name in s[key]})
    return out
