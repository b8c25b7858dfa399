"""Models named by a Hugging Face Hub repository id (vLLM's ``vllm serve org/name``), read
through the real ``huggingface_hub`` from a hub cache laid out as it lays one out
(models--org--name/refs, snapshots): ``--download-dir``, ``--revision`` (branch, tag, commit),
``repo_id:QUANT`` for a GGUF repository, and the errors. The machine has no route to the Hub,
so the processes run with HF_HUB_OFFLINE=1 (the cache alone answers), except one that finds
the Hub unreachable and falls back to the cache."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from server_utils import RemoteServer, free_port, run_serve_cli

from ironlm.model_loader.hub import gguf_file, is_hub_reference, weight_files

pytestmark = [pytest.mark.real_model]

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_REPO = "someone/SmolLM2-135M-Instruct-GGUF"
BROKEN_REPO = "someone/missing-shard"
V1_TEMPLATE = "{% for m in messages %}v1 says: {{ m['content'] }}\n{% endfor %}"


def commit_of(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


def add_snapshot(cache: Path, repo_id: str, refs: list[str], files: dict[str, Path | str]) -> str:
    """One snapshot of ``repo_id`` in the hub cache ``cache`` (files as links to ``Path``s or
    written from ``str``s), named by ``refs`` (branches / tags); returns its commit hash."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = commit_of(repo_id + ",".join(refs))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, content in files.items():
        if isinstance(content, Path):  # as huggingface_hub: snapshot -> blobs/<hash> (no suffix)
            blob = repo / "blobs" / commit_of(str(content) + commit)
            blob.parent.mkdir(exist_ok=True)
            try:  # a blob is a file of its own (no .gguf suffix to follow a link to)
                os.link(content, blob)
            except OSError:
                shutil.copyfile(content, blob)
            (snapshot / name).symlink_to(Path("../../blobs") / blob.name)
        else:
            (snapshot / name).write_text(content)
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return commit


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> tuple[Path, str]:
    """main: SmolLM2 as it is; tag v1: the same weights with another chat template; a GGUF
    repository holding SmolLM2's Q4_1 file. Returns (cache folder, v1's commit)."""
    from ironlm.model_loader.downloads import ensure_test_gguf

    cache = tmp_path_factory.mktemp("hub-cache")
    files: dict[str, Path | str] = {f.name: f for f in smollm2_dir.iterdir()}
    add_snapshot(cache, REPO, ["main"], files)
    v1 = dict(files, **{"chat_template.jinja": V1_TEMPLATE})
    commit = add_snapshot(cache, REPO, ["v1"], v1)
    gguf = ensure_test_gguf("smollm2")
    add_snapshot(cache, GGUF_REPO, ["main"], {gguf.name: gguf, "README.md": "a GGUF repo"})
    # a snapshot whose index names a shard the cache lacks
    index = {"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    add_snapshot(cache, BROKEN_REPO, ["main"], {"config.json": smollm2_dir / "config.json",
                                                "model.safetensors.index.json": json.dumps(index)})
    return cache, commit


def offline_env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**env, "HF_HUB_OFFLINE": "1", **more}


def run_python(code: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_reference_shapes() -> None:
    assert is_hub_reference("Qwen/Qwen3-0.6B") and is_hub_reference("gpt2")
    assert is_hub_reference("unsloth/Qwen3-0.6B-GGUF:Q4_K_M")
    assert not is_hub_reference("/models/model") and not is_hub_reference("./model")
    assert not is_hub_reference("a/b/c") and not is_hub_reference("model.gguf:Q4_0")


def test_weight_files_follow_the_loader() -> None:
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}}  # fmt: skip
    asked: list[str] = []

    def read(name: str) -> dict:
        asked.append(name)
        return index

    sharded = ["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
               "model-00002-of-00002.safetensors", "consolidated.safetensors",
               "original/consolidated.00.pth", "pytorch_model.bin"]  # fmt: skip
    # the index's shards only: not Mistral's consolidated copy, not the .bin copy
    assert weight_files(sharded, "auto", read) == [
        "model.safetensors.index.json", *sorted(set(index["weight_map"].values()))]
    assert asked == ["model.safetensors.index.json"]
    # the single file wins over other top-level copies; nested folders never count
    single = ["model.safetensors", "consolidated.safetensors", "onnx/model.safetensors"]
    assert weight_files(single, "auto", read) == ["model.safetensors"]
    assert weight_files(["a.safetensors", "sub/b.safetensors"], "auto", read) == [
        "a.safetensors"]
    # the first format the repository has at its top level; load_format narrows the choice
    assert weight_files(["original/model.safetensors", "pytorch_model.bin"], "auto",
                        read) == ["pytorch_model.bin"]  # fmt: skip
    assert weight_files(["model.safetensors", "pytorch_model.bin"], "pt", read) == [
        "pytorch_model.bin"]
    assert weight_files(["weights.pt"], "auto", read) == ["weights.pt"]
    # training state is no weight; a consolidated copy only where nothing else is
    assert weight_files(["training_args.bin", "a.bin"], "auto", read) == ["a.bin"]
    assert weight_files(["consolidated.safetensors", "x.safetensors"], "auto", read) == [
        "x.safetensors"]
    assert weight_files(["consolidated.safetensors"], "auto", read) == [
        "consolidated.safetensors"]
    assert weight_files(["model.safetensors"], "dummy", read) == []
    assert weight_files(["config.json"], "auto", read) == []
    # an index that names no shards is an error naming it, not a KeyError
    for broken in ({}, {"weight_map": {}}, {"weight_map": ["x"]}, []):
        with pytest.raises(ValueError, match="model.safetensors.index.json names no shards"):
            weight_files(sharded, "auto", lambda name, b=broken: b)


