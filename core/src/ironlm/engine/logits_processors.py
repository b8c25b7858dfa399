"""The engine's side of custom logits processors (vLLM's ``logits_processors``; the interface
is ``interfaces/logits_processor.py``, the sampling worker's side ``worker/logits_batch.py``):
the configured entries as classes, checked before any worker starts, and each request's
``validate_params``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ironlm.interfaces.logits_processor import LogitsProcessor, logits_processor_class
from ironlm.plugin_manager import PluginManager
from ironlm.python_file import import_class
from ironlm.sampling_params import SamplingParams

# vLLM's message
SPEC_DECODE_REFUSED = ("Custom logits processors are not supported when speculative decoding "
                       "is enabled.")


def load_logits_processors(
    pm: PluginManager, entries: Sequence[Any], speculation: Any
) -> list[type[LogitsProcessor]]:
    """Each entry as a LogitsProcessor subclass: a class as given, vLLM's "module:Class" or a
    "module.Class" name imported, a plain name one a plugin registered
    (``register_logits_processors``); ValueError naming the entry otherwise, and with
    speculative decoding (``speculation`` not None)."""
    if speculation is not None:
        raise ValueError(SPEC_DECODE_REFUSED)
    classes = []
    for entry in entries:
        if isinstance(entry, str) and (":" in entry or "." in entry):
            entry = import_class(entry, "logits_processors")
        elif isinstance(entry, str):
            entry = pm.select_logits_processor(entry)
        classes.append(logits_processor_class(entry))
    return classes


def validate_request(classes: Sequence[type[LogitsProcessor]], params: SamplingParams) -> None:
    """Every processor's ``validate_params``: a ValueError refuses the request (a 400 on the
    server); any other exception it raises on the request's extra_args does too, named."""
    for cls in classes:
        try:
            cls.validate_params(params)
        except ValueError:
            raise
        except Exception as exc:  # the processor's own, on the client's extra_args
            raise ValueError(f"{cls.__name__}.validate_params refused the request's "
                             f"extra_args (vllm_xargs): {type(exc).__name__}: {exc}") from exc
