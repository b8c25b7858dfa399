"""GuidedManager: selects guided backends by name, caches compiled specs, builds masks."""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import torch

from ironlm.interfaces.guided import Grammar, GuidedBackend, GuidedSpec
from ironlm.plugin_manager import PluginManager

_CACHE_SIZE = 256
log = logging.getLogger("ironlm.guided")


class GuidedManager:
    def __init__(self, pm: PluginManager, tokenizer: Any, vocab_size: int, default: str) -> None:
        self.pm = pm
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.default = default
        self._backends: dict[str, GuidedBackend] = {}
        self._compiled: OrderedDict[tuple[str, GuidedSpec], Any] = OrderedDict()

    def backend(self, name: str | None) -> GuidedBackend:
        cls = self.pm.select_guided_backend(name or self.default)
        if cls.name not in self._backends:
            self._backends[cls.name] = cls(self.tokenizer, self.vocab_size)
        return self._backends[cls.name]

    def grammar(self, spec: GuidedSpec, backend_name: str | None) -> Grammar:
        """A fresh Grammar for ``spec``; compiles once per (backend, spec). ValueError when the
        backend cannot enforce the spec."""
        backend = self.backend(backend_name)
        if spec.kind not in backend.supported_kinds:
            raise ValueError(
                f"guided decoding backend {backend.name!r} does not support {spec.kind!r} "
                f"constraints (it supports: {', '.join(sorted(backend.supported_kinds))})"
            )
        key = (backend.name, spec)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = backend.compile(spec)
            self._compiled[key] = compiled
            if len(self._compiled) > _CACHE_SIZE:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(key)
        return backend.new_grammar(compiled)

    def build_mask(self, requests: list[Any]) -> torch.Tensor | None:
        """(len(requests), vocab) bool, True = allowed; None when no row is constrained.
        A grammar that fails (a backend dead end) is dropped and its request marked
        ``grammar_failed``: the output processor then aborts it rather than emit text that
        breaks the constraint."""
        if all(r.grammar is None for r in requests):
            return None
        mask = torch.ones((len(requests), self.vocab_size), dtype=torch.bool)
        for i, req in enumerate(requests):
            if req.grammar is None:
                continue
            mask[i] = False
            try:
                req.grammar.fill_mask(mask[i])
            except Exception as exc:
                log.warning("guided grammar failed for request %s: %s", req.request_id, exc)
                req.grammar_failed = True
                mask[i] = True
        return mask
