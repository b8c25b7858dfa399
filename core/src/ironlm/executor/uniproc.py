"""Executor ``uni``: one worker in the engine's own process."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from ironlm.config import EngineConfig
from ironlm.interfaces.executor import Executor
from ironlm.interfaces.step import ModelInput, ModelOutput
from ironlm.interfaces.worker import WorkerBase, WorkerRank, with_extension
from ironlm.plugin_manager import PluginManager


class UniProcExecutor(Executor):
    name: ClassVar[str] = "uni"

    def __init__(
        self, config: EngineConfig, plugins: PluginManager, worker_cls: type[WorkerBase]
    ) -> None:
        super().__init__(config, plugins, worker_cls)
        if config.world_size != 1:
            raise ValueError(
                "distributed_executor_backend 'uni' runs one worker; "
                f"tensor_parallel_size={config.tensor_parallel_size} x "
                f"pipeline_parallel_size={config.pipeline_parallel_size} needs 'mp' or 'ray'"
            )
        self.worker: WorkerBase | None = None

    def start(self) -> None:
        cls = with_extension(self.worker_cls, self.config.worker_extension_cls)
        worker = cls(self.config, WorkerRank(rank=0, world_size=1, local_rank=0),
                                 self.plugins)
        worker.init_device()
        worker.load_model()
        self.worker = worker

    def _worker(self) -> WorkerBase:
        if self.worker is None:
            raise RuntimeError("executor is not started (or was shut down)")
        return self.worker

    def execute_model(self, model_input: ModelInput) -> ModelOutput:
        output = self._worker().execute_model(model_input)
        assert output is not None, "the only worker samples"
        return output

    def collective_rpc(
        self, method: str | Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> list[Any]:
        return [self._worker().execute_method(method, *args, **kwargs)]

    def check_health(self) -> None:
        self._worker().check_health()

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
        self.worker = None
