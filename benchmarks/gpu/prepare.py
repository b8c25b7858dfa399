"""Prepare what a GPU lease needs (run here, in the repository root, before the device call).

The lent machine has torch, triton and transformers but no network: everything else travels
as wheels (``.whl/``) and small inputs (``.gpu/``), both ignored by git (.git/info/exclude):
  .whl/   ironlm, ironlm-cuda, ironlm-cpu, ironlm-bench + the server and client packages the
          image lacks
  .gpu/   tiny/      a seeded 2-layer Llama with SmolLM2's tokenizer (real weights, 29 MB)
          llama1b/   Llama-3.2-1B-shaped config + tokenizer (for --load-format dummy)
          llama8b/   Llama-3-8B-shaped config + tokenizer (for --load-format dummy)
          cache/models/smollm2/   SmolLM2's config + tokenizer only: the tests' ``tiny_llama_dir``
                                  fixture reads its tokenizer (IRONLM_CACHE_DIR=.gpu/cache)

    python benchmarks/gpu/prepare.py        # then: device run, carry [".whl", ".gpu"]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from ironlm.model_loader.downloads import ensure_test_model

# the device image's Python is 3.12; versions as in this project's CI venv
SERVER_WHEELS = ["pydantic==2.14.4", "pydantic_core==2.50.5", "annotated-types==0.8.0",
                 "typing-inspection==0.4.5", "fastapi==0.165.0", "starlette==1.10.0",
                 "uvicorn==0.54.0", "gguf==0.19.0", "opentelemetry-api==1.45.2",
                 # the official client of tests/test_cuda_server.py
                 "openai==3.57.0", "httpx2==2.16.2", "httpcore2==2.16.2", "truststore==0.10.5",
                 "jiter==0.19.0", "sniffio==1.3.1", "anyio==4.16.0",
                 "typing_extensions==4.16.0"]  # fmt: skip
LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                tie_word_embeddings=True)  # fmt: skip
LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                tie_word_embeddings=False)  # fmt: skip


def main() -> None:
    root = Path.cwd()
    gpu, whl = root / ".gpu", root / ".whl"
    smollm2 = ensure_test_model("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    torch.manual_seed(0)
    tiny = LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       tie_word_embeddings=True, eos_token_id=2, bos_token_id=1,
                       initializer_range=0.2)  # fmt: skip
    LlamaForCausalLM(tiny).save_pretrained(gpu / "tiny")
    tokenizer.save_pretrained(gpu / "tiny")
    for name, shape in (("llama1b", LLAMA_1B), ("llama8b", LLAMA_8B)):
        config = LlamaConfig(**shape, max_position_embeddings=131072, rope_theta=500000.0,
                             rms_norm_eps=1e-5, eos_token_id=2, bos_token_id=1)  # fmt: skip
        config.architectures = ["LlamaForCausalLM"]
        config.save_pretrained(gpu / name)
        tokenizer.save_pretrained(gpu / name)
    cached = gpu / "cache" / "models" / "smollm2"
    cached.mkdir(parents=True, exist_ok=True)
    for f in smollm2.iterdir():
        if f.suffix in (".json", ".jinja"):
            shutil.copy(f, cached / f.name)
    whl.mkdir(exist_ok=True)
    exclude = root / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    listed = exclude.read_text().split() if exclude.exists() else []
    with exclude.open("a") as out:  # both travel only through the device call's ``carry``
        out.writelines(f"{p}\n" for p in ("/.gpu/", "/.whl/") if p not in listed)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(whl),
                    "./core", "./plugins/cuda", "./plugins/cpu", "./benchmarks"], check=True)
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", "--platform", "manylinux_2_17_x86_64",
                    "--platform", "manylinux2014_x86_64", "-d", str(whl), *SERVER_WHEELS],
                   check=True)  # fmt: skip
    print(f"ready: {gpu} and {whl}")


if __name__ == "__main__":
    main()
