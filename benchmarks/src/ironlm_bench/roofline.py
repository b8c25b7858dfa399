"""An offline batch's roofline: the least time any engine needs for its work on this machine.

Why: the compute bound (``machine.bounds``) prices every token at 2 x params FLOPs at the
matmul peak. A decode step also reads every weight and each running request's whole KV cache
from memory, and where the matmul peak is high, those bytes take longer than the FLOPs: on a
2-core Xeon with AMX (a 2 TFLOP/s oneDNN bf16 reading, ~20 GB/s read), a batch-64 SmolLM2
decode step's 17 GFLOP take 8.5 ms and its 270 MB of bf16 weights alone 13.5 ms, so no engine
comes near that bound there. The roofline prices each step at the slower of the two:

- prefill, all prompts as one step: every prompt token through the layers plus one LM-head
  row per prompt (the engines compute logits for the last position only), against reading
  the weights once;
- decode step j (j = 1 .. the longest output - 1: the first token comes with the prefill):
  each request still generating runs one token, and reads its KV cache of prompt + j tokens
  (a sliding-window layer at most its window), with the weights read once for the step.

Everything else counts as free (attention FLOPs, activations, cache writes, sampling, the
scheduler), and all requests run together (fewer at a time would read the weights more
often), so the roofline is an upper bound on the batch's tokens/s, up to the bandwidth
measurement: where the weights or caches stay in a large L3 a step reads faster than the
bench's DRAM sum, and the fraction can pass 1, as the single-stream bound's can.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ironlm_bench.machine import ModelCost


@dataclass(frozen=True)
class KvCost:
    """Bytes of KV cache one token holds, by kind of layer."""

    layer_bytes: int  # K and V of one token in one layer
    full_layers: int  # layers attending to the whole context
    window_layers: int  # sliding-window layers: at most `window` tokens each
    window: int

    def bytes_for(self, context: int) -> int:
        """KV bytes one decode step reads for a request with ``context`` tokens."""
        kept = self.full_layers * context + self.window_layers * min(context, self.window)
        return self.layer_bytes * kept

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_cost(hf_config: Any, bytes_per_value: int) -> KvCost:
    """From a transformers config: layers, KV heads, head size, and where the config lists
    them (``layer_types``, Gemma 3's five sliding layers to one full), the sliding ones."""
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    layers = hf_config.num_hidden_layers
    window = getattr(hf_config, "sliding_window", None) or 0
    types = getattr(hf_config, "layer_types", None) or ()
    sliding = sum(t == "sliding_attention" for t in types[:layers]) if window else 0
    return KvCost(2 * kv_heads * head_dim * bytes_per_value, layers - sliding, sliding, window)


def batch_seconds(
    prompt_tokens: Sequence[int],  # per request
    output_tokens: Sequence[int],  # per request
    cost: ModelCost,
    kv: KvCost,
    peak_gflops: float,  # the matmul peak of the engine's dtype
    read_gbs: float,
    weight_bytes: int,  # what one pass over the model reads (quantized engines read fewer)
) -> float:
    """The roofline time of one offline batch (module doc)."""
    peak, bandwidth = peak_gflops * 1e9, read_gbs * 1e9
    head_flops = 2 * cost.head_params
    layer_flops = cost.flops_per_token - head_flops  # one token through the layers
    prefill_flops = sum(prompt_tokens) * layer_flops + len(prompt_tokens) * head_flops
    seconds = max(prefill_flops / peak, weight_bytes / bandwidth)
    for j in range(1, max(output_tokens, default=0)):
        running = [p for p, n in zip(prompt_tokens, output_tokens, strict=True) if n > j]
        step_bytes = weight_bytes + sum(kv.bytes_for(p + j) for p in running)
        seconds += max(len(running) * cost.flops_per_token / peak, step_bytes / bandwidth)
    return seconds


def batch_bound_tok_s(
    prompt_tokens: Sequence[int], output_tokens: Sequence[int], cost: ModelCost, kv: KvCost,
    peak_gflops: float, read_gbs: float, weight_bytes: int,
) -> float:
    """Prompt and output tokens per second at the roofline (``batch_seconds``)."""
    seconds = batch_seconds(prompt_tokens, output_tokens, cost, kv, peak_gflops, read_gbs,
                            weight_bytes)  # fmt: skip
    return (sum(prompt_tokens) + sum(output_tokens)) / seconds
