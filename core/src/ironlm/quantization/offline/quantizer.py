"""``ironlm quantize``: a float Llama-family HF folder -> a quantized HF folder, layer by layer.

Each decoder layer's float tensors are read, quantized by the chosen algorithm (with the
calibration activations where it needs them) and written; the activations then move on to the
next layer. Memory holds one layer's weights and the calibration activations, which are
bounded by ``calib_tokens``. Everything that is not a decoder linear (embeddings, norms, biases,
LM head) is written in ``dtype``; with ``lm_head`` (weight_only_int8) the LM head's table, the
embedding's when they are tied, is written as int8 rows with per-row scales.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer

from ironlm.quantization.int4 import GROUP_SIZES
from ironlm.quantization.offline import QUANT_TYPES
from ironlm.quantization.offline import calibration as calib
from ironlm.quantization.offline.awq import awq_layer
from ironlm.quantization.offline.checkpoint import (
    FloatCheckpoint,
    ShardedWriter,
    atomic_folder,
    copy_side_files,
)
from ironlm.quantization.offline.formats import (
    awq_tensors,
    fp8_tensors,
    gptq_tensors,
    int4_tensors,
    int8_tensors,
    quantization_config,
)
from ironlm.quantization.offline.gptq import (
    V2_ALPHA,
    asymmetric_target,
    gptq_quantize,
    hessian,
)
from ironlm.quantization.offline.llama_block import (
    ATTN_O,
    ATTN_QKV,
    LINEARS,
    MLP_DOWN,
    MLP_GATE_UP,
    ROW_PARALLEL,
    DecoderLayer,
    LlamaShape,
    Rotary,
)
from ironlm.quantization.offline.smoothquant import smooth_layer
from ironlm.quantization.rtn import int4_params, int4_values

INT4_TYPES = ("awq", "gptq", "weight_only_int4")
CALIBRATED = ("smooth_quant", "awq", "gptq")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class QuantizeOptions:
    quant_type: str
    tp_size: int = 1
    dtype: str = "fp16"  # of everything left unquantized
    alpha: float = 0.5  # SmoothQuant migration strength
    tokenids_path: Path | None = None  # calibration token ids; None: the built-in text
    multi_query_mode: bool = False
    group_size: int | None = None  # int4: None picks the largest of 128/64/32 that shards
    zero_points: bool | None = None  # int4: None: awq with zero points, the others without
    desc_act: bool = True  # GPTQ act-order (GPTQModel's default)
    damp: float = 0.05  # GPTQ damping (fraction of the mean Hessian diagonal; GPTQModel's)
    mse: float = 2.4  # GPTQ: norm of the per-group clipping search (0: full range)
    v2_alpha: float | None = None  # GPTQ v2 asymmetric calibration (None: V2_ALPHA; 0: off)
    lm_head: bool = False  # weight_only_int8: the LM head (tied: the embedding table) in int8
    calib_tokens: int = calib.DEFAULT_MAX_TOKENS
    seq_len: int = calib.DEFAULT_SEQ_LEN
    search_tokens: int = 512  # AWQ: tokens the scale-search and clip losses run on
    progress: bool = True


@dataclass
class _Plan:
    """What the options resolve to for one model."""

    shape: LlamaShape
    group_size: int | None
    zero_points: bool


def quantize_model(src: Path, out: Path, opts: QuantizeOptions) -> Path:
    """Write the quantized checkpoint of the HF folder ``src`` to ``out`` (atomically)."""
    if opts.quant_type not in QUANT_TYPES:
        raise ValueError(
            f"unknown --quant-type {opts.quant_type!r}; choose one of {', '.join(QUANT_TYPES)}"
        )
    if opts.dtype not in DTYPES:
        raise ValueError(f"unknown -t {opts.dtype!r}; choose one of {', '.join(DTYPES)}")
    if not (src / "config.json").is_file():
        raise ValueError(f"-i {src} is not an HF model folder (no config.json)")
    raw_config = json.loads((src / "config.json").read_text())
    if raw_config.get("quantization_config"):
        method = raw_config["quantization_config"].get("quant_method")
        raise ValueError(f"-i {src} is already quantized (quant_method {method!r})")
    hf_config = AutoConfig.from_pretrained(str(src))
    plan = _plan(hf_config, opts)
    reader = FloatCheckpoint(src)
    data = _calibration(src, hf_config, opts) if opts.quant_type in CALIBRATED else None
    dtype = DTYPES[opts.dtype]
    with atomic_folder(out) as tmp:
        writer = ShardedWriter(tmp)
        rotary = Rotary(hf_config, plan.shape, max(data.lengths) if data else 1)
        x = reader.get("model.embed_tokens.weight")[data.ids] if data else None
        quantize_layer = _LAYER_QUANTIZERS[opts.quant_type]
        layers = range(hf_config.num_hidden_layers)
        for i in tqdm(layers, desc=f"quantize {opts.quant_type}", unit="layer",
                      disable=not opts.progress):  # fmt: skip
            prefix = f"model.layers.{i}."
            names = [n for n in reader.names() if n.startswith(prefix)]
            tensors = {n[len(prefix) :]: reader.get(n) for n in names}
            missing = [prefix + n for n in plan.shape.required() if n not in tensors]
            if missing:
                raise ValueError(f"{src}: the checkpoint lacks {', '.join(missing)}")
            layer = DecoderLayer(tensors, plan.shape, rotary)
            x, tensors = quantize_layer(layer, x, data, plan, opts)
            writer.add({prefix + n: t for n, t in tensors.items()})
            writer.add({
                prefix + n: t.to(dtype) for n, t in layer.t.items()
                if n.rpartition(".")[0] not in LINEARS or n.endswith(".bias")
            })  # fmt: skip
        head = _lm_head_table(reader, hf_config) if opts.lm_head else None
        writer.add({
            n: reader.get(n).to(dtype) for n in reader.names()
            if not n.startswith("model.layers.") and n != head
        })  # fmt: skip
        if head is not None:  # int8 rows (vocab, hidden), a float32 scale per row
            writer.add(int8_tensors(head.removesuffix(".weight"), reader.get(head)))
        writer.finish()
        raw_config["quantization_config"] = quantization_config(
            opts.quant_type, plan.group_size, plan.zero_points, opts.alpha, opts.desc_act,
            opts.damp, opts.lm_head,
        )  # fmt: skip
        raw_config["dtype"] = str(dtype).removeprefix("torch.")
        raw_config.pop("torch_dtype", None)
        (tmp / "config.json").write_text(json.dumps(raw_config, indent=2) + "\n")
        copy_side_files(src, tmp)
    return out


def _plan(hf_config: object, opts: QuantizeOptions) -> _Plan:
    shape = LlamaShape.of(hf_config)
    tp = opts.tp_size
    if tp < 1:
        raise ValueError(f"-tp must be at least 1, got {tp}")
    kv = shape.num_kv_heads
    if shape.num_heads % tp or shape.intermediate % tp or (kv % tp and tp % kv):
        raise ValueError(
            f"-tp {tp} does not divide the model: {shape.num_heads} attention heads, {kv} KV "
            f"heads, intermediate size {shape.intermediate}"
        )
    if opts.multi_query_mode and kv == shape.num_heads:
        raise ValueError(
            f"--multi-query-mode: the checkpoint has as many KV heads as query heads "
            f"({kv}); multi-query / grouped-query attention has fewer"
        )
    if opts.quant_type == "smooth_quant" and not 0.0 <= opts.alpha <= 1.0:
        raise ValueError(f"-sq (SmoothQuant alpha) must be in [0, 1], got {opts.alpha}")
    if opts.v2_alpha is not None and not 0.0 <= opts.v2_alpha <= 1.0:
        raise ValueError(f"--v2-alpha must be in [0, 1], got {opts.v2_alpha}")
    if opts.v2_alpha is not None and opts.quant_type != "gptq":
        raise ValueError(f"--v2-alpha is a GPTQ option; --quant-type is {opts.quant_type}")
    if opts.lm_head and opts.quant_type != "weight_only_int8":
        raise ValueError(
            f"--quantize-lm-head is a weight_only_int8 option; --quant-type is {opts.quant_type}"
        )
    zero_points = opts.zero_points if opts.zero_points is not None else opts.quant_type == "awq"
    if opts.quant_type == "awq" and not zero_points:
        raise ValueError("AWQ checkpoints (AutoAWQ GEMM) carry zero points; drop --sym")
    group = None
    if opts.quant_type in INT4_TYPES:
        # the input features each rank holds per linear: the whole input of column-parallel
        # ones, a 1/tp slice of row-parallel ones (o_proj, down_proj)
        features = {
            name: shape.in_features(name) // (tp if name in ROW_PARALLEL else 1)
            for name in LINEARS
        }
        candidates = (opts.group_size,) if opts.group_size else tuple(reversed(GROUP_SIZES))
        group = next((g for g in candidates if all(k % g == 0 for k in features.values())), None)
        if group is None:
            raise ValueError(
                f"group size {opts.group_size or 'of ' + str(GROUP_SIZES)} does not divide every "
                f"layer's input at -tp {tp} (input features per rank: {features})"
            )
    return _Plan(shape, group, zero_points)


def _lm_head_table(reader: FloatCheckpoint, hf_config: object) -> str:
    """The checkpoint name of the LM head's matrix: the embedding's when they are tied."""
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    name = "model.embed_tokens.weight" if tied else "lm_head.weight"
    if name not in reader.names():
        raise ValueError(f"--quantize-lm-head: the checkpoint lacks {name}")
    return name


def _calibration(src: Path, hf_config: object, opts: QuantizeOptions) -> calib.Calibration:
    if opts.tokenids_path is not None:
        return calib.from_token_ids_file(
            opts.tokenids_path, int(hf_config.vocab_size), opts.seq_len, opts.calib_tokens
        )
    tokenizer = AutoTokenizer.from_pretrained(str(src))
    return calib.from_text(tokenizer, calib.builtin_text(), opts.seq_len, opts.calib_tokens)


# -- one decoder layer per quant type: (layer, x, calibration, plan, options) -> (next x, tensors)
LayerResult = tuple[torch.Tensor | None, dict[str, torch.Tensor]]


def _int8_layer(layer, x, data, plan, opts) -> LayerResult:  # type: ignore[no-untyped-def]
    return x, {k: v for n in LINEARS for k, v in int8_tensors(n, layer.weight(n)).items()}


def _fp8_layer(layer, x, data, plan, opts) -> LayerResult:  # type: ignore[no-untyped-def]
    return x, {k: v for n in LINEARS for k, v in fp8_tensors(n, layer.weight(n)).items()}


def _rtn_int4_layer(layer, x, data, plan, opts) -> LayerResult:  # type: ignore[no-untyped-def]
    out: dict[str, torch.Tensor] = {}
    for n in LINEARS:
        w = layer.weight(n)
        scale, zero = int4_params(w, plan.group_size, plan.zero_points)
        codes = int4_values(w, scale, zero, plan.group_size)
        out.update(int4_tensors(n, codes, scale, zero, plan.zero_points))
    return x, out


def _smooth_quant_layer(layer, x, data, plan, opts) -> LayerResult:  # type: ignore[no-untyped-def]
    h = layer.attn_input(x)
    o_in = layer.attention(h, data.lengths)
    x1 = x + layer.linear(ATTN_O, o_in)
    h2 = layer.mlp_input(x1)
    m = layer.down_input(h2)
    x_next = x1 + layer.linear(MLP_DOWN, m)  # the float function, unchanged by the migration
    act_max = {key: t.abs().amax(dim=0) for key, t in
               (("attn", h), ("o", o_in), ("mlp", h2), ("down", m))}  # fmt: skip
    smooth_layer(layer, act_max, opts.alpha)
    return _int8_layer(layer, x_next, data, plan, opts)


def _awq_layer(layer, x, data, plan, opts) -> LayerResult:  # type: ignore[no-untyped-def]
    x_next = layer.forward(x, data.lengths)  # the float model's activations feed the next layer
    awq_layer(layer, x, data.lengths, plan.group_size, True, opts.search_tokens)
    out: dict[str, torch.Tensor] = {}
    for n in LINEARS:
        w = layer.weight(n)
        scale, zero = int4_params(w, plan.group_size, True)
        scale = scale.half().float()  # as stored
        out.update(awq_tensors(n, int4_values(w, scale, zero, plan.group_size), scale, zero))
    return x_next, out


def _gptq_layer(layer, x, data, plan, opts) -> LayerResult:  # type: ignore[no-untyped-def]
    """True-sequential: each linear group is quantized on inputs computed with the already
    quantized linears before it; the next layer sees the quantized layer's output. With
    ``v2_alpha`` > 0 the float model's activations run beside them (``x`` is then the stacked
    pair (2, T, hidden): quantized, float; the first layer gets one tensor for both) and each
    linear is fitted to the float model's outputs (``asymmetric_target``)."""
    out: dict[str, torch.Tensor] = {}
    alpha = V2_ALPHA if opts.v2_alpha is None else opts.v2_alpha
    v2 = alpha > 0
    xq, xf = (x, x) if x.dim() == 2 else (x[0], x[1])

    def run(names: tuple[str, ...], inputs: torch.Tensor,
            float_inputs: torch.Tensor | None) -> None:
        # linears reading the same input share H (and so the act-order permutation): one
        # stacked solve, split by rows afterwards
        weights = [layer.weight(n) for n in names]
        target, h = torch.cat(weights), hessian(inputs)
        if float_inputs is not None:
            target = asymmetric_target(target, h, inputs, float_inputs, opts.damp, alpha)
        shards = opts.tp_size if names[0] in ROW_PARALLEL else 1
        res = gptq_quantize(target, h, plan.group_size, plan.zero_points, opts.damp,
                            opts.desc_act, shards, opts.mse)  # fmt: skip
        start = 0
        for n, w in zip(names, weights):
            rows = slice(start, start + w.shape[0])
            start += w.shape[0]
            out.update(gptq_tensors(n, res.codes[rows], res.scale[rows], res.zero[rows],
                                    res.g_idx.clone()))  # fmt: skip
            layer.t[f"{n}.weight"] = res.dequantized[rows]

    # each float-path stage runs before the linears it reads are replaced by their quantized
    # values
    h = layer.attn_input(xq)
    hf = layer.attn_input(xf) if v2 else None
    of = layer.attention(hf, data.lengths) if v2 else None
    run(ATTN_QKV, h, hf)
    o_in = layer.attention(h, data.lengths)
    x1f = xf + layer.linear(ATTN_O, of) if v2 else None
    run((ATTN_O,), o_in, of)
    x1 = xq + layer.linear(ATTN_O, o_in)
    h2 = layer.mlp_input(x1)
    h2f = layer.mlp_input(x1f) if v2 else None
    mf = layer.down_input(h2f) if v2 else None
    run(MLP_GATE_UP, h2, h2f)
    m = layer.down_input(h2)
    x_next_f = x1f + layer.linear(MLP_DOWN, mf) if v2 else None
    run((MLP_DOWN,), m, mf)
    x_next = x1 + layer.linear(MLP_DOWN, m)
    return (torch.stack([x_next, x_next_f]) if v2 else x_next), out


_LAYER_QUANTIZERS: dict[str, Callable[..., LayerResult]] = {
    "weight_only_int8": _int8_layer,
    "smooth_quant": _smooth_quant_layer,
    "fp8": _fp8_layer,
    "weight_only_int4": _rtn_int4_layer,
    "awq": _awq_layer,
    "gptq": _gptq_layer,
}
