"""Model resolution and weight loading: HF folders (safetensors / pt), GGUF files, Hugging Face
Hub repository ids (fetched into the hub cache), dummy weights."""

from ironlm.model_loader.hub import HubOptions
from ironlm.model_loader.loader import (
    LOAD_FORMATS,
    load_model,
    reload_checkpoint,
    resolve_load_format,
)
from ironlm.model_loader.source import ModelSource, resolve_model

__all__ = ["LOAD_FORMATS", "HubOptions", "ModelSource", "load_model", "reload_checkpoint",
           "resolve_load_format", "resolve_model"]
