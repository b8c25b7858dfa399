"""The worker's sleep-mode and weight methods (vLLM's names; the engine reaches them through
``collective_rpc``), mixed into ``Worker``: sleep and wake-up (``ironlm.worker.sleep``), the
checkpoint's weights again, and the model for user functions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ironlm.interfaces.model import WEIGHTS_ASLEEP, ModelArchitecture, ModelContext
from ironlm.interfaces.quantization import UnquantizedMethod
from ironlm.model_loader import ModelSource, reload_checkpoint
from ironlm.worker.sleep import SleepingMemory, SleepReport

if TYPE_CHECKING:
    from ironlm.config import EngineConfig
    from ironlm.interfaces.platform import Platform
    from ironlm.worker.model_runner import ModelRunner


class WeightCalls:
    config: EngineConfig
    ctx: ModelContext
    source: ModelSource
    _asleep: SleepingMemory
    platform: Platform  # the worker's properties
    model_runner: ModelRunner

    def sleep(self, level: int = 1) -> SleepReport:
        """Free the KV cache, and offload (level 1) or discard (level 2) the weights
        (``ironlm.worker.sleep``)."""
        if level == 2 and self.ctx.quantization.name != UnquantizedMethod.name:
            raise ValueError(
                f"sleep level 2 discards the weights, and a model quantized with "
                f"{self.ctx.quantization.name!r} cannot load new ones; use level 1"
            )
        runner = self.model_runner
        if runner.graphs is not None:
            runner.graphs.forget()  # the addresses they recorded are about to go
        try:
            report = self._asleep.sleep(level, list(runner.model.parameters()),
                                        runner.kv_caches, runner.swap_caches)
        finally:
            runner.model.weights_asleep = self._asleep.asleep("weights")
        self.platform.release_memory()
        return report

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Allocate what ``sleep`` freed again: ``tags`` among SLEEP_TAGS (None: all)."""
        try:
            self._asleep.wake_up(tags)
        finally:
            self.model_runner.model.weights_asleep = self._asleep.asleep("weights")

    def sleeping_tags(self) -> list[str]:
        """The tags this worker holds freed (after a sleep that failed halfway too)."""
        return sorted(self._asleep.freed)

    def reload_weights(self) -> None:
        """The checkpoint's weights again, in place (vLLM's)."""
        reload_checkpoint(self.get_model(), self.source, self.ctx, self.config.load_format)

    def get_model(self) -> ModelArchitecture:
        """This rank's model (its shard and stage), vLLM's name."""
        return self.model_runner.model

    def apply_model(self, func: Callable[[ModelArchitecture], Any]) -> Any:
        """``func(model)`` on this rank's model (``LLM.apply_model``); refused while its
        weights sleep (their storages are empty)."""
        model = self.get_model()
        if model.weights_asleep:
            raise ValueError(WEIGHTS_ASLEEP)
        return func(model)
