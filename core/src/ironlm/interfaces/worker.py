"""WorkerBase: what one rank of the model runs, and what every executor drives.

An executor (``ironlm.interfaces.executor``) decides where workers live (this process, child
processes, Ray actors); a worker owns one rank's device, model shard, KV cache and model runner.
The engine never talks to a worker directly: it calls the executor, which calls the same method
on every worker (``collective_rpc``) or on all of them for a step (``execute_model``).

Life of a worker, in call order:
  ``init_device()``            platform, device, torch.distributed groups when world_size > 1
  ``load_model()``             this rank's shard of the weights
  ``determine_num_kv_blocks()`` KV blocks that fit the configured budget on this rank
  ``initialize_kv_cache(n)``   allocate ``n`` blocks per layer (the minimum over all ranks)
  ``execute_model(input)``     once per engine step
  ``shutdown()``               free memory; the process may stay
Any other public method (LoRA adapters, profiling, ...) is reachable through
``Executor.collective_rpc(name, ...)``, which every executor runs as ``execute_method`` on
each worker: a method of the worker, else of the engine's ``worker_extension_cls`` (vLLM's:
user methods that see the worker as ``self``), or a callable given the worker first.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pytest's pattern: the contract names its host for typing only
    from ironlm.config import EngineConfig
    from ironlm.interfaces.step import ModelInput, ModelOutput
    from ironlm.plugin_manager import PluginManager


class UnknownMethodError(AttributeError):
    """A ``collective_rpc`` call named a method the worker does not have."""


# what sleep mode frees and wake-up takes back (vLLM's tags; ``ironlm.worker.sleep``)
SLEEP_TAGS = ("weights", "kv_cache")


@dataclass(frozen=True)
class WorkerRank:
    """Where one worker sits in the parallel layout (picklable: it crosses processes)."""

    rank: int  # global rank in [0, world_size): pp_rank * tp_size + tp_rank
    world_size: int  # tensor_parallel_size * pipeline_parallel_size
    local_rank: int  # device index on its machine
    # torch.distributed rendezvous, e.g. "tcp://127.0.0.1:29511"; None when world_size == 1
    init_method: str | None = None
    local_world_size: int = 1  # ranks on this machine (they share its cores)


class WorkerBase(ABC):
    """One rank's worker. Built as ``WorkerClass(config, rank, plugins)`` in the process where
    it runs; ``plugins`` is that process's PluginManager (None: discover plugins here)."""

    def __init__(
        self, config: EngineConfig, rank: WorkerRank, plugins: PluginManager | None = None
    ) -> None:
        self.config = config
        self.worker_rank = rank
        self.rank = rank.rank  # vLLM's worker attributes: global rank, device index
        self.local_rank = rank.local_rank

    def execute_method(
        self, method: str | Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Any:
        """One ``collective_rpc`` call on this worker (see ``resolve_method``)."""
        return self.resolve_method(method)(*args, **kwargs)

    def resolve_method(self, method: str | Callable[..., Any]) -> Callable[..., Any]:
        """What a ``collective_rpc`` call runs here: a callable as ``method(worker, ...)``, a
        name as this worker's method (``worker_extension_cls``'s included: the worker's class
        derives from it, ``with_extension``). AttributeError for an unknown name."""
        if callable(method):
            return functools.partial(method, self)
        bound = getattr(self, method, None)
        if bound is None:
            raise UnknownMethodError(f"worker {type(self).__name__} has no method {method!r}")
        return bound

    @abstractmethod
    def init_device(self) -> None:
        """Select the platform, bind the device, join the process groups."""

    @abstractmethod
    def load_model(self) -> None:
        """Build the model and load this rank's weights."""

    @abstractmethod
    def determine_num_kv_blocks(self) -> int:
        """KV blocks this rank can hold under the configured budget (``num_kv_blocks``,
        ``kv_cache_memory`` or ``gpu_memory_utilization``)."""

    @abstractmethod
    def initialize_kv_cache(self, num_kv_blocks: int) -> None:
        """Allocate ``num_kv_blocks`` blocks for every attention layer of this rank."""

    @abstractmethod
    def execute_model(self, model_input: ModelInput) -> ModelOutput | None:
        """Run one step. The rank that samples (first tensor-parallel rank of the last
        pipeline stage) returns the output; every other rank returns None."""

    def check_health(self) -> None:
        """Raise when this worker cannot serve (default: healthy while it answers)."""

    def shutdown(self) -> None:
        """Free the model and the KV cache. Idempotent."""


def with_extension(
    worker_cls: type[WorkerBase], extension: type | None
) -> type[WorkerBase]:
    """vLLM's ``worker_extension_cls``: the class every executor builds its workers from, a
    subclass of ``worker_cls`` and ``extension`` (the extension's methods, class attributes
    and helpers on the worker, ``self`` the worker; its ``__init__`` is not called, as in
    vLLM). Made where the worker is built (a class made at run time does not pickle), the
    same in every process. ValueError for a name both define."""
    if extension is None:
        return worker_cls
    clash = [n for n in dir(extension) if not n.startswith("__") and hasattr(worker_cls, n)]
    if clash:
        raise ValueError(f"worker_extension_cls {extension.__qualname__} defines {clash}, which "
                         f"worker {worker_cls.__name__} has already")
    return type(f"{worker_cls.__name__}With{extension.__name__}", (worker_cls, extension), {})
