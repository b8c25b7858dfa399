"""``ironlm quantize``: write a quantized copy of a float HF folder (the parameter set's
offline tool; ``ironlm.quantization.offline``). The output loads with ``ironlm serve OUT`` and
``LLM(OUT)``, no flag needed: its config.json carries the ``quantization_config``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ironlm.quantization.offline import DTYPE_NAMES, QUANT_TYPES

    p = sub.add_parser(
        "quantize",
        help="quantize a float HF folder (weight_only_int8, smooth_quant, awq, gptq, fp8)",
        description=(
            "Quantize a Llama-family HF folder layer by layer and write a new HF folder "
            "(safetensors, config.json with quantization_config, tokenizer). awq and gptq run "
            "their algorithms (activation-aware scale search; Hessian-based error compensation) "
            "and smooth_quant its migration on calibration activations from a built-in text "
            "sample or --tokenids-path. OUT is written to a temporary folder and renamed."
        ),
    )
    p.add_argument("-i", "--input", "--model-dir", dest="input", type=Path, required=True,
                   help="the float HF folder")  # fmt: skip
    p.add_argument("-o", "--output", "--output-dir", dest="output", type=Path, required=True,
                   help="the folder to create (must not exist)")  # fmt: skip
    p.add_argument("--quant-type", "-quant_type", dest="quant_type", required=True,
                   metavar="{" + ",".join(QUANT_TYPES) + "}",
                   help="quantization method to write")  # fmt: skip
    p.add_argument("-tp", "--tp-size", "--tensor-parallel-size", dest="tp_size", type=int,
                   default=1, help="tensor-parallel size the checkpoint must shard to: groups "
                   "of row-parallel layers stay whole per rank (default 1)")  # fmt: skip
    p.add_argument("-t", "--dtype", "--storage-type", dest="dtype", choices=DTYPE_NAMES,
                   default="fp16",
                   help="dtype of everything left unquantized (default fp16)")  # fmt: skip
    p.add_argument("-sq", "--smoothquant", dest="alpha", type=float, default=0.5,
                   help="SmoothQuant migration strength alpha in [0, 1] (default 0.5)")  # fmt: skip
    p.add_argument("--tokenids-path", "-token", dest="tokenids_path", type=Path, default=None,
                   help="calibration token ids: one sequence per line, ids separated by commas "
                   "or spaces (default: the built-in text sample)")  # fmt: skip
    p.add_argument("--multi-query-mode", action="store_true",
                   help="assert the model shares KV heads between query heads (multi-query or "
                   "grouped-query attention; the layout follows config.json either "
                   "way)")  # fmt: skip
    p.add_argument("--group-size", type=int, default=None,
                   help="4-bit group size (32, 64, 128; default: the largest that divides "
                   "every layer's input per rank)")  # fmt: skip
    zeros = p.add_mutually_exclusive_group()
    zeros.add_argument("--sym", dest="zero_points", action="store_false", default=None,
                       help="4-bit without zero points (default for gptq, weight_only_int4)")
    zeros.add_argument("--asym", dest="zero_points", action="store_true",
                       help="4-bit with zero points (default for awq)")
    p.add_argument("--desc-act", action=argparse.BooleanOptionalAction, default=True,
                   help="GPTQ act-order: quantize input features by decreasing activity "
                   "(default: on, as GPTQModel)")
    p.add_argument("--damp", type=float, default=0.05,
                   help="GPTQ damping, a fraction of the mean Hessian diagonal (default 0.05, "
                   "GPTQModel's damp_percent)")
    p.add_argument("--mse", type=float, default=2.4,
                   help="GPTQ: clip each group's range by the shrink factor minimizing the "
                   "p-norm of its rounding error, p = this value (default 2.4, the GPTQ "
                   "reference's; 0: the full range)")
    p.add_argument("--v2-alpha", type=float, default=None,
                   help="GPTQ v2 asymmetric calibration: move each linear's target toward the "
                   "float model's outputs on the quantized model's inputs, strength in [0, 1] "
                   "(default 0.25; 1: the least-squares fit; 0: plain GPTQ)")
    p.add_argument("--quantize-lm-head", action="store_true",
                   help="weight_only_int8: quantize the LM head too (per vocabulary row; a tied "
                   "embedding shares it), as GPTQ configs' lm_head and llama.cpp's Q8_0 files "
                   "do; default: the LM head stays in -t's dtype, as vLLM's weight-only "
                   "methods leave it")  # fmt: skip
    p.add_argument("--calib-tokens", type=int, default=4096,
                   help="calibration tokens at most (default 4096)")
    p.add_argument("--calib-seq-len", dest="seq_len", type=int, default=512,
                   help="calibration sequence length at most (default 512)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ironlm.quantization.offline.quantizer import QuantizeOptions, quantize_model

    opts = QuantizeOptions(
        quant_type=args.quant_type,
        tp_size=args.tp_size,
        dtype=args.dtype,
        alpha=args.alpha,
        tokenids_path=args.tokenids_path,
        multi_query_mode=args.multi_query_mode,
        group_size=args.group_size,
        zero_points=args.zero_points,
        desc_act=args.desc_act,
        damp=args.damp,
        mse=args.mse,
        v2_alpha=args.v2_alpha,
        lm_head=args.quantize_lm_head,
        calib_tokens=args.calib_tokens,
        seq_len=args.seq_len,
    )
    try:
        out = quantize_model(args.input, args.output, opts)
    except (ValueError, OSError) as exc:
        print(f"ironlm quantize: error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0
