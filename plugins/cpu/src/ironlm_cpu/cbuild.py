"""Build a C source into a shared library once, cache it, and load it with ctypes.

The cpu plugin's kernels (paged decode attention, packed linear, fused layer ops) are small C
files compiled on first use with the system compiler. Libraries are cached under
``$IRONLM_CACHE_DIR/kernels`` (default ~/.cache/ironlm), named by a hash of source and flags,
and written atomically, so concurrent builders race harmlessly.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

# ctypes signature of one exported C function: (argument types, return type or None)
Signature = tuple[list[Any], Any]


def compile_flags() -> list[str]:
    # AVX2+FMA when torch's own dispatcher found them here; else the compiler's baseline ISA
    isa = torch.backends.cpu.get_cpu_capability()
    simd = ["-mavx2", "-mfma"] if isa in ("AVX2", "AVX512") else []
    # -fopenmp links libgomp.so.1; torch has already loaded its own copy of that soname, so the
    # loader binds ours to it and both share one thread team
    return ["-O3", "-fPIC", "-shared", "-fno-math-errno", "-fopenmp", *simd]


def heads_contiguous(x: torch.Tensor) -> bool:
    """(T, heads, D) float32 whose heads lie contiguously inside a token (any token stride): the
    layout the C kernels read q/k/v rows in, views of the fused QKV output included."""
    return (
        x.dim() == 3 and x.dtype == torch.float32 and x.stride(2) == 1
        and x.stride(1) == x.shape[2]
    )  # fmt: skip


def has_avx2() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def load_library(name: str, source: str) -> ctypes.CDLL:
    """The compiled ``source`` (building it on first use). Raises OSError, RuntimeError or
    subprocess.SubprocessError when it cannot be built or loaded."""
    flags = compile_flags()
    digest = hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:16]
    root = os.environ.get("IRONLM_CACHE_DIR") or os.path.join("~", ".cache", "ironlm")
    lib = Path(root).expanduser() / "kernels" / f"{name}_{digest}.so"
    if not lib.exists():
        _compile(source, flags, lib)
    return ctypes.CDLL(str(lib))


class KernelLibrary:
    """One C source built and loaded with the ctypes signatures of the functions it exports.
    ``available`` / ``reason`` say whether it runs here; ``lib`` is the loaded library. The
    plugin's kernel classes subclass it.

    Kernel wrappers call through ``call``, so that while a decode graph is being captured
    (``graphs.CpuGraphCapture``) every call is also appended to ``recorder``, a list of
    (function, arguments) that a replay runs again in order.
    """

    def __init__(
        self, name: str, source: str, signatures: dict[str, Signature], what: str,
        needs_avx2: bool = False,
    ) -> None:  # fmt: skip
        self.reason = ""
        self.lib: ctypes.CDLL | None = None
        self.recorder: list[tuple[Any, tuple[Any, ...]]] | None = None
        if needs_avx2 and not has_avx2():
            self.reason = f"{what} needs AVX2 + FMA"
            return
        try:
            lib = load_library(name, source)
            for fn_name, (argtypes, restype) in signatures.items():
                fn = getattr(lib, fn_name)
                fn.argtypes, fn.restype = argtypes, restype
            self.lib = lib
        except (OSError, subprocess.SubprocessError, RuntimeError, AttributeError) as exc:
            self.reason = f"{what} unavailable: {exc}"

    @property
    def available(self) -> bool:
        return self.lib is not None

    def call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, recorded when a capture is on (arguments are plain ints / floats /
        None: pointers, sizes and scalars, so a replay needs nothing else)."""
        if self.recorder is not None:
            self.recorder.append((fn, args))
        return fn(*args)


def _compile(source: str, flags: list[str], target: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc/gcc) found")
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
