"""Custom logits processors written as for vLLM (only the import differs), for
test_logits_processors.py and the server it starts (``--logits-processors
logits_processors_examples:TargetTokenProcessor``: the tests folder is on the server's path).

- ``TargetTokenProcessor``: vLLM's documented example: a request whose extra_args name a
  ``target_token`` can sample nothing else. It keeps its requests by batch index through
  ``update_state`` alone, so a request that samples another's target shows an index mix-up.
- ``NoRepeatProcessor``: a request-level callable (vLLM V0's form) through
  ``AdapterLogitsProcessor``: with ``no_repeat`` set, no token of the prompt or the output
  so far may come again (HF's ``NoRepeatNGramLogitsProcessor(1)``).
- ``ProbeProcessor``: argmax-invariant; keeps a copy of the rows it is given (requests with
  ``probe`` set), to show where in the sampler it runs.
"""

from __future__ import annotations

from typing import Any

import torch

from ironlm import SamplingParams
from ironlm.config import EngineConfig
from ironlm.interfaces.logits_processor import (
    AdapterLogitsProcessor,
    BatchUpdate,
    LogitsProcessor,
    process_dict_updates,
)


class TargetTokenProcessor(LogitsProcessor):
    name = "target_token"  # its name when a plugin registers it

    def __init__(self, config: EngineConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.targets: dict[int, int] = {}  # batch index -> target token

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        target = (sampling_params.extra_args or {}).get("target_token")
        if target is not None and (not isinstance(target, int) or target < 0):
            raise ValueError(f"target_token must be a non-negative integer, got {target!r}")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.targets, batch_update,
                             lambda params, _prompt, _out: (params.extra_args or {})
                             .get("target_token"))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, target in self.targets.items():
            keep = logits[index, target].item()
            logits[index] = float("-inf")
            logits[index, target] = keep
        return logits


class NoRepeatProcessor(AdapterLogitsProcessor):
    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params: SamplingParams) -> Any:
        if not (params.extra_args or {}).get("no_repeat"):
            return None

        def ban_seen(prompt_ids: list[int], output_ids: list[int],
                     row: torch.Tensor) -> torch.Tensor:
            seen = torch.tensor(prompt_ids + output_ids, dtype=torch.long)
            return row.index_fill(0, seen, float("-inf"))

        return ban_seen


class ProbeProcessor(LogitsProcessor):
    def __init__(self, config: EngineConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.probed: dict[int, bool] = {}
        self.seen: list[torch.Tensor] = []  # per apply: the probed rows it was given

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.probed, batch_update,
                             lambda params, _p, _o: (params.extra_args or {}).get("probe"))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        rows = sorted(self.probed)
        if rows:
            self.seen.append(logits[rows].clone())
        return logits


def has_processors(worker: Any) -> bool:
    """For ``collective_rpc`` (by reference, so mp workers import it): whether this worker
    built the custom processors (the sampling rank does)."""
    return worker.model_runner.sampler.custom is not None
