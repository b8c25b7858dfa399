"""LoRA adapters on our models against HF transformers + peft, on tiny random configs of every
family (Llama, Qwen2 with q/k/v bias, Qwen3 with q/k norms, Gemma 3): two adapters and the
base model in one mixed batch through the paged KV cache, logits compared per sequence. Also:
adapter weights shard like their base layer (column-parallel B by rows, row-parallel A by
columns, replicated KV heads), checked on tensor-parallel ranks built without processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from test_models_helpers import PagedRunner, assert_logits_close, hf_logits, load_ours
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
)

from ironlm.interfaces.model import ModelContext
from ironlm.interfaces.platform import LayerOps
from ironlm.lora.model import LoRAModel
from ironlm.lora.peft_adapter import load_peft_adapter

VOCAB = 96
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-6)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {  # two differently shaped adapters: every part vs parts of the merged layers
    "all8": dict(r=8, lora_alpha=16, target_modules=ALL),
    "qvd4": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj",
                                                                      "down_proj"]),
}


def _configs() -> dict[str, PretrainedConfig]:
    return {
        "llama": LlamaConfig(**COMMON, architectures=["LlamaForCausalLM"]),
        "qwen2": Qwen2Config(**COMMON, architectures=["Qwen2ForCausalLM"]),
        "qwen3": Qwen3Config(**COMMON, architectures=["Qwen3ForCausalLM"], head_dim=24),
        "gemma3": Gemma3TextConfig(
            **{**COMMON, "num_key_value_heads": 1}, architectures=["Gemma3ForCausalLM"],
            head_dim=32, query_pre_attn_scalar=24, sliding_window=6,
            layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=None,
            final_logit_softcapping=15.0, pad_token_id=0,
        ),
    }


def _hf(folder: Path, adapter: Path | None = None) -> Any:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.config._attn_implementation = "eager"
    return (PeftModel.from_pretrained(model, adapter) if adapter else model).eval()


@pytest.fixture(scope="module", params=list(_configs()))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """(name, model folder, {adapter name: folder}) with random (non-zero B) adapters."""
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    torch.manual_seed(0)
    config = _configs()[request.param]
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(root / "model")
    adapters = {}
    for i, (name, spec) in enumerate(ADAPTERS.items()):
        torch.manual_seed(10 + i)
        base = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32)
        peft = get_peft_model(base, LoraConfig(init_lora_weights=False, **spec))  # type: ignore[arg-type]
        with torch.no_grad():  # peft's random init leaves B small: make each adapter matter
            for pname, p in peft.named_parameters():
                if "lora_B" in pname:
                    p.mul_(50.0)
        peft.save_pretrained(root / name)
        adapters[name] = root / name
    return request.param, root / "model", adapters


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_mixed_adapters_match_hf_peft(family) -> None:  # type: ignore[no-untyped-def]
    """Base, all8 and qvd4 sequences share every step: a chunked prefill next to decodes."""
    name, folder, adapters = family
    ours = load_ours(folder)
    lora = LoRAModel(ours, max_loras=3, max_rank=8, dtype=torch.float32,
                     device=torch.device("cpu"), layer_ops=LayerOps())
    slot_of = {None: -1}
    for slot, (adapter, path) in enumerate(adapters.items()):
        lora.set_slot(slot, lora.prepare(load_peft_adapter(path, 8, adapter), slot + 1))
        slot_of[adapter] = slot
    seqs = {None: _tokens(13, 1), "all8": _tokens(11, 2), "qvd4": _tokens(12, 3)}
    runner = PagedRunner(ours, num_blocks=24, block_size=4)
    ids = {a: runner.add_sequence(len(t)) for a, t in seqs.items()}
    logits: dict[str | None, list[torch.Tensor]] = {a: [] for a in seqs}
    plan = [{None: (0, 6), "all8": (0, 11), "qvd4": (0, 4)},
            {None: (6, 13), "qvd4": (4, 12)}]
    for step in plan:
        _bind(lora, {a: seqs[a][slice(*rng)] for a, rng in step.items()}, slot_of)
        outs = runner.step({ids[a]: seqs[a][slice(*rng)] for a, rng in step.items()})
        for a, out in zip(step, outs):
            logits[a].append(out)
    for adapter, tokens in seqs.items():
        ref = hf_logits(_hf(folder, adapters.get(adapter)), tokens)
        assert_logits_close(torch.cat(logits[adapter]), ref)
    # the adapters change the model (else the comparison above proves little)
    base_ref = hf_logits(_hf(folder), seqs["all8"])
    assert (torch.cat(logits["all8"]) - base_ref).abs().max() > 0.1 * base_ref.abs().max()


def _bind(lora: LoRAModel, chunks: dict[str | None, list[int]], slot_of: dict) -> None:  # type: ignore[type-arg]
    per_token = [slot_of[a] for a, toks in chunks.items() for _ in toks]
    lora.state.bind(torch.tensor(per_token, dtype=torch.int32), active=True)


def test_weights_shard_like_their_layer(family, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """On tensor-parallel ranks (built without processes), each rank's A / B is the part of
    the full adapter its layer's weight shard covers: column-parallel B by rows (q | k | v,
    gate | up, KV heads shared by ranks when fewer than ranks), row-parallel A by columns."""
    name, folder, adapters = family
    from ironlm.model_loader import resolve_model

    source = resolve_model(str(folder))
    full_ctx = _ctx(0, 1)
    cls = type(load_ours(folder))
    adapter = load_peft_adapter(adapters["all8"], 8)
    full = LoRAModel(cls(source.hf_config, full_ctx), 1, 8, torch.float32, torch.device("cpu"),
                     LayerOps()).prepare(adapter, 1)
    tp = 4  # 2 KV heads (1 for gemma3) over 4 ranks: replicated KV heads
    ranks = []
    for r in range(tp):
        model = cls(source.hf_config, _ctx(r, tp))
        ranks.append((model, LoRAModel(model, 1, 8, torch.float32, torch.device("cpu"),
                                       LayerOps()).prepare(adapter, 1)))
    for path, parts in full.layers.items():
        layers = [dict(m.named_modules())[path] for m, _ in ranks]
        for pid, (a_full, b_full) in parts.items():
            shards = [prep.layers[path][pid] for _, prep in ranks]
            if path.endswith(("o_proj", "down_proj")):  # row parallel: A by columns, B whole
                assert torch.equal(torch.cat([a for a, _ in shards], dim=1), a_full)
                assert all(torch.equal(b, b_full) for _, b in shards)
            else:  # column parallel: A whole, B rows as the weight's rows
                assert all(torch.equal(a, a_full) for a, _ in shards)
                for layer, (_, b) in zip(layers, shards):
                    assert torch.equal(b, layer.shard_output_rows(b_full, pid))
        # the weight itself is cut the same way: load a full part, compare with the shard
        for layer in layers:
            for pid, size in layer.lora_parts():
                if path.endswith(("o_proj", "down_proj")):
                    continue
                full_rows = parts[pid][1].shape[0] if pid in parts else None
                if full_rows is None:
                    continue
                w = torch.randn(full_rows, layer.in_features)
                layer.load_weight("weight", w, pid if len(layer.lora_parts()) > 1 else None)
                offset = sum(s for p, s in layer.lora_parts()[: [p for p, _ in
                             layer.lora_parts()].index(pid)])
                assert torch.equal(layer.weight[offset : offset + size],
                                   layer.shard_output_rows(w, pid))


def _ctx(rank: int, size: int) -> ModelContext:
    from ironlm.attention.reference import ReferenceAttentionBackend
    from ironlm.interfaces.quantization import UnquantizedMethod

    return ModelContext(attention=ReferenceAttentionBackend(), layer_ops=LayerOps(),
                        quantization=UnquantizedMethod(), dtype=torch.float32,
                        device=torch.device("cpu"), tp_rank=rank, tp_size=size)
