"""vLLM's LoRA engine methods (add_lora, remove_lora, list_loras) and the step's adapter
loading, mixed into ``LLMEngine``: the adapters live in its ``AdapterCache`` (None without
enable_lora), the requests that use them in its scheduler."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ironlm.engine.adapter_cache import AdapterCache
from ironlm.engine.request import Request
from ironlm.lora.request import LoRARequest
from ironlm.outputs import RequestOutput

if TYPE_CHECKING:
    from ironlm.config import EngineConfig
    from ironlm.engine.output_processor import OutputProcessor
    from ironlm.engine.scheduler import Scheduler

log = logging.getLogger("ironlm.engine")


class LoRACalls:
    adapters: AdapterCache | None
    scheduler: Scheduler
    outputs: OutputProcessor
    config: EngineConfig

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Register an adapter and check it can run (ValueError naming the problem); it is
        loaded now when there is room, else when a step needs it."""
        self._check_adapter(lora_request)
        return True

    def remove_lora(self, lora_id: int) -> bool:
        """Forget an adapter; requests already using it finish with it."""
        cache = self._lora_cache()
        running, waiting = self.scheduler.lora_ids()
        return cache.remove(lora_id, lora_id in running | waiting)

    def list_loras(self) -> set[int]:
        """Ids of the adapters the workers hold now."""
        return set(self._lora_cache().loaded)

    def _lora_cache(self) -> AdapterCache:
        if self.adapters is None:
            raise ValueError("LoRA is not enabled: start the engine with enable_lora=True "
                             "(--enable-lora) to serve LoRA adapters")
        return self.adapters

    def _check_adapter(self, lora_request: LoRARequest) -> None:
        cache = self._lora_cache()
        new = cache.register(lora_request)
        running, _ = self.scheduler.lora_ids()
        try:
            cache.check(lora_request.lora_int_id, running)
        except BaseException:
            if new:  # a refused adapter leaves nothing behind
                cache.known.pop(lora_request.lora_int_id, None)
            raise

    def _load_adapters(self, scheduled: list[tuple[Request, int]]) -> list[RequestOutput]:
        """Have the workers hold the step's adapters. An adapter that no longer loads (its
        files changed since it was checked) aborts its requests, not the step."""
        assert self.adapters is not None
        running, waiting = self.scheduler.lora_ids()
        self.adapters.collect(running | waiting)
        needed = {req.lora_id for req, _ in scheduled if req.lora_id}
        broken: set[int] = set()
        for lora_id in sorted(needed):
            try:
                self.adapters.ensure({lora_id}, needed | running)
            except ValueError as exc:
                log.error("LoRA adapter %d cannot load; aborting its requests: %s", lora_id, exc)
                broken.add(lora_id)
        if not broken:
            return []
        victims = [req for req, _ in scheduled if req.lora_id in broken]
        scheduled[:] = [(req, n) for req, n in scheduled if req.lora_id not in broken]
        return self.outputs.abort(victims, self.scheduler)

    def _lora_stats(self) -> dict[str, Any]:
        """Adapters of running and waiting requests, by name (vLLM's lora_requests_info)."""
        if self.adapters is None:
            return {}
        running, waiting = self.scheduler.lora_ids()
        known = self.adapters.known

        def names(ids: set[int]) -> list[str]:
            return sorted(known[i].lora_name for i in ids if i in known)

        return {"max_lora": self.config.max_loras, "running_lora_adapters": names(running),
                "waiting_lora_adapters": names(waiting)}
