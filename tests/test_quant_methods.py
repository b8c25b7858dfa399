"""The quantization methods on a tiny random Llama: each public checkpoint format, written here
by the tests' own packers (from the formats' descriptions), loads into exactly the weights it
stands for; online quantization by name; the checks on bad checkpoints and flags."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from quant_helpers import (
    IDS_TINY,
    LINEARS,
    awq_codes,
    awq_pack_reference,
    float_tensors,
    gptq_col_codes,
    gptq_pack_cols_reference,
    gptq_pack_rows_reference,
    gptq_row_codes,
    load,
    our_logits,
    write_variant,
)

from ironlm.interfaces.quant import pack_int4, unpack_int4
from ironlm.plugin_manager import PluginManager
from ironlm.quantization.packing import (
    awq_pack,
    awq_unpack,
    gptq_pack_cols,
    gptq_pack_rows,
    gptq_unpack_cols,
    gptq_unpack_rows,
)
from ironlm.registry import UnknownNameError

IDS = IDS_TINY
G = 32


def _layers(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The decoder linears of a checkpoint (their module names)."""
    return sorted(
        n.removesuffix(".weight") for n in tensors
        if any(n.endswith(f".{linear}.weight") for linear in LINEARS)
    )  # fmt: skip


def _random_codes(n: int, k: int, gen: torch.Generator) -> tuple[np.ndarray, ...]:
    codes = torch.randint(0, 16, (n, k), generator=gen).numpy()
    zeros = torch.randint(0, 16, (n, k // G), generator=gen).numpy()
    scales = (torch.rand(n, k // G, generator=gen) * 0.02 + 0.001).half().float().numpy()
    return codes, zeros, scales


def _dequant(codes: np.ndarray, zeros: np.ndarray, scales: np.ndarray,
             groups: np.ndarray) -> torch.Tensor:  # fmt: skip
    return torch.from_numpy(((codes - zeros[:, groups]) * scales[:, groups]).astype(np.float32))


# -- packings --------------------------------------------------------------------------------
def test_packings_match_the_published_bit_layouts() -> None:
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (16, 64), generator=gen)
    assert torch.equal(awq_pack(codes), awq_pack_reference(codes.numpy()))
    assert np.array_equal(awq_codes(awq_pack(codes)), codes.numpy())
    assert torch.equal(awq_unpack(awq_pack_reference(codes.numpy())).long(), codes)
    assert torch.equal(gptq_pack_rows(codes), gptq_pack_rows_reference(codes.numpy()))
    assert np.array_equal(gptq_row_codes(gptq_pack_rows(codes)), codes.numpy())
    assert torch.equal(gptq_unpack_rows(gptq_pack_rows(codes)).long(), codes)
    assert torch.equal(gptq_pack_cols(codes), gptq_pack_cols_reference(codes.numpy()))
    assert np.array_equal(gptq_col_codes(gptq_pack_cols(codes)), codes.numpy())
    assert torch.equal(gptq_unpack_cols(gptq_pack_cols(codes)).long(), codes)
    assert (awq_pack(codes) < 0).any()  # words with the top nibble >= 8 are negative int32
    assert torch.equal(unpack_int4(pack_int4(codes)).long(), codes)


# -- checkpoints written by the tests' packers load exactly ----------------------------------------
def _awq_variant(src: Path, dst: Path) -> tuple[Path, Path]:
    gen = torch.Generator().manual_seed(1)
    base = float_tensors(src)
    quant, ref = dict(base), dict(base)
    for name in _layers(base):
        n, k = base[f"{name}.weight"].shape
        codes, zeros, scales = _random_codes(n, k, gen)
        del quant[f"{name}.weight"]
        quant[f"{name}.qweight"] = awq_pack_reference(codes.T.copy())
        quant[f"{name}.qzeros"] = awq_pack_reference(zeros.T.copy())
        quant[f"{name}.scales"] = torch.from_numpy(scales.T.copy()).half()
        ref[f"{name}.weight"] = _dequant(codes, zeros, scales, np.arange(k) // G)
    config = {"quant_method": "awq", "bits": 4, "group_size": G, "zero_point": True,
              "version": "gemm", "modules_to_not_convert": None}  # fmt: skip
    return (write_variant(src, dst / "awq", quant, config),
            write_variant(src, dst / "awq-ref", ref, None))  # fmt: skip


def test_autoawq_gemm_checkpoint_loads_without_a_flag(tiny_llama_dir: Path, tmp_path: Path) -> None:
    awq, ref = _awq_variant(tiny_llama_dir, tmp_path)
    torch.testing.assert_close(our_logits(awq, IDS), our_logits(ref, IDS), rtol=0, atol=2e-4)
    # the flag may name the checkpoint's own method
    torch.testing.assert_close(our_logits(awq, IDS, "awq"), our_logits(ref, IDS), rtol=0,
                               atol=2e-4)  # fmt: skip


@pytest.mark.parametrize(("sym", "act_order", "fmt"), [
    (True, False, "gptq"), (False, True, "gptq"), (True, True, "gptq_v2"),
])
def test_gptq_checkpoint_loads(tiny_llama_dir: Path, tmp_path: Path, sym: bool,
                               act_order: bool, fmt: str) -> None:  # fmt: skip
    gen = torch.Generator().manual_seed(2)
    base = float_tensors(tiny_llama_dir)
    quant, ref = dict(base), dict(base)
    perms: dict[int, torch.Tensor] = {}
    for name in _layers(base):
        n, k = base[f"{name}.weight"].shape
        codes, zeros, scales = _random_codes(n, k, gen)
        if sym:
            zeros[:] = 8
        # act-order: groups numbered in a permuted order; q/k/v (and gate/up) share the input,
        # hence one permutation per input width, as GPTQ's shared Hessian gives
        perm = perms.setdefault(k, torch.randperm(k, generator=gen)) if act_order else None
        g_idx = (np.arange(k) // G if perm is None
                 else (torch.argsort(perm).numpy() // G))  # fmt: skip
        del quant[f"{name}.weight"]
        quant[f"{name}.qweight"] = gptq_pack_rows_reference(codes.T.copy())
        stored = zeros - 1 if fmt == "gptq" else zeros
        quant[f"{name}.qzeros"] = gptq_pack_cols_reference(stored.T.copy())
        quant[f"{name}.scales"] = torch.from_numpy(scales.T.copy()).half()
        quant[f"{name}.g_idx"] = torch.from_numpy(g_idx.astype(np.int32))
        ref[f"{name}.weight"] = _dequant(codes, zeros, scales, g_idx)
    config = {"quant_method": "gptq", "bits": 4, "group_size": G, "desc_act": act_order,
              "sym": sym, "checkpoint_format": fmt}  # fmt: skip
    gptq = write_variant(tiny_llama_dir, tmp_path / "gptq", quant, config)
    reference = write_variant(tiny_llama_dir, tmp_path / "ref", ref, None)
    torch.testing.assert_close(our_logits(gptq, IDS), our_logits(reference, IDS), rtol=0,
                               atol=2e-4)  # fmt: skip
    model = load(gptq)
    layer = model.model.layers[0].self_attn.qkv_proj
    assert (layer.input_perm is not None) == act_order
    assert model.model.layers[0].self_attn.qkv_proj.quant_method.layout().zero_points == (not sym)


@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_checkpoint_merges_parts_with_their_own_scales(
    tiny_llama_dir: Path, tmp_path: Path, per_channel: bool
) -> None:
    gen = torch.Generator().manual_seed(3)
    base = float_tensors(tiny_llama_dir)
    quant, ref = dict(base), dict(base)
    for name in _layers(base):
        w = base[f"{name}.weight"]
        q = (torch.randn(w.shape, generator=gen) * 50).to(torch.float8_e4m3fn)
        scale = (torch.rand(w.shape[0] if per_channel else (), generator=gen) * 1e-3 + 1e-4)
        quant[f"{name}.weight"] = q
        quant[f"{name}.weight_scale"] = scale.reshape(-1, 1) if per_channel else scale
        ref[f"{name}.weight"] = q.float() * (scale.reshape(-1, 1) if per_channel else scale)
    fp8 = write_variant(tiny_llama_dir, tmp_path / "fp8", quant,
                        {"quant_method": "fp8", "activation_scheme": "dynamic"})  # fmt: skip
    reference = write_variant(tiny_llama_dir, tmp_path / "ref", ref, None)
    torch.testing.assert_close(our_logits(fp8, IDS), our_logits(reference, IDS), rtol=0,
                               atol=2e-4)  # fmt: skip


@pytest.mark.parametrize(("name", "tolerance"), [
    ("weight_only_int8", 0.02), ("smooth_quant", 0.05), ("fp8", 0.1), ("weight_only_int4", 0.5),
])
def test_online_quantization_by_name(tiny_llama_dir: Path, name: str, tolerance: float) -> None:
    """A float checkpoint served with quantization=NAME is quantized at load; the packed
    layout replaces the float weight."""
    want = our_logits(tiny_llama_dir, IDS)
    got = our_logits(tiny_llama_dir, IDS, name)
    assert not torch.equal(got, want)
    assert (got - want).norm() / want.norm() < tolerance
    model = load(tiny_llama_dir, name)
    linear = model.model.layers[0].mlp.down_proj
    assert not hasattr(linear, "weight") and linear.quant_packed["qweight"].dtype in (
        torch.int8, torch.uint8, torch.float8_e4m3fn)  # fmt: skip


# -- bad input --------------------------------------------------------------------------------
def test_unknown_and_mismatched_methods_are_named(tiny_llama_dir: Path, tmp_path: Path) -> None:
    pm = PluginManager()
    with pytest.raises(UnknownNameError, match="installed quantization methods: .*awq.*gptq"):
        pm.resolve_quantization("nope", None)
    awq, _ = _awq_variant(tiny_llama_dir, tmp_path)
    with pytest.raises(ValueError, match="'gptq' was requested.*quant_method='awq'"):
        load(awq, "gptq")
    with pytest.raises(ValueError, match="reads AWQ checkpoints"):
        load(tiny_llama_dir, "awq")
    with pytest.raises(ValueError, match="reads GPTQ checkpoints"):
        load(tiny_llama_dir, "gptq")
    assert pm.resolve_quantization(None, {"quant_method": "awq"}) == "awq"
    with pytest.raises(UnknownNameError, match="quant_method='bitnet'.*installed"):
        pm.resolve_quantization(None, {"quant_method": "bitnet"})


def test_corrupt_checkpoints_fail_clearly(tiny_llama_dir: Path, tmp_path: Path) -> None:
    awq, _ = _awq_variant(tiny_llama_dir, tmp_path)
    tensors = load_file(str(awq / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj"
    missing = {k: v for k, v in tensors.items() if k != f"{name}.qzeros"}
    config = {"quant_method": "awq", "bits": 4, "group_size": G, "version": "gemm"}
    folder = write_variant(tiny_llama_dir, tmp_path / "missing", missing, config)
    with pytest.raises(ValueError, match=f"lacks weights for: {name}.qzeros"):
        load(folder)
    wrong_dtype = dict(tensors) | {f"{name}.qweight": tensors[f"{name}.qweight"].float()}
    folder = write_variant(tiny_llama_dir, tmp_path / "dtype", wrong_dtype, config)
    with pytest.raises(ValueError, match=f"{name}.qweight.*2-D int32"):
        load(folder)
    folder = write_variant(tiny_llama_dir, tmp_path / "group", tensors,
                           config | {"group_size": 16})  # fmt: skip
    with pytest.raises(ValueError,
                       match=r"qzeros.*\(64, 4\) does not fit parameter shape \(64, 8\)"):
        load(folder)
    folder = write_variant(tiny_llama_dir, tmp_path / "group48", tensors,
                           config | {"group_size": 48})  # fmt: skip
    with pytest.raises(ValueError, match="group_size 48 does not divide"):
        load(folder)
