"""Models named by a Hugging Face Hub repository id, as vLLM takes them:
``ironlm serve Qwen/Qwen3-0.6B``.

The repository's files come through ``huggingface_hub`` into its cache (``--download-dir``
instead of the default one), at ``--revision`` (a branch, tag or commit hash; default the main
branch); with ``HF_HUB_OFFLINE=1`` the cache alone answers and the Hub is never asked; gated or
private repositories take ``--hf-token`` (or ``HF_TOKEN``, or the token of ``hf auth login``). A
GGUF repository is named ``repo_id:QUANT`` (vLLM's form: ``unsloth/Qwen3-0.6B-GGUF:Q4_K_M``),
which stands for its one .gguf file of that quantization type.

Only what a model needs is fetched: configs, tokenizer files, chat templates, code (for
``trust_remote_code``) and one weight format, the first of safetensors, .bin and .pt files the
repository has (vLLM's order; none for ``load_format="dummy"``), never ``original/`` (Meta's
consolidated copies of the same weights).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, constants, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

from ironlm.config import EngineConfig

# "name" or "owner/name", each part as the Hub allows it
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")
# "owner/name:QUANT" (a quantization type, e.g. Q4_K_M or UD-Q4_K_XL)
GGUF_REFERENCE = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*):"
                            r"([A-Za-z0-9_+-]+)")  # fmt: skip
# everything but the weights: configs, tokenizers, chat templates, remote code
META_PATTERNS = ["*.json", "*.jinja", "*.model", "*.tiktoken", "*.txt", "*.py"]
WEIGHT_PATTERNS = {
    "auto": ["*.safetensors", "*.bin", "*.pt"],
    "safetensors": ["*.safetensors"],
    "pt": ["*.bin", "*.pt"],
    "gguf": ["*.gguf"],
    "dummy": [],
}
IGNORE_PATTERNS = ["original/*"]
# a GGUF file split in parts: name-00001-of-00003.gguf
SPLIT_GGUF = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


@dataclass(frozen=True)
class HubOptions:
    """Where and how a repository id is fetched (the engine's revision, download_dir,
    hf_token and load_format)."""

    revision: str | None = None  # branch, tag or commit hash; None: main
    download_dir: str | None = None  # the cache folder; None: huggingface_hub's default
    token: str | None = None  # None: HF_TOKEN or the stored login token
    load_format: str = "auto"  # which weight files are fetched (WEIGHT_PATTERNS)

    @classmethod
    def of(cls, config: EngineConfig) -> HubOptions:
        """The engine's options for its model."""
        return cls(config.revision, config.download_dir, config.hf_token, config.load_format)

    @classmethod
    def cache_of(cls, config: EngineConfig) -> HubOptions:
        """The engine's cache folder and token, for another repository than the model's (a
        draft model, at its main revision)."""
        return cls(download_dir=config.download_dir, token=config.hf_token)


def is_hub_reference(model: str) -> bool:
    """Whether ``model``, named and not found locally, reads as a repository id (or a GGUF
    repository's ``repo_id:QUANT``)."""
    return bool(REPO_ID.fullmatch(model) or GGUF_REFERENCE.fullmatch(model))


def fetch_model(model: str, hub: HubOptions) -> Path:
    """The local snapshot folder of repository ``model`` (or, for ``repo_id:QUANT``, its
    .gguf file), downloaded where the cache lacks it. ValueError naming the repository when
    it cannot be had (unknown, gated, not cached while offline, no such revision)."""
    gguf = GGUF_REFERENCE.fullmatch(model)
    repo_id = gguf.group(1) if gguf else model
    offline = bool(constants.HF_HUB_OFFLINE)
    if gguf:
        quant = gguf.group(2)
        allow = [f"*{quant}*.gguf", f"*{quant.lower()}*.gguf", f"*{quant.upper()}*.gguf"]
    else:
        allow = META_PATTERNS + _weight_patterns(repo_id, hub, offline)
    try:
        folder = Path(snapshot_download(
            repo_id, revision=hub.revision, cache_dir=hub.download_dir, token=hub.token,
            allow_patterns=allow, ignore_patterns=IGNORE_PATTERNS, local_files_only=offline,
        ))  # fmt: skip
    except LocalEntryNotFoundError as exc:
        where = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face Hub cannot be reached"
        raise ValueError(
            f"model {model!r} is not a local path, and {where}: its files at revision "
            f"{hub.revision or 'main'} are not in the cache ({hub.download_dir or 'default'})"
        ) from exc
    except (HfHubHTTPError, OSError) as exc:
        raise ValueError(f"model {model!r} cannot be fetched from the Hugging Face Hub "
                         f"(revision {hub.revision or 'main'}): {exc}") from exc  # fmt: skip
    if gguf:
        return _one_gguf(folder, model, gguf.group(2))
    if not (folder / "config.json").is_file():
        raise ValueError(f"model {model!r}: the repository has no config.json at revision "
                         f"{hub.revision or 'main'} (not a Transformers model)")  # fmt: skip
    return folder


def _weight_patterns(repo_id: str, hub: HubOptions, offline: bool) -> list[str]:
    """The weight files to fetch: those of the first pattern of the load format that the
    repository has (listed on the Hub); offline, all of them (the cache has what it has)."""
    patterns = WEIGHT_PATTERNS.get(hub.load_format, WEIGHT_PATTERNS["auto"])
    if offline or len(patterns) < 2:
        return patterns
    try:
        files = HfApi(token=hub.token).list_repo_files(repo_id, revision=hub.revision)
    except Exception:  # unreachable or refused: snapshot_download says why, or uses the cache
        return patterns
    return first_matching_pattern(files, patterns)


def first_matching_pattern(files: list[str], patterns: list[str]) -> list[str]:
    """[the first of ``patterns`` some file outside original/ matches] (vLLM's choice of one
    weight format), or all of them when none matches."""
    files = [f for f in files if not f.startswith("original/")]
    for pattern in patterns:
        if fnmatch.filter(files, pattern):
            return [pattern]
    return patterns


def _one_gguf(folder: Path, model: str, quant: str) -> Path:
    """The snapshot's one .gguf file of quantization ``quant`` (names compared without case)."""
    want = quant.lower()
    files = sorted(f for f in folder.rglob("*.gguf") if want in f.name.lower())
    if any(SPLIT_GGUF.search(f.name) for f in files):
        raise ValueError(f"model {model!r}: the {quant} GGUF is split in parts "
                         f"({', '.join(f.name for f in files)}); give one merged .gguf file")
    if len(files) != 1:
        found = ", ".join(f.name for f in files) or "none"
        raise ValueError(f"model {model!r}: expected one .gguf file of type {quant} in the "
                         f"repository, found {found}")  # fmt: skip
    return files[0]
