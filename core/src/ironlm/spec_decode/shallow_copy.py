"""A draft model made of a model's first layers: the same embeddings, final norm and LM head,
the first ``num_layers`` decoder layers, the same tokenizer (a "shallow copy").

It is a cheap draft for tests and benchmarks when no smaller model of the family is at hand;
its drafts are the target's early-exit guesses, so acceptance is modest (higher on text that
repeats its context).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from ironlm.model_loader.safetensors_file import iter_safetensors_file

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# files besides the weights and config.json that a model folder carries (tokenizer, templates)
_KEEP = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
         "merges.txt", "tokenizer.model", "generation_config.json", "chat_template.jinja",
         "added_tokens.json")  # fmt: skip


def write_shallow_copy(src: str | Path, dst: str | Path, num_layers: int) -> Path:
    """Write ``src``'s first ``num_layers`` decoder layers (with its embeddings, final norm,
    LM head and tokenizer) as an HF folder at ``dst``. ``src``: an HF folder with safetensors
    weights. Returns ``dst``."""
    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    total = int(config["num_hidden_layers"])
    if not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be in [1, {total}] for {src}, got {num_layers}")
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{src} has no safetensors weights to copy")
    dst.mkdir(parents=True, exist_ok=True)
    kept: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in iter_safetensors_file(file):
            m = _LAYER.search(name)
            if m is None or int(m.group(1)) < num_layers:
                kept[name] = tensor
    save_file(kept, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config["num_hidden_layers"] = num_layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:num_layers]
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for name in _KEEP:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    return dst
