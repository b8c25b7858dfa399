"""What the cpu platform's kernel choice measures on this machine, for a model's linear shapes.

    python benchmarks/kernel_choice_cpu.py [--model DIR] [--dtype float32|bfloat16]
        [--isa avx2|avx512|...] [--threads N]

For each linear weight shape of the model (default SmolLM2-135M's: qkv, o, gate/up, down, LM
head), measures every implementation at 1, 8, 64 and 512 rows (``IRONLM_CPU_TUNE=refresh``
semantics: ignores the cache and the load) and prints the decision with each implementation's
time as a ratio of torch's (below 1: faster than torch). Also prints the CPU, its ISA groups
and the target the kernels were built for. Nothing is written to the tuning cache.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch


def model_shapes(model: str | None) -> list[tuple[int, int]]:
    """(out, in) of the model's distinct linear weights (SmolLM2-135M's without ``--model``)."""
    if model is None:
        hidden, inter, heads, kv, vocab = 576, 1536, 9, 3, 49152
    else:
        cfg = json.loads((Path(model) / "config.json").read_text())
        hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
        heads, kv, vocab = cfg["num_attention_heads"], cfg.get("num_key_value_heads"), cfg["vocab_size"]
        kv = kv or heads
    head_dim = hidden // heads
    qkv = (heads + 2 * kv) * head_dim
    return [(qkv, hidden), (hidden, heads * head_dim), (2 * inter, hidden), (hidden, inter),
            (vocab, hidden)]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="HF folder (config.json) for the shapes")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--isa", default=None, help="IRONLM_CPU_ISA for this run (default: best)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    if args.isa:
        os.environ["IRONLM_CPU_ISA"] = args.isa
    torch.set_num_threads(args.threads)

    from ironlm_cpu.isa import host_cpu
    from ironlm_cpu.layer_ops import CpuLayerOps
    from ironlm_cpu.linear_kernel import PackedLinearKernel
    from ironlm_cpu.tuner import KernelTuner, machine_load

    kernel = PackedLinearKernel()
    cpu = host_cpu()
    print(f"cpu: {cpu.model}; ISA groups: {', '.join(cpu.groups()) or 'none'}; "
          f"kernels built for {kernel.target.describe()}; threads {args.threads}; "
          f"load per core {machine_load():.2f}")  # fmt: skip
    if not kernel.available:
        print(f"packed linear kernel unavailable: {kernel.reason}")
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        tuner = KernelTuner(kernel.target, Path(tmp), mode="refresh", forced="",
                            budget_s=float("inf"))  # fmt: skip
        ops = CpuLayerOps(kernel, tuner=tuner)
        for n, k in model_shapes(args.model):
            t0 = time.perf_counter()
            ops.pack_linear_weight(torch.randn(n, k).to(dtype))
            key = next(key for key in tuner.decisions if f"|{n}x{k}|" in key)
            d = tuner.decisions[key]
            print(f"\n{n} x {k} ({time.perf_counter() - t0:.1f} s to measure): "
                  f"{d['layout']} layout -- {d['why']}")  # fmt: skip
            for bucket, times in d.get("us", {}).items():
                base = times.get("torch")
                cells = [f"{impl} {us:.0f}us" + (f" ({us / base:.2f}x)" if base else "")
                         for impl, us in sorted(times.items(), key=lambda kv: kv[1])]  # fmt: skip
                print(f"  M={bucket:>4}: chosen {d['impls'][bucket]:<9} | " + ", ".join(cells))


if __name__ == "__main__":
    main()
