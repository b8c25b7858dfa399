"""AdapterCache: the engine's view of which LoRA adapters its workers hold.

Workers hold up to ``max_cpu_loras`` adapters (vLLM's LRU cache of CPU LoRAs); the engine
decides which, through the executor (``collective_rpc("add_lora" | "remove_lora")``), so the
same calls reach every rank wherever it runs. An adapter named by a request is registered once
and checked once (loaded, or only read and checked when every held adapter is in use);
afterwards it is loaded whenever a step needs it, evicting the least recently used adapter that
no step needs, and re-read from its path if it was evicted meanwhile.
"""

from __future__ import annotations

from collections import OrderedDict

from ironlm.interfaces.executor import Executor
from ironlm.lora.request import LoRARequest


class NoRoom(RuntimeError):
    """Every held adapter is in use: nothing can be evicted now."""


class AdapterCache:
    def __init__(self, executor: Executor, capacity: int) -> None:
        self.executor = executor
        self.capacity = capacity
        self.known: dict[int, LoRARequest] = {}  # every adapter the engine was told of, by id
        self.checked: set[int] = set()  # ids whose adapter loaded (or checked) once
        self.loaded: OrderedDict[int, None] = OrderedDict()  # held by the workers, LRU first
        self.unloading: set[int] = set()  # removed by the user while requests still use them

    def register(self, lora: LoRARequest) -> bool:
        """Remember an adapter (True: it is new); ValueError when its id already names
        another adapter."""
        known = self.known.get(lora.lora_int_id)
        if known is not None and (known.lora_name, known.lora_path) != (
            lora.lora_name, lora.lora_path,
        ):  # fmt: skip
            raise ValueError(
                f"lora_int_id {lora.lora_int_id} already names adapter {known.lora_name!r} "
                f"({known.lora_path}); {lora.lora_name!r} ({lora.lora_path}) needs another id"
            )
        self.known[lora.lora_int_id] = lora
        self.unloading.discard(lora.lora_int_id)
        return known is None

    def check(self, lora_id: int, busy: set[int]) -> None:
        """Make sure the adapter can run (ValueError naming the problem), loading it when an
        idle adapter can make room, else reading and checking it on the workers only."""
        if lora_id in self.checked:
            return
        try:
            self.ensure({lora_id}, busy)
        except NoRoom:
            self.executor.collective_rpc("check_lora", self.known[lora_id])
        self.checked.add(lora_id)

    def ensure(self, ids: set[int], busy: set[int]) -> None:
        """Have the workers hold every adapter in ``ids``, evicting least recently used ones
        outside ``ids | busy``. ValueError for an adapter that cannot load; NoRoom when all
        held adapters are in use."""
        for lora_id in ids & self.loaded.keys():
            self.loaded.move_to_end(lora_id)
        for lora_id in sorted(ids - self.loaded.keys()):
            while len(self.loaded) >= self.capacity:
                victim = next((v for v in self.loaded if v not in ids and v not in busy), None)
                if victim is None:
                    raise NoRoom(f"all {self.capacity} held adapters are in use")
                self._drop(victim)
            try:
                self.executor.collective_rpc("add_lora", self.known[lora_id])
            except BaseException:
                self.executor.collective_rpc("remove_lora", lora_id)  # ranks that took it
                raise
            self.loaded[lora_id] = None
            self.checked.add(lora_id)

    def remove(self, lora_id: int, in_use: bool) -> bool:
        """Forget an adapter (False: unknown). Requests still using it finish with it: the
        workers drop it when ``collect`` finds it unused."""
        if lora_id not in self.known:
            return False
        if in_use:
            self.unloading.add(lora_id)
            return True
        self._forget(lora_id)
        return True

    def collect(self, in_use: set[int]) -> None:
        """Drop adapters removed while in use once no request uses them."""
        for lora_id in list(self.unloading - in_use):
            self._forget(lora_id)

    def _forget(self, lora_id: int) -> None:
        self.unloading.discard(lora_id)
        self.known.pop(lora_id, None)
        self.checked.discard(lora_id)
        if lora_id in self.loaded:
            self._drop(lora_id)

    def _drop(self, lora_id: int) -> None:
        del self.loaded[lora_id]
        self.executor.collective_rpc("remove_lora", lora_id)
