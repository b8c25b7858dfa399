"""Executor: how the engine's workers are laid out (in-process, processes, Ray)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from ironlm.interfaces.platform import Availability

if TYPE_CHECKING:
    from ironlm.engine.config import EngineConfig
    from ironlm.engine.model_input import ModelInput, ModelOutput
    from ironlm.plugin_manager import PluginManager


class Executor(ABC):
    """Runs the model runner on one or more workers. Registered through ``register_executors``.

    Constructed as ``Executor(config, plugin_manager)`` by the engine, then ``start()``; each
    engine step calls ``execute_model`` with the step's host-side input and gets sampled tokens
    back. Workers in other processes build their own PluginManager (discovery is per process).
    """

    name: ClassVar[str]

    def __init__(self, config: EngineConfig, pm: PluginManager | None = None) -> None:
        self.config = config

    @classmethod
    def is_available(cls) -> Availability:
        return Availability.yes()

    @abstractmethod
    def start(self) -> None:
        """Create the workers, load the model, allocate the KV cache (``num_kv_blocks``)."""

    @property
    @abstractmethod
    def num_kv_blocks(self) -> int:
        """KV blocks each worker allocated (the same on every worker)."""

    @abstractmethod
    def execute_model(self, model_input: ModelInput) -> ModelOutput:
        """Run one forward + sample step and return the driver worker's output."""

    @abstractmethod
    def collective_rpc(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``worker.method(*args, **kwargs)`` on every worker; results in rank order."""

    @abstractmethod
    def check_health(self) -> None:
        """Raise RuntimeError when a worker is gone."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers and free their memory. Idempotent."""
