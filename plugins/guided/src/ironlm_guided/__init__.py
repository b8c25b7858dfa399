"""ironlm-guided: structured-output backends for IronLM.

``outlines`` (outlines-core regex automata), ``lm-format-enforcer`` (character-level parsers)
and ``xgrammar`` (pushdown automata), registered through ``register_guided_backends``.
"""
