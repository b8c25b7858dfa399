"""``ironlm quantize`` on a tiny random Llama (every --quant-type, the flags' spellings, the
calibration file, the checks) and its AWQ / GPTQ outputs read back by the tests' own unpacking
of the public formats. The real-model quality lives in test_quant_quality.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from quant_helpers import (
    IDS_TINY,
    dequantize_awq,
    dequantize_gptq,
    float_tensors,
    load,
    our_logits,
    write_variant,
)
from safetensors.torch import load_file

from ironlm.cli import build_parser
from ironlm.cli import main as cli_main


def _quantize(src: Path, out: Path, *flags: str) -> int:
    return cli_main(["quantize", "-i", str(src), "-o", str(out), "-t", "fp32", *flags])


def test_flag_spellings_of_the_parameter_set() -> None:
    args = build_parser().parse_args([
        "quantize", "-i", "in", "-o", "out", "-quant_type", "smooth_quant", "-tp", "2",
        "-t", "bf16", "-sq", "0.8", "-token", "ids.txt", "--multi-query-mode",
    ])  # fmt: skip
    assert (args.quant_type, args.tp_size, args.dtype, args.alpha) == ("smooth_quant", 2, "bf16",
                                                                       0.8)  # fmt: skip
    assert args.tokenids_path == Path("ids.txt") and args.multi_query_mode
    args = build_parser().parse_args(["quantize", "-i", "a", "-o", "b", "--quant-type", "gptq",
                                      "--tokenids-path", "f"])  # fmt: skip
    assert (args.quant_type, args.tokenids_path, args.tp_size, args.dtype) == (
        "gptq", Path("f"), 1, "fp16")  # fmt: skip


@pytest.mark.parametrize(("quant_type", "tolerance"), [
    ("weight_only_int8", 0.02), ("smooth_quant", 0.05), ("fp8", 0.1), ("awq", 0.5),
    ("gptq", 0.5), ("weight_only_int4", 0.5),
])
def test_every_quant_type_writes_a_folder_that_loads_without_a_flag(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    quant_type: str, tolerance: float,
) -> None:  # fmt: skip
    out = tmp_path / "out"
    assert _quantize(tiny_llama_dir, out, "--quant-type", quant_type) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out)
    assert f"quantize {quant_type}" in captured.err and "2/2" in captured.err  # per-layer bar
    config = json.loads((out / "config.json").read_text())
    method = {"weight_only_int4": "weight_only_int4"}.get(quant_type, quant_type)
    assert config["quantization_config"]["quant_method"] == method
    assert config["dtype"] == "float32"
    assert (out / "tokenizer.json").is_file() and (out / "model.safetensors").is_file()
    assert not list(tmp_path.glob(".out.partial-*"))
    want = our_logits(tiny_llama_dir, IDS_TINY)
    got = our_logits(out, IDS_TINY)
    assert (got - want).norm() / want.norm() < tolerance


def test_awq_and_gptq_outputs_unpack_independently(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """What the tool packs, the published layouts' reader (tests/quant_helpers.py, explicit bit
    loops) reads as the very weights IronLM computes with, and they approximate the float
    weights to 4-bit precision."""
    base = float_tensors(tiny_llama_dir)
    for quant_type, flags in (("awq", []), ("gptq", ["--desc-act", "--asym"])):
        out = tmp_path / quant_type
        assert _quantize(tiny_llama_dir, out, "--quant-type", quant_type, "--group-size", "32",
                         *flags) == 0  # fmt: skip
        packed = load_file(str(out / "model.safetensors"))
        group = json.loads((out / "config.json").read_text())["quantization_config"]["group_size"]
        ref = dict(base)
        for name in [n.removesuffix(".qweight") for n in packed if n.endswith(".qweight")]:
            w = (dequantize_awq(packed, name, group) if quant_type == "awq"
                 else dequantize_gptq(packed, name))  # fmt: skip
            error = (w - base[f"{name}.weight"]).norm() / base[f"{name}.weight"].norm()
            assert error < 0.25, (name, float(error))
            ref[f"{name}.weight"] = w
            if quant_type == "gptq":
                g_idx = packed[f"{name}.g_idx"]
                assert not torch.equal(g_idx, torch.sort(g_idx).values)  # act order
        # AWQ's smoothing changes the norms the tool writes
        ref.update({k: v.float() for k, v in packed.items() if k.endswith("layernorm.weight")})
        reference = write_variant(tiny_llama_dir, tmp_path / f"{quant_type}-ref", ref, None)
        torch.testing.assert_close(our_logits(out, IDS_TINY), our_logits(reference, IDS_TINY),
                                   rtol=0, atol=2e-4)  # fmt: skip


def test_calibration_from_a_token_ids_file(tiny_llama_dir: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    ids = tmp_path / "ids.txt"
    ids.write_text("1, 504, 3216 314,253\n\n  1345 28 9110, 30 2\n")
    assert _quantize(tiny_llama_dir, tmp_path / "ok", "-quant_type", "gptq", "-token",
                     str(ids)) == 0  # fmt: skip
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 3\n4 5 49152\n")
    assert _quantize(tiny_llama_dir, tmp_path / "no", "--quant-type", "awq",
                     "--tokenids-path", str(bad)) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert f"{bad}:2: token id 49152 is outside the vocabulary (0..49151)" in err
    bad.write_text("1 2 x3\n")
    assert _quantize(tiny_llama_dir, tmp_path / "no", "--quant-type", "awq", "-token",
                     str(bad)) == 2  # fmt: skip
    assert f"{bad}:1: 'x3' is not a token id" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_bad_input_fails_clearly_and_never_half_writes(
    tiny_llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    cases = [
        (["--quant-type", "int3"], "unknown --quant-type 'int3'; choose one of weight_only_int8"),
        (["--quant-type", "awq", "-tp", "3"], "-tp 3 does not divide the model"),
        (["--quant-type", "gptq", "--group-size", "48"], "group size 48 does not divide"),
        (["--quant-type", "smooth_quant", "-sq", "1.5"], "alpha) must be in [0, 1]"),
        (["--quant-type", "awq", "--sym"], "AWQ checkpoints (AutoAWQ GEMM) carry zero points"),
        (["--quant-type", "gptq", "--mse", "-1"], "--mse must be 0 (off) or a positive norm"),
        (["--quant-type", "gptq", "--v2-alpha", "2"], "--v2-alpha must be in [0, 1], got 2.0"),
        (["--quant-type", "awq", "--v2-alpha", "0.5"], "--v2-alpha is a GPTQ option"),
        (["--quant-type", "fp8", "--quantize-lm-head"],
         "--quantize-lm-head is a weight_only_int8 option"),
    ]
    for flags, message in cases:
        assert _quantize(tiny_llama_dir, out, *flags) == 2
        assert message in capsys.readouterr().err
    # a checkpoint missing a tensor of its last layer fails after writing started
    tensors = float_tensors(tiny_llama_dir)
    del tensors["model.layers.1.mlp.down_proj.weight"]
    broken = write_variant(tiny_llama_dir, tmp_path / "broken", tensors, None)
    assert _quantize(broken, out, "--quant-type", "weight_only_int8") == 2
    assert "model.layers.1.mlp.down_proj.weight" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".out.*"))
    # an existing output folder is left alone; a quantized input is refused
    assert _quantize(tiny_llama_dir, out, "--quant-type", "fp8") == 0
    assert _quantize(tiny_llama_dir, out, "--quant-type", "fp8") == 2
    assert "already exists" in capsys.readouterr().err
    assert _quantize(out, tmp_path / "again", "--quant-type", "fp8") == 2
    assert "already quantized (quant_method 'fp8')" in capsys.readouterr().err


@pytest.mark.parametrize("tied", [True, False])
def test_quantize_lm_head_writes_an_int8_table_that_loads(
    tiny_llama_dir: Path, tmp_path: Path, tied: bool
) -> None:
    """--quantize-lm-head: the LM head's matrix (the embedding's when tied) as int8 rows with a
    scale per row and ``lm_head`` in the config; the model loads the table quantized (lookups
    and logits from the int8 rows) and its logits stay within int8's error of the float ones."""
    src = tiny_llama_dir
    if not tied:  # a separate head: the embedding must stay float
        tensors = float_tensors(tiny_llama_dir)
        gen = torch.Generator().manual_seed(5)
        emb = tensors["model.embed_tokens.weight"]
        tensors["lm_head.weight"] = emb + 0.02 * torch.randn(emb.shape, generator=gen)
        src = write_variant(tiny_llama_dir, tmp_path / "untied", tensors, None)
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps(dict(config, tie_word_embeddings=False)))
    out, plain = tmp_path / "out", tmp_path / "plain"
    assert _quantize(src, out, "--quant-type", "weight_only_int8", "--quantize-lm-head") == 0
    assert _quantize(src, plain, "--quant-type", "weight_only_int8") == 0
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config == {"quant_method": "weight_only_int8", "bits": 8, "lm_head": True}
    written = load_file(str(out / "model.safetensors"))
    head = "model.embed_tokens" if tied else "lm_head"
    vocab = written[f"{head}.weight"].shape[0]
    assert written[f"{head}.weight"].dtype == torch.int8
    assert written[f"{head}.weight_scale"].shape == (vocab,)
    if not tied:
        assert written["model.embed_tokens.weight"].dtype == torch.float32
    model = load(out)
    assert model.lm_head.quant_layout is not None and model.lm_head.quant_layout.kind == "int8"
    embedding_layout = model.model.embed_tokens.quant_layout
    assert (embedding_layout is not None) == tied
    want, got = our_logits(src, IDS_TINY), our_logits(out, IDS_TINY)
    assert (got - want).norm() / want.norm() < 0.02
    assert not torch.equal(got, our_logits(plain, IDS_TINY))  # the head's rounding shows


