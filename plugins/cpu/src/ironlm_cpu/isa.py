"""Which x86 instruction sets the cpu plugin's C kernels are built for: one place.

The CPU's features come from its ``flags`` line in /proc/cpuinfo (what the kernel found with
CPUID and enabled, XSAVE state for AVX-512 and AMX included), the compiler's from compiling one
intrinsic of each group. A *target* is the set of groups both have, e.g. ``avx2`` on an AVX2-only
EPYC or ``amx`` (avx2, avx_vnni, avx512, avx512_vnni, avx512_bf16, amx) on a Sapphire Rapids
Xeon; every C source is compiled for it with the groups' ``-m`` flags, so code behind
``#ifdef __AVX512F__`` / ``__AVX512VNNI__`` / ``__AVX512BF16__`` / ``__AMX_TILE__`` guards runs
exactly where the CPU has it. A CPU without AVX2 + FMA gets the ``generic`` target (the
compiler's x86-64 baseline, SSE2) and the platform says so.

``IRONLM_CPU_ISA`` forces a lower target for tests and comparisons: a level, ``generic``,
``avx2``, ``avx512`` or ``amx`` (``auto``: the best), optionally followed by groups to leave out,
``avx512,-avx512_bf16``. Asking for a level the CPU or the compiler lacks is an error that says
what is missing and what is on offer, never a silent downgrade.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "IRONLM_CPU_ISA"


@dataclass(frozen=True)
class IsaGroup:
    """Instructions enabled together: every CPU flag present, every required group chosen."""

    name: str
    level: int  # 1 avx2, 2 avx512, 3 amx; a forced level keeps the groups at or below it
    cpu_flags: tuple[str, ...]  # /proc/cpuinfo names, all needed
    cc_flags: tuple[str, ...]  # compiler flags that enable them
    requires: tuple[str, ...]  # groups that must be chosen too
    probe: str  # one statement using the group's intrinsics (checks the compiler)


GROUPS: tuple[IsaGroup, ...] = (
    IsaGroup(
        "avx2",
        1,
        ("avx", "avx2", "fma", "f16c"),
        ("-mavx", "-mavx2", "-mfma", "-mf16c"),
        (),
        "__m256 a = _mm256_set1_ps(1.f); a = _mm256_fmadd_ps(a, a, a); (void)a;",
    ),
    IsaGroup(
        "avx_vnni",
        1,
        ("avx_vnni",),
        ("-mavxvnni",),
        ("avx2",),
        "__m256i a = _mm256_set1_epi8(1); a = _mm256_dpbusd_avx_epi32(a, a, a); (void)a;",
    ),
    IsaGroup(
        "avx512",
        2,
        ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"),
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512cd"),
        ("avx2",),
        "__m512 a = _mm512_set1_ps(1.f); a = _mm512_fmadd_ps(a, a, a); (void)a;",
    ),
    IsaGroup(
        "avx512_vnni",
        2,
        ("avx512_vnni",),
        ("-mavx512vnni",),
        ("avx512",),
        "__m512i a = _mm512_set1_epi8(1); a = _mm512_dpbusd_epi32(a, a, a); (void)a;",
    ),
    IsaGroup(
        "avx512_bf16",
        2,
        ("avx512_bf16",),
        ("-mavx512bf16",),
        ("avx512",),
        "__m512 a = _mm512_set1_ps(1.f); __m512bh b = _mm512_cvtne2ps_pbh(a, a);"
        " a = _mm512_dpbf16_ps(a, b, b); (void)a;",
    ),
    IsaGroup(
        "amx",
        3,
        ("amx_tile", "amx_int8", "amx_bf16"),
        ("-mamx-tile", "-mamx-int8", "-mamx-bf16"),
        ("avx512_bf16",),
        "_tile_zero(0); _tile_dpbf16ps(0, 1, 2); _tile_release();",
    ),
)
GROUP_BY_NAME = {g.name: g for g in GROUPS}
# forced level -> the group that defines it (None: the baseline, always there)
LEVELS: dict[str, str | None] = {"generic": None, "avx2": "avx2", "avx512": "avx512", "amx": "amx"}


class IsaUnavailable(RuntimeError):
    """``IRONLM_CPU_ISA`` asks for something this CPU or compiler cannot give."""


@dataclass(frozen=True)
class CpuInfo:
    model: str
    flags: frozenset[str]

    @classmethod
    def parse(cls, cpuinfo: str) -> CpuInfo:
        """From /proc/cpuinfo text (the first processor's ``model name`` and ``flags``)."""
        model, flags = "unknown", None
        for line in cpuinfo.splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model == "unknown":
                model = value.strip()
            elif key == "flags" and flags is None:
                flags = frozenset(value.split())
        return cls(model, flags or frozenset())

    def groups(self) -> tuple[str, ...]:
        """The groups this CPU has, in ``GROUPS`` order."""
        have: list[str] = []
        for g in GROUPS:
            if set(g.cpu_flags) <= self.flags and all(r in have for r in g.requires):
                have.append(g.name)
        return tuple(have)


@dataclass(frozen=True)
class IsaTarget:
    """What one build of a C source is compiled for: the chosen groups, in ``GROUPS`` order."""

    groups: tuple[str, ...]

    @property
    def name(self) -> str:
        """The highest level reached: generic, avx2, avx512 or amx."""
        best = "generic"
        for level, group in LEVELS.items():
            if group is not None and group in self.groups:
                best = level
        return best

    def has(self, group: str) -> bool:
        return group in self.groups

    @property
    def cc_flags(self) -> list[str]:
        return [f for g in self.groups for f in GROUP_BY_NAME[g].cc_flags]

    def describe(self) -> str:
        return f"{self.name} ({', '.join(self.groups) or 'x86-64 baseline'})"


GENERIC = IsaTarget(())


def parse_request(value: str | None) -> tuple[str | None, frozenset[str]]:
    """``IRONLM_CPU_ISA`` -> (forced level or None for the best, groups left out)."""
    if value is None or not value.strip():
        return None, frozenset()
    parts = [p.strip() for p in value.split(",") if p.strip()]
    level: str | None = parts[0]
    if level in ("auto", "native", "best"):
        level = None
    elif level not in LEVELS:
        raise IsaUnavailable(
            f"{ENV_VAR}={value!r}: unknown level {level!r}; choose one of "
            f"auto, {', '.join(LEVELS)}, optionally followed by groups to leave out "
            f"(e.g. 'avx512,-avx512_bf16')"
        )
    excluded = set()
    for part in parts[1:]:
        name = part.removeprefix("-")
        if not part.startswith("-") or name not in GROUP_BY_NAME:
            raise IsaUnavailable(
                f"{ENV_VAR}={value!r}: {part!r} is not '-GROUP' with GROUP one of "
                f"{', '.join(GROUP_BY_NAME)}"
            )
        excluded.add(name)
    return level, frozenset(excluded)


def select_target(
    cpu: CpuInfo, request: str | None, compiler_has: dict[str, bool] | None = None
) -> IsaTarget:
    """The target for ``cpu`` under ``request`` (an ``IRONLM_CPU_ISA`` value). ``compiler_has``
    maps group -> whether the compiler can build it (missing entries: yes). Raises
    IsaUnavailable when a forced level is not there."""
    level, excluded = parse_request(request)
    cap = 99 if level is None else (0 if LEVELS[level] is None else
                                    GROUP_BY_NAME[LEVELS[level]].level)  # fmt: skip
    cc = compiler_has or {}
    on_cpu = cpu.groups()
    chosen: list[str] = []
    for name in on_cpu:
        g = GROUP_BY_NAME[name]
        if g.level > cap or name in excluded or not cc.get(name, True):
            continue
        if all(r in chosen for r in g.requires):
            chosen.append(name)
    target = IsaTarget(tuple(chosen))
    wanted = None if level is None else LEVELS[level]
    if wanted is not None and wanted not in chosen:
        group = GROUP_BY_NAME[wanted]
        if wanted not in on_cpu:
            missing = sorted(set(group.cpu_flags) - cpu.flags) or list(group.requires)
            why = f"this CPU ({cpu.model}) lacks {', '.join(missing)}"
        elif not cc.get(wanted, True):
            why = f"the C compiler cannot build it ({' '.join(group.cc_flags)})"
        else:
            why = f"it was left out ({request})"
        offered = ["generic"] + [lv for lv, g in LEVELS.items() if g is not None and g in on_cpu]
        raise IsaUnavailable(
            f"{ENV_VAR}={request!r} asks for the {level} target, but {why}; "
            f"this machine offers: {', '.join(offered)}"
        )
    return target


# -- this process's machine and compiler (read once) -------------------------------------------
@functools.cache
def host_cpu() -> CpuInfo:
    try:
        return CpuInfo.parse(Path("/proc/cpuinfo").read_text())
    except OSError:
        return CpuInfo("unknown", frozenset())


def compiler() -> str | None:
    """The C compiler the kernels are built with: $CC, else cc or gcc on PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@functools.cache
def compiler_supports(cc: str, group: str) -> bool:
    """Whether ``cc`` compiles the group's probe with its flags (and its required groups').
    Answers are kept in ``$IRONLM_CACHE_DIR/kernels/compiler-probes.json`` per compiler path
    and modification time, so a start-up runs no compiler when its kernels are cached."""
    root = os.environ.get("IRONLM_CACHE_DIR") or os.path.join("~", ".cache", "ironlm")
    store = Path(root).expanduser() / "kernels" / "compiler-probes.json"
    try:
        path = shutil.which(cc) or cc
        key = f"{path}|{os.stat(path).st_mtime_ns}|{group}"
    except OSError:
        return False
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), bool):
        return known[key]
    ok = _probe(cc, group)
    known = known if isinstance(known, dict) else {}
    known[key] = ok
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, store)
    except OSError:
        pass  # an unwritable cache only costs the probe next time
    return ok


def _probe(cc: str, group: str) -> bool:
    g = GROUP_BY_NAME[group]
    flags = [f for r in _closure(group) for f in GROUP_BY_NAME[r].cc_flags]
    source = f"#include <immintrin.h>\nvoid probe(void) {{ {g.probe} }}\n"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(source)
        try:
            proc = subprocess.run([cc, *flags, "-c", str(src), "-o", str(Path(tmp) / "probe.o")],
                                  capture_output=True, timeout=60)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return False
    return proc.returncode == 0


def _closure(group: str) -> list[str]:
    """The group and every group it needs, dependencies first."""
    out: list[str] = []
    for r in GROUP_BY_NAME[group].requires:
        out += [x for x in _closure(r) if x not in out]
    return out + [group]


def host_target(request: str | None = None) -> IsaTarget:
    """The target for this machine under ``request`` (default: ``$IRONLM_CPU_ISA``)."""
    if request is None:
        request = os.environ.get(ENV_VAR)
    return _host_target(request, compiler())


@functools.cache
def _host_target(request: str | None, cc: str | None) -> IsaTarget:
    cpu = host_cpu()
    if cc is None or not (shutil.which(cc) or os.path.exists(cc)):
        # no compiler at all: the CPU decides, and each library's build says what is missing
        return select_target(cpu, request)
    have = {g: compiler_supports(cc, g) for g in cpu.groups()}
    return select_target(cpu, request, have)


def targets_to_compile(cc: str) -> list[IsaTarget]:
    """One target per level with every group of that level or below that ``cc`` can build,
    whatever this CPU runs: what the compile-only tests build (a level whose defining group the
    compiler lacks is left out)."""
    out = [GENERIC]
    for group in (g for g in LEVELS.values() if g is not None):
        top = GROUP_BY_NAME[group].level
        names: list[str] = []
        for g in GROUPS:
            if (
                g.level <= top
                and all(r in names for r in g.requires)
                and compiler_supports(cc, g.name)
            ):
                names.append(g.name)
        if group in names:
            out.append(IsaTarget(tuple(names)))
    return out
