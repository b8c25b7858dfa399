"""Building a model on the target device and filling its weights.

Formats (``load_format``, vLLM's meanings):
  auto         GGUF for a .gguf model; else safetensors when the folder has them, else pt
  safetensors  *.safetensors (the index's files when the folder has an index), one tensor at a time
  pt           PyTorch pickles (*.bin / *.pt), memory-mapped, weights only
  gguf         the .gguf file, one tensor at a time: the GGML types the quantization
               method keeps (the gguf method's layouts) stay quantized, the rest dequantised
  dummy        random weights of the right shapes (benchmarks); deterministic from ``seed``
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch

from ironlm.interfaces.model import ModelArchitecture, ModelContext
from ironlm.interfaces.quant import GGUF
from ironlm.layers.linear import LinearBase
from ironlm.layers.vocab_embedding import VocabParallelEmbedding
from ironlm.model_loader.safetensors_file import iter_safetensors_file
from ironlm.model_loader.source import ModelSource

LOAD_FORMATS = ("auto", "safetensors", "pt", "gguf", "dummy")

# vLLM's dummy weights: uniform in [-1e-3, 1e-3], small enough that activations stay finite
DUMMY_LOW, DUMMY_HIGH = -1e-3, 1e-3


def load_model(
    source: ModelSource,
    model_cls: type[ModelArchitecture],
    ctx: ModelContext,
    load_format: str = "auto",
    seed: int = 0,
) -> ModelArchitecture:
    """Construct ``model_cls(hf_config, ctx)`` on ``ctx.device`` in ``ctx.dtype``, fill its
    weights per ``load_format``, then let the quantization method repack every linear (and the
    platform lay out the LM head)."""
    fmt = resolve_load_format(source, load_format)
    keep = _kept_ggml_types(ctx)
    if fmt == "dummy" and keep:
        raise ValueError(
            "load_format 'dummy' cannot fill GGUF-quantized layers (their block types come "
            "from the file); load the .gguf file itself"
        )
    with torch.device(ctx.device):
        model = model_cls(source.hf_config, ctx)
    model.eval()
    with torch.no_grad():
        if fmt == "dummy":
            fill_dummy_weights(model, seed)
        else:
            model.load_weights(iter_checkpoint(source, fmt, keep))
        for module in model.modules():
            if isinstance(module, LinearBase):
                module.quant_method.process_weights_after_loading(module)
            elif isinstance(module, VocabParallelEmbedding):  # and the LM head
                module.process_weights_after_loading()
    model.weights_processed = True  # later load_weights calls are updates
    return model


def reload_checkpoint(
    model: ModelArchitecture, source: ModelSource, ctx: ModelContext, load_format: str = "auto"
) -> None:
    """The checkpoint's weights into the loaded ``model`` again, in place (vLLM's
    ``reload_weights``: after sleep mode discarded them, or updates replaced them)."""
    fmt = resolve_load_format(source, load_format)
    if fmt == "dummy":
        raise ValueError("reload_weights: load_format 'dummy' has no checkpoint to read")
    with torch.no_grad():
        model.load_weights(iter_checkpoint(source, fmt, _kept_ggml_types(ctx)))


def _kept_ggml_types(ctx: ModelContext) -> frozenset[int]:
    """GGML types the method keeps quantized (its gguf layouts); every other is dequantised."""
    return frozenset(
        int(layout.ggml_type)
        for layout in ctx.quantization.layouts()
        if layout.kind == GGUF and layout.ggml_type is not None
    )


def resolve_load_format(source: ModelSource, load_format: str) -> str:
    """The concrete format ``load_format`` means for ``source``; ValueError when it does not
    apply or is unknown."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"unknown load_format {load_format!r}; valid: {', '.join(LOAD_FORMATS)}")
    if load_format == "dummy":
        return "dummy"
    if source.gguf_file is not None:
        if load_format not in ("auto", "gguf"):
            raise ValueError(
                f"load_format {load_format!r} cannot read GGUF file {source.gguf_file}"
            )
        return "gguf"
    if load_format == "gguf":
        raise ValueError(f"load_format 'gguf' needs a .gguf model; {source.path} is a folder")
    if load_format == "auto":
        return "safetensors" if _safetensors_files(source.path) else "pt"
    return load_format


def iter_checkpoint(
    source: ModelSource, fmt: str, keep_ggml_types: frozenset[int] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, CPU tensor) pairs of the checkpoint, one tensor alive at a time
    (``keep_ggml_types``: GGUF tensor types to yield quantized, see ``iter_gguf_weights``)."""
    if fmt == "gguf":
        from ironlm.model_loader.gguf_weights import iter_gguf_weights

        assert source.gguf_file is not None
        yield from iter_gguf_weights(source.gguf_file, source.hf_config, keep_ggml_types)
    elif fmt == "safetensors":
        yield from _iter_safetensors(_require(_safetensors_files(source.path), source.path, fmt))
    elif fmt == "pt":
        yield from _iter_pt(_require(_pt_files(source.path), source.path, fmt))
    else:
        raise ValueError(f"no checkpoint reader for load_format {fmt!r}")


def fill_dummy_weights(model: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn on the CPU from one generator seeded with ``seed``, in parameter
    order, so the weights are the same on every device. Float parameters are uniform in
    [DUMMY_LOW, DUMMY_HIGH]; integer (packed quantized) ones uniform over [0, 16)."""
    generator = torch.Generator().manual_seed(seed)
    for _, param in model.named_parameters():
        if param.dtype.is_floating_point:
            values = torch.empty(param.shape, dtype=torch.float32)
            values.uniform_(DUMMY_LOW, DUMMY_HIGH, generator=generator)
        else:
            values = torch.randint(0, 16, param.shape, generator=generator)
        param.data.copy_(values)


def _safetensors_files(folder: Path) -> list[Path]:
    return _checkpoint_files(
        folder, "model.safetensors.index.json", "model.safetensors", "*.safetensors"
    )


def _pt_files(folder: Path) -> list[Path]:
    files = _checkpoint_files(folder, "pytorch_model.bin.index.json", "pytorch_model.bin", "*.bin")
    return files or sorted(folder.glob("*.pt"))


def _checkpoint_files(folder: Path, index_name: str, single_name: str, pattern: str) -> list[Path]:
    """The index's shard files when there is an index (folders may hold other copies, e.g.
    Mistral's consolidated.safetensors), else the single file, else every match."""
    index = folder / index_name
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    if (folder / single_name).is_file():
        return [folder / single_name]
    return sorted(folder.glob(pattern))


def _require(files: list[Path], folder: Path, fmt: str) -> list[Path]:
    if not files:
        raise ValueError(f"no {fmt} weights in {folder}")
    return files


def _iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:  # plain reads: no mapped checkpoint pages beside the model's copies
        yield from iter_safetensors_file(file)


def _iter_pt(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        state = torch.load(str(file), map_location="cpu", weights_only=True, mmap=True)
        for name in list(state):
            yield name, state.pop(name)
        del state