def test_tensor_parallel_size_makes_groups_whole_per_rank(tiny_llama_dir: Path,
                                                          tmp_path: Path) -> None:  # fmt: skip
    """o_proj reads 64 features, down_proj 128: at -tp 2 a rank holds 32 of o_proj's, so the
    group size drops to 32 (at -tp 1, 64 fits every layer)."""
    for tp, group in ((1, 64), (2, 32)):
        out = tmp_path / f"tp{tp}"
        assert _quantize(tiny_llama_dir, out, "--quant-type", "gptq", "-tp", str(tp),
                         "--desc-act") == 0  # fmt: skip
        config = json.loads((out / "config.json").read_text())["quantization_config"]
        assert config["group_size"] == group
        packed = load_file(str(out / "model.safetensors"))
        g_idx = packed["model.layers.0.self_attn.o_proj.g_idx"].long()
        # act order keeps each rank's share of input features within its own groups
        half = g_idx.numel() // tp
        assert g_idx[:half].max() < g_idx[half:].min() if tp == 2 else True
        load(out)


def test_multi_query_mode_checks_the_attention(
    tmp_path: Path, tiny_llama_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The layout follows config.json; --multi-query-mode asserts shared KV heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    assert _quantize(tiny_llama_dir, tmp_path / "gqa", "--quant-type", "weight_only_int8",
                     "--multi-query-mode") == 0  # fmt: skip
    mha = tmp_path / "mha-src"
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=4)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(mha)
    assert _quantize(mha, tmp_path / "mha", "--quant-type", "weight_only_int8",
                     "--multi-query-mode") == 2  # fmt: skip
    assert "--multi-query-mode: the checkpoint has as many KV heads" in capsys.readouterr().err


