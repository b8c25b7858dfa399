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

    def build_mask(
        self, requests: list[Any], drafts: list[list[int]] | None = None
    ) -> torch.Tensor | None:
        """(rows, vocab) bool, True = allowed: per request, the row after its last token and
        one after each of its drafts (speculative decoding; the grammar is advanced through
        them and rolled back). None when no row is constrained. A grammar that fails (a backend
        dead end) is dropped and its request marked ``grammar_failed``: the output processor
        then aborts it rather than emit text that breaks the constraint."""
        if all(r.grammar is None for r in requests):
            return None
        drafts = drafts if drafts is not None else [[] for _ in requests]
        mask = torch.ones((sum(1 + len(d) for d in drafts), self.vocab_size), dtype=torch.bool)
        at = 0
        for req, ds in zip(requests, drafts):
            rows = mask[at : at + 1 + len(ds)]
            at += 1 + len(ds)
            if req.grammar is None:
                continue
            rows[:] = False
            try:
                _fill_rows(req.grammar, ds, rows)
            except Exception as exc:
                log.warning("guided grammar failed for request %s: %s", req.request_id, exc)
                req.grammar_failed = True
                rows[:] = True
        return mask


def _fill_rows(grammar: Grammar, drafts: list[int], rows: torch.Tensor) -> None:
    """rows[0]: the grammar's mask now; rows[j]: after drafts[:j] (the state is restored)."""
    grammar.fill_mask(rows[0])
    accepted = 0
    try:
        for j, token in enumerate(drafts, start=1):
            if not grammar.accept_token(token):
                raise RuntimeError(f"draft token {token} was checked but the grammar refuses it")
            accepted += 1
            grammar.fill_mask(rows[j])
    finally:
        if accepted:
            grammar.rollback(accepted)