def test_gguf_file_matches_the_whole_quantization_name() -> None:
    files = ["README.md", "m-BF16.gguf", "m-F16.gguf", "m-Q4_K_M.gguf", "m-Q4_K_S.gguf",
             "m.q8_0.gguf", "Q2_K/m-Q2_K-00001-of-00002.gguf",
             "Q2_K/m-Q2_K-00002-of-00002.gguf"]  # fmt: skip
    assert gguf_file(files, "r", "F16") == "m-F16.gguf"  # not m-BF16.gguf
    assert gguf_file(files, "r", "bf16") == "m-BF16.gguf"
    assert gguf_file(files, "r", "Q8_0") == "m.q8_0.gguf"
    assert gguf_file(files, "r", "q4_k_m") == "m-Q4_K_M.gguf"
    with pytest.raises(ValueError, match="found none"):
        gguf_file(files, "r", "Q4_K")  # Q4_K_M and Q4_K_S are other types
    with pytest.raises(ValueError, match="split in parts"):
        gguf_file(files, "r", "Q2_K")
    with pytest.raises(ValueError, match="found m-Q4_K_M.gguf, m2-Q4_K_M.gguf"):
        gguf_file(["m-Q4_K_M.gguf", "m2-Q4_K_M.gguf"], "r", "Q4_K_M")


@pytest.fixture(scope="module")
def server(hub_cache: tuple[Path, str]) -> Iterator[RemoteServer]:
    cache, _ = hub_cache
    args = ["--download-dir", str(cache), "--revision", "v1", "--max-model-len", "512",
            "--dtype", "float32", "--kv-cache-memory", "64MiB"]  # fmt: skip
    with RemoteServer(REPO, args, env=offline_env()) as srv:
        yield srv


def test_server_serves_a_repository_id_at_a_revision(server: RemoteServer,
                                                    smollm2_dir: Path) -> None:
    from ironlm import LLM, SamplingParams

    models = httpx.get(server.url("/v1/models"), timeout=10).json()
    assert [m["id"] for m in models["data"]] == [REPO]  # served as named, like vLLM
    chat = [{"role": "user", "content": "Name one colour."}]
    tokens = httpx.post(server.url("/tokenize"), json={"model": REPO, "messages": chat},
                        timeout=30).json()["tokens"]  # fmt: skip
    client = server.openai_client(timeout=60)
    assert client.completions.create(model=REPO, prompt=tokens, max_tokens=1).choices
    # the v1 tag's chat template rendered the prompt
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(smollm2_dir).decode(tokens)
    assert text.startswith("v1 says: Name one colour.")
    # the weights are SmolLM2's: greedy text equal to the local folder's
    got = client.completions.create(model=REPO, prompt="The capital of France is",
                                    max_tokens=12, temperature=0).choices[0].text  # fmt: skip
    llm = LLM(str(smollm2_dir), dtype="float32", max_model_len=512, kv_cache_memory=64 << 20)
    want = llm.generate(["The capital of France is"], SamplingParams(max_tokens=12, temperature=0),
                        use_tqdm=False)[0].outputs[0].text  # fmt: skip
    assert got == want