def _prompt_logprobs(folder: Path, tp: int) -> torch.Tensor:
    from ironlm import LLM, SamplingParams

    llm = LLM(str(folder), tensor_parallel_size=tp, dtype="float32", max_model_len=64,
              kv_cache_memory=16 << 20, enforce_eager=True,
              distributed_executor_backend="mp" if tp > 1 else None)  # fmt: skip
    try:
        out = llm.generate([{"prompt_token_ids": IDS_TINY}],
                           SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    finally:
        llm.shutdown()
    return torch.tensor([e[t].logprob for e, t in zip(out.prompt_logprobs[1:], IDS_TINY[1:])])


def test_tp2_gptq_checkpoint_serves_sharded_as_on_one_rank(tiny_llama_dir: Path,
                                                           tmp_path: Path) -> None:  # fmt: skip
    """A ``-tp 2 --desc-act`` GPTQ output loads at tensor-parallel size 2 (mp executor; each
    rank's g_idx within its own groups) and scores the prompt as one rank does."""
    out = tmp_path / "gptq"
    assert _quantize(tiny_llama_dir, out, "--quant-type", "gptq", "-tp", "2", "--desc-act") == 0
    torch.testing.assert_close(_prompt_logprobs(out, 2), _prompt_logprobs(out, 1),
                               rtol=0, atol=1e-4)  # fmt: skip


@pytest.mark.parametrize("zero_points", [False, True])
def test_gptq_clipping_search_lowers_the_group_error(zero_points: bool) -> None:
    """--mse: for bell-shaped groups the full min / max range wastes codes on the tails; the
    clipped range the search finds has a lower p-norm error, and 0 keeps the full range."""
    from ironlm.quantization.offline.gptq import group_params
    from ironlm.quantization.rtn import int4_params

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(32, 64, generator=gen) * 0.02

    def err(scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:  # (N,) per row
        q = torch.clamp(torch.round(w / scale) + zero, 0, 15)
        return ((q - zero) * scale - w).abs().pow(2.4).sum(dim=1)

    full = int4_params(w, 64, zero_points)
    assert all(torch.equal(a, b) for a, b in zip(group_params(w, zero_points, 0.0), full))
    searched = group_params(w, zero_points, 2.4)
    assert bool((err(*searched) <= err(*full)).all())  # never worse: 1.0 is on the grid
    assert float(err(*searched).sum()) < 0.95 * float(err(*full).sum())
    assert bool((searched[0] < full[0]).any())  # some rows clipped


def test_gptq_v2_target_fits_the_float_outputs() -> None:
    """--v2-alpha: with inputs X~ that differ from the float model's X (the error of the layers
    before), the target W* fits W X on X~ better than W itself, exactly (least squares) at
    alpha 1, partly in between; equal inputs give W back."""
    from ironlm.quantization.offline.gptq import asymmetric_target, hessian

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(24, 32, generator=gen)
    x = torch.randn(256, 32, generator=gen)
    xq = x + 0.1 * torch.randn(256, 32, generator=gen)  # upstream quantization noise

    def misfit(target: torch.Tensor) -> float:
        return float((xq @ target.t() - x @ w.t()).square().sum())

    exact = torch.linalg.lstsq(xq, x @ w.t()).solution.t()
    torch.testing.assert_close(asymmetric_target(w, hessian(xq), xq, x, 0.0, 1.0), exact,
                               rtol=1e-3, atol=1e-3)  # fmt: skip
    half = asymmetric_target(w, hessian(xq), xq, x, 0.01, 0.5)
    assert misfit(exact) < misfit(half) < misfit(w)
    torch.testing.assert_close(asymmetric_target(w, hessian(x), x, x, 0.01, 1.0), w)
