"""LoRARequest: which adapter a request runs with (vLLM's class, same fields and import path
shape: ``from ironlm.lora.request import LoRARequest``).

``lora_int_id`` identifies the adapter inside the engine (the prefix cache, the loaded-adapter
cache and the per-step mapping use it): it must be positive and name one adapter for the
engine's lifetime. Two requests are the same adapter when their names are equal.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    long_lora_max_len: int | None = None  # vLLM's long-context LoRA: not supported here
    base_model_name: str | None = None  # the served model this adapter belongs to

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) \
                or self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        if self.long_lora_max_len is not None:
            raise ValueError("long_lora_max_len is not supported: IronLM has no long-context "
                             "LoRA (scaled rotary per adapter)")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    @property
    def local_path(self) -> str:
        return self.lora_path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoRARequest) and self.lora_name == other.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)
