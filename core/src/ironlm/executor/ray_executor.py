"""Executor ``ray``: every rank a Ray actor, placed with a placement group (one bundle per
rank asking for one of the platform's devices, ``Platform.ray_device_key``), on a running
cluster (``ray start --head``; ``RAY_ADDRESS``) or a local one Ray starts for the run.

Start-up checks that the cluster has enough devices (naming how many it has), waits for the
placement group, builds the workers with their node's visible devices and local ranks, and
runs ``init_device`` (rendezvous at rank 0's node IP and a free port there) and
``load_model`` on all of them. Steps call every actor and take the sampling rank's output.
A monitor thread pings the actors; an actor that dies makes the executor dead: the other
actors are killed (none waits forever in a collective) and every later call raises.
Ray is an optional extra: ``pip install 'ironlm[ray]'``.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections import defaultdict
from typing import Any, Callable, ClassVar

from torch.distributed import TCPStore

from ironlm.config import EngineConfig
from ironlm.distributed.layout import ParallelLayout
from ironlm.distributed.process_groups import host_rendezvous
from ironlm.executor.ray_actor import RayWorkerActor
from ironlm.executor.worker_process import WorkerDiedError
from ironlm.interfaces.executor import LOCKSTEP_METHODS, REPLY_AFTER_FAILURE_S, Executor
from ironlm.interfaces.platform import Availability
from ironlm.interfaces.step import ModelInput, ModelOutput
from ironlm.interfaces.worker import WorkerBase, WorkerRank
from ironlm.plugin_manager import PluginManager

log = logging.getLogger("ironlm.executor.ray")
INSTALL_HINT = "pip install 'ironlm[ray]' (or: pip install ray)"
PLACEMENT_TIMEOUT_S = 120.0
PING_INTERVAL_S = 1.0


class RayConnection:
    """A process's use of its one Ray connection (``ray.init`` holds it per process), shared
    by the process's executors (a server's data-parallel engines have one each): the first
    that needs it connects (RAY_ADDRESS or a cluster already running on this machine, else a
    local one), the last that leaves disconnects; a connection made before them is left be."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._ours = False  # connected by an executor (else by the process itself)

    def acquire(self) -> None:
        import ray

        with self._lock:
            if self._users == 0 and not ray.is_initialized():
                ray.init(log_to_driver=False)
                self._ours = True
            self._users += 1

    def release(self) -> None:
        import ray

        with self._lock:
            self._users -= 1
            if self._users == 0 and self._ours:
                self._ours = False
                if ray.is_initialized():
                    ray.shutdown()


