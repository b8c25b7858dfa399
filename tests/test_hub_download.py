"""Hub repository ids fetched over HTTP by the real ``huggingface_hub``, from a loopback
stand-in for the Hub (tests/fake_hub.py; this machine has no route to the real one): only
the files the loader reads are downloaded (an index's shards, not consolidated, original/ or
.bin copies; the one GGUF file of the asked type), refusals come before any download, the
engine pins its workers to the commit, and a later offline run finds the cache complete."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_hub import FakeHub, commit_hash

pytestmark = [pytest.mark.real_model]

REPO = "someone/tiny-llama"
GGUF_REPO = "someone/SmolLM2-GGUF"


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> dict:
    """A sharded tiny Llama (index + shards) beside decoy copies the loader does not read,
    and a GGUF repository holding SmolLM2's Q4_1 file beside decoys of other types."""
    from transformers import LlamaForCausalLM

    from ironlm.model_loader.downloads import ensure_test_gguf

    sharded = tmp_path_factory.mktemp("sharded")
    LlamaForCausalLM.from_pretrained(tiny_llama_dir).save_pretrained(sharded, max_shard_size="5MB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llama_dir / name, sharded / name)
    files: dict[str, Path | bytes] = {f.name: f for f in sharded.iterdir()}
    assert len([n for n in files if n.endswith(".safetensors")]) > 1
    decoys: dict[str, Path | bytes] = {"consolidated.safetensors": b"not read",
                                       "original/model.safetensors": b"not read",
                                       "pytorch_model.bin": b"not read", "README.md": b"# tiny",
                                       "sub/extra.json": b"{}"}
    gguf = ensure_test_gguf("smollm2")
    return {
        REPO: {"main": {**files, **decoys}},
        "someone/forbidden": 403, "someone/down": 503,
        GGUF_REPO: {"main": {"SmolLM2-Q4_1.gguf": gguf, "SmolLM2-BF16.gguf": b"not read",
                             "SmolLM2-Q4_1-draft.txt": b"x",
                             "Q8_0/SmolLM2-Q8_0-00001-of-00002.gguf": b"not read",
                             "Q8_0/SmolLM2-Q8_0-00002-of-00002.gguf": b"not read"}},
    }  # fmt: skip


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300, check=False)  # fmt: skip


def hub_env(hub_url: str | None, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HOME"] = str(home)  # no stored login token
    if hub_url is None:
        return {**env, "HF_HUB_OFFLINE": "1"}
    return {**env, "HF_ENDPOINT": hub_url}


FETCH = """
from ironlm import LLM, SamplingParams
from ironlm.model_loader import HubOptions, resolve_model
cache = {cache!r}
print("gguf", resolve_model({gguf!r}, hub=HubOptions(download_dir=cache)).gguf_file.name)
llm = LLM({repo!r}, download_dir=cache, max_model_len=128, kv_cache_memory=16 << 20)
out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                   use_tqdm=False)[0].outputs[0]
print("tokens", out.token_ids)
print("pinned", llm.engine.config.revision)
"""


def test_fetch_over_http_then_offline(repos: dict, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    code = FETCH.format(cache=str(cache), gguf=GGUF_REPO + ":q4_1", repo=REPO)
    with FakeHub(repos) as hub:
        done = run_python(code, hub_env(hub.url, tmp_path / "home"))
        assert done.returncode == 0, done.stderr[-3000:]
        downloaded = sorted(set(hub.downloads))
    index = json.loads(Path(repos[REPO]["main"]["model.safetensors.index.json"]).read_text())
    shards = sorted(set(index["weight_map"].values()))
    want_weights = ["model.safetensors.index.json", *shards]
    meta = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    assert downloaded == sorted([f"{GGUF_REPO}/SmolLM2-Q4_1.gguf"]
                                + [f"{REPO}/{name}" for name in want_weights + meta])
    online = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert online["gguf"] == "SmolLM2-Q4_1.gguf"
    assert online["pinned"] == commit_hash(REPO, "main")  # workers loaded the resolved commit
    # offline afterwards: the cache recorded main and holds everything the model needs
    done = run_python(code, hub_env(None, tmp_path / "home"))
    assert done.returncode == 0, done.stderr[-3000:]
    offline = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert offline == online


@pytest.mark.parametrize("model,extra,message", [
    ("someone/absent", "", "RepositoryNotFoundError"),
    (REPO, ", revision='v9'", "revision v9"),
    (GGUF_REPO + ":Q8_0", "", "split in parts"),
    (GGUF_REPO + ":F16", "", "found none"),  # BF16 is another type
    (REPO + ":Q4_1", "", "found none"),
    ("someone/forbidden", "", "refused it"),  # the Hub's answer, not a reason to use the cache
    ("someone/down", "", "503 Service Unavailable"),  # 5xx: the cache, which lacks it
])  # fmt: skip
def test_refusals_come_before_downloads(repos: dict, tmp_path: Path, model: str, extra: str,
                                        message: str) -> None:  # fmt: skip
    code = f"""
from ironlm.model_loader import HubOptions, resolve_model
resolve_model({model!r}, hub=HubOptions(download_dir={str(tmp_path)!r}{extra}))
"""
    with FakeHub(repos) as hub:
        done = run_python(code, hub_env(hub.url, tmp_path / "home"))
        assert hub.downloads == []
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError") and model in last and message in last, last
