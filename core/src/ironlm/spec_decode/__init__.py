"""Speculative decoding proposers of the core (registered by ``ironlm.builtin_plugin``):
``ngram`` (prompt lookup) and ``draft_model`` (a smaller model with the target's tokenizer),
plus ``shallow_copy`` to make a draft from a model's first layers.

They are written against the contract only (``ironlm.interfaces.spec_decode``), as a
third-party proposer would be; the worker verifies their drafts (``ironlm.worker``).
"""
