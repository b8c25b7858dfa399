"""Executor: where the engine's workers live (this process, child processes, Ray actors)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from ironlm.interfaces.platform import Availability

if TYPE_CHECKING:  # pytest's pattern: the contract names its host for typing only
    from ironlm.config import EngineConfig
    from ironlm.interfaces.step import ModelInput, ModelOutput
    from ironlm.interfaces.worker import WorkerBase
    from ironlm.plugin_manager import PluginManager


# Worker calls whose ranks meet in collectives (the rendezvous, a step's all-reduces and
# pipeline sends): once one rank fails the others may wait forever, so the executor is dead.
LOCKSTEP_METHODS = frozenset({"init_device", "load_model", "execute_model"})
# After one worker failed any other call, how long the others may take to finish it before
# the executor counts them stuck in a collective (dead); when all finish, the ranks are in
# step and the failure is raised alone (a refused weight update leaves the engine running).
REPLY_AFTER_FAILURE_S = 30.0


class Executor(ABC):
    """Lays out one worker per rank and drives them. Registered through ``register_executors``.

    Constructed by the engine as ``Executor(config, plugins, worker_cls)``: ``worker_cls`` is
    the core's worker (a :class:`~ironlm.interfaces.worker.WorkerBase`), built as
    ``with_extension(worker_cls, config.worker_extension_cls)(config, WorkerRank(...),
    plugins)`` where it runs; ``plugins`` is the engine's
    PluginManager, for workers in the engine's own process (a worker in another process builds
    its own: discovery is per process).

    The engine then calls ``start()``, ``determine_num_kv_blocks()``,
    ``initialize_kv_cache(n)``, and ``execute_model`` once per step.
    """

    name: ClassVar[str]

    def __init__(
        self, config: EngineConfig, plugins: PluginManager, worker_cls: type[WorkerBase]
    ) -> None:
        self.config = config
        self.plugins = plugins
        self.worker_cls = worker_cls

    @classmethod
    def is_available(cls) -> Availability:
        return Availability.yes()

    @abstractmethod
    def start(self) -> None:
        """Create the workers; each runs ``init_device()`` and ``load_model()``."""

    def determine_num_kv_blocks(self) -> int:
        """KV blocks every worker can hold: the minimum over the workers."""
        return min(self.collective_rpc("determine_num_kv_blocks"))

    def initialize_kv_cache(self, num_kv_blocks: int) -> None:
        """Have every worker allocate ``num_kv_blocks`` blocks per attention layer."""
        self.collective_rpc("initialize_kv_cache", num_kv_blocks)

    @abstractmethod
    def execute_model(self, model_input: ModelInput) -> ModelOutput:
        """Run one step on every worker; return the sampling worker's output."""

    @abstractmethod
    def collective_rpc(
        self, method: str | Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> list[Any]:
        """``worker.execute_method(method, *args, **kwargs)`` on every worker (a worker or
        worker-extension method by name, or a callable given the worker first); results in
        rank order."""

    @abstractmethod
    def check_health(self) -> None:
        """Raise RuntimeError when a worker is gone."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers and free their memory. Idempotent."""
