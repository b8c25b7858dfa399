"""The cpu plugin's ISA dispatch (``ironlm_cpu.isa``, ``cbuild``): CPU flags from /proc/cpuinfo
text, the target chosen for a CPU, forced targets (IRONLM_CPU_ISA), refusals with a clear
message, the bf16 ``auto`` dtype rule, and every kernel source compiled for every target the
compiler can build (only the ones this CPU runs are run, in test_cpu_linear / test_cpu_fused)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ironlm_cpu import isa
from ironlm_cpu.cbuild import KernelLibrary, build_library
from ironlm_cpu.decode_kernel import _SOURCE as DECODE_SOURCE
from ironlm_cpu.fused_kernels import _SOURCE as FUSED_SOURCE
from ironlm_cpu.isa import CpuInfo, IsaTarget, IsaUnavailable, select_target
from ironlm_cpu.linear_kernel import _SOURCE as LINEAR_SOURCE
from ironlm_cpu.platform import auto_dtype

EPYC_FLAGS = (
    "fpu sse sse2 ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c "
    "bmi1 avx2 bmi2 sha_ni vaes vpclmulqdq"
)
XEON_SPR_FLAGS = EPYC_FLAGS + (
    " avx_vnni avx512_bf16 avx512f avx512dq avx512cd avx512bw "
    "avx512vl avx512_vnni avx512_fp16 amx_bf16 amx_tile amx_int8"
)
ZEN4_FLAGS = EPYC_FLAGS + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16"
OLD_FLAGS = "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt avx"


def cpuinfo(model: str, flags: str) -> str:
    return (
        f"processor\t: 0\nvendor_id\t: X\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"
        f"processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n"
    )


def test_flags_parsed_from_cpuinfo_text() -> None:
    cpu = CpuInfo.parse(cpuinfo("AMD EPYC", EPYC_FLAGS))
    assert cpu.model == "AMD EPYC"  # the first processor's line
    assert {"avx2", "fma", "f16c"} <= cpu.flags and "avx512f" not in cpu.flags
    assert cpu.groups() == ("avx2",)
    assert CpuInfo.parse("").groups() == ()


@pytest.mark.parametrize(
    ("flags", "best", "groups"),
    [
        (EPYC_FLAGS, "avx2", ("avx2",)),
        (ZEN4_FLAGS, "avx512", ("avx2", "avx512", "avx512_vnni", "avx512_bf16")),
        (
            XEON_SPR_FLAGS,
            "amx",
            ("avx2", "avx_vnni", "avx512", "avx512_vnni", "avx512_bf16", "amx"),
        ),
        (OLD_FLAGS, "generic", ()),
    ],
)
def test_best_target_per_cpu(flags: str, best: str, groups: tuple[str, ...]) -> None:
    target = select_target(CpuInfo.parse(cpuinfo("cpu", flags)), None)
    assert (target.name, target.groups) == (best, groups)
    assert select_target(CpuInfo.parse(cpuinfo("cpu", flags)), "auto") == target


def test_forced_lower_targets_and_left_out_groups() -> None:
    xeon = CpuInfo.parse(cpuinfo("Intel Xeon", XEON_SPR_FLAGS))
    assert select_target(xeon, "avx2").groups == ("avx2", "avx_vnni")
    assert select_target(xeon, "generic") == isa.GENERIC
    assert select_target(xeon, "avx512").name == "avx512"
    assert not select_target(xeon, "avx512").has("amx")
    no_bf16 = select_target(xeon, "avx512,-avx512_bf16")
    assert no_bf16.name == "avx512" and not no_bf16.has("avx512_bf16")
    with pytest.raises(IsaUnavailable, match="left out"):
        select_target(xeon, "amx,-avx512_bf16")  # AMX needs the bf16 group
    assert "-mavx512f" in select_target(xeon, "avx512").cc_flags
    assert "-mavx512f" not in select_target(xeon, "avx2").cc_flags


def test_missing_target_is_refused_with_what_is_missing() -> None:
    epyc = CpuInfo.parse(cpuinfo("AMD EPYC", EPYC_FLAGS))
    with pytest.raises(IsaUnavailable) as err:
        select_target(epyc, "avx512")
    msg = str(err.value)
    assert "IRONLM_CPU_ISA='avx512'" in msg and "AMD EPYC" in msg and "avx512f" in msg
    assert "offers: generic, avx2" in msg
    with pytest.raises(IsaUnavailable, match="lacks amx_bf16"):
        select_target(CpuInfo.parse(cpuinfo("Zen 4", ZEN4_FLAGS)), "amx")
    with pytest.raises(IsaUnavailable, match="lacks avx2"):
        select_target(CpuInfo.parse(cpuinfo("old", OLD_FLAGS)), "avx2")


def test_compiler_without_a_group_is_named() -> None:
    zen4 = CpuInfo.parse(cpuinfo("Zen 4", ZEN4_FLAGS))
    target = select_target(zen4, None, {"avx512_bf16": False})
    assert target.name == "avx512" and not target.has("avx512_bf16")  # best it can build
    with pytest.raises(IsaUnavailable, match="compiler cannot build it"):
        select_target(zen4, "avx512", {"avx512": False})


@pytest.mark.parametrize("bad", ["avx1024", "avx2,avx512_vnni", "avx2,-nope"])
def test_bad_request_values(bad: str) -> None:
    with pytest.raises(IsaUnavailable, match="IRONLM_CPU_ISA"):
        isa.parse_request(bad)


def test_host_target_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(isa.ENV_VAR, "generic")
    assert isa.host_target() == isa.GENERIC
    assert KernelLibrary("x", "int f(void) { return 1; }", {}, "test").target == isa.GENERIC
    offered = isa.host_cpu().groups()
    if "avx512" not in offered:
        monkeypatch.setenv(isa.ENV_VAR, "avx512")
        with pytest.raises(IsaUnavailable, match="offers"):
            isa.host_target()
        lib = KernelLibrary("x", "int f(void) { return 1; }", {}, "test kernel")
        assert not lib.available and "IRONLM_CPU_ISA" in lib.reason  # refused, not downgraded
        from ironlm_cpu.platform import CpuPlatform

        status = CpuPlatform().is_available()
        assert not status.available and "avx512" in status.reason


def test_generic_target_refuses_avx2_only_libraries() -> None:
    lib = KernelLibrary(
        "x", "int f(void) { return 1; }", {}, "an AVX2 kernel", needs_avx2=True, target=isa.GENERIC
    )
    assert not lib.available and "needs AVX2 + FMA" in lib.reason


def test_auto_dtype_is_bf16_only_with_bf16_arithmetic() -> None:
    assert auto_dtype(IsaTarget(("avx2",))) == torch.float32
    assert auto_dtype(IsaTarget(("avx2", "avx512", "avx512_vnni"))) == torch.float32
    assert auto_dtype(IsaTarget(("avx2", "avx512", "avx512_bf16"))) == torch.bfloat16
    assert auto_dtype(isa.GENERIC) == torch.float32


def _compile_targets() -> list[IsaTarget]:
    cc = isa.compiler()
    return isa.targets_to_compile(cc) if cc else []


@pytest.mark.parametrize("target", _compile_targets(), ids=lambda t: t.name)
@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("cpu_linear", LINEAR_SOURCE),
        ("cpu_fused", FUSED_SOURCE),
        ("cpu_paged_decode", DECODE_SOURCE),
    ],
)
def test_every_source_compiles_for_every_target(
    name: str, source: str, target: IsaTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Builds only (targets beyond this CPU cannot run here); a level the compiler lacks is not
    in the list (``targets_to_compile``), so it is not silently skipped as a pass."""
    monkeypatch.setenv("IRONLM_CACHE_DIR", str(tmp_path))
    lib = build_library(name, source, target)
    assert lib.exists() and lib.stat().st_size > 0 and f"_{target.name}_" in lib.name


def test_compile_targets_cover_the_levels_gcc_supports() -> None:
    cc = isa.compiler()
    if cc is None:
        pytest.skip("no C compiler")
    names = [t.name for t in isa.targets_to_compile(cc)]
    assert names[:2] == ["generic", "avx2"]
    if isa.compiler_supports(cc, "avx512_bf16"):  # gcc >= 10
        assert "avx512" in names


def test_missing_compiler_keeps_the_cpu_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No compiler is not a CPU without AVX2: the target stays the CPU's and each library says
    it cannot be built."""
    monkeypatch.setenv("IRONLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    assert isa.host_target().groups == isa.host_cpu().groups()
    lib = KernelLibrary("x", "int f(void) { return 1; }", {}, "test kernel")
    assert not lib.available and "unavailable" in lib.reason
