"""vLLM's --prefix-caching-hash-algo: the prefix cache names a block by a cryptographic hash by
default (SHA-256: a crafted prompt cannot collide with another's blocks and be handed their
KV), or by the canonical-CBOR / xxHash variants. Each shares blocks exactly where prefixes
match; a missing package or an unknown name is refused; the real model gives the same tokens
with its prompts served from the cache."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from ironlm import LLM, SamplingParams
from ironlm.config import PREFIX_CACHING_HASH_ALGOS, EngineConfig
from ironlm.engine.block_hash import block_hasher
from ironlm.engine.block_manager import BlockManager
from ironlm.engine.request import Request
from ironlm.entrypoints.openai.cli_args import make_parser


def _req(rid: str, tokens: list[int], salt: str | None = None) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), eos_token_id=None,
                   cache_salt=salt)


@pytest.mark.parametrize("algo", PREFIX_CACHING_HASH_ALGOS)
def test_blocks_are_shared_exactly_where_prefixes_match(algo: str) -> None:
    bm = BlockManager(num_kv_blocks=16, block_size=4, enable_prefix_caching=True,
                      hasher=block_hasher(algo))
    a = _req("a", list(range(13)))  # 3 full blocks
    assert bm.allocate(a, 13)
    same_two = _req("b", [*range(8), 99, 9, 10, 11, 12])  # block 3 differs: 2 shared
    assert bm.find_cached_prefix(same_two) == bm.block_ids("a")[:2]
    first_differs = _req("c", [99, *range(1, 13)])  # the chain breaks at block 1
    assert bm.find_cached_prefix(first_differs) == []
    salted = _req("d", list(range(13)), salt="tenant-1")  # a salt starts its own chain
    assert bm.find_cached_prefix(salted) == []
    hashes = [bm.blocks[i].block_hash for i in bm.block_ids("a")[:3]]
    assert len(set(hashes)) == 3 and all(isinstance(h, bytes) for h in hashes)
    assert len(hashes[0]) == (32 if algo.startswith("sha256") else 16)


def test_sha256_cbor_is_the_same_bytes_everywhere() -> None:
    cbor2 = pytest.importorskip("cbor2")  # tests/requirements.txt installs it
    # block 0 of tokens 0..3: SHA-256 of the canonical CBOR of (b"", [0, 1, 2, 3]), which any
    # CBOR library in any language encodes the same way
    bm = BlockManager(num_kv_blocks=4, block_size=4, enable_prefix_caching=True,
                      hasher=block_hasher("sha256_cbor"))
    req = _req("a", [0, 1, 2, 3, 4])
    assert bm.allocate(req, 5)
    want = hashlib.sha256(bytes.fromhex("82" "40" "84" "00" "01" "02" "03")).digest()
    assert cbor2.dumps((b"", (0, 1, 2, 3)), canonical=True).hex() == "824084" + "00010203"
    assert bm.blocks[bm.block_ids("a")[0]].block_hash == want


def test_pickled_hashes_do_not_depend_on_shared_objects() -> None:
    # pickle's memo would write a string that appears twice as a reference: the same salt
    # from two sources (the literal "root", the same text parsed from JSON) must hash alike
    sha = block_hasher("sha256")
    parsed = "".join(["ro", "ot"])
    assert sha(("root", 0, "root")) == sha(("root", 0, parsed))


def test_a_missing_package_and_an_unknown_algorithm_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "xxhash", None)  # as if not installed
    with pytest.raises(ValueError, match="pip install xxhash"):
        block_hasher("xxhash")
    with pytest.raises(ValueError, match="prefix_caching_hash_algo 'md5' is not one of"):
        EngineConfig(model="m", prefix_caching_hash_algo="md5")
    with pytest.raises(SystemExit):
        make_parser().parse_args(["m", "--prefix-caching-hash-algo", "md5"])
    args = make_parser().parse_args(["m", "--prefix-caching-hash-algo", "xxhash_cbor"])
    assert args.prefix_caching_hash_algo == "xxhash_cbor"
    assert EngineConfig(model="m").prefix_caching_hash_algo == "sha256"  # vLLM's default


@pytest.mark.real_model
def test_real_model_prompts_served_from_an_xxhash_cache(smollm2_dir: Path) -> None:
    # one engine (the suite's process keeps what engines leave on its heap): the prompts
    # computed in full, then again from the cache, give the same greedy tokens
    shared = "You are a helpful assistant who answers briefly and precisely. " * 12
    prompts = [shared + p for p in ("The capital of France is", "def fib(n):", "Hello")]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    llm = LLM(str(smollm2_dir), prefix_caching_hash_algo="xxhash_cbor", dtype="float32",
              max_model_len=512, kv_cache_memory=64 << 20)
    cold = []
    for prompt in prompts:  # each computed in full: the cache emptied before it
        assert llm.reset_prefix_cache()
        cold += [o.outputs[0].token_ids for o in llm.generate([prompt], greedy, use_tqdm=False)]
    assert llm.engine.stats()["prefix_cache_hits"] == 0
    warm = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    assert warm == cold
    assert llm.engine.stats()["prefix_cache_hits"] >= 3 * 16
