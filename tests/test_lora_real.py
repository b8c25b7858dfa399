"""Multi-LoRA on the real SmolLM2 with two adapters trained with peft in the test set-up
(``smollm2_loras``, tests/lora_adapters.py): IronLM's greedy output per adapter equals HF
transformers + peft on the same adapter, in one batch mixing both adapters and the base model
(decode steps through the cpu platform's recorded decode graphs, LoRA kernels included)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lora_adapters import MAX_TOKENS, PROMPTS

from ironlm import LLM, SamplingParams
from ironlm.lora.request import LoRARequest

pytestmark = pytest.mark.real_model


def test_trained_adapters_change_the_greedy_output(smollm2_loras) -> None:  # type: ignore[no-untyped-def]
    ref = smollm2_loras.reference
    for i in range(len(PROMPTS)):
        base, pirate, french = ref[(None, i)], ref[("pirate", i)], ref[("french", i)]
        assert pirate != base and french != base and pirate != french


def test_mixed_batch_matches_hf_peft(smollm2_dir: Path, smollm2_loras) -> None:  # type: ignore[no-untyped-def]
    loras = {name: LoRARequest(name, i + 1, str(path))
             for i, (name, path) in enumerate(smollm2_loras.paths.items())}
    plan = [(adapter, i) for i in range(len(PROMPTS)) for adapter in (None, *loras)]
    llm = LLM(str(smollm2_dir), enable_lora=True, max_loras=2, max_model_len=256,
              kv_cache_memory=64 << 20, dtype="float32")  # as HF + peft in float32
    try:
        outs = llm.generate(
            [PROMPTS[i] for _, i in plan], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
            lora_request=[loras[a] if a else None for a, _ in plan], use_tqdm=False,
        )
        graphs = llm.engine.executor.worker.model_runner.graphs  # type: ignore[attr-defined]
        assert graphs is not None and graphs.disabled is None and graphs.graphs
    finally:
        llm.shutdown()
    for (adapter, i), out in zip(plan, outs):
        assert out.outputs[0].token_ids == smollm2_loras.reference[(adapter, i)], (adapter, i)
