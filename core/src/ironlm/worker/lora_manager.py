"""WorkerLoRAManager: the adapters one worker holds, and which of them sit in the kernel slots.

Two tiers, as in vLLM: up to ``max_cpu_loras`` adapters are held prepared in host memory (read,
checked against the model and cut to this rank's shard; the engine decides which, and evicts
the least recently used through ``remove``); ``max_loras`` of them sit in the slots the
segmented LoRA matmul reads. Each step maps its sequences' adapters to slots, copying an
adapter into the least recently used slot that the step does not need when it is not in one.
Everything here is per rank: every worker receives the same calls and the same steps, and slot
numbers never leave the worker, so ranks need not agree on them.
"""

from __future__ import annotations

import torch

from ironlm.config import EngineConfig
from ironlm.interfaces.platform import LayerOps
from ironlm.lora.model import LoRAModel, PreparedAdapter
from ironlm.lora.peft_adapter import load_peft_adapter
from ironlm.lora.request import LoRARequest


class WorkerLoRAManager:
    def __init__(
        self,
        model: torch.nn.Module,
        config: EngineConfig,
        layer_ops: LayerOps,
        model_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.model = LoRAModel(
            model, config.max_loras, config.max_lora_rank, config.lora_torch_dtype(model_dtype),
            device, layer_ops,
        )  # fmt: skip
        self.state = self.model.state
        self.device = device
        self.max_rank = config.max_lora_rank
        self.max_cpu_loras = int(config.max_cpu_loras or config.max_loras)
        self.adapters: dict[int, PreparedAdapter] = {}  # lora_int_id -> prepared weights
        self.slots: list[int | None] = [None] * config.max_loras  # adapter id per slot
        self._last_used = [0] * config.max_loras  # step counter when each slot last served
        self._step = 0

    # -- adapters (collective_rpc from the engine) ----------------------------------------------
    def add(self, request: LoRARequest) -> bool:
        """Read, check and hold an adapter; False when it is held already. LoRAAdapterError (a
        ValueError) names what is wrong with it."""
        if request.lora_int_id in self.adapters:
            return False
        if len(self.adapters) >= self.max_cpu_loras:
            raise RuntimeError(
                f"worker holds {len(self.adapters)} adapters (max_cpu_loras): the engine must "
                "remove one before adding another"
            )
        adapter = load_peft_adapter(request.lora_path, self.max_rank, request.lora_name)
        self.adapters[request.lora_int_id] = self.model.prepare(adapter, request.lora_int_id)
        return True

    def check(self, request: LoRARequest) -> None:
        """Read and check an adapter without holding it (LoRAAdapterError when it cannot run)."""
        adapter = load_peft_adapter(request.lora_path, self.max_rank, request.lora_name)
        self.model.prepare(adapter, request.lora_int_id)

    def remove(self, lora_id: int) -> bool:
        for i, held in enumerate(self.slots):
            if held == lora_id:
                self.slots[i] = None
        return self.adapters.pop(lora_id, None) is not None

    def ids(self) -> set[int]:
        return set(self.adapters)

    # -- one step -------------------------------------------------------------------------------
    def slots_for(self, lora_ids: list[int]) -> list[int]:
        """The slot of each entry's adapter (-1 for 0, the base model), loading adapters into
        slots as needed."""
        self._step += 1
        needed = {i for i in lora_ids if i}
        if len(needed) > len(self.slots):
            raise RuntimeError(
                f"{len(needed)} adapters in one step but only max_loras={len(self.slots)} slots"
            )
        where: dict[int, int] = {i: self.slots.index(i) for i in needed if i in self.slots}
        for lora_id in sorted(needed - where.keys()):
            adapter = self.adapters.get(lora_id)
            if adapter is None:
                raise RuntimeError(f"LoRA adapter id {lora_id} is not loaded on this worker")
            slot = min(
                (i for i, held in enumerate(self.slots) if held not in needed),
                key=lambda i: (self.slots[i] is not None, self._last_used[i]),
            )
            self.model.set_slot(slot, adapter)
            self.slots[slot] = lora_id
            where[lora_id] = slot
        for slot in where.values():
            self._last_used[slot] = self._step
        return [where[i] if i else -1 for i in lora_ids]

    def bind_tokens(self, seq_slots: list[int], seq_lens: list[int]) -> None:
        """Point every LoRA layer at this step's per-token slots (eager forward)."""
        if all(s < 0 for s in seq_slots):  # base model only: the layers skip the kernel
            self.state.bind(self.state.token_slots[:0], active=False)
            return
        per_token = [s for s, n in zip(seq_slots, seq_lens) for _ in range(n)]
        tensor = torch.tensor(per_token, dtype=torch.int32, device=self.device)
        self.state.bind(tensor, active=True)
