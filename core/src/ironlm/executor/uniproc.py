"""Executor ``uni``: one worker in the engine's own process."""

from __future__ import annotations

from typing import Any, ClassVar

from ironlm.engine.config import EngineConfig
from ironlm.engine.model_input import ModelInput, ModelOutput
from ironlm.engine.model_runner import ModelRunner
from ironlm.interfaces.executor import Executor
from ironlm.plugin_manager import PluginManager


class UniProcExecutor(Executor):
    name: ClassVar[str] = "uni"

    def __init__(self, config: EngineConfig, pm: PluginManager | None = None) -> None:
        super().__init__(config)
        if config.tensor_parallel_size != 1:
            raise ValueError(
                "distributed_executor_backend 'uni' runs one worker; "
                f"tensor_parallel_size={config.tensor_parallel_size} needs 'mp' or 'ray'"
            )
        self._pm = pm or PluginManager()
        self.runner: ModelRunner | None = None
        self._num_blocks = 0

    def start(self) -> None:
        self.runner = ModelRunner(self.config, self._pm, rank=0)
        self._num_blocks = self.runner.determine_num_blocks()
        self.runner.allocate_kv_cache(self._num_blocks)

    @property
    def num_kv_blocks(self) -> int:
        return self._num_blocks

    def _runner(self) -> ModelRunner:
        if self.runner is None:
            raise RuntimeError("executor is not started (or was shut down)")
        return self.runner

    def execute_model(self, model_input: ModelInput) -> ModelOutput:
        return self._runner().execute(model_input)

    def collective_rpc(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [getattr(self._runner(), method)(*args, **kwargs)]

    def check_health(self) -> None:
        self._runner()

    def shutdown(self) -> None:
        self.runner = None
