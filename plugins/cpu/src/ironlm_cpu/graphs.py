"""Decode graphs on the cpu platform: a forward recorded as its list of C kernel calls.

Why: at batch 1 a SmolLM2 decode step spends ~25 ms in the packed linears and another 10-15 ms
in Python around ~300 kernel calls (module calls, dispatch checks, output allocation, ctypes
argument conversion). Every compute op of a float32 decode forward on this platform is one of
the plugin's C kernels, called with pointers, sizes and scalars only; with static inputs, a
static KV cache and outputs kept alive, the same calls with the same arguments compute the next
step. ``capture`` runs the forward once while every ``Recordable.call`` is recorded (the C
libraries' calls, and the torch ops the kernel choice picked, written as calls that store into
a preallocated output: ``torch_kernels``); a replay runs the recorded calls in order, nothing
else.

What makes a recording faithful is checked while capturing, through a torch function mode
(``_CaptureGuard``) that sees every torch call the forward makes: anything that would compute
outside the C kernels (an op whose result is new memory other than an ``empty``, an in-place op,
an ``out=`` argument) or read tensor data into Python (``item``, ``tolist``, ``bool``) makes the
capture fail with the op's name, and the engine runs that batch eagerly (a final logit soft
cap is such an op today; Gemma 3's embedding scale and the per-head q/k norms of Gemma 3 and
Qwen3 became C calls on 2026-11-27). One kind of torch op is
recorded instead of refused: a dtype conversion (``x.float()``, ``x.to(dtype)``; a bf16 model's
LM head returns its logits as float32 this way), replayed as a ``copy_`` into the result it
made. The guard also keeps every tensor the forward touched alive, so recorded pointers stay
valid.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import torch
from ironlm.interfaces.graphs import GraphCapture, GraphCaptureError, StepGraph
from torch.overrides import TorchFunctionMode

from ironlm_cpu.cbuild import KernelLibrary, Recordable, Recording, pack_slots

# torch functions that allocate without computing (their results are kernel outputs)
_ALLOCATORS = frozenset({torch.empty, torch.empty_like})
# reading tensor data into Python would freeze a data-dependent branch into the recording
_DATA_READS = frozenset({
    "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__complex__",
    "__format__", "__contains__", "equal", "allclose", "is_nonzero",
})
_INPLACE_DUNDERS = frozenset({
    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
    "__imod__", "__ipow__", "__imatmul__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
    "__irshift__",
})
# dtype conversions a replay redoes as ``result.copy_(source)``
_CONVERSIONS = frozenset({torch.Tensor.float, torch.Tensor.to})


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors(item)]
    return []


def _metadata(result: Any) -> bool:
    """Whether a torch call's result is tensor metadata (a number, a flag, a shape or stride,
    a dtype, device or layout): no tensor came out of it. Not None: ``__setitem__`` returns
    None, and is refused."""
    if isinstance(result, tuple):
        return all(type(x) is int for x in result)
    return isinstance(result, (int, float, bool, torch.dtype, torch.device, torch.layout))


def _storage(t: torch.Tensor) -> object:
    if t.layout != torch.strided:  # an opaque library tensor (oneDNN's weights): no storage
        return ("opaque", id(t))
    return t.untyped_storage().data_ptr()


class _CaptureGuard(TorchFunctionMode):
    """Keeps every tensor the forward touches; ``problem`` names the first op that a replay
    of the C calls would not reproduce."""

    def __init__(self, recording: Recording) -> None:
        super().__init__()
        self.recording = recording
        self.kept: list[torch.Tensor] = []
        self.problem: str | None = None

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        if _metadata(result) and name not in _DATA_READS:
            # data_ptr, stride, shape, dim, is_contiguous ...: two thirds of a capture's torch
            # calls, and nothing to record or refuse (a data read is refused below)
            self.kept += [a for a in args if isinstance(a, torch.Tensor)]
            return result
        inputs = _tensors(args) + _tensors(kwargs)
        outputs = _tensors(result)
        self.kept += inputs + outputs
        # ops inside a recorded call (``Recordable.call``) are replayed with it
        if self.problem is None and not self.recording.trusted:
            if self._conversion(func, inputs, result):
                self.recording.add(result.copy_, (inputs[0],))
                return result
            self.problem = self._check(func, name, kwargs, inputs, outputs)
        return result

    @staticmethod
    def _conversion(func: Any, inputs: list[torch.Tensor], result: Any) -> bool:
        """Whether ``func`` converted one tensor's dtype into fresh memory of the same shape."""
        return (
            func in _CONVERSIONS and len(inputs) == 1 and isinstance(result, torch.Tensor)
            and result.dtype != inputs[0].dtype and result.shape == inputs[0].shape
            and result.device == inputs[0].device and result.numel() > 0
            and _storage(result) != _storage(inputs[0])
        )  # fmt: skip

    @staticmethod
    def _check(
        func: Any, name: str, kwargs: dict[str, Any], inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
    ) -> str | None:  # fmt: skip
        if name in _DATA_READS:
            return f"{name}() reads tensor data into Python"
        if name in _INPLACE_DUNDERS or (name.endswith("_") and not name.endswith("__")):
            return f"in-place torch op {name}"
        if kwargs.get("out") is not None:
            return f"torch op {name} with out="
        if func in _ALLOCATORS:
            return None
        sources = {_storage(t) for t in inputs if t.numel()}
        for out in outputs:
            if out.numel() and _storage(out) not in sources:
                return f"torch op {name} computes a new tensor outside the C kernels"
        return None


