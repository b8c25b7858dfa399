"""Shared helpers for the model tests (no tests here): build a model with the core reference
attention backend, run sequences through the paged KV cache, and run HF transformers on the
same tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ironlm.attention.batch import build_attention_batch
from ironlm.attention.reference import ReferenceAttentionBackend
from ironlm.interfaces.model import ModelArchitecture, ModelContext
from ironlm.interfaces.platform import LayerOps
from ironlm.interfaces.quantization import UnquantizedMethod
from ironlm.model_loader import ModelSource, load_model, resolve_model
from ironlm.models.gemma3 import Gemma3ForCausalLM
from ironlm.models.llama import LlamaForCausalLM

ARCHITECTURES: dict[str, type[ModelArchitecture]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
}


def reference_context(dtype: torch.dtype = torch.float32) -> ModelContext:
    return ModelContext(
        attention=ReferenceAttentionBackend(),
        layer_ops=LayerOps(),
        quantization=UnquantizedMethod(),
        dtype=dtype,
        device=torch.device("cpu"),
    )


def load_ours(
    model: str | Path | ModelSource, load_format: str = "auto", seed: int = 0
) -> ModelArchitecture:
    source = model if isinstance(model, ModelSource) else resolve_model(str(model))
    return load_model(
        source, ARCHITECTURES[source.architectures[0]], reference_context(), load_format, seed
    )


class PagedRunner:
    """Runs sequences through ``model`` with a paged KV cache: each sequence owns blocks taken
    from the end of the pool backwards (so block ids are not in position order)."""

    def __init__(self, model: ModelArchitecture, num_blocks: int = 64, block_size: int = 4) -> None:
        self.model = model
        self.block_size = block_size
        backend = ReferenceAttentionBackend()
        self.backend = backend
        self.kv_caches = [
            torch.zeros(
                backend.kv_cache_shape(num_blocks, block_size, spec.num_kv_heads, spec.head_dim),
                dtype=torch.float32,
            )
            for spec in model.attention_layers()
        ]
        self.free = list(range(num_blocks))
        self.tables: list[list[int]] = []
        self.lens: list[int] = []

    def add_sequence(self, max_len: int) -> int:
        need = -(-max_len // self.block_size)
        blocks = [self.free.pop() for _ in range(need)]
        self.tables.append(blocks)
        self.lens.append(0)
        return len(self.tables) - 1

    @torch.no_grad()
    def step_hidden(self, chunks: dict[int, list[int]]) -> list[torch.Tensor]:
        """One forward over new tokens of several sequences; returns each sequence's final
        hidden states (num_new_tokens, hidden_size)."""
        seqs = list(chunks)
        ctx_lens = [self.lens[s] for s in seqs]
        q_lens = [len(chunks[s]) for s in seqs]
        batch = build_attention_batch(
            ctx_lens, q_lens, [self.tables[s] for s in seqs], self.block_size
        )
        ids = torch.tensor([t for s in seqs for t in chunks[s]], dtype=torch.int64)
        positions = torch.tensor(
            [p for c, q in zip(ctx_lens, q_lens) for p in range(c, c + q)], dtype=torch.int64
        )
        hidden = self.model(ids, positions, self.kv_caches, self.backend.build_metadata(batch))
        for s, q in zip(seqs, q_lens):
            self.lens[s] += q
        return list(hidden.split(q_lens))

    @torch.no_grad()
    def step(self, chunks: dict[int, list[int]]) -> list[torch.Tensor]:
        """Like step_hidden, returning (num_new_tokens, vocab) float32 logits per sequence."""
        return [self.model.compute_logits(h) for h in self.step_hidden(chunks)]


@torch.no_grad()
def run_prefill_then_decode(
    model: ModelArchitecture,
    token_ids: list[int],
    num_decode: int,
    block_size: int = 4,
    last: int | None = None,
) -> torch.Tensor:
    """Prefill ``token_ids[:-num_decode]`` in one step, then feed the remaining tokens one per
    decode step. Returns float32 logits of every position, or of the ``last`` ones:
    (len(token_ids) or last, vocab)."""
    runner = PagedRunner(
        model, num_blocks=-(-len(token_ids) // block_size) + 2, block_size=block_size
    )
    seq = runner.add_sequence(len(token_ids))
    split = len(token_ids) - num_decode
    parts = runner.step_hidden({seq: token_ids[:split]})
    for t in token_ids[split:]:
        parts += runner.step_hidden({seq: [t]})
    hidden = torch.cat(parts)
    return model.compute_logits(hidden if last is None else hidden[-last:])


@torch.no_grad()
def hf_logits(hf_model: Any, token_ids: list[int], last: int | None = None) -> torch.Tensor:
    """HF transformers' logits over the full sequence (or its ``last`` positions), float32."""
    out = hf_model(input_ids=torch.tensor([token_ids]), use_cache=False, logits_to_keep=last or 0)
    return out.logits[0].float()


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor, rel_tol: float = 1e-3) -> None:
    scale = ref.abs().max().item()
    diff = (ours - ref).abs().max().item()
    assert diff <= rel_tol * scale, (
        f"max abs diff {diff:.3g} > {rel_tol} * logits scale {scale:.3g}"
    )
    assert torch.equal(ours.argmax(-1), ref.argmax(-1)), "argmax differs"
