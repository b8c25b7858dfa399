"""Time the cpu plugin's quantized linear kernels against its float32 packed linear.

SmolLM2-135M's linear shapes (per layer: qkv 960x576, o 576x576, gate_up 3072x576, down
576x1536; 30 layers; the tied LM head 49152x576), random weights in each canonical layout
(``ironlm.interfaces.quant``) packed by ``CpuLayerOps.pack_quantized``. For each format and
activation row count it prints the time of one forward's worth of linears (ms), the weight
bytes that forward reads (MB) and the rate it reads them at (GB/s), and the speed-up over
float32. The K-quants (256-element super-blocks) only fit the down projection (K=1536); their
row shows its 30 copies alone, against float32 on the same. Every layer has its own weights,
so a pass reads them from memory as a decode step does.

    python benchmarks/quant_linear_cpu.py [--rows 1 4 16 64] [--repeats N] [--threads N]
        [--formats fp32 int8 w8a8 int4-g128 int4-g32-sym fp8 q4_0 q4_1 q8_0 q4_k q6_k]
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np
import torch

from ironlm.interfaces.quant import QuantLayout, pack_int4
from ironlm_cpu.layer_ops import CpuLayerOps

LAYERS = 30
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (N, K) per layer
HEAD_SHAPE = (49152, 576)
FORMATS = ["fp32", "int8", "w8a8", "int4-g128", "int4-g32-sym", "fp8", "q4_0", "q4_1", "q8_0",
           "q4_k", "q6_k"]
GGML = {"q4_0": 2, "q4_1": 3, "q8_0": 8, "q4_k": 12, "q6_k": 14}
GGML_BLOCK = {"q4_0": (32, 18), "q4_1": (32, 20), "q8_0": (32, 34), "q4_k": (256, 144),
              "q6_k": (256, 210)}


def best_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def canonical(fmt: str, n: int, k: int, rng: np.random.Generator) -> tuple[QuantLayout, dict]:
    """Random tensors of layout ``fmt`` for an (n, k) weight."""
    if fmt in ("int8", "w8a8"):
        q = torch.from_numpy(rng.integers(-127, 128, (n, k), dtype=np.int8))
        return QuantLayout(fmt), {"qweight": q, "scale": torch.rand(n) / 100}
    if fmt == "fp8":
        q = torch.randn(n, k).to(torch.float8_e4m3fn)
        return QuantLayout("fp8"), {"qweight": q, "scale": torch.rand(n) / 100}
    if fmt.startswith("int4"):
        group = int(fmt.split("-g")[1].split("-")[0])
        zeros = not fmt.endswith("sym")
        values = torch.from_numpy(rng.integers(0, 16, (n, k), dtype=np.uint8))
        t = {"qweight": pack_int4(values), "scale": torch.rand(n, k // group) / 100}
        if zeros:
            t["zero"] = torch.from_numpy(rng.integers(0, 16, (n, k // group), dtype=np.uint8))
        return QuantLayout("int4", group_size=group, zero_points=zeros), t
    elements, size = GGML_BLOCK[fmt]
    raw = rng.integers(0, 256, (n, k // elements, size), dtype=np.uint8)
    half = np.full((n, k // elements), 0.01, np.float16).view(np.uint8).reshape(n, -1, 2)
    for at in ((208,) if fmt == "q6_k" else (0, 2) if fmt in ("q4_1", "q4_k") else (0,)):
        raw[:, :, at:at + 2] = half  # finite scales
    layout = QuantLayout("gguf", ggml_type=GGML[fmt])
    return layout, {"qweight": torch.from_numpy(raw.reshape(n, -1))}


def model_fn(ops: CpuLayerOps, fmt: str, shapes: list[tuple[int, int]], rows: int,
             rng: np.random.Generator) -> tuple[Callable[[], Any], int]:
    """One pass over distinct weights of ``shapes`` (as a forward reads every layer's own
    weights from memory), and the bytes of weight that pass reads."""
    calls, nbytes = [], 0
    inputs = {k: torch.randn(rows, k) for k in {k for _, k in shapes}}
    for n, k in shapes:
        x = inputs[k]
        if fmt == "fp32":
            w = ops.pack_linear_weight(torch.randn(n, k))
            calls.append(lambda x=x, w=w: ops.linear(x, w, None))
            nbytes += w.numel() * 4
            continue
        layout, tensors = canonical(fmt, n, k, rng)
        packed = ops.pack_quantized(layout, tensors)
        nbytes += sum(t.numel() * t.element_size() for t in packed.values())
        calls.append(lambda x=x, layout=layout, packed=packed:
                     ops.quantized_linear(layout, x, packed, None))

    def run() -> None:
        for call in calls:
            call()

    return run, nbytes


def fits(fmt: str, k: int) -> bool:
    return fmt not in ("q4_k", "q6_k") or k % 256 == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--formats", nargs="+", default=FORMATS, choices=FORMATS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ops = CpuLayerOps()
    rng = np.random.default_rng(0)
    print(f"threads {torch.get_num_threads()}, quant kernels: {ops.quant.isa or ops.quant.reason}")
    for rows in args.rows:
        print(f"\n{rows} activation row(s): one forward's linears (30 layers + LM head)")
        print(f"{'format':>16} {'ms':>9} {'MB read':>9} {'GB/s':>7} {'vs fp32':>8}")
        base: dict[bool, float] = {}
        for fmt in ["fp32"] + [f for f in args.formats if f != "fp32"]:
            full = all(fits(fmt, k) for _, k in LAYER_SHAPES + [HEAD_SHAPE])
            shapes = LAYER_SHAPES * LAYERS + [HEAD_SHAPE] if full else [(576, 1536)] * LAYERS
            run, nbytes = model_fn(ops, fmt, shapes, rows, rng)
            ms = best_ms(run, args.repeats)
            del run
            if fmt == "fp32":
                base[True] = ms
                run, _ = model_fn(ops, "fp32", [(576, 1536)] * LAYERS, rows, rng)
                base[False] = best_ms(run, args.repeats)
                del run
            label = fmt if full else f"{fmt} (down x30)"
            print(f"{label:>16} {ms:9.2f} {nbytes / 1e6:9.1f} {nbytes / ms / 1e6:7.1f} "
                  f"{base[full] / ms:7.2f}x", flush=True)


if __name__ == "__main__":
    main()
