"""Prefix-cache block hashes (vLLM's ``--prefix-caching-hash-algo``).

A full block's hash digests (its parent block's hash, its key: the token ids, and a digest of
its embedded rows where the prompt has them); the first block's parent is b"", or the digest of
the request's LoRA adapter and ``cache_salt``. Two blocks with the same hash share KV, so a
collision would hand one request another's KV (a wrong answer, or another tenant's prompt leaking
into it): the hash is cryptographic by default, as vLLM's since 0.10.

- ``sha256`` (default): SHA-256 of the pickled object (pickled without pickle's memo, so equal
  objects give equal bytes whether or not they share parts: deterministic within one Python).
- ``sha256_cbor``: SHA-256 of its canonical CBOR encoding (``cbor2``): the same bytes in
  every process and language.
- ``xxhash`` / ``xxhash_cbor``: xxHash's 128-bit XXH3 instead of SHA-256 (``xxhash``): faster,
  not collision resistant against a crafted prompt (vLLM's warning: only where every tenant
  is trusted).
"""

from __future__ import annotations

import hashlib
import importlib
import io
import pickle
from collections.abc import Callable
from typing import Any

from ironlm.config import PREFIX_CACHING_HASH_ALGOS

# hash of a block's (parent hash, key), or of the root ("root", lora id, cache salt)
BlockHasher = Callable[[Any], bytes]


def block_hasher(algo: str) -> BlockHasher:
    """The hasher of ``algo``; ValueError naming the package to install where the algorithm
    needs one that is missing, or naming the choices for an unknown one."""
    if algo not in PREFIX_CACHING_HASH_ALGOS:
        raise ValueError(f"prefix_caching_hash_algo {algo!r} is not one of "
                         f"{', '.join(PREFIX_CACHING_HASH_ALGOS)}")
    digest_name, _, serializer = algo.partition("_")
    encode = _cbor_encoder(algo) if serializer == "cbor" else _pickled
    if digest_name == "sha256":
        return lambda obj: hashlib.sha256(encode(obj)).digest()
    xxh3_128 = _module("xxhash", algo).xxh3_128_digest
    return lambda obj: xxh3_128(encode(obj))


def _pickled(obj: Any) -> bytes:
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.fast = True  # no memo: a string that appears twice is written twice, not referenced
    pickler.dump(obj)
    return buf.getvalue()


def _cbor_encoder(algo: str) -> Callable[[Any], bytes]:
    dumps = _module("cbor2", algo).dumps
    return lambda obj: dumps(obj, canonical=True)


def _module(name: str, algo: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ValueError(f"--prefix-caching-hash-algo {algo} needs the {name} package: "
                         f"pip install {name} (or 'ironlm[hashes]')") from None
