"""Sequence classifiers made from the test models: the causal LM's own weights (its safetensors
file hard-linked as the first shard, nothing copied) and a seeded ``score`` head in a second
shard, under HF's ``*ForSequenceClassification`` name, so HF transformers loads the same folder
as the reference."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

_CLASSIFIER_OF = {
    "LlamaForCausalLM": "LlamaForSequenceClassification",
    "Gemma3ForCausalLM": "Gemma3TextForSequenceClassification",
}
BASE_SHARD = "model-00001-of-00002.safetensors"
HEAD_SHARD = "model-00002-of-00002.safetensors"


def write_classifier(base: Path, out: Path, labels: list[str], seed: int = 0,
                     scale: float = 0.05, **config_extra: Any) -> Path:
    """``base`` (an HF causal-LM folder with one model.safetensors) as a classifier over
    ``labels`` in ``out``; the head drawn from N(0, scale^2) with ``seed``; ``config_extra``
    set in its config.json (``problem_type``, ``sentence_transformers``)."""
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((base / "config.json").read_text()) | config_extra
    config["architectures"] = [_CLASSIFIER_OF[config["architectures"][0]]]
    config["id2label"] = {str(i): name for i, name in enumerate(labels)}
    config["label2id"] = {name: i for i, name in enumerate(labels)}
    config["num_labels"] = len(labels)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    os.link(base / "model.safetensors", out / BASE_SHARD)
    generator = torch.Generator().manual_seed(seed)
    head = torch.randn(len(labels), int(config["hidden_size"]), generator=generator) * scale
    save_file({"score.weight": head.contiguous()}, str(out / HEAD_SHARD))
    from safetensors import safe_open

    with safe_open(str(base / "model.safetensors"), "pt") as f:
        weight_map = {name: BASE_SHARD for name in f.keys()}  # noqa: SIM118 (not a dict)
    weight_map["score.weight"] = HEAD_SHARD
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    for name in os.listdir(base):  # tokenizer, chat template, generation config
        if name.startswith(("tokenizer", "chat_template", "special_tokens", "generation")):
            shutil.copy(base / name, out / name)
    return out
