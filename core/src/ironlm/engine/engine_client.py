"""EngineClient: what the server runs requests on, one engine or a data-parallel group.

``AsyncEngine`` (one engine on its thread) and ``DataParallelEngine`` (several) both have
this shape; the server is written against it alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any, Protocol

from ironlm.engine.llm_engine import LLMEngine
from ironlm.outputs import RequestOutput


class EngineClient(Protocol):
    draining: bool  # set at shutdown: new requests get ServerShuttingDownError

    def start(self) -> None:
        """Build the engine(s); raise what building raised."""

    def shutdown(self) -> None: ...

    @property
    def engine(self) -> LLMEngine:
        """The (first) engine: the model's facts (tokenizer, limits, config)."""

    @property
    def engines(self) -> list[LLMEngine]:
        """Every engine, for reads of their state off their threads (``is_sleeping``)."""

    @property
    def is_alive(self) -> bool: ...

    @property
    def fatal_error(self) -> BaseException | None: ...

    @property
    def last_stats(self) -> dict[str, Any]:
        """The engine stats last published (summed over the engines)."""

    @property
    def num_in_flight(self) -> int:
        """Sequences of the requests between generate() entry and their end."""

    def generate(
        self, request_id: str, prompt: Any, params: Any, data_parallel_rank: int | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[RequestOutput]:
        """Queue one request (on engine ``data_parallel_rank``, else the least loaded one);
        its cumulative outputs until finished (see AsyncEngine)."""

    def check_num_seqs(self, params: Any) -> int: ...

    async def compile_guided(self, spec: Any, backend: str | None) -> None: ...

    def abort_all(self, err: Exception) -> None: ...

    def call_all(self, fn: Callable[[LLMEngine], Any]) -> Future[list[Any]]:
        """``fn(engine)`` on every engine's thread: the results in order, or the first
        error once every call has ended."""
