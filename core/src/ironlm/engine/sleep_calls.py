"""vLLM's sleep-mode engine methods (sleep, wake_up, is_sleeping), mixed into ``LLMEngine``:
every worker frees its KV cache and offloads or discards its weights (``ironlm.worker.sleep``)
while no request runs; requests are refused until every tag is awake again."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ironlm.interfaces.worker import SLEEP_TAGS

if TYPE_CHECKING:
    from ironlm.config import EngineConfig
    from ironlm.engine.block_manager import BlockManager
    from ironlm.engine.scheduler import Scheduler
    from ironlm.interfaces.executor import Executor

log = logging.getLogger("ironlm.engine")


class EngineSleepingError(RuntimeError):
    """A request came while the engine sleeps; the server answers 503."""


class SleepCalls:
    config: EngineConfig
    executor: Executor
    scheduler: Scheduler
    block_manager: BlockManager
    sleeping_tags: set[str]  # what is asleep: SLEEP_TAGS after sleep(), less what woke

    def sleep(self, level: int = 1) -> None:
        """Level 1: free the KV cache and offload the weights to host memory (where they are
        already, on the cpu platform, they stay); level 2: discard the weights too (they are
        zeros after wake-up until new ones are loaded). The prefix cache is forgotten.
        Asleep already: nothing happens (vLLM's, logged). ValueError without
        enable_sleep_mode or while requests run. Should a worker fail, what any rank freed
        counts as asleep (all of it, when the workers cannot say): ``wake_up()`` takes it
        back."""
        if not self.config.enable_sleep_mode:
            raise ValueError("sleep mode is not enabled: start the engine with "
                             "enable_sleep_mode=True (--enable-sleep-mode)")
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}")
        if self.sleeping_tags:
            log.warning("sleep: the engine is asleep already (%s)", sorted(self.sleeping_tags))
            return
        if self.scheduler.has_unfinished():
            raise ValueError("sleep: requests are running; let them finish or abort them first")
        self.block_manager.reset_prefix_cache()
        self.sleeping_tags = set(SLEEP_TAGS)  # from here on, whatever the workers answer
        try:
            reports = self.executor.collective_rpc("sleep", level)
        except BaseException:
            try:  # what some rank freed before the failure stays asleep
                asleep = self.executor.collective_rpc("sleeping_tags")
                self.sleeping_tags = {tag for tags in asleep for tag in tags}
            except Exception:  # noqa: S110  the workers cannot say: all counts as asleep
                pass
            raise
        mib = 1 << 20
        for tag in SLEEP_TAGS:
            log.info("sleep level %d: %s freed %.1f MiB, kept %.1f MiB (all ranks)", level, tag,
                     sum(r.freed[tag] for r in reports) / mib,
                     sum(r.kept[tag] for r in reports) / mib)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back what ``sleep`` freed: ``tags`` among "weights" and "kv_cache" (None:
        both; vLLM's, so new weights can be loaded before the KV cache is allocated)."""
        unknown = sorted(set(tags or ()) - set(SLEEP_TAGS))
        if unknown:
            raise ValueError(f"wake_up: unknown tags {unknown}; valid: {list(SLEEP_TAGS)}")
        self.executor.collective_rpc("wake_up", tags)  # on every rank, or it raises
        self.sleeping_tags -= set(tags if tags is not None else SLEEP_TAGS)

    def is_sleeping(self) -> bool:
        """Whether some tag is still asleep (requests are refused until none is)."""
        return bool(self.sleeping_tags)

    def _check_awake(self) -> None:
        if self.sleeping_tags:
            raise EngineSleepingError(
                f"the engine is sleeping ({sorted(self.sleeping_tags)} asleep): call "
                "wake_up() before adding requests"
            )
