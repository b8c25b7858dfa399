"""Build a C source into a shared library once, cache it, and load it with ctypes.

The cpu plugin's kernels (paged decode attention, packed linear, fused layer ops) are small C
files compiled on first use with the system compiler, for the ISA target ``isa`` picks (the
same source for every target: ISA-specific code sits behind the compiler's macros). Libraries
are cached under ``$IRONLM_CACHE_DIR/kernels`` (default ~/.cache/ironlm), named by target and a
hash of source, flags and compiler, and written atomically, so concurrent builders race
harmlessly.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from ironlm_cpu.isa import GENERIC, IsaTarget, IsaUnavailable, compiler, host_target

# ctypes signature of one exported C function: (argument types, return type or None)
Signature = tuple[list[Any], Any]

BASE_FLAGS = ("-O3", "-fPIC", "-shared", "-fno-math-errno", "-march=x86-64", "-mtune=generic")


def compile_flags(target: IsaTarget) -> list[str]:
    # -fopenmp links libgomp.so.1; torch has already loaded its own copy of that soname, so the
    # loader binds ours to it and both share one thread team
    return [*BASE_FLAGS, "-fopenmp", *target.cc_flags]


# the dtypes the fused and decode C kernels take, and the suffix of their C entry points
KERNEL_DTYPES: dict[torch.dtype, str] = {torch.float32: "f32", torch.bfloat16: "bf16"}


def heads_contiguous(x: torch.Tensor) -> bool:
    """(T, heads, D) float32 or bf16 whose heads lie contiguously inside a token (any token
    stride): the layout the C kernels read q/k/v rows in, views of the fused QKV output
    included."""
    return (
        x.dim() == 3 and x.dtype in KERNEL_DTYPES and x.stride(2) == 1
        and x.stride(1) == x.shape[2]
    )  # fmt: skip


def load_library(name: str, source: str, target: IsaTarget) -> ctypes.CDLL:
    """The compiled ``source`` for ``target`` (building it on first use). Raises OSError,
    RuntimeError or subprocess.SubprocessError when it cannot be built or loaded."""
    return ctypes.CDLL(str(build_library(name, source, target)))


def build_library(name: str, source: str, target: IsaTarget) -> Path:
    """Path of the shared library of ``source`` built for ``target`` (compiled when not cached);
    building does not need a CPU that runs the target."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc/gcc) found")
    flags = compile_flags(target)
    digest = hashlib.sha256((source + " ".join(flags) + cc).encode()).hexdigest()[:16]
    root = os.environ.get("IRONLM_CACHE_DIR") or os.path.join("~", ".cache", "ironlm")
    lib = Path(root).expanduser() / "kernels" / f"{name}_{target.name}_{digest}.so"
    if not lib.exists():
        _compile(cc, source, flags, lib)
    return lib


# C spelling of the ctypes argument types a replay thunk unpacks from its 64-bit slots
_SLOT_TYPES: dict[Any, str] = {
    ctypes.c_void_p: "void *", ctypes.c_int: "int", ctypes.c_int64: "int64_t",
    ctypes.c_float: "float",
}  # fmt: skip

THUNK_SUFFIX = "__replay"


def thunk_source(signatures: dict[str, Signature]) -> str:
    """C source appended to a library: for each function whose arguments are all of
    ``_SLOT_TYPES``, ``void <name>__replay(const uint64_t *a)`` calling it with argument i
    taken from slot a[i] (``pack_slots`` fills them; a float is its 32 bits). A decode graph
    replays its recorded calls through these in one C loop (``graphs.ReplayLibrary``)."""
    out = ["#include <stdint.h>",
           "static inline float ironlm_slot_f32(uint64_t s) {",
           "    union { uint32_t u; float f; } v = {(uint32_t)s};",
           "    return v.f;",
           "}"]  # fmt: skip
    for name, (argtypes, _restype) in signatures.items():
        if not all(t in _SLOT_TYPES for t in argtypes):
            continue
        args = ", ".join(
            "ironlm_slot_f32(a[%d])" % i if t is ctypes.c_float
            else "(void *)(uintptr_t)a[%d]" % i if t is ctypes.c_void_p
            else "(%s)(int64_t)a[%d]" % (_SLOT_TYPES[t], i)
            for i, t in enumerate(argtypes)
        )  # fmt: skip
        unused = "" if argtypes else "    (void)a;\n"
        out.append(f"void {name}{THUNK_SUFFIX}(const uint64_t *a) {{\n{unused}"
                   f"    (void){name}({args});\n}}")  # fmt: skip
    return "\n".join(out) + "\n"