class RayExecutor(Executor):
    name: ClassVar[str] = "ray"
    # Ray keeps one connection per process (ray.init / ray.shutdown are process-wide), so
    # the executors of a process (one per data-parallel engine) must share its use: this
    # object is that sharing, explicit, rather than each executor guessing whether another
    # still needs Ray when it shuts down
    connection: ClassVar[RayConnection] = RayConnection()

    @classmethod
    def is_available(cls) -> Availability:
        if importlib.util.find_spec("ray") is None:
            return Availability.no(f"Ray is not installed; install it with: {INSTALL_HINT}")
        return Availability.yes("Ray is installed")

    def __init__(
        self, config: EngineConfig, plugins: PluginManager, worker_cls: type[WorkerBase]
    ) -> None:
        super().__init__(config, plugins, worker_cls)
        self.layout = ParallelLayout(config.tensor_parallel_size, config.pipeline_parallel_size)
        self.actors: list[Any] = []
        self.placement_group: Any = None
        self._store: TCPStore | None = None  # the rendezvous, alive as long as the workers
        self.dead: str | None = None
        self._uses_ray = False  # this executor holds a use of the process's Ray connection
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None

    # -- start-up ------------------------------------------------------------------------
    def start(self) -> None:
        import ray

        platform = self.plugins.select_platform(self.config.device)
        key, world = platform.ray_device_key, self.layout.world_size
        self.connection.acquire()
        self._uses_ray = True
        try:
            have = ray.cluster_resources().get(key, 0)
            ranks = world * self.config.data_parallel_size  # every engine's, when -dp N
            if have < ranks:
                raise ValueError(
                    f"tensor_parallel_size x pipeline_parallel_size x data_parallel_size = "
                    f"{ranks} ranks need {ranks} {key} in the Ray cluster (one per rank for "
                    f"platform {platform.name!r}), but it has {have:g}"
                )
            self._place_actors(ray, key, world)
            self._create_workers(ray, platform.visible_devices_env, key)
            self._monitor = threading.Thread(target=self._watch, name="ironlm-ray-monitor",
                                             daemon=True)
            self._monitor.start()
            self.collective_rpc("init_device")
            self.collective_rpc("load_model")
        except BaseException:
            self.shutdown()
            raise

    def _place_actors(self, ray: Any, key: str, world: int) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.placement_group = placement_group([{key: 1.0}] * world, strategy="PACK")
        ready, _ = ray.wait([self.placement_group.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise ValueError(
                f"Ray could not place {world} workers with one {key} each within "
                f"{PLACEMENT_TIMEOUT_S:g} s (cluster resources: {ray.cluster_resources()})"
            )
        actor_cls = ray.remote(RayWorkerActor)
        resources: dict[str, Any] = {"num_cpus": 0}
        if key == "CPU":
            resources = {"num_cpus": 1}
        elif key == "GPU":
            resources["num_gpus"] = 1
        else:
            resources["resources"] = {key: 1}
        self.actors = [
            actor_cls.options(
                **resources,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.placement_group, placement_group_bundle_index=i
                ),
            ).remote()
            for i in range(world)
        ]

    def _create_workers(self, ray: Any, visible_env: str | None, key: str) -> None:
        infos = ray.get([a.node_info.remote(key) for a in self.actors])
        # per node: its ranks in rank order and the union of their device ids
        by_node: dict[str, list[int]] = defaultdict(list)
        for rank, (node, _, _) in enumerate(infos):
            by_node[node].append(rank)
        host = ray.util.get_node_ip_address()  # the engine's node hosts the rendezvous
        self._store = host_rendezvous(host, len(infos))
        init_method = f"tcp://{host}:{self._store.port}"
        calls = []
        for rank, (node, _, ids) in enumerate(infos):
            peers = by_node[node]
            node_ids = sorted({i for r in peers for i in infos[r][2]}, key=_device_order)
            env: dict[str, str] = {}
            if visible_env and node_ids:  # each rank sees its node's devices, uses its own
                env[visible_env] = ",".join(node_ids)
                local_rank = node_ids.index(ids[0])
            else:
                local_rank = peers.index(rank)
            # the data-parallel engines' ranks are taken to share the node's cores too (torch
            # threads; engines spread over several nodes: set IRONLM_CPU_THREADS per node)
            worker_rank = WorkerRank(rank, len(infos), local_rank, init_method,
                                     local_world_size=len(peers) * self.config.data_parallel_size)
            calls.append(self.actors[rank].create.remote(self.config, worker_rank,
                                                         self.worker_cls, env))
        self._get_all(calls)

    # -- steps ---------------------------------------------------------------------------
    def execute_model(self, model_input: ModelInput) -> ModelOutput:
        output = self.collective_rpc("execute_model", model_input)[self.layout.sampling_rank]
        assert output is not None, "the sampling rank returns the step's output"
        return output

    def collective_rpc(
        self, method: str | Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> list[Any]:
        self.check_health()
        if not self.actors:
            raise RuntimeError("executor is not started (or was shut down)")
        lockstep = isinstance(method, str) and method in LOCKSTEP_METHODS
        refs = [a.call.remote(method, args, kwargs) for a in self.actors]
        return self._get_all(refs, tolerate=not lockstep)

    def _get_all(self, refs: list[Any], tolerate: bool = False) -> list[Any]:
        """Every result in rank order. A dead actor makes the executor dead, and so does a
        worker's own exception, raised without waiting for the others, unless ``tolerate``
        (a call outside the lockstep ones) and every other worker finishes the call within
        REPLY_AFTER_FAILURE_S: then the ranks are in step and the exception is raised alone."""
        import ray
        from ray.exceptions import RayActorError

        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                results[index[done[0]]] = ray.get(done[0])
            except RayActorError as exc:
                self._mark_dead(f"Ray worker rank {index[done[0]]} died: {exc}")
                raise WorkerDiedError(self.dead) from None
            except BaseException as exc:  # the worker's own exception (a RayTaskError)
                if tolerate and isinstance(exc, Exception) and _all_finish(ray, pending):
                    raise
                self._mark_dead(f"Ray worker rank {index[done[0]]} failed: {exc!r}")
                raise
        return results

    def check_health(self) -> None:
        if self.dead is not None:
            raise WorkerDiedError(self.dead)

    # -- failure and shutdown --------------------------------------------------------------
    def _watch(self) -> None:
        import ray
        from ray.exceptions import RayActorError

        while not self._stopping.wait(PING_INTERVAL_S) and self.dead is None:
            for rank, actor in enumerate(list(self.actors)):
                try:
                    ray.get(actor.ping.remote())  # answers after a running step
                except RayActorError as exc:
                    if not self._stopping.is_set():
                        self._mark_dead(f"Ray worker rank {rank} died: {exc}")
                    return
                except Exception:  # Ray is shutting down under us
                    return

    def _mark_dead(self, reason: str) -> None:
        import ray

        if self.dead is None:
            self.dead = reason
            log.error("executor ray: %s; killing the other workers", reason)
        for actor in self.actors:
            ray.kill(actor)

    def shutdown(self) -> None:
        self._stopping.set()
        if importlib.util.find_spec("ray") is None:
            return
        import ray

        if ray.is_initialized():
            for actor in self.actors:
                ray.kill(actor)
            if self.placement_group is not None:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(self.placement_group)
        self.actors = []
        self.placement_group = None
        self._store = None
        if self._monitor is not None:
            self._monitor.join(timeout=5.0)
            self._monitor = None
        if self._uses_ray:
            self._uses_ray = False
            self.connection.release()


def _device_order(device_id: str) -> tuple[int, str]:
    return (int(device_id), device_id) if device_id.isdigit() else (1 << 30, device_id)


def _all_finish(ray: Any, refs: list[Any]) -> bool:
    """Whether every call of ``refs`` ends (with a result or the worker's own exception)
    within REPLY_AFTER_FAILURE_S, its actor alive."""
    from ray.exceptions import RayActorError

    if not refs:
        return True
    done, pending = ray.wait(refs, num_returns=len(refs), timeout=REPLY_AFTER_FAILURE_S)
    if pending:
        return False
    for ref in done:
        try:
            ray.get(ref)
        except RayActorError:
            return False
        except Exception:  # noqa: S110  its own failure of the call: the actor is ready
            pass
    return True
