"""Executor ``mp``: one worker process per rank on this machine, the driver (rank 0) in the
engine's own process, as vLLM lays them out. Under data parallelism (several engines in one
server, ``engine/data_parallel.py``) rank 0 runs in a child process too, so that the engines'
forward passes run in parallel instead of taking turns on the server's interpreter; each
engine's ranks then take the device indices (local ranks) after the lower engines' ranks.

Start-up: every other rank is spawned (``multiprocessing`` spawn: a fresh interpreter that
discovers its own plugins) and reports its construction; then ``init_device`` (the
torch.distributed rendezvous at ``tcp://127.0.0.1:<free port>``) and ``load_model`` run on
every rank. A worker that fails reports its exception, which the engine raises with the
worker's traceback as its cause; nothing waits on a rank that is gone.

Steps: ``collective_rpc`` sends the call to every child (one pickled message, the same bytes
to each), runs it on the driver, then collects one reply per child. A monitor thread watches
the children; when one dies unexpectedly the executor is dead: the other children are
stopped (so no rank waits forever in a collective), every later call raises, and
``check_health`` says which rank died and how. Children are daemonic and also leave when the
engine's end of their pipe closes, so none outlives the engine.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import pickle
import threading
import time
import weakref
from multiprocessing.connection import wait
from typing import Any, Callable, ClassVar, NoReturn

from torch.distributed import TCPStore

from ironlm.config import EngineConfig
from ironlm.distributed.layout import ParallelLayout
from ironlm.distributed.process_groups import host_rendezvous
from ironlm.executor.worker_process import (  # WorkerDiedError: raised by this executor
    STOP,
    WorkerChild,
    WorkerDiedError,
    call_payload,
    run_worker,
)
from ironlm.interfaces.executor import LOCKSTEP_METHODS, REPLY_AFTER_FAILURE_S, Executor
from ironlm.interfaces.step import ModelInput, ModelOutput
from ironlm.interfaces.worker import UnknownMethodError, WorkerBase, WorkerRank, with_extension
from ironlm.plugin_manager import PluginManager

log = logging.getLogger("ironlm.executor.mp")
STOP_TIMEOUT_S = 5.0  # a child that does not leave in time after STOP is terminated


class MultiprocExecutor(Executor):
    name: ClassVar[str] = "mp"

    def __init__(
        self, config: EngineConfig, plugins: PluginManager, worker_cls: type[WorkerBase]
    ) -> None:
        super().__init__(config, plugins, worker_cls)
        self.layout = ParallelLayout(config.tensor_parallel_size, config.pipeline_parallel_size)
        self.driver: WorkerBase | None = None  # rank 0 in this process (None: in a child)
        self.started = False
        self._cls = with_extension(worker_cls, config.worker_extension_cls)  # the ranks' class
        self.children: list[WorkerChild] = []
        self.dead: str | None = None  # why the executor cannot run steps any more
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None
        self._store: TCPStore | None = None  # the rendezvous, alive as long as the workers
        self._driver_call: threading.Thread | None = None  # the driver's start-up call

    # -- start-up ------------------------------------------------------------------------
    def start(self) -> None:
        world = self.layout.world_size
        dp, dp_rank = self.config.data_parallel_size, self.config.data_parallel_rank
        platform = self.plugins.select_platform(self.config.device)
        count = platform.device_count()
        if count is not None and world * dp > count:
            raise ValueError(
                f"tensor_parallel_size x pipeline_parallel_size x data_parallel_size = "
                f"{world * dp} ranks, but platform {platform.name!r} has {count} device(s) on "
                "this machine; use fewer ranks, or distributed_executor_backend='ray' across "
                "machines"
            )
        self._store = host_rendezvous("127.0.0.1", world)
        init_method = f"tcp://127.0.0.1:{self._store.port}"
        # every rank of every data-parallel engine on this machine shares its cores / devices
        ranks = [WorkerRank(r, world, dp_rank * world + r, init_method,
                            local_world_size=world * dp) for r in range(world)]
        remote = ranks if dp > 1 else ranks[1:]  # rank 0 in a child too under data parallelism
        ctx = multiprocessing.get_context("spawn")
        # an engine never shut down stops its workers and rendezvous before the interpreter
        # tears them down (else multiprocessing kills the children and the store's thread
        # aborts the process); weak, so that the executor can still be collected
        shutdown = weakref.WeakMethod(self.shutdown)
        atexit.register(lambda: (method := shutdown()) is not None and method())
        try:
            for rank in remote:
                parent_end, child_end = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=run_worker, args=(self.config, rank, self.worker_cls, child_end),
                    name=f"ironlm-worker-{rank.rank}", daemon=True,
                )  # fmt: skip
                proc.start()
                child_end.close()
                self.children.append(WorkerChild(rank.rank, proc, parent_end))
            for child in self.children:  # each reports its construction (or its error)
                child.reply(lambda: self.dead)
            self.started = True
            if dp == 1:
                self.driver = self._cls(self.config, ranks[0], self.plugins)
            self._monitor = threading.Thread(
                target=self._watch, name="ironlm-mp-monitor", daemon=True
            )
            self._monitor.start()
            self._startup_rpc("init_device")
            self._startup_rpc("load_model")
        except BaseException:
            self.shutdown()
            raise

    def _startup_rpc(self, method: str) -> None:
        """``method`` on every rank; the driver's call runs on a helper thread, so that a
        child failing first (the driver then waits in the rendezvous) is raised at once."""
        payload = pickle.dumps((method, (), {}))
        for child in self.children:
            child.conn.send_bytes(payload)
        outcome: list[BaseException | None] = []

        def run_driver() -> None:
            try:
                getattr(self.driver, method)()
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        helper = threading.Thread(target=run_driver, name=f"ironlm-driver-{method}", daemon=True)
        if self.driver is not None:  # else every rank is a child
            self._driver_call = helper
            helper.start()
        pending = {child.conn: child for child in self.children}
        while pending or helper.is_alive():
            if outcome and outcome[0] is not None:
                raise outcome[0]  # the children wait for the driver: do not wait for them
            for conn in wait(list(pending), timeout=0.2) if pending else []:
                pending.pop(conn).reply(lambda: self.dead)  # type: ignore[call-overload]
            if not pending and helper.is_alive():
                helper.join(timeout=0.2)
        if outcome and outcome[0] is not None:
            raise outcome[0]

    # -- steps ---------------------------------------------------------------------------
    def execute_model(self, model_input: ModelInput) -> ModelOutput:
        output = self.collective_rpc("execute_model", model_input)[self.layout.sampling_rank]
        assert output is not None, "the sampling rank returns the step's output"
        return output

    def collective_rpc(
        self, method: str | Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> list[Any]:
        self.check_health()
        if not self.started:
            raise RuntimeError("executor is not started (or was shut down)")
        call = self._local_call(method)  # an unknown name: raised, nothing sent
        payload = call_payload(method, args, kwargs)
        label = method if isinstance(method, str) else getattr(method, "__qualname__", "callable")
        lockstep = isinstance(method, str) and method in LOCKSTEP_METHODS
        try:
            for child in self.children:
                child.conn.send_bytes(payload)
            results = [call(*args, **kwargs)] if call is not None else []
        except Exception as exc:
            if lockstep or not self._children_replied(self.children):
                self._fail(label, exc)  # the children may wait for the driver in a collective
            raise  # every child answered the call too: the ranks are in step
        except BaseException as exc:
            self._fail(label, exc)
        for i, child in enumerate(self.children):
            try:
                results.append(child.reply(lambda: self.dead))
            except Exception as exc:
                if lockstep or isinstance(exc, WorkerDiedError):
                    self._fail(label, exc)  # that child left
                # the others may wait for it in a collective: they get a deadline
                if not self._children_replied(self.children[i + 1 :]):
                    self._fail(label, exc)
                raise
        return results

    def _local_call(self, method: str | Callable[..., Any]) -> Callable[..., Any] | None:
        """The driver's own call of ``method`` (None when rank 0 runs in a child: the name is
        checked against the ranks' class). UnknownMethodError for an unknown name."""
        if self.driver is not None:
            return self.driver.resolve_method(method)
        if isinstance(method, str) and not callable(getattr(self._cls, method, None)):
            raise UnknownMethodError(f"worker {self._cls.__name__} has no method {method!r}")
        return None

    def _children_replied(
        self, children: list[WorkerChild], timeout_s: float = REPLY_AFTER_FAILURE_S
    ) -> bool:
        """After one rank's call failed: whether each of ``children`` answers the same call
        within ``timeout_s`` (its reply, result or error, is read and dropped)."""
        deadline = time.monotonic() + timeout_s
        for child in children:
            if not child.conn.poll(max(0.0, deadline - time.monotonic())):
                return False
            try:
                child.reply(lambda: self.dead)
            except WorkerDiedError:
                return False
            except Exception:
                pass  # its own failure of the call: it is ready for the next one
        return True

    def _fail(self, label: str, exc: BaseException) -> NoReturn:
        """Ranks may now disagree on which call they are in: the workers cannot go on. Marks
        the executor dead and raises (the exited child, not its echo in a collective)."""
        gone = self._exited_child()
        self._mark_dead(gone or f"{label} failed: {exc!r}")
        if gone is not None and not isinstance(exc, WorkerDiedError):
            raise WorkerDiedError(gone) from exc
        raise exc

    def _exited_child(self, grace_s: float = 2.0) -> str | None:
        """Which child has exited (waiting up to ``grace_s`` for its death to be visible)."""
        deadline = time.monotonic() + grace_s
        while True:
            for child in self.children:
                if child.proc.exitcode is not None:
                    return (f"worker rank {child.rank} (pid {child.proc.pid}) died with exit "
                            f"code {child.proc.exitcode}")
            if time.monotonic() > deadline:
                return self.dead
            time.sleep(0.05)

    def check_health(self) -> None:
        if self.dead is not None:
            raise WorkerDiedError(self.dead)

    # -- failure and shutdown --------------------------------------------------------------
    def _watch(self) -> None:
        sentinels = {child.proc.sentinel: child for child in self.children}
        while sentinels and not self._stopping.is_set():
            for sentinel in wait(list(sentinels), timeout=0.5):
                child = sentinels.pop(sentinel)  # type: ignore[call-overload]
                if self._stopping.is_set():
                    return
                child.proc.join(timeout=1.0)
                self._mark_dead(
                    f"worker rank {child.rank} (pid {child.proc.pid}) died with exit code "
                    f"{child.proc.exitcode}"
                )
                return

    def _mark_dead(self, reason: str) -> None:
        if self.dead is None:
            self.dead = reason
            log.error("executor mp: %s; stopping the other workers", reason)
        for child in self.children:  # ranks blocked in a collective with the dead one leave
            if child.proc.is_alive():
                child.proc.terminate()

    def shutdown(self) -> None:
        self._stopping.set()
        self.started = False
        for child in self.children:
            try:
                if child.proc.is_alive():
                    child.conn.send(STOP)
            except (OSError, ValueError):
                pass
        for child in self.children:
            child.proc.join(timeout=STOP_TIMEOUT_S)
            if child.proc.is_alive():
                child.proc.terminate()
                child.proc.join(timeout=STOP_TIMEOUT_S)
            if child.proc.is_alive():
                child.proc.kill()
                child.proc.join()
            child.conn.close()
        self.children = []
        if self.driver is not None:
            self.driver.shutdown()
            self.driver = None
        self._store = None  # a driver left waiting in a failed start-up gets an error and ends
        if self._driver_call is not None:
            self._driver_call.join(timeout=STOP_TIMEOUT_S)  # and resets its process state
            self._driver_call = None
        if self._monitor is not None:
            self._monitor.join(timeout=2.0)
            self._monitor = None
