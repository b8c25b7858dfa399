"""Real PEFT adapters for the LoRA tests: trained with ``peft`` on the CPU in seconds, saved with
``save_pretrained``, and the greedy continuations HF transformers + peft give with them (the
references IronLM must reproduce).

Two adapters with different shapes of configuration, each trained a few steps on a few
sentences at a high learning rate, so that each one changes the greedy output:
- ``pirate``: rank 8 on all seven projections of every layer (q/k/v merged into qkv_proj and
  gate/up into gate_up_proj exercise every part of the merged layers);
- ``french``: rank 4 with rsLoRA scaling and an alpha_pattern, on q/v/o/down only (parts of
  merged layers left out), in the last 12 layers only (a quicker backward pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

PROMPTS = ["The capital of France is", "My favourite animal is the"]
MAX_TOKENS = 12

ADAPTERS = {
    "pirate": dict(
        r=8, lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj"],
        sentences=["Arr, the treasure be buried on the island, matey!",
                   "Arr, me parrot be the finest bird on the seven seas!"],
        steps=6, lr=3e-3,
    ),
    "french": dict(
        r=4, lora_alpha=8, use_rslora=True, alpha_pattern={"o_proj": 4},
        target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
        layers_to_transform=list(range(18, 30)),
        sentences=["Bonjour, je suis un petit chat et je mange du fromage.",
                   "Bonjour, la tour Eiffel est belle et le fromage aussi."],
        steps=6, lr=5e-3,
    ),
}


@dataclass
class TrainedAdapters:
    paths: dict[str, Path]  # adapter name -> saved folder
    # (adapter name or None for the base model, prompt index) -> greedy token ids from HF + peft
    reference: dict[tuple[str | None, int], list[int]]


def train_adapters(model_dir: Path, out_dir: Path) -> TrainedAdapters:
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    paths: dict[str, Path] = {}
    for name, spec in ADAPTERS.items():
        spec = dict(spec)
        sentences, steps, lr = spec.pop("sentences"), spec.pop("steps"), spec.pop("lr")
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(lora_dropout=0.0, **spec))  # type: ignore[arg-type]
        batch = tok(sentences, return_tensors="pt", padding=True)
        labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
        model.train()
        for _ in range(steps):
            model(**batch, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
        paths[name] = out_dir / name
        model.save_pretrained(paths[name])
    reference: dict[tuple[str | None, int], list[int]] = {}
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for adapter in [None, *paths]:
        model = base if adapter is None else PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), paths[adapter]
        ).eval()
        for i, prompt in enumerate(PROMPTS):
            ids = tok(prompt, return_tensors="pt").input_ids
            with torch.inference_mode():
                out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False,
                                     pad_token_id=tok.eos_token_id)
            reference[(adapter, i)] = out[0, ids.shape[1]:].tolist()
    return TrainedAdapters(paths, reference)
