"""resolve_model / load_model on tiny checkpoints: formats, dummy weights, and the errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_models_helpers import ARCHITECTURES, load_ours, reference_context, run_prefill_then_decode
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig

from ironlm.model_loader import LOAD_FORMATS, load_model, resolve_model
from ironlm.models.llama import LlamaForCausalLM

TINY = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    architectures=["LlamaForCausalLM"],
)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**TINY), dtype=torch.bfloat16).save_pretrained(
        folder
    )
    return folder


def _config_only(tmp_path: Path) -> Path:
    LlamaConfig(**TINY).save_pretrained(tmp_path)
    return tmp_path


def test_resolve_folder(tiny_folder: Path) -> None:
    source = resolve_model(str(tiny_folder))
    assert source.path == tiny_folder.resolve() and source.gguf_file is None
    assert source.architectures == ["LlamaForCausalLM"]
    assert source.checkpoint_dtype == torch.bfloat16
    assert source.max_position_embeddings == 64
    assert source.hf_config.hidden_size == 32


def test_resolve_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="not a .gguf"):
        resolve_model(str(tmp_path / "weights.bin"))


def test_safetensors_and_pt_load_the_same(tiny_folder: Path, tmp_path: Path) -> None:
    """A bf16 checkpoint loads into float32 params; the pickle format gives the same model."""
    (tmp_path / "config.json").write_text((tiny_folder / "config.json").read_text())
    torch.save(load_file(tiny_folder / "model.safetensors"), tmp_path / "pytorch_model.bin")
    tokens = [3, 9, 27, 17, 51, 8]
    a = run_prefill_then_decode(load_ours(tiny_folder, "safetensors"), tokens, 2)
    b = run_prefill_then_decode(load_ours(tmp_path, "auto"), tokens, 2)  # auto -> pt here
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="no safetensors weights"):
        load_ours(tmp_path, "safetensors")


def test_sharded_safetensors_use_the_index(tiny_folder: Path, tmp_path: Path) -> None:
    """Shards listed by the index are read; a stray extra file beside them is ignored."""
    state = load_file(tiny_folder / "model.safetensors")
    names = sorted(state)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, tmp_path / file, metadata={"format": "pt"})
    save_file({"junk.weight": torch.zeros(1)}, tmp_path / "consolidated.safetensors")
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text((tiny_folder / "config.json").read_text())
    tokens = [5, 4, 3, 2]
    torch.testing.assert_close(
        run_prefill_then_decode(load_ours(tmp_path), tokens, 1),
        run_prefill_then_decode(load_ours(tiny_folder), tokens, 1),
        rtol=0,
        atol=0,
    )


def test_unknown_load_format(tiny_folder: Path) -> None:
    with pytest.raises(ValueError, match="valid: auto, safetensors, pt, gguf, dummy"):
        load_ours(tiny_folder, "tensorizer")
    with pytest.raises(ValueError, match="needs a .gguf model"):
        load_ours(tiny_folder, "gguf")
    assert LOAD_FORMATS == ("auto", "safetensors", "pt", "gguf", "dummy")


def test_dummy_weights_need_no_checkpoint(tmp_path: Path) -> None:
    folder = _config_only(tmp_path)
    a = run_prefill_then_decode(load_ours(folder, "dummy", seed=1), [1, 2, 3, 4], 1)
    b = run_prefill_then_decode(load_ours(folder, "dummy", seed=1), [1, 2, 3, 4], 1)
    c = run_prefill_then_decode(load_ours(folder, "dummy", seed=2), [1, 2, 3, 4], 1)
    assert torch.isfinite(a).all() and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_missing_and_unexpected_weights(tiny_folder: Path, tmp_path: Path) -> None:
    state = load_file(tiny_folder / "model.safetensors")
    (tmp_path / "config.json").write_text((tiny_folder / "config.json").read_text())
    source = resolve_model(str(tmp_path))
    missing = {k: v for k, v in state.items() if k != "model.layers.1.self_attn.k_proj.weight"}
    save_file(missing, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"qkv_proj.weight \(shards \['k'\]\)"):
        load_model(source, LlamaForCausalLM, reference_context())
    save_file(
        {**state, "model.layers.0.extra.weight": torch.zeros(2)}, tmp_path / "model.safetensors"
    )
    with pytest.raises(ValueError, match="unexpected weight 'model.layers.0.extra.weight'"):
        load_model(source, LlamaForCausalLM, reference_context())
    bad = dict(state)
    bad["model.norm.weight"] = torch.zeros(7)
    save_file(bad, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="checkpoint shape"):
        load_model(source, LlamaForCausalLM, reference_context())


def test_model_built_in_context_dtype(tiny_folder: Path) -> None:
    ctx = reference_context(torch.bfloat16)
    model = load_model(resolve_model(str(tiny_folder)), ARCHITECTURES["LlamaForCausalLM"], ctx)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.rotary_emb.cos_cache.dtype == torch.bfloat16
    hidden = torch.zeros(2, 32, dtype=torch.bfloat16)
    assert model.compute_logits(hidden).dtype == torch.float32


def test_quantization_config_passthrough(tmp_path: Path) -> None:
    config = LlamaConfig(**TINY)
    config.quantization_config = {"quant_method": "w8a8", "bits": 8}
    config.save_pretrained(tmp_path)
    assert resolve_model(str(tmp_path)).quantization_config == {"quant_method": "w8a8", "bits": 8}
    plain = tmp_path / "plain"
    LlamaConfig(**TINY).save_pretrained(plain)
    assert resolve_model(str(plain)).quantization_config is None


def test_safetensors_reader_matches_the_library(tmp_path: Path) -> None:
    from ironlm.model_loader.safetensors_file import iter_safetensors_file

    tensors = {
        "w.f32": torch.randn(5, 7),
        "w.bf16": torch.randn(3, 4).to(torch.bfloat16),
        "w.f16": torch.randn(9).half(),
        "ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    got = dict(iter_safetensors_file(path))
    want = load_file(str(path))
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_safetensors_reader_rejects_a_truncated_file(tmp_path: Path) -> None:
    from ironlm.model_loader.safetensors_file import iter_safetensors_file

    path = tmp_path / "m.safetensors"
    save_file({"a": torch.randn(64, 64)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(ValueError, match="file ends inside tensor 'a'"):
        list(iter_safetensors_file(path))


def test_hf_overrides_are_laid_over_the_config(tiny_folder: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    source = resolve_model(str(tiny_folder), hf_overrides={
        "max_position_embeddings": 300, "rope_theta": 42.0,  # vLLM's top-level rope_theta
        "max_position_embedings": 7,  # misspelt: set, but named in a warning
    })
    assert source.max_position_embeddings == 300
    assert source.hf_config.rope_parameters["rope_theta"] == 42.0
    assert source.hf_config.rope_parameters["rope_type"] == "default"  # merged, not replaced
    assert "'max_position_embedings' is not a field of LlamaConfig" in caplog.text
    gemma = Gemma3TextConfig(architectures=["Gemma3ForCausalLM"])  # rope per attention kind
    gemma.save_pretrained(tiny_folder.parent / "gemma3-config")
    folder = str(tiny_folder.parent / "gemma3-config")
    with pytest.raises(ValueError, match="per layer type"):
        resolve_model(folder, hf_overrides={"rope_theta": 5.0})
    nested = resolve_model(folder, hf_overrides={
        "rope_parameters": {"full_attention": {"rope_theta": 5.0}}}).hf_config.rope_parameters
    assert nested["full_attention"]["rope_theta"] == 5.0
    assert nested["full_attention"]["rope_type"] == gemma.rope_parameters["full_attention"][
        "rope_type"]
    assert nested["sliding_attention"] == gemma.rope_parameters["sliding_attention"]
