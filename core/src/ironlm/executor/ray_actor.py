"""RayWorkerActor: the Ray actor that hosts one worker rank (made remote by the ``ray``
executor; this module imports nothing of Ray, so it loads without the extra)."""

from __future__ import annotations

import os
from typing import Any, Callable

from ironlm.config import EngineConfig
from ironlm.interfaces.worker import WorkerBase, WorkerRank, with_extension


class RayWorkerActor:
    def __init__(self) -> None:
        self.worker: WorkerBase | None = None

    def node_info(self, device_key: str) -> tuple[str, str, list[str]]:
        """(node id, node IP, ids of the ``device_key`` devices Ray gave this actor)."""
        import ray

        ctx = ray.get_runtime_context()
        ids = [str(i) for i in ctx.get_accelerator_ids().get(device_key, [])]
        return ctx.get_node_id(), ray.util.get_node_ip_address(), ids

    def create(
        self,
        config: EngineConfig,
        rank: WorkerRank,
        worker_cls: type[WorkerBase],
        env: dict[str, str],
    ) -> int:
        """Set ``env`` (e.g. the node's visible devices), then build the worker; its pid."""
        os.environ.update(env)
        cls = with_extension(worker_cls, config.worker_extension_cls)
        self.worker = cls(config, rank, None)  # discovers plugins in this process
        return os.getpid()

    def call(
        self, method: str | Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        assert self.worker is not None, "create() first"
        return self.worker.execute_method(method, *args, **kwargs)

    def ping(self) -> bool:
        return True
