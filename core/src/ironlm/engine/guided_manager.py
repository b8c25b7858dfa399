"""GuidedManager: picks a guided backend per spec, caches compiled specs, builds masks.

Selection: a named backend compiles or refuses. ``auto`` (vLLM's behaviour) tries the available
backends from the highest priority down and falls back to the next one only when a backend
raises UnsupportedFeatureError (a feature it cannot enforce); an invalid spec is refused at
once, and ``spec.disable_fallback`` keeps the first backend's refusal.

Compiling may take long (an outlines index over a large regex): the server calls ``compile``
from a worker thread before queueing the request, so the engine thread only finds it cached.
The cache is shared with that thread under a lock; compiling itself runs outside the lock.

A Grammar that fails (raises, or allows no token: a backend dead end) ends its own request
only: ``build_mask`` and the output processor record ``grammar_error`` on the request and the
engine finishes it with that error; every other request goes on.

Specs with ``close_at_budget`` (tool calls) are closed before their token budget runs out:
near the end ``build_mask`` lets ``guided_closing.BudgetCloser`` fill their rows.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

import torch

from ironlm.engine.guided_closing import BudgetCloser
from ironlm.interfaces.guided import (
    Grammar,
    GuidedBackend,
    GuidedSpec,
    UnsupportedFeatureError,
)
from ironlm.plugin_manager import PluginManager

_CACHE_SIZE = 256
log = logging.getLogger("ironlm.guided")


class GuidedManager:
    def __init__(self, pm: PluginManager, tokenizer: Any, vocab_size: int, default: str,
                 max_model_len: int | None = None) -> None:
        self.pm = pm
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.default = default
        self.closer = BudgetCloser(tokenizer, vocab_size, max_model_len)
        self._lock = threading.Lock()
        self._backends: dict[str, GuidedBackend] = {}
        # (requested backend name, spec) -> (backend that compiled it, compiled spec)
        self._compiled: OrderedDict[tuple[str, GuidedSpec], tuple[GuidedBackend, Any]] = \
            OrderedDict()

    def backend(self, cls: type[GuidedBackend]) -> GuidedBackend:
        """The one instance of backend ``cls`` (built on first use)."""
        with self._lock:
            instance = self._backends.get(cls.name)
        if instance is None:
            instance = cls(self.tokenizer, self.vocab_size)  # may be slow: outside the lock
            with self._lock:
                instance = self._backends.setdefault(cls.name, instance)
        return instance

    def compile(self, spec: GuidedSpec, backend_name: str | None) -> tuple[GuidedBackend, Any]:
        """The backend chosen for ``spec`` and its compiled form (cached). ValueError (a 400)
        when the spec is invalid or no backend may enforce it; the message names each
        backend tried and why it refused."""
        if spec.close_at_budget:
            self.closer.token_ranks()  # built here, off the engine thread, once
        name = backend_name or self.default
        key = (name, spec)
        with self._lock:
            hit = self._compiled.get(key)
            if hit is not None:
                self._compiled.move_to_end(key)
                return hit
        candidates = self.pm.guided_backend_candidates(name)
        if spec.disable_fallback:
            candidates = candidates[:1]
        refusals: list[str] = []
        for cls in candidates:
            if spec.kind not in cls.supported_kinds:
                refusals.append(
                    f"{cls.name!r} does not support {spec.kind!r} constraints (it supports: "
                    f"{', '.join(sorted(cls.supported_kinds))})"
                )
                continue
            backend = self.backend(cls)
            try:
                compiled = backend.compile(spec)
            except UnsupportedFeatureError as exc:
                refusals.append(f"{cls.name!r}: {exc}")
                continue
            with self._lock:
                self._compiled[key] = (backend, compiled)
                if len(self._compiled) > _CACHE_SIZE:
                    self._compiled.popitem(last=False)
            return backend, compiled
        if len(refusals) == 1:
            raise ValueError(f"guided decoding backend {refusals[0]}")
        raise ValueError("no guided decoding backend can enforce this constraint: "
                         + "; ".join(refusals))

    def grammar(self, spec: GuidedSpec, backend_name: str | None) -> tuple[Grammar, str]:
        """A fresh Grammar for ``spec`` and the name of the backend it runs on (see
        ``compile``)."""
        backend, compiled = self.compile(spec, backend_name)
        return backend.new_grammar(compiled), backend.name

    def build_mask(
        self, requests: list[Any], drafts: list[list[int]] | None = None
    ) -> torch.Tensor | None:
        """(rows, vocab) bool, True = allowed: per request, the row after its last token and
        one after each of its drafts (speculative decoding; the grammar is advanced through
        them and rolled back). None when no row is constrained. A grammar that fails (a backend
        dead end: it raises or allows nothing) is dropped and its request marked with
        ``grammar_error``: the output processor then ends that request with the error rather
        than emit text that breaks the constraint."""
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
                if ds or not self.closer.fill_row(req, rows[0]):
                    _fill_rows(req.grammar, ds, rows)
            except Exception as exc:
                mark_dead_end(req, exc)
                rows[:] = True
        return mask


def mark_dead_end(req: Any, exc: BaseException) -> None:
    """Record on ``req`` that its Grammar failed (the request then ends with this error)."""
    name = req.grammar_backend
    log.warning("guided decoding backend %r failed for request %s: %s", name, req.request_id,
                exc)
    if req.grammar_error is None:
        req.grammar_error = (
            f"guided decoding backend {name!r} reached a dead end after "
            f"{len(req.output_token_ids)} generated tokens ({exc}); the request was stopped "
            "so that no output breaks the constraint. Retry, or choose another backend with "
            "guided_decoding_backend."
        )


def _fill_rows(grammar: Grammar, drafts: list[int], rows: torch.Tensor) -> None:
    """rows[0]: the grammar's mask now; rows[j]: after drafts[:j] (the state is restored)."""
    grammar.fill_mask(rows[0])
    if not bool(rows[0].any()):
        raise RuntimeError("no token is allowed next")
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
