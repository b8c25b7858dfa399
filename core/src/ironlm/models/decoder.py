"""What every decoder-only model here shares: the stack of one pipeline stage and its head,
with HF checkpoint names.

``StageDecoder`` (the HF ``model.*`` module) holds the token embedding on the first stage, the
decoder layers of its stage (the others are ``MissingLayer`` placeholders, so layer ``i`` keeps
the name ``layers.i`` of the checkpoint) and the final norm on the last stage.
``StageModel`` wraps it under HF names and routes each checkpoint tensor to the stage that
holds it; ``StageCausalLM`` adds the LM head on the last stage (a tied LM head shares the
embedding when both sit on one stage, and otherwise loads its own copy of
``model.embed_tokens.weight``); ``classifier.StageSequenceClassifier`` adds HF's ``score``
head instead. A model family subclasses ``StageDecoder`` and the heads it offers, supplying
its layers, its norm, its embedding scale and which rotary table each layer reads.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from ironlm.distributed.layout import stage_layers
from ironlm.interfaces.attention import AttentionLayerSpec
from ironlm.interfaces.model import WEIGHTS_ASLEEP, ModelArchitecture, ModelContext
from ironlm.layers.layernorm import RMSNorm
from ironlm.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from ironlm.layers.weight_loading import load_named_weights
from ironlm.layers.weight_update import update_named_weights

EMBED_NAME = "model.embed_tokens.weight"
LM_HEAD_NAME = "lm_head.weight"
CosSin = tuple[torch.Tensor, torch.Tensor]


class MissingLayer(torch.nn.Module):
    """A decoder layer another pipeline stage holds (keeps the layer indices of the names)."""


class StageDecoder(torch.nn.Module):
    def __init__(
        self,
        hf_config: Any,
        ctx: ModelContext,
        make_layer: Callable[[int], torch.nn.Module],
        make_norm: Callable[[], RMSNorm],
        embed_scale: float | None = None,  # embedding rows times this (Gemma: sqrt(hidden))
    ) -> None:
        super().__init__()
        self.stage = stage_layers(int(hf_config.num_hidden_layers), ctx.pp_rank, ctx.pp_size)
        self.is_first = ctx.is_first_stage
        self.is_last = ctx.is_last_stage
        self.embed_tokens: VocabParallelEmbedding | None = (
            VocabParallelEmbedding(
                hf_config.vocab_size, hf_config.hidden_size, ctx, scale=embed_scale
            ) if self.is_first else None
        )  # fmt: skip
        self.layers = torch.nn.ModuleList(
            make_layer(i) if i in self.stage else MissingLayer()
            for i in range(hf_config.num_hidden_layers)
        )
        self.norm: RMSNorm | None = make_norm() if self.is_last else None

    def stage_layers(self) -> list[torch.nn.Module]:
        return [self.layers[i] for i in self.stage]

    # -- what a family changes ------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        assert self.embed_tokens is not None
        return self.embed_tokens(input_ids)  # (num_tokens, hidden_size)

    def rotary_for(self, positions: torch.Tensor) -> Callable[[torch.nn.Module], CosSin]:
        """Looks the rotary tables up once per step; returns each layer's (cos, sin)."""
        raise NotImplementedError

    # -- one stage ---------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,  # (num_tokens,)
        positions: torch.Tensor,  # (num_tokens,)
        kv_caches: list[torch.Tensor],  # one per layer of this stage
        attn_metadata: Any,
        intermediate: dict[str, torch.Tensor] | None = None,
        inputs_embeds: torch.Tensor | None = None,  # (num_tokens, hidden): rows to run as given
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        residual: torch.Tensor | None
        if self.is_first:
            hidden = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
            residual = None
        else:
            assert intermediate is not None, "a later pipeline stage needs the previous one's"
            hidden, residual = intermediate["hidden"], intermediate["residual"]
        cos_sin = self.rotary_for(positions)
        for layer, kv_cache in zip(self.stage_layers(), kv_caches, strict=True):
            hidden, residual = layer(hidden, residual, cos_sin(layer), kv_cache, attn_metadata)
        if not self.is_last:
            assert residual is not None
            return {"hidden": hidden, "residual": residual}
        assert self.norm is not None
        return self.norm(hidden, residual)[0]


class StageModel(ModelArchitecture):
    """A ``StageDecoder`` (``self.model``) under HF names, and the head a subclass puts on the
    last stage: ``StageCausalLM``'s LM head, or a classifier's ``score`` (classifier.py)."""

    supports_prompt_embeds = True

    def __init__(self, hf_config: Any, model: StageDecoder, tied: bool) -> None:
        super().__init__()
        self.config = hf_config
        self.model = model
        self.tie_word_embeddings = tied
        self.lm_head: ParallelLMHead | None = None  # StageCausalLM's, on the last stage

    def attention_layers(self) -> list[AttentionLayerSpec]:
        return [layer.self_attn.spec for layer in self.model.stage_layers()]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: Any,
        intermediate: dict[str, torch.Tensor] | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        return self.model(input_ids, positions, kv_caches, attn_metadata, intermediate,
                          inputs_embeds)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(input_ids)  # the family's scale applied (Gemma: sqrt(hidden))

    def skip_weight(self, name: str) -> bool:
        """Checkpoint tensors this rank does not hold (other stages', recomputed tables)."""
        return name.endswith("rotary_emb.inv_freq")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.weights_asleep:
            raise ValueError(WEIGHTS_ASLEEP)
        if self.weights_processed:  # an update: any subset, into the packed layouts
            update_named_weights(self, self._stage_weights(weights), self.skip_weight)
        else:
            load_named_weights(self, self._stage_weights(weights), self.skip_weight)

    def _stage_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterable[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors this stage holds, under the names it holds them by."""
        m = self.model
        own_head = self.lm_head is not None and not self.lm_head.tied
        for name, tensor in weights:
            table = name in (EMBED_NAME, LM_HEAD_NAME)
            scale = name in (EMBED_NAME + "_scale", LM_HEAD_NAME + "_scale")  # int8 tables
            if name.startswith("model.layers."):
                index = name.split(".")[2]
                if self.weights_processed and not (
                    index.isdigit() and int(index) < len(m.layers)
                ):  # an update for a layer no stage has is the trainer's mistake: say so
                    raise ValueError(f"unexpected weight {name!r}: the model has "
                                     f"{len(m.layers)} layers")
                if int(index) not in m.stage:
                    continue
            elif (table or scale) and name.startswith("model."):  # the embedding's
                if self.tie_word_embeddings and own_head:  # the last stage's copy of it
                    yield LM_HEAD_NAME + ("_scale" if scale else ""), tensor
                if not m.is_first:
                    continue
            elif table or scale:  # the LM head's own
                # tied checkpoints sometimes carry a copy of the embedding as lm_head
                if not own_head or self.tie_word_embeddings:
                    continue
            elif name.startswith("model.norm.") and not m.is_last:
                continue
            yield name, tensor


class StageCausalLM(StageModel):
    """A causal LM: the stage's decoder and, on the last stage, the LM head."""

    def __init__(self, hf_config: Any, ctx: ModelContext, model: StageDecoder, tied: bool) -> None:
        super().__init__(hf_config, model, tied)
        if model.is_last:
            share = model.embed_tokens if tied and model.is_first else None
            self.lm_head = ParallelLMHead(
                hf_config.vocab_size, hf_config.hidden_size, ctx, tie_to=share
            )

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        assert self.lm_head is not None, "only the last pipeline stage computes logits"
        return self.lm_head(hidden)  # (num_rows, vocab_size) float32