def pack_slots(argtypes: list[Any], args: tuple[Any, ...]) -> list[int] | None:
    """``args`` as the signed 64-bit slots a thunk unpacks (None when one does not fit)."""
    slots = []
    for t, a in zip(argtypes, args, strict=True):
        if t is ctypes.c_float and isinstance(a, (int, float)):
            v = struct.unpack("<I", struct.pack("<f", a))[0]
        elif t is ctypes.c_void_p and (a is None or isinstance(a, int)):
            v = a or 0
        elif t in (ctypes.c_int, ctypes.c_int64) and isinstance(a, int):
            v = a
        else:
            return None
        slots.append(v - (1 << 64) if v >= 1 << 63 else v)
    return slots


class Recordable:
    """Something whose calls a decode-graph capture records (``graphs.CpuGraphCapture``): while
    ``recorder`` is set, every ``call`` is appended to it, and a replay runs the recorded calls
    again in order. The C libraries are recordable; so are torch ops written as calls that
    store into a preallocated output (``torch_kernels``)."""

    def __init__(self) -> None:
        self.recorder: Recording | None = None

    def call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, recorded when a capture is on. For C functions the arguments are plain
        ints / floats / None (pointers, sizes, scalars); for torch calls, the tensors the call
        reads and the output it writes, which the recording keeps alive."""
        if self.recorder is None:
            return fn(*args)
        self.recorder.add(fn, args, self.thunk(fn))
        self.recorder.trusted += 1  # the capture guard lets the call's own torch ops through
        try:
            return fn(*args)
        finally:
            self.recorder.trusted -= 1

    def thunk(self, fn: Any) -> int | None:
        """Address of ``fn``'s replay thunk (``thunk_source``), None when it has none (a
        Python call)."""
        return None


class Recording:
    """The calls one capture recorded, each with its replay thunk's address or None;
    ``trusted`` > 0 while a recorded call runs."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []
        self.thunks: list[int | None] = []
        self.trusted = 0

    def add(self, fn: Any, args: tuple[Any, ...], thunk: int | None = None) -> None:
        self.calls.append((fn, args))
        self.thunks.append(thunk)


class KernelLibrary(Recordable):
    """One C source built for an ISA target and loaded with the ctypes signatures of the
    functions it exports. ``available`` / ``reason`` say whether it runs here; ``lib`` is the
    loaded library; ``target`` what it was built for (``isa.host_target()`` unless given: the
    best this CPU and compiler share, or what ``IRONLM_CPU_ISA`` forces). Sources guard
    ISA-specific code with the compiler's macros (``#ifdef __AVX512F__``, ``__AVX512VNNI__``,
    ``__AVX512BF16__``, ``__AMX_TILE__``, ...). The plugin's kernel classes subclass it and call
    their functions through ``call`` (see ``Recordable``).
    """

    def __init__(
        self, name: str, source: str, signatures: dict[str, Signature], what: str,
        needs_avx2: bool = False, target: IsaTarget | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.reason = ""
        self.lib: ctypes.CDLL | None = None
        self._thunks: dict[str, int] = {}  # C function name -> its replay thunk's address
        try:
            self.target = target if target is not None else host_target()
        except IsaUnavailable as exc:
            self.target = GENERIC
            self.reason = f"{what} unavailable: {exc}"
            return
        if needs_avx2 and not self.target.has("avx2"):
            self.reason = f"{what} needs AVX2 + FMA (target: {self.target.describe()})"
            return
        try:
            lib = load_library(name, source + thunk_source(signatures), self.target)
            for fn_name, (argtypes, restype) in signatures.items():
                fn = getattr(lib, fn_name)
                fn.argtypes, fn.restype = argtypes, restype
                if hasattr(lib, fn_name + THUNK_SUFFIX):
                    thunk = getattr(lib, fn_name + THUNK_SUFFIX)
                    self._thunks[fn_name] = ctypes.cast(thunk, ctypes.c_void_p).value or 0
            self.lib = lib
        except (OSError, subprocess.SubprocessError, RuntimeError, AttributeError) as exc:
            self.reason = f"{what} unavailable: {exc}"

    @property
    def available(self) -> bool:
        return self.lib is not None

    def thunk(self, fn: Any) -> int | None:
        return self._thunks.get(getattr(fn, "__name__", ""))


def _compile(cc: str, source: str, flags: list[str], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, so = Path(tmp) / "kernel.c", Path(tmp) / "kernel.so"
        src.write_text(source)
        proc = subprocess.run(
            [cc, *flags, str(src), "-o", str(so), "-lm"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[:500]}")
        os.replace(so, target)
