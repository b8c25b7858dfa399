"""Model resolution and weight loading: HF folders (safetensors / pt), GGUF files, dummy weights."""

from ironlm.model_loader.loader import LOAD_FORMATS, load_model, resolve_load_format
from ironlm.model_loader.source import ModelSource, resolve_model

__all__ = ["LOAD_FORMATS", "ModelSource", "load_model", "resolve_load_format", "resolve_model"]
