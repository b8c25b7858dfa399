"""Multi-LoRA serving: PEFT adapters read from disk (``peft_adapter``), the per-layer slot
stacks the segmented LoRA matmul reads (``layer``), and how adapters map onto a model's merged
layers (``model``). Workers hold adapters (``ironlm.worker.lora_manager``); the engine decides
which are loaded and which run in a step (``ironlm.engine.adapter_cache``)."""

from ironlm.lora.request import LoRARequest

__all__ = ["LoRARequest"]
