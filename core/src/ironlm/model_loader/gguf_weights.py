"""GGUF checkpoints: config and weights under their HF names, one tensor at a time.

transformers owns the GGUF metadata -> HF config key table and the per-architecture tensor
fix-ups (Llama's q/k row permutation for llama.cpp's rotary layout, Gemma's ``1 + w``
norm weights); this module streams the tensors through those fix-ups so that only one
tensor is alive at a time.

Tensors of the GGML types the quantization method keeps (``keep_types``: the gguf method's
Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) are not dequantised: they are yielded as two entries,
``<module>.qweight_type`` (0-dim int64, the GGMLQuantizationType) then ``<module>.weight``
(uint8 (rows, row bytes), the file's blocks). Row fix-ups reach them as row permutations (a
fix-up applied to the row indices); a fix-up that is not one dequantises that tensor. Every
other quantized type is dequantised, with one log line naming the types.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
from transformers.integrations import GGUF_CONFIG_MAPPING
from transformers.modeling_gguf_pytorch_utils import (
    TENSOR_PROCESSORS,
    TensorProcessor,
    get_gguf_hf_weights_map,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from ironlm.model_loader.gguf_file import GGUFFile, GGUFTensorInfo

log = logging.getLogger(__name__)

# GGML types that hold plain (unquantized) numbers: dequantising them is a cast
_PLAIN_TYPES = ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")

# GGUF architectures whose HF config is rebuilt here from the metadata (one fast pass over the
# file) with transformers' key table; others go through transformers' own GGUF config reader,
# which decodes every metadata array element by element (half a minute for a 262k vocabulary).
FAST_CONFIG_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")


def load_gguf_config(gguf_path: Path, trust_remote_code: bool = False) -> PretrainedConfig:
    """The HF config of a GGUF file, as transformers derives it from the metadata, with
    ``architectures`` filled in (GGUF metadata names the model type only)."""
    gguf = GGUFFile(gguf_path)
    if gguf.metadata.get("general.architecture") in FAST_CONFIG_ARCHITECTURES:
        config_dict = gguf_config_dict(gguf)
        config = CONFIG_MAPPING[config_dict["model_type"]].from_dict(config_dict)
    else:
        config = AutoConfig.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, trust_remote_code=trust_remote_code
        )
    if not getattr(config, "architectures", None):
        arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
        if arch is None:
            raise ValueError(
                f"{gguf_path}: no causal-LM architecture known for model type {config.model_type!r}"
            )
        config.architectures = [arch]
    return config


def gguf_config_dict(gguf: GGUFFile) -> dict[str, Any]:
    """HF config fields from GGUF metadata through transformers' GGUF_CONFIG_MAPPING
    (``<arch>.block_count`` -> ``num_hidden_layers``, ...), for FAST_CONFIG_ARCHITECTURES."""
    metadata = gguf.metadata
    # (llama.cpp files Mistral models under "llama" too; like transformers, they load as Llama
    # configs, which carry no sliding window)
    config: dict[str, Any] = {
        # llama.cpp writes the output projection only when it is not the embedding matrix
        "tie_word_embeddings": all(t.name != "output.weight" for t in gguf.tensors),
    }
    for key, value in metadata.items():
        prefix, _, field = key.partition(".")
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(field)
        if renamed is None or renamed == -1:
            continue
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        config[renamed] = value
    if config.get("model_type") == "gemma3":  # a GGUF holds the text model only
        config["model_type"] = "gemma3_text"
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in metadata:
        config["vocab_size"] = len(metadata["tokenizer.ggml.tokens"])
    return config


def iter_gguf_weights(
    gguf_path: Path, hf_config: PretrainedConfig, keep_types: frozenset[int] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, tensor) for every tensor of the GGUF file, one at a time: float32
    (dequantised), or for 2-D tensors of a type in ``keep_types`` the (type, block rows) pair
    described in the module docstring. Tensors with no HF counterpart (e.g. llama.cpp's
    precomputed rope factors) are skipped."""
    from gguf import GGMLQuantizationType

    gguf = GGUFFile(gguf_path)
    architecture = gguf.metadata["general.architecture"]
    processor_cls = TENSOR_PROCESSORS.get(architecture, TensorProcessor)
    processor = processor_cls(config=hf_config.to_dict())
    # transformers maps names by walking an HF model's state dict; a meta-device model costs
    # no memory and gives exactly those names.
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(hf_config)
    name_map = get_gguf_hf_weights_map(hf_model, processor)
    del hf_model
    dequantised: Counter[str] = Counter()
    for tensor in gguf.tensors:
        qtype = GGMLQuantizationType(tensor.ggml_type)
        if tensor.ggml_type in keep_types and len(tensor.shape) == 2:
            kept = _kept_rows(gguf, tensor, processor, name_map)
            if kept is not None:
                hf_name, rows = kept
                module = hf_name.rpartition(".")[0]
                yield f"{module}.qweight_type", torch.tensor(int(qtype), dtype=torch.int64)
                yield hf_name, rows
                continue
        named = _dequantised(gguf, tensor, processor, name_map)
        if named is None:
            continue
        if qtype.name not in _PLAIN_TYPES:
            dequantised[qtype.name] += 1
        yield named
    if dequantised and keep_types:
        kept_names = ", ".join(GGMLQuantizationType(t).name for t in sorted(keep_types))
        log.info(
            "%s: dequantised at load (not kept quantized): %s; kept quantized: %s",
            gguf_path.name,
            ", ".join(f"{count} {name} tensors" for name, count in sorted(dequantised.items())),
            kept_names,
        )


def _dequantised(
    gguf: GGUFFile, tensor: GGUFTensorInfo, processor: TensorProcessor, name_map: dict[str, str]
) -> tuple[str, torch.Tensor] | None:
    from gguf import GGMLQuantizationType, dequantize

    weights = dequantize(gguf.raw(tensor), GGMLQuantizationType(tensor.ggml_type))
    result = processor.process(
        weights=weights, name=tensor.name, tensor_key_mapping=name_map, parsed_parameters={}
    )
    if result.name not in name_map:
        return None
    # a copy: the reader's arrays are read-only views of the memory-mapped file
    return name_map[result.name], torch.from_numpy(np.array(result.weights, dtype=np.float32))


def _kept_rows(
    gguf: GGUFFile, tensor: GGUFTensorInfo, processor: TensorProcessor, name_map: dict[str, str]
) -> tuple[str, torch.Tensor] | None:
    """(HF name, uint8 block rows) of a quantized 2-D tensor with the processor's row fix-up
    applied; None when the tensor has no HF counterpart or its fix-up is not a row
    permutation (it is then dequantised)."""
    rows = tensor.shape[0]
    index = np.arange(rows, dtype=np.float64).reshape(rows, 1)
    result = processor.process(
        weights=index, name=tensor.name, tensor_key_mapping=name_map, parsed_parameters={}
    )
    if result.name not in name_map:
        return None
    order = np.asarray(result.weights)
    if order.shape != (rows, 1) or not np.array_equal(np.sort(order[:, 0]), index[:, 0]):
        return None
    raw = gguf.raw(tensor)  # (rows, row bytes) uint8 view of the file
    return name_map[result.name], torch.from_numpy(raw[order[:, 0].astype(np.int64)])
