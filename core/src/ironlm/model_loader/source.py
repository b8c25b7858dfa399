"""Where a model comes from: a local HF folder or a single GGUF file, resolved once into a
ModelSource (config, checkpoint dtype, architectures, tokenizer)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PretrainedConfig

from ironlm.model_loader.hub import HubOptions, fetch_model, is_hub_reference

log = logging.getLogger("ironlm.model_loader")

# used when a config names no context length (vLLM's fallback)
DEFAULT_MAX_POSITION_EMBEDDINGS = 2048


@dataclass
class ModelSource:
    """A resolved model. ``path`` is what the user named (an HF folder or a .gguf file);
    ``gguf_file`` is set for GGUF models."""

    path: Path
    gguf_file: Path | None
    hf_config: PretrainedConfig
    checkpoint_dtype: torch.dtype  # dtype the weights are stored in (float32 for GGUF)
    architectures: list[str]  # HF architecture names, e.g. ["LlamaForCausalLM"]
    max_position_embeddings: int
    trust_remote_code: bool = False
    revision: str | None = None  # the commit of a Hub repository's snapshot (None: local)

    @property
    def is_gguf(self) -> bool:
        return self.gguf_file is not None

    @property
    def quantization_config(self) -> dict[str, Any] | None:
        """The checkpoint's HF ``quantization_config`` (for QuantizationMethod.from_config), or
        None for plain weights. A GGUF file's is ``{"quant_method": "gguf", "ggml_types":
        [...]}``: the GGML type names its tensors use (read from the tensor directory)."""
        if self.gguf_file is not None:
            from ironlm.model_loader.gguf_file import GGUFFile

            return {"quant_method": "gguf", "ggml_types": GGUFFile(self.gguf_file).type_names()}
        config = getattr(self.hf_config, "quantization_config", None)
        if config is None or isinstance(config, dict):
            return config
        return config.to_dict()

    def load_tokenizer(self, tokenizer: str | None = None, hub: HubOptions | None = None) -> Any:
        """The HF tokenizer: from ``tokenizer`` (a folder, or a Hub repository id fetched with
        ``hub``'s revision, cache folder and token) when given, else from the model folder,
        else converted from the GGUF metadata."""
        if tokenizer is not None:
            hub = hub or HubOptions()
            return AutoTokenizer.from_pretrained(
                tokenizer, trust_remote_code=self.trust_remote_code, revision=hub.revision,
                cache_dir=hub.download_dir, token=hub.token,
            )  # fmt: skip
        if self.gguf_file is not None:
            return AutoTokenizer.from_pretrained(
                str(self.gguf_file.parent),
                gguf_file=self.gguf_file.name,
                trust_remote_code=self.trust_remote_code,
            )
        return AutoTokenizer.from_pretrained(
            str(self.path), trust_remote_code=self.trust_remote_code
        )

    def load_generation_config(self) -> GenerationConfig | None:
        """The folder's generation_config.json (eos ids, default sampling), or None."""
        if self.gguf_file is not None or not (self.path / "generation_config.json").is_file():
            return None
        return GenerationConfig.from_pretrained(str(self.path))


def resolve_model(
    model: str, trust_remote_code: bool = False, hf_overrides: dict[str, Any] | None = None,
    hub: HubOptions | None = None,
) -> ModelSource:  # fmt: skip
    """Resolve ``model`` (a local HF folder with config.json, a .gguf file, or a Hugging Face
    Hub repository id fetched with ``hub``'s options: model_loader/hub.py) into a
    ModelSource, ``hf_overrides`` laid over its config. ValueError when the path does not
    exist or holds no model."""
    path = Path(model).expanduser()
    if path.exists():
        return _resolve_path(model, path, trust_remote_code, hf_overrides)
    if not is_hub_reference(model):
        raise ValueError(
            f"model {model!r} does not exist: give a local HF folder (config.json + "
            "weights), a .gguf file, or a Hugging Face Hub repository id"
        )
    fetched = fetch_model(model, hub or HubOptions())
    source = _resolve_path(model, fetched.path, trust_remote_code, hf_overrides)
    return replace(source, revision=fetched.commit)


def _resolve_path(model: str, path: Path, trust_remote_code: bool,
                  hf_overrides: dict[str, Any] | None) -> ModelSource:  # fmt: skip
    # the folder resolved, not the file: a hub cache's snapshot file links to a blob without
    # the .gguf suffix
    path = path.parent.resolve() / path.name
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"model {model!r} is a file but not a .gguf file")
        from ironlm.model_loader.gguf_weights import load_gguf_config

        config = _override(load_gguf_config(path, trust_remote_code), hf_overrides)
        return _source(path, path, config, torch.float32, trust_remote_code)
    if not (path / "config.json").is_file():
        raise ValueError(f"model folder {model!r} has no config.json (not an HF model folder)")
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    config = _override(config, hf_overrides)
    return _source(path, None, config, _config_dtype(config), trust_remote_code)