_REPLAY_SOURCE = r"""
#include <stdint.h>
/* program: per call its thunk's address, its slot count, its slots; a zero address ends it */
void ironlm_replay(const uint64_t *p) {
    while (p[0]) {
        ((void (*)(const uint64_t *))(uintptr_t)p[0])(p + 2);
        p += 2 + p[1];
    }
}
"""


class ReplayLibrary(KernelLibrary):
    """``ironlm_replay``: runs a program of thunk calls (``cbuild.thunk_source``) in one C loop.

    Why: a Python loop of ctypes calls costs ~2-3 us a call (argument conversion, the GIL
    released and taken back); a batch-64 SmolLM2 bf16 step is ~300 calls."""

    def __init__(self) -> None:
        super().__init__("cpu_replay", _REPLAY_SOURCE,
                         {"ironlm_replay": ([ctypes.c_void_p], None)}, "graph replay loop")


class CpuStepGraph(StepGraph):
    """The recorded calls, and every tensor whose address they hold. With a replay library,
    each run of consecutive C calls that have thunks replays as one program (a ``uint64``
    tensor: thunk, slot count, slots per call); other calls (torch ops, dtype conversions)
    run from Python between them, in the recorded order."""

    def __init__(
        self, calls: list[tuple[Any, tuple[Any, ...]]], kept: list[torch.Tensor],
        thunks: list[int | None] | None = None, replay_lib: ReplayLibrary | None = None,
    ) -> None:  # fmt: skip
        self.calls = calls
        self._kept = kept
        self._steps: list[Callable[[], Any]] = []
        self._programs: list[torch.Tensor] = []
        thunks = thunks if thunks is not None and replay_lib is not None else [None] * len(calls)
        self.in_c: list[bool] = []  # per call: replayed inside a C program
        run: list[int] = []
        for (fn, args), thunk in zip(calls, thunks, strict=True):
            slots = None if thunk is None else pack_slots(list(fn.argtypes), args)
            self.in_c.append(slots is not None)
            if slots is not None:
                run += [thunk, len(slots), *slots]
                continue
            self._flush(run, replay_lib)
            self._steps.append(functools.partial(fn, *args))
        self._flush(run, replay_lib)

    def _flush(self, run: list[int], replay_lib: ReplayLibrary | None) -> None:
        if not run:
            return
        assert replay_lib is not None and replay_lib.lib is not None
        program = torch.tensor(run + [0], dtype=torch.int64)  # slots are signed already
        self._programs.append(program)
        self._steps.append(functools.partial(replay_lib.lib.ironlm_replay, program.data_ptr()))
        run.clear()

    def __len__(self) -> int:
        return len(self.calls)

    @property
    def python_calls(self) -> int:
        """Steps a replay takes from Python: programs plus the calls without a thunk."""
        return len(self._steps)

    def replay(self) -> None:
        for step in self._steps:
            step()


class CpuGraphCapture(GraphCapture):
    """Records the calls a forward makes into ``libraries`` (the layer ops' and the attention
    backend's C code). Measured on SmolLM2 (2 threads): a batch-1 decode step 37-45 ms eager,
    28-31 ms replayed (Python gone); batch 64 353 -> 304 ms (Python, and the ~90 MB of fresh
    intermediate tensors an eager step allocates). The price is memory: a graph keeps its
    intermediates, about 1.4 MiB per captured row for SmolLM2 (88 MiB for the 64-row graph),
    for the sizes that were used."""

    max_batch_size = 64
    computes_on_capture = True  # the recorded calls ran on the inputs of the capture

    def __init__(self, libraries: list[Recordable]) -> None:
        self.libraries = libraries
        replay = ReplayLibrary()  # without it (no compiler) every call replays from Python
        self.replay_lib = replay if replay.available else None

    def capture(self, forward: Callable[[], torch.Tensor]) -> tuple[StepGraph, torch.Tensor]:
        recording = Recording()
        guard = _CaptureGuard(recording)
        for lib in self.libraries:
            lib.recorder = recording
        try:
            with guard:
                out = forward()
        finally:
            for lib in self.libraries:
                lib.recorder = None
        if guard.problem is not None:
            raise GraphCaptureError(guard.problem)
        if not recording.calls:
            raise GraphCaptureError("the forward called none of the cpu plugin's C kernels")
        graph = CpuStepGraph(recording.calls, guard.kept + [out], recording.thunks,
                             self.replay_lib)
        return graph, out