def test_offline_llm_by_commit_and_gguf_reference(hub_cache: tuple[Path, str]) -> None:
    cache, commit = hub_cache
    code = f"""
from ironlm import LLM, SamplingParams
from ironlm.model_loader import HubOptions, resolve_model
cache = {str(cache)!r}
source = resolve_model({REPO!r}, hub=HubOptions(revision="v1", download_dir=cache))
print("commit", source.path.name, source.revision)
gguf = resolve_model({GGUF_REPO + ":q4_1"!r}, hub=HubOptions(download_dir=cache))
print("gguf", gguf.gguf_file.name)
llm = LLM({GGUF_REPO + ":Q4_1"!r}, download_dir=cache, max_model_len=256,
          kv_cache_memory=32 << 20)
out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0),
                   use_tqdm=False)[0].outputs[0]
print("text", len(out.token_ids), repr(out.text))
print("pinned", llm.engine.config.revision, llm.engine.config.tokenizer_revision)
"""
    lines = dict(line.split(" ", 1) for line in run_python(code, offline_env()).splitlines()
                 if line.split(" ", 1)[0] in ("commit", "gguf", "text", "pinned"))  # fmt: skip
    assert lines["commit"] == f"{commit} {commit}"  # the tag's snapshot, not main's
    # the workers load the commit the engine resolved main to; the tokenizer keeps "main"
    assert lines["pinned"] == f"{commit_of(GGUF_REPO + 'main')} None"
    assert lines["gguf"].endswith("Q4_1.gguf")
    assert lines["text"].startswith("8 ")


def test_unreachable_hub_falls_back_to_the_cache(hub_cache: tuple[Path, str]) -> None:
    # not offline: the Hub is asked first (a closed loopback port here), then the cache
    cache, _ = hub_cache
    env = offline_env(HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    env.pop("HF_HUB_OFFLINE")
    code = f"""
from ironlm.model_loader import HubOptions, resolve_model
print(resolve_model({REPO!r}, hub=HubOptions(download_dir={str(cache)!r})).path.name)
"""
    assert run_python(code, env).split()[-1] == commit_of(REPO + "main")


@pytest.mark.parametrize("model,extra,message", [
    ("HuggingFaceTB/not-cached", [], "not in the cache"),
    (REPO, ["--revision", "v9"], "revision v9"),
    (GGUF_REPO + ":Q8_0", [], "found none"),
    (REPO, ["--load-format", "gguf"], "repo_id:QUANT"),
    (BROKEN_REPO, [], "lacks model-00001-of-00002.safetensors"),
])  # fmt: skip
def test_errors_name_the_repository(hub_cache: tuple[Path, str], model: str, extra: list[str],
                                    message: str) -> None:
    cache, _ = hub_cache
    done = run_serve_cli([model, "--download-dir", str(cache), *extra], env=offline_env())
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert model.split(":")[0] in out and message in out, out[-2000:]
    assert "Traceback" not in out


def test_tokenizer_from_a_repository_id(hub_cache: tuple[Path, str], smollm2_dir: Path) -> None:
    # --tokenizer names a repository (tag v1) while the model is a local folder
    cache, _ = hub_cache
    code = f"""
from ironlm import LLM
llm = LLM({str(smollm2_dir)!r}, tokenizer={REPO!r}, tokenizer_revision="v1",
          download_dir={str(cache)!r}, max_model_len=256, kv_cache_memory=32 << 20)
print(json.dumps(llm.get_tokenizer().chat_template))
"""
    out = run_python("import json\n" + code, offline_env())
    assert json.loads(out.splitlines()[-1]) == V1_TEMPLATE


def test_bench_reads_a_repository_id(hub_cache: tuple[Path, str], tmp_path: Path) -> None:
    # ironlm bench fetches the repository once with the Hub flags, then runs on the snapshot
    cache, commit = hub_cache
    code = f"""
from ironlm.cli import main
print("rc", main(["bench", "latency", "--model", {REPO!r}, "--download-dir", {str(cache)!r},
                  "--revision", "v1", "--batch-size", "1", "--input-len", "8",
                  "--output-len", "2", "--num-iters", "1", "--num-iters-warmup", "0",
                  "--skip-machine-limits", "--result-dir", {str(tmp_path)!r},
                  "--max-model-len", "256", "--kv-cache-memory", "64MiB"]))
"""
    assert "rc 0" in run_python(code, offline_env())
    (result,) = tmp_path.rglob("*.json")
    assert Path(json.loads(result.read_text())["args"]["model"]).name == commit