def sliding_window(config: PretrainedConfig) -> int | None:
    """The window of the model's sliding-window layers; None when no layer slides (no
    window, ``use_sliding_window`` false, or ``layer_types`` without a sliding layer)."""
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


def _override(config: PretrainedConfig, overrides: dict[str, Any] | None) -> PretrainedConfig:
    """``overrides`` laid over ``config`` (vLLM's hf_overrides): a value that is an object,
    for a key naming a sub-config or an object (``rope_parameters``), updates its fields;
    anything else is set. ``rope_theta``, which transformers 5 keeps inside
    ``rope_parameters``, goes there (vLLM's recipes set it at the top). A key the config did
    not have is set too (a model may read it with a default), with a warning: a misspelt key
    changes nothing."""
    for key, value in (overrides or {}).items():
        sub = getattr(config, key, None)
        if key == "rope_theta" and isinstance(getattr(config, "rope_parameters", None), dict):
            _override(config, {"rope_parameters": _rope_theta(config.rope_parameters, value)})
            continue
        if not hasattr(config, key):
            log.warning("hf_overrides: %r is not a field of %s; set anyway", key,
                        type(config).__name__)
        if isinstance(value, dict) and isinstance(sub, PretrainedConfig):
            _override(sub, value)
        elif isinstance(value, dict) and isinstance(sub, dict):
            setattr(config, key, _merged(sub, value))
        else:
            setattr(config, key, value)
        log.info("hf_overrides: %s.%s = %r", type(config).__name__, key, getattr(config, key))
    return config


def _merged(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` laid over ``base``, objects inside merged the same way."""
    out = dict(base)
    for key, value in update.items():
        old = out.get(key)
        out[key] = _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) \
            else value
    return out


def _rope_theta(params: dict[str, Any], theta: Any) -> dict[str, Any]:
    """``{"rope_theta": theta}`` for a config's flat rope parameters; per-layer-type ones
    (Gemma 3: one entry per attention kind) need the kind named."""
    if "rope_theta" not in params:
        raise ValueError(
            f"hf_overrides rope_theta: this model's rope_parameters are per layer type "
            f"({sorted(params)}); give {{\"rope_parameters\": {{KIND: {{\"rope_theta\": ...}}}}}}"
        )
    return {"rope_theta": theta}


def _source(
    path: Path,
    gguf_file: Path | None,
    config: PretrainedConfig,
    dtype: torch.dtype,
    trust_remote_code: bool,
) -> ModelSource:
    architectures = list(getattr(config, "architectures", None) or [])
    if not architectures:
        raise ValueError(f"{path}: config names no architectures")
    max_pos = getattr(config, "max_position_embeddings", None) or DEFAULT_MAX_POSITION_EMBEDDINGS
    return ModelSource(
        path=path,
        gguf_file=gguf_file,
        hf_config=config,
        checkpoint_dtype=dtype,
        architectures=architectures,
        max_position_embeddings=int(max_pos),
        trust_remote_code=trust_remote_code,
    )


def _config_dtype(config: PretrainedConfig) -> torch.dtype:
    """The checkpoint dtype the config declares (``dtype``);
    float32 when it declares none."""
    value = getattr(config, "dtype", None)
    if value is None:
        return torch.float32
    if isinstance(value, torch.dtype):
        return value
    dtype = getattr(torch, str(value).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"config declares an unknown dtype {value!r}")
    return dtype
