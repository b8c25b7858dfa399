"""Default sampling parameters from the model's generation config (vLLM's ``--generation-config``).

Model makers ship recommended sampling settings in ``generation_config.json`` (Qwen: temperature
0.7, top-p 0.8, top-k 20; Gemma 3: top-k 64, top-p 0.95). vLLM applies them by default: a
request field left unset takes the generation config's value before SamplingParams' own
default, and ``max_new_tokens`` caps every request's output on the server. The sources:

- ``generation_config="auto"`` (default): the model folder's ``generation_config.json``
  (a GGUF file has none);
- ``"vllm"``: none, SamplingParams' defaults alone (vLLM's name for it);
- a folder path: that folder's ``generation_config.json``.

``override_generation_config`` (a dict) is laid over the source. Only the six fields vLLM reads
count (``SAMPLING_FIELDS``); an override naming anything else is refused, since it would be
ignored (vLLM ignores it silently).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from transformers import GenerationConfig

from ironlm.sampling_params import SamplingParams

log = logging.getLogger("ironlm.engine")

# generation-config field -> SamplingParams field
SAMPLING_FIELDS = {
    "repetition_penalty": "repetition_penalty",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "max_new_tokens": "max_tokens",
}


def default_sampling(
    source: str, model_config: GenerationConfig | None, override: dict[str, Any]
) -> dict[str, Any]:
    """SamplingParams keyword arguments that replace SamplingParams' defaults: from
    ``model_config`` (the model's own generation config, for ``source`` "auto"), from no
    config ("vllm"), or from the folder ``source`` names; then ``override``. ValueError names
    the flag for a missing folder, an override field that is not a sampling field, or a value
    SamplingParams refuses."""
    unknown = sorted(set(override) - set(SAMPLING_FIELDS))
    if unknown:
        raise ValueError(
            f"override_generation_config: {unknown} not used for sampling; the fields read "
            f"are {sorted(SAMPLING_FIELDS)}"
        )
    config: dict[str, Any] = {}
    if source == "auto":
        config = model_config.to_diff_dict() if model_config is not None else {}
    elif source != "vllm":
        folder = Path(source).expanduser()
        if not (folder / "generation_config.json").is_file():
            raise ValueError(
                f"generation_config {source!r}: no generation_config.json in that folder; "
                "give 'auto' (the model's), 'vllm' (none) or a folder holding one"
            )
        config = GenerationConfig.from_pretrained(str(folder)).to_diff_dict()
    config.update(override)
    where = (f"generation config {source!r}" + (" with override_generation_config"
                                                if override else ""))
    out = {SAMPLING_FIELDS[k]: _number(k, v, where) for k, v in config.items()
           if k in SAMPLING_FIELDS and v is not None}
    if out.get("top_k") == 0:  # transformers' "no top-k"; SamplingParams spells it -1
        out["top_k"] = -1
    try:
        SamplingParams(**out)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc} (--generation-config vllm ignores the model's "
                         "values; --override-generation-config replaces one)") from None
    if out:
        log.warning(
            "Default sampling parameters come from the model's generation config: %s. If this "
            "is not intended, start with --generation-config vllm.", out)
    return out


def _number(name: str, value: Any, where: str) -> int | float:
    """A sampling field's value as SamplingParams takes it: an int for top_k and
    max_new_tokens (2.0 is 2), a float for the others; ValueError naming it otherwise."""
    integral = name in ("top_k", "max_new_tokens")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            integral and value != int(value)):
        kind = "an integer" if integral else "a number"
        raise ValueError(f"{where}: {name} must be {kind}, got {value!r}")
    return int(value) if integral else float(value)
