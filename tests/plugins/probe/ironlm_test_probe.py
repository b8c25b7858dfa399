"""The cpu platform under another name, writing down on which thread the engine calls its
process hooks (tests only).

Registered as ``cpu-probe`` (never chosen by "auto"). Each call of ``before_engine_thread``
and ``configure_process`` appends a line ``<hook> <thread name> <engine threads alive>`` to the
file that ``IRONLM_TEST_PROBE_LOG`` names. Found by the server through the entry point of the
fake distribution next to this file (put this folder on PYTHONPATH).
"""

from __future__ import annotations

import os
import threading
from typing import Callable, ClassVar

from ironlm import hookimpl
from ironlm_cpu.platform import CpuPlatform

IRONLM_CONTRACT_VERSION = "1.0"


def _record(hook: str) -> None:
    engines = sum(t.name == "ironlm-engine" for t in threading.enumerate())
    with open(os.environ["IRONLM_TEST_PROBE_LOG"], "a") as log:
        log.write(f"{hook} {threading.current_thread().name} {engines}\n")


class ProbePlatform(CpuPlatform):
    name: ClassVar[str] = "cpu-probe"
    priority: ClassVar[int] = -100
    default_attention_backend: ClassVar[str] = "torch_ref"  # cpu_paged names "cpu" only

    def before_engine_thread(self) -> None:
        _record("before_engine_thread")
        super().before_engine_thread()

    def configure_process(self, local_world_size: int = 1) -> None:
        _record("configure_process")
        super().configure_process(local_world_size)


@hookimpl
def register_platforms(register: Callable[[type], None]) -> None:
    register(ProbePlatform)
