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

import torch


def compile_flags() -> list[str]:
    # AVX2+FMA when torch's own dispatcher found them here; else the compiler's baseline ISA
    isa = torch.backends.cpu.get_cpu_capability()
    simd = ["-mavx2", "-mfma"] if isa in ("AVX2", "AVX512") else []
    # -fopenmp links libgomp.so.1; torch has already loaded its own copy of that soname, so the
    # loader binds ours to it and both share one thread team
    return ["-O3", "-fPIC", "-shared", "-fno-math-errno", "-fopenmp", *simd]


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
