"""The cpu plugin's quantized linear / embedding kernels against the core's pure-torch reference
(ironlm.interfaces.quant), on random canonical tensors of every layout: row counts 1/3/7/64,
odd output sizes, K not a multiple of the vector width, with and without bias; the generic
(no-AVX2) build against the AVX2 one; the AVX-512 VNNI / AVX-VNNI paths compiled; layouts
without a kernel falling back to the reference.

GGUF kernels quantize activations to int8 blocks (as llama.cpp does): they are checked tightly
against that rounding emulated in torch, and loosely against the float reference.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ironlm.interfaces.quant import QuantLayout, pack_int4, reference_embedding, reference_linear

from ironlm_cpu.layer_ops import CpuLayerOps
from ironlm_cpu.quant_kernels import SIGNATURES, QuantKernels, quant_source
from ironlm_cpu.quant_packing import Format, features, kernel_format, pack, packed_format

ROWS = [1, 3, 7, 64, 45]
GGML = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}


@pytest.fixture(scope="module")
def ops() -> CpuLayerOps:
    layer_ops = CpuLayerOps()
    if not layer_ops.quant.available:
        pytest.skip(layer_ops.quant.reason)
    return layer_ops


def float_layout(kind: str, n: int, k: int, seed: int) -> tuple[QuantLayout, dict[str, torch.Tensor]]:
    """Random canonical tensors of a float-activation or w8a8 layout ("int8", "w8a8", "fp8",
    "int4-g<G>[-sym]")."""
    g = torch.Generator().manual_seed(seed)
    if kind in ("int8", "w8a8"):
        q = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
        return QuantLayout(kind), {"qweight": q, "scale": torch.rand(n, generator=g) / 50}
    if kind.startswith("fp8"):
        q = (torch.randn(n, k, generator=g) * 30).to(torch.float8_e4m3fn)  # normals and subnormals
        scale = torch.rand((), generator=g) if kind == "fp8-tensor" else torch.rand(n, generator=g)
        return QuantLayout("fp8"), {"qweight": q, "scale": scale}
    group = int(kind.split("-g")[1].split("-")[0])
    zeros = not kind.endswith("-sym")
    t = {"qweight": pack_int4(torch.randint(0, 16, (n, k), generator=g)),
         "scale": torch.rand(n, k // group, generator=g) / 10}  # fmt: skip
    if zeros:
        t["zero"] = torch.randint(0, 16, (n, k // group), generator=g).to(torch.uint8)
    return QuantLayout("int4", group_size=group, zero_points=zeros), t


def gguf_layout(name: str, n: int, k: int, seed: int) -> tuple[QuantLayout, dict[str, torch.Tensor]]:
    """GGUF rows: quantized by the gguf package where it can (Q4_0, Q4_1, Q8_0); random blocks
    with finite half-float scales for the K-quants (it only dequantizes those)."""
    from gguf import GGMLQuantizationType, quantize

    rng = np.random.default_rng(seed)
    qtype = GGMLQuantizationType(GGML[name])
    if name in ("Q4_0", "Q4_1", "Q8_0"):
        raw = quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    else:
        size = 144 if name == "Q4_K" else 210
        raw = rng.integers(0, 256, (n, k // 256, size), dtype=np.uint8)
        for at in (0, 2) if name == "Q4_K" else (208,):  # d (and dmin): small positive halves
            half = rng.uniform(1e-3, 1e-2, (n, k // 256)).astype(np.float16)
            raw[:, :, at:at + 2] = half.view(np.uint8).reshape(n, k // 256, 2)
        raw = raw.reshape(n, -1)
    return QuantLayout("gguf", ggml_type=GGML[name]), {"qweight": torch.from_numpy(raw)}


def emulate_q8(x: torch.Tensor, block: int) -> torch.Tensor:
    """x after the GGUF kernels' activation rounding: int8 per ``block`` elements, scale
    max |x| / 127, round half to even."""
    t, k = x.shape
    xb = x.reshape(t, k // block, block)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(xb * inv) * (amax / 127.0)).reshape(t, k)


# (kind, n, k): n % 16 == 0 takes the 16-row panel kernels (int8, fp8, int4), odd n the row
# kernels; w8a8 pads n to 8-row panels; k not a multiple of 8 / 32 (panels: 4) exercises the
# tails
FLOAT_CASES = [("int8", 37, 100), ("int8", 48, 100), ("int8", 32, 102), ("fp8", 48, 98), ("w8a8", 37, 100), ("w8a8", 16, 576),
               ("w8a8", 96, 68),  # n % 32 == 0: AVX-512 VNNI's 8-row x 4-panel batch tile
               ("w8a8", 48, 128), ("w8a8", 32, 1536),  # n % 16, k % 64 == 0: AMX builds' tiles
               ("w8a8", 19, 30), ("fp8", 37, 100), ("fp8", 32, 72), ("fp8-tensor", 19, 72),
               ("int4-g32", 37, 96), ("int4-g32", 64, 96), ("int4-g64-sym", 21, 192),
               ("int4-g64-sym", 16, 128), ("int4-g128", 37, 256)]  # fmt: skip


@pytest.mark.parametrize("kind, n, k", FLOAT_CASES)
@pytest.mark.parametrize("rows", ROWS)
def test_float_activation_and_w8a8_kernels_match_reference(
    ops: CpuLayerOps, kind: str, n: int, k: int, rows: int
) -> None:
    layout, tensors = float_layout(kind, n, k, seed=rows)
    packed = ops.pack_quantized(layout, tensors)
    if k % 4 == 0 or kind != "w8a8":
        assert "w0" in packed and "qweight" not in packed  # repacked for the C kernel
    else:  # w8a8 panels need k % 4 == 0: the reference runs it
        assert packed is tensors
    g = torch.Generator().manual_seed(100 + rows)
    x = torch.randn(rows, k, generator=g)
    bias = torch.randn(n, generator=g) if rows != 3 else None
    got = ops.quantized_linear(layout, x, packed, bias)
    want = reference_linear(layout, x, tensors, bias)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    if layout.kind == "w8a8":  # exact integer sums, the reference's rescale
        assert torch.equal(got, want)
    else:  # float sums in another order
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("n, k", [(48, 128), (32, 576), (64, 1536), (32, 68), (352, 1536)])
@pytest.mark.parametrize("rows", [1, 2, 16, 45, 300])
def test_w8a8_on_16_row_panels_matches_reference(
    ops: CpuLayerOps, n: int, k: int, rows: int
) -> None:
    """w8a8 weights laid out for AMX tiles (16-row panels, where n % 16 == 0 and k % 64 == 0):
    on AMX builds the tile unit multiplies them, elsewhere the 8-row kernels read them as two
    halves; either way the reference's result, bit for bit.
    K % 64 != 0 keeps 8-row panels. 300 rows take the tiles' prefill order (two chunks of 9
    and 10 row blocks: the first ends on a lone block), over groups of panels (48 outputs: 3
    panels, a lone last one; 352 x 1536: 22 panels in several groups)."""
    layout, tensors = float_layout("w8a8", n, k, seed=rows)
    packed = pack(Format.W8A8, layout, tensors, amx_int8=True)
    want_fmt = Format.W8A8P if k % 64 == 0 else Format.W8A8
    assert packed_format(Format.W8A8, packed) == want_fmt
    assert features(want_fmt, packed) == (n, k)
    g = torch.Generator().manual_seed(200 + rows)
    x = torch.randn(rows, k, generator=g) * 3
    bias = torch.randn(n, generator=g) if rows % 2 else None
    got = ops.quantized_linear(layout, x, packed, bias)
    assert torch.equal(got, reference_linear(layout, x, tensors, bias))
    ids = torch.tensor([n - 1, 0, 17])
    assert torch.equal(ops.quantized_embedding(layout, ids, packed),
                       reference_embedding(layout, ids, tensors))


def test_w8a8_panels_follow_the_build(ops: CpuLayerOps) -> None:
    """The layer ops lay w8a8 weights out for the tile unit exactly where it runs them."""
    layout, tensors = float_layout("w8a8", 32, 128, seed=1)
    fmt = packed_format(Format.W8A8, ops.pack_quantized(layout, tensors))
    assert fmt == (Format.W8A8P if ops.quant.amx_int8() else Format.W8A8)
    if ops.quant.amx_int8():
        assert "amx-int8" in ops.quant.isa


def test_w8a8_activation_rounding_ties_to_even(ops: CpuLayerOps) -> None:
    """Activations whose x / s falls exactly halfway (s = 1: max |x| = 127) round to even in
    the vector paths (16 and 8 at a time) and the scalar tail, as the reference does."""
    layout, tensors = float_layout("w8a8", 16, 36, seed=2)
    packed = ops.pack_quantized(layout, tensors)
    halves = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 3.5])
    x = torch.cat([torch.tensor([127.0]), halves.repeat(4)[:35]]).reshape(1, 36)
    x = torch.cat([x, -x])
    got = ops.quantized_linear(layout, x, packed, None)
    assert torch.equal(got, reference_linear(layout, x, tensors, None))


@pytest.mark.parametrize("name, n, k", [("Q4_0", 37, 96), ("Q4_1", 37, 576), ("Q4_1", 48, 576),
                                        ("Q8_0", 21, 320), ("Q8_0", 32, 320), ("Q4_K", 37, 512),
                                        ("Q4_K", 16, 512), ("Q6_K", 21, 768), ("Q6_K", 32, 256)])  # fmt: skip
@pytest.mark.parametrize("rows", ROWS)
def test_gguf_kernels_match_reference(ops: CpuLayerOps, name: str, n: int, k: int, rows: int) -> None:
    """Decode (up to 8 rows, or output sizes that are not whole 16-row panels): activations in
    int8 blocks, checked against that rounding emulated in torch. Prefill with whole panels:
    the blocks dequantized to float panels, checked against the float reference."""
    from gguf import GGMLQuantizationType, dequantize

    layout, tensors = gguf_layout(name, n, k, seed=rows)
    packed = ops.pack_quantized(layout, tensors)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=g)
    bias = torch.randn(n, generator=g)
    got = ops.quantized_linear(layout, x, packed, bias)
    want = reference_linear(layout, x, tensors, bias)
    if rows > 8 and n % 16 == 0:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        return
    raw = tensors["qweight"].numpy()
    w = torch.from_numpy(dequantize(raw, GGMLQuantizationType(GGML[name])).copy()).double()
    block = 256 if name.endswith("_K") else 32
    emulated = (emulate_q8(x, block).double() @ w.t() + bias.double()).float()
    torch.testing.assert_close(got, emulated, rtol=1e-5, atol=1e-5 * emulated.abs().max().item())
    assert ((got - want).norm() / want.norm()).item() < 0.02  # the activations' rounding


@pytest.mark.parametrize("kind", ["int8", "w8a8", "fp8", "int4-g32", "int4-g64-sym", "Q4_0",
                                  "Q4_1", "Q8_0", "Q4_K", "Q6_K"])  # fmt: skip
@pytest.mark.parametrize("n", [45, 48])
def test_quantized_embedding_rows_equal_reference(ops: CpuLayerOps, kind: str, n: int) -> None:
    if kind.startswith("Q"):
        layout, tensors = gguf_layout(kind, n, 512, seed=7)
    else:
        layout, tensors = float_layout(kind, n, 128, seed=7)
    packed = ops.pack_quantized(layout, tensors)
    ids = torch.tensor([n - 1, 0, 7, 7, 3])
    got = ops.quantized_embedding(layout, ids, packed)
    want = reference_embedding(layout, ids, tensors)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * want.abs().max().item())
    with pytest.raises(IndexError, match="outside"):
        ops.quantized_embedding(layout, torch.tensor([0, n]), packed)


def test_other_dtypes_and_strided_inputs(ops: CpuLayerOps) -> None:
    layout, tensors = float_layout("int4-g32", 32, 64, seed=3)
    packed = ops.pack_quantized(layout, tensors)
    x = torch.randn(5, 128)[:, ::2]  # a strided view: rows 128 apart, elements 2 apart
    torch.testing.assert_close(ops.quantized_linear(layout, x, packed, None),
                               reference_linear(layout, x, tensors, None), rtol=1e-5, atol=1e-4)
    xb = torch.randn(4, 64).to(torch.bfloat16)
    got = ops.quantized_linear(layout, xb, packed, None)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, reference_linear(layout, xb, tensors, None))
    assert ops.quantized_linear(layout, torch.empty(0, 64), packed, None).shape == (0, 32)


def test_layouts_without_a_kernel_use_the_reference(ops: CpuLayerOps) -> None:
    odd = QuantLayout("int4", group_size=16, zero_points=True)
    status = ops.quantized_support(odd)
    assert status.available and "reference" in status.reason and "multiple of 32" in status.reason
    g = torch.Generator().manual_seed(0)
    tensors = {"qweight": pack_int4(torch.randint(0, 16, (8, 64), generator=g)),
               "scale": torch.rand(8, 4, generator=g),
               "zero": torch.randint(0, 16, (8, 4), generator=g).to(torch.uint8)}  # fmt: skip
    assert ops.pack_quantized(odd, tensors) is tensors
    x = torch.randn(2, 64, generator=g)
    assert torch.equal(ops.quantized_linear(odd, x, tensors, None),
                       reference_linear(odd, x, tensors, None))
    q5 = ops.quantized_support(QuantLayout("gguf", ggml_type=6))  # Q5_0
    assert q5.available and "no cpu kernel for gguf (Q5_0)" in q5.reason
    assert f"({ops.quant.isa})" in ops.quantized_support(QuantLayout("w8a8")).reason


# -- other instruction sets -----------------------------------------------------------------
def _compile(flags: list[str], out: Path, mode: str = "-shared") -> subprocess.CompletedProcess[str]:
    """Build the kernels' source with ``flags`` (``mode``: -shared for a library, -S for
    assembly)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc/gcc) on PATH")
    src = out.with_suffix(".c")
    src.write_text(quant_source())
    extra = ["-fPIC", "-lm"] if mode == "-shared" else []
    return subprocess.run([cc, "-O2", "-fopenmp", mode, *flags, str(src), "-o", str(out), *extra],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def _kernels_from(lib_path: Path) -> QuantKernels:
    """A QuantKernels whose library is ``lib_path`` (another build of the same source)."""
    kernels = QuantKernels()
    lib = ctypes.CDLL(str(lib_path))
    for name, (argtypes, restype) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    kernels.lib = lib
    kernels.isa = lib.ironlm_quant_isa().decode()
    return kernels


def test_generic_build_matches_the_simd_build(ops: CpuLayerOps, tmp_path: Path) -> None:
    """The plain-C path (a build for a CPU without AVX2) gives the SIMD path's results."""
    proc = _compile([], tmp_path / "generic.so")
    assert proc.returncode == 0, proc.stderr
    generic = CpuLayerOps(quant=_kernels_from(tmp_path / "generic.so"))
    assert generic.quant.isa == "generic"
    cases: list[tuple[QuantLayout, dict[str, Any]]] = [
        float_layout(kind, 23, k, seed=1) for kind, _, k in FLOAT_CASES
    ] + [gguf_layout(name, 23, 512, seed=1) for name in GGML]
    g = torch.Generator().manual_seed(5)
    for layout, tensors in cases:
        packed = ops.pack_quantized(layout, tensors)
        if packed is tensors:
            continue  # runs the reference
        fmt, _ = kernel_format(layout)
        assert fmt is not None
        _, k = features(packed_format(fmt, packed), packed)
        for rows in (1, 6):
            x = torch.randn(rows, k, generator=g)
            simd = ops.quantized_linear(layout, x, packed, None)
            plain = generic.quantized_linear(layout, x, packed, None)
            torch.testing.assert_close(plain, simd, rtol=1e-5, atol=1e-5 * simd.abs().max().item(),
                                       msg=layout.describe())
        ids = torch.tensor([0, 22])
        assert torch.equal(generic.quantized_embedding(layout, ids, packed),
                           ops.quantized_embedding(layout, ids, packed))
    # w8a8 on the tile unit's 16-row panels: the plain loops read them too
    layout, tensors = float_layout("w8a8", 32, 128, seed=1)
    packed = pack(Format.W8A8, layout, tensors, amx_int8=True)
    assert not generic.quant.amx_int8()
    x = torch.randn(6, 128, generator=g)
    assert torch.equal(generic.quantized_linear(layout, x, packed, None),
                       reference_linear(layout, x, tensors, None))


@pytest.mark.parametrize("isa, flags, instruction", [
    ("avx512-vnni", ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"],
     "vpdpbusd"),
    ("avx-vnni", ["-mavx2", "-mfma", "-mavxvnni"], "vpdpbusd"),
    ("amx-int8", ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni",
                  "-mamx-tile", "-mamx-int8", "-mamx-bf16"], "tdpbssd"),
])  # fmt: skip
def test_vnni_paths_compile(tmp_path: Path, isa: str, flags: list[str], instruction: str) -> None:
    """This machine may lack the instructions; the paths must at least build (a multi-target
    build compiles them wherever the compiler knows the flags)."""
    probe = subprocess.run([shutil.which("cc") or "cc", *flags, "-E", "-x", "c", "-"], input="",
                           capture_output=True, text=True)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"the C compiler does not know {' '.join(flags)}: {probe.stderr.strip()[:200]}")
    asm = tmp_path / f"{isa}.s"
    proc = _compile([*flags, "-O1"], asm, mode="-S")
    assert proc.returncode == 0, proc.stderr
    text = asm.read_text()
    assert "ironlm_quant_linear:" in text
    assert instruction in text  # the VNNI dot product (AMX: the int8 tile product) that build uses
