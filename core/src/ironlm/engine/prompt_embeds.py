"""Prompt embeddings (vLLM's ``--enable-prompt-embeds``): a prompt given as the rows the
model's embedding layer would produce, (num_tokens, hidden_size), instead of token ids.

The engine keeps a request's rows (float32, on the host) for its whole life: each step sends
the rows of the prompt positions it runs (``ScheduledSeq.prompt_embeds``), again after a
preemption that recomputes; the runner splices them in (``worker/prompt_rows.py``). The prompt's token ids are placeholders (``PLACEHOLDER_ID``),
so the prefix cache keys a block on a digest of its rows (``block_digest``) besides them.

Over HTTP a tensor comes as base64 of ``torch.save``'s bytes (vLLM's wire format, Completions
API only), read with ``weights_only`` and in dense (strided) layout only: a crafted sparse or
quantized payload is refused before any index in it is used.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from typing import Any

import torch

from ironlm.interfaces.model import ModelArchitecture

# the id that stands in the request's token list at each embedded position (any id in the
# vocabulary: the runner never embeds it, the rows replace it)
PLACEHOLDER_ID = 0
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def checked_embeds(embeds: object, hidden_size: int) -> torch.Tensor:
    """The prompt's rows as a float32 (num_tokens, hidden_size) host tensor; ValueError naming
    ``prompt_embeds`` for anything else (vLLM takes (1, num_tokens, hidden_size) too)."""
    if not isinstance(embeds, torch.Tensor):  # a ValueError: the server's 400 naming the field
        raise ValueError(  # noqa: TRY004
            f"prompt_embeds must be a torch.Tensor, got {type(embeds).__name__}")
    if embeds.layout != torch.strided:
        raise ValueError(f"prompt_embeds must be a dense tensor, got layout {embeds.layout}")
    if embeds.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"prompt_embeds dtype {embeds.dtype} is not a floating-point type "
                         "(float32, bfloat16 or float16)")
    if embeds.dim() == 3 and embeds.shape[0] == 1:
        embeds = embeds[0]
    if embeds.dim() != 2:
        raise ValueError("prompt_embeds must be of shape (seq_len, hidden_size), got "
                         f"{tuple(embeds.shape)}")
    if embeds.shape[1] != hidden_size:
        raise ValueError(f"prompt_embeds hidden size {embeds.shape[1]} does not match the "
                         f"model's hidden_size {hidden_size}")
    if embeds.untyped_storage().nbytes() < embeds.numel() * embeds.element_size():
        # an expanded (stride 0) or overlapping view: a few bytes that would become many
        raise ValueError("prompt_embeds must hold its values: an expanded or overlapping "
                         "view is not taken (call .contiguous() on it)")
    rows = embeds.detach().to("cpu", torch.float32).contiguous()
    if not bool(torch.isfinite(rows).all()):
        raise ValueError("prompt_embeds contains NaN or infinite values")
    return rows


def decode_embeds(payload: str, hidden_size: int) -> torch.Tensor:
    """One base64 ``torch.save`` payload (the Completions API's ``prompt_embeds``) as
    ``checked_embeds`` rows; ValueError naming the field for what does not decode."""
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise ValueError("prompt_embeds is not valid base64") from None
    # A sparse payload is refused by its layout before any of its values or indices is read
    # (so torch's sparse checks, a process-wide switch, are not needed here).
    try:
        tensor = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 (whatever untrusted bytes make torch.load raise)
        raise ValueError(f"prompt_embeds is not a tensor saved with torch.save ("
                         f"{type(exc).__name__})") from None
    try:
        return checked_embeds(tensor, hidden_size)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 (e.g. a meta tensor: no values to read)
        raise ValueError(f"prompt_embeds could not be read as rows ({type(exc).__name__})") \
            from None


def block_digest(rows: torch.Tensor) -> bytes:
    """A prefix-cache key for a block's embedded rows (float32 bytes: equal rows, equal key)."""
    return hashlib.blake2b(rows.numpy().tobytes(), digest_size=16).digest()


def check_embeds_support(model_cls: type[ModelArchitecture], speculation: Any) -> None:
    """enable_prompt_embeds at start-up: the architecture must take embedded rows
    (``ModelArchitecture.supports_prompt_embeds``); speculative decoding is refused (its
    proposers read the prompt's token ids, which an embedded prompt does not have)."""
    if not model_cls.supports_prompt_embeds:
        raise ValueError(f"enable_prompt_embeds: the model architecture {model_cls.__name__} "
                         "does not take prompt embeddings (supports_prompt_embeds is False)")
    if speculation is not None:
        raise ValueError("enable_prompt_embeds cannot be combined with speculative decoding "
                         "(the proposers read the prompt's token ids)")

