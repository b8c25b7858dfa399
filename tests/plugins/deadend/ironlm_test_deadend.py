"""A guided-decoding backend that reaches a dead end on purpose (tests only).

Registered as ``deadend``. It takes regex specs whose pattern is a number ``k``: the Grammar
allows every token for ``k`` steps, then fails the way a real backend can: ``raise`` (its
mask raises), ``empty`` (its mask allows nothing), ``accept`` (it refuses the sampled token).
The mode comes after the number: ``"3"``, ``"3 empty"``, ``"0 accept"``.

Found by the server through the entry point of the fake distribution next to this file (put
this folder on PYTHONPATH).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch

from ironlm import hookimpl
from ironlm.interfaces.guided import Grammar, GuidedBackend, GuidedSpec

IRONLM_CONTRACT_VERSION = "1.0"


class DeadEndGrammar(Grammar):
    def __init__(self, after: int, mode: str) -> None:
        self.after = after
        self.mode = mode
        self.steps = 0

    def fill_mask(self, mask: torch.Tensor) -> None:
        if self.steps < self.after or self.mode == "accept":
            mask[:] = True
        elif self.mode == "raise":
            raise RuntimeError(f"forced dead end after {self.steps} tokens")

    def accept_token(self, token_id: int) -> bool:
        if self.mode == "accept" and self.steps >= self.after:
            return False
        self.steps += 1
        return True

    def rollback(self, num_tokens: int) -> None:
        self.steps -= num_tokens

    def is_terminated(self) -> bool:
        return False


class DeadEndBackend(GuidedBackend):
    name: ClassVar[str] = "deadend"
    priority: ClassVar[int] = -100  # never chosen by "auto"
    supported_kinds: ClassVar[frozenset[str]] = frozenset({"regex"})

    def compile(self, spec: GuidedSpec) -> Any:
        after, _, mode = spec.value.partition(" ")
        return int(after), mode or "raise"

    def new_grammar(self, compiled: Any) -> Grammar:
        return DeadEndGrammar(*compiled)


@hookimpl
def register_guided_backends(register: Callable[[type], None]) -> None:
    register(DeadEndBackend)
