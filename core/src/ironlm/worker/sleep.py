"""Sleep mode on one worker (vLLM's ``enable_sleep_mode``: ``LLM.sleep(level)``,
``LLM.wake_up(tags)``): memory handed back while the engine idles, so a trainer sharing the
machine or the device can use it, and taken again on wake-up.

Level 1 frees the KV cache (tag ``kv_cache``: every layer's cache and the host swap space)
and offloads the weights (tag ``weights``): a storage on a device is copied to host memory and
freed there; one already in host memory (the cpu platform's) has nowhere to go and stays.
Level 2 frees the weights too, without a copy: after wake-up they are zeros until new ones are
loaded (``model.load_weights`` through ``collective_rpc``, or ``reload_weights``).

Freeing is ``storage.resize_(0)`` on every storage (a shared one once), then
``Platform.release_memory`` (an allocator's cache back to the system); wake-up resizes them
back, zero-filled as allocated at start-up (the host swap space is left uncommitted, as
``allocate_swap`` leaves it). Every tensor object, parameter and view stays the one the model
and the attention backend hold, at a new address: captured decode graphs are dropped and
captured again by the next steps. Weights are the model's parameters; buffers (rotary
tables, computed at construction) stay. A tensor without a storage of its own to resize
(oneDNN's reordered weights) stays allocated with its values, and is counted as kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ironlm.interfaces.worker import SLEEP_TAGS

log = logging.getLogger("ironlm.worker")


@dataclass
class _Freed:
    storage: torch.UntypedStorage
    nbytes: int
    host_copy: torch.UntypedStorage | None  # level 1 on a device: the values to put back
    zero: bool  # zero-filled on wake-up (not the swap space: its pages stay uncommitted)


@dataclass
class SleepReport:
    """Bytes one worker freed and kept by tag (``LLM.sleep`` logs them)."""

    freed: dict[str, int]
    kept: dict[str, int]


class SleepingMemory:
    """The storages a sleeping worker freed, by tag, until each tag wakes. Each storage is
    recorded as soon as it is freed and forgotten only once it is back, so a failure halfway
    (no host memory for a copy, no device memory to wake into) loses none: the call raises
    and a later ``wake_up`` takes back what was freed."""

    def __init__(self) -> None:
        self.freed: dict[str, list[_Freed]] = {}

    def asleep(self, tag: str) -> bool:
        return tag in self.freed

    def sleep(
        self,
        level: int,
        weights: list[torch.Tensor],
        kv_cache: list[torch.Tensor],
        swap_space: list[torch.Tensor],
    ) -> SleepReport:
        if self.freed:
            raise ValueError(f"already asleep ({sorted(self.freed)} not woken)")
        report = SleepReport({tag: 0 for tag in SLEEP_TAGS}, {tag: 0 for tag in SLEEP_TAGS})
        for tag, tensors, keep, zero in (
            ("weights", weights, level == 1, True),
            ("kv_cache", kv_cache, False, True),
            ("kv_cache", swap_space, False, False),
        ):
            report.kept[tag] += _free(tensors, keep, zero, self.freed.setdefault(tag, []))
        for tag in SLEEP_TAGS:
            report.freed[tag] = sum(f.nbytes for f in self.freed[tag])
        return report

    def wake_up(self, tags: list[str] | None) -> None:
        for tag in tags if tags is not None else SLEEP_TAGS:
            entries = self.freed.get(tag, [])
            while entries:
                f = entries[-1]
                f.storage.resize_(f.nbytes)
                if f.host_copy is not None:
                    f.storage.copy_(f.host_copy)
                elif f.zero:
                    f.storage.fill_(0)
                entries.pop()  # back: forgotten only now
            self.freed.pop(tag, None)


def _free(
    tensors: list[torch.Tensor], keep_values: bool, zero: bool, freed: list[_Freed]
) -> int:
    """Free the storages of ``tensors`` (a shared one once) into ``freed``, each recorded as
    soon as it is freed; the bytes kept allocated. ``keep_values``: offload, not discard."""
    kept = 0
    seen: set[int] = set()
    for tensor in tensors:
        if tensor.layout != torch.strided:  # an opaque library layout: no storage to resize
            kept += tensor.numel() * tensor.element_size()
            continue
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        nbytes = storage.nbytes()
        if keep_values and storage.device.type == "cpu":  # in host memory already
            kept += nbytes
            continue
        copy = storage.cpu() if keep_values else None  # before anything is freed
        try:
            storage.resize_(0)
        except RuntimeError:  # not resizable (memory it does not own): stays
            kept += nbytes
            continue
        freed.append(_Freed(storage, nbytes, copy, zero))
    return kept
