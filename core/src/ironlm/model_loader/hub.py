"""Models named by a Hugging Face Hub repository id, as vLLM takes them:
``ironlm serve Qwen/Qwen3-0.6B``.

The repository's files come through ``huggingface_hub`` into its cache (``--download-dir``
instead of the default one), at ``--revision`` (a branch, tag or commit hash; default the main
branch); with ``HF_HUB_OFFLINE=1``, or when the Hub cannot be reached, the cache alone answers.
Gated or private repositories take ``--hf-token`` (or ``HF_TOKEN``, or the token of ``hf auth
login``). A GGUF repository is named ``repo_id:QUANT`` (vLLM's form:
``unsloth/Qwen3-0.6B-GGUF:Q4_K_M``), which stands for its one .gguf file of that quantization
type.

Only what a model needs is fetched, from the repository's top level: configs, tokenizer
files, chat templates, code (for ``trust_remote_code``) and the checkpoint files the loader
reads (model_loader/loader.py) of one weight format, the first of safetensors, .bin and .pt
the repository has (vLLM's order; none for ``load_format="dummy"``): an index's shards, else
the single-file checkpoint, else every file of that format (Mistral's consolidated copy only
where nothing else is; never training state such as training_args.bin). The branch or tag is
resolved to a commit once, the listing and every download use it, and the engine pins its
workers to it (ModelSource.revision): a branch that moves meanwhile does not mix versions.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from huggingface_hub import (
    HfApi,
    ResolvedRevision,
    constants,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub.errors import (
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from ironlm.config import EngineConfig

# "name" or "owner/name", each part as the Hub allows it
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")
# "owner/name:QUANT" (a quantization type, e.g. Q4_K_M or UD-Q4_K_XL)
GGUF_REFERENCE = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*):"
                            r"([A-Za-z0-9_+-]+)")  # fmt: skip
# everything but the weights: configs, tokenizers, chat templates, remote code
META_PATTERNS = ["*.json", "*.jinja", "*.model", "*.tiktoken", "*.txt", "*.py"]
# files of a weight format's suffix that hold no model weights (vLLM leaves them out too)
NOT_WEIGHTS = frozenset({"training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt",
                         "scaler.pt"})
# a GGUF file split in parts: name-00001-of-00003.gguf
SPLIT_GGUF = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class CheckpointLayout:
    """How one weight format is laid out, in the loader's order: an index naming the shards,
    else one file, else every top-level file matching ``suffix``."""

    index: str | None
    single: str | None
    suffix: str


SAFETENSORS = CheckpointLayout("model.safetensors.index.json", "model.safetensors", ".safetensors")
BIN = CheckpointLayout("pytorch_model.bin.index.json", "pytorch_model.bin", ".bin")
PT = CheckpointLayout(None, None, ".pt")
# the formats each load format takes, first preferred (vLLM's order)
LOAD_FORMAT_LAYOUTS: dict[str, list[CheckpointLayout]] = {
    "auto": [SAFETENSORS, BIN, PT],
    "safetensors": [SAFETENSORS],
    "pt": [BIN, PT],
    "dummy": [],
}


@dataclass(frozen=True)
class HubOptions:
    """Where and how a repository id is fetched (the engine's revision, download_dir,
    hf_token and load_format)."""

    revision: str | None = None  # branch, tag or commit hash; None: main
    download_dir: str | None = None  # the cache folder; None: huggingface_hub's default
    token: str | None = field(default=None, repr=False)  # None: HF_TOKEN or the login token
    load_format: str = "auto"  # which weight files are fetched (LOAD_FORMAT_LAYOUTS)

    @property
    def revision_name(self) -> str:
        """The revision as messages name it (None is the main branch)."""
        return self.revision or "main"

    @classmethod
    def of(cls, config: EngineConfig) -> HubOptions:
        """The engine's options for its model."""
        return cls(config.revision, config.download_dir, config.hf_token, config.load_format)

    @classmethod
    def cache_of(cls, config: EngineConfig) -> HubOptions:
        """The engine's cache folder and token, for another repository than the model's (a
        draft model, at its main revision)."""
        return cls(download_dir=config.download_dir, token=config.hf_token)


@dataclass(frozen=True)
class Fetched:
    """A fetched model: its snapshot folder (or, for ``repo_id:QUANT``, its .gguf file) and
    the commit it is at."""

    path: Path
    commit: str


def is_hub_reference(model: str) -> bool:
    """Whether ``model``, named and not found locally, reads as a repository id (or a GGUF
    repository's ``repo_id:QUANT``)."""
    return bool(REPO_ID.fullmatch(model) or GGUF_REFERENCE.fullmatch(model))


def fetch_model(model: str, hub: HubOptions) -> Fetched:
    """Repository ``model`` (or, for ``repo_id:QUANT``, its .gguf file) in the local cache,
    downloaded where the cache lacks it. ValueError naming the repository when it cannot be
    had (unknown, gated, no such revision or file, not cached while offline)."""
    gguf = GGUF_REFERENCE.fullmatch(model)
    repo_id = gguf.group(1) if gguf else model
    if hub.load_format == "gguf" and not gguf:
        raise ValueError(f"model {model!r}: load_format 'gguf' takes a GGUF repository as "
                         f"repo_id:QUANT (e.g. {model}:Q4_K_M), or a local .gguf file")  # fmt: skip
    unreachable: Exception | None = None
    if not constants.HF_HUB_OFFLINE:
        api = HfApi(token=hub.token)
        try:
            # the branch or tag resolved once: the listing and every download use its commit
            # (and the cache records the name for later offline runs)
            resolved = api.resolve_revision(repo_id, revision=hub.revision,
                                            cache_dir=hub.download_dir)  # fmt: skip
            info = api.model_info(repo_id, revision=resolved.resolved)
        except (RepositoryNotFoundError, RevisionNotFoundError) as exc:  # and gated ones
            raise ValueError(f"model {model!r} cannot be fetched from the Hugging Face Hub "
                             f"(revision {hub.revision_name}): {_reason(exc)}") from exc
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else None
            if status is not None and 400 <= status < 500 and status != 429:
                # the Hub's answer (a refused token, no permission, a disabled repository)
                raise ValueError(f"model {model!r}: the Hugging Face Hub refused it (revision "
                                 f"{hub.revision_name}): {_reason(exc)}") from exc
            unreachable = exc  # the Hub failing (5xx, rate limit): the cache answers, below
        except Exception as exc:  # noqa: BLE001 the transport's errors, whose classes are
            unreachable = exc  # huggingface_hub's HTTP library's: the cache answers, below
        else:
            files = [s.rfilename for s in info.siblings or []]
            return _fetch_online(model, repo_id, hub, resolved, files, gguf)
    return _from_cache(model, repo_id, hub, gguf, unreachable)


def _fetch_online(model: str, repo_id: str, hub: HubOptions, resolved: ResolvedRevision,
                  files: list[str], gguf: re.Match[str] | None) -> Fetched:  # fmt: skip
    """Download what ``files`` (the repository's listing at ``resolved``) says the model
    needs, at that commit; refusals come before any download."""
    where = f"revision {hub.revision_name} (commit {resolved.resolved})"

    def download(name: str) -> Path:
        try:
            return Path(hf_hub_download(repo_id, name, revision=resolved,
                                        cache_dir=hub.download_dir, token=hub.token))
        except Exception as exc:  # HTTP, transport or disk: say which file
            raise ValueError(f"model {model!r}: {name} at {where} cannot be downloaded: "
                             f"{_reason(exc)}") from exc  # fmt: skip

    if gguf:
        return Fetched(download(gguf_file(files, model, gguf.group(2))), resolved.resolved)
    if "config.json" not in files:
        raise ValueError(f"model {model!r}: the repository has no config.json at {where} "
                         "(not a Transformers model)")  # fmt: skip
    weights = weight_files(files, hub.load_format, lambda name: json.loads(
        download(name).read_text()))  # fmt: skip
    # exact names: the top-level configs, tokenizer files and code, and the weights
    meta = [name for name in files if "/" not in name
            and any(fnmatch.fnmatch(name, pattern) for pattern in META_PATTERNS)]  # fmt: skip
    try:
        folder = Path(snapshot_download(
            repo_id, revision=resolved, cache_dir=hub.download_dir, token=hub.token,
            allow_patterns=meta + weights,
        ))  # fmt: skip
    except Exception as exc:  # HTTP, transport or disk: say what failed
        raise ValueError(f"model {model!r} cannot be fetched at {where}: "
                         f"{_reason(exc)}") from exc  # fmt: skip
    return Fetched(folder, resolved.resolved)


def _reason(exc: Exception) -> str:
    """``exc`` on one line, its class first (huggingface_hub's messages span lines)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _from_cache(model: str, repo_id: str, hub: HubOptions, gguf: re.Match[str] | None,
                unreachable: Exception | None) -> Fetched:  # fmt: skip
    """The cached snapshot at the revision, checked for what the model needs (a snapshot the
    cache knows to be incomplete still serves when the missing files are not those)."""
    why = (f"the Hugging Face Hub cannot be reached ({_reason(unreachable)})"
           if unreachable is not None else "HF_HUB_OFFLINE is set")  # fmt: skip
    try:
        folder = Path(snapshot_download(
            repo_id, revision=hub.revision, cache_dir=hub.download_dir, allow_patterns=[],
            local_files_only=True,
        ))  # fmt: skip
    except LocalEntryNotFoundError as exc:
        raise ValueError(
            f"model {model!r} is not a local path, and {why}: it is not in the cache "
            f"({hub.download_dir or 'default'}) at revision {hub.revision_name}"
        ) from exc
    files = [str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file()]
    if gguf:
        return Fetched(folder / gguf_file(files, model, gguf.group(2)), folder.name)
    if "config.json" not in files:
        raise ValueError(f"model {model!r}: the cached snapshot at revision "
                         f"{hub.revision_name} has no config.json ({why})")  # fmt: skip
    weights = weight_files(files, hub.load_format,
                           lambda name: json.loads((folder / name).read_text()))  # fmt: skip
    missing = [name for name in weights if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"model {model!r}: the cached snapshot lacks {', '.join(missing[:3])}"
                         f"{' ...' if len(missing) > 3 else ''} ({why})")  # fmt: skip
    return Fetched(folder, folder.name)


def weight_files(files: list[str], load_format: str,
                 read_index: Callable[[str], dict]) -> list[str]:  # fmt: skip
    """The checkpoint files the loader reads, of the first layout of ``load_format`` that
    ``files`` (a repository listing) has: the shards an index names (``read_index`` reads
    it), else the single file, else every top-level file of its suffix; [] when none (the
    loader then says the folder holds no weights). The index itself comes along."""
    top = [name for name in files if "/" not in name]
    for layout in LOAD_FORMAT_LAYOUTS.get(load_format, LOAD_FORMAT_LAYOUTS["auto"]):
        if layout.index is not None and layout.index in top:
            index = read_index(layout.index)
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{layout.index} names no shards (its \"weight_map\" is "
                                 "missing or empty): the checkpoint cannot be fetched")
            return [layout.index, *sorted(set(weight_map.values()))]
        if layout.single is not None and layout.single in top:
            return [layout.single]
        matches = sorted(name for name in top
                         if name.endswith(layout.suffix) and name not in NOT_WEIGHTS)
        # Mistral's consolidated copy of the same weights, only where nothing else is
        plain = [name for name in matches if not name.startswith("consolidated")]
        if matches:
            return plain or matches
    return []


def gguf_file(files: list[str], model: str, quant: str) -> str:
    """The one .gguf file of ``files`` whose name carries quantization type ``quant`` as a
    whole part (``-Q4_K_M.gguf``, ``.q4_k_m.gguf``; F16 is not BF16, Q4_K is not Q4_K_M);
    ValueError when it is split in parts, missing or ambiguous."""
    part = re.compile(rf"(?:^|[-_.]){re.escape(quant)}(?:[-.]|$)", re.IGNORECASE)
    found = sorted(name for name in files if name.lower().endswith(".gguf")
                   and part.search(Path(name).name[: -len(".gguf")]))  # fmt: skip
    if any(SPLIT_GGUF.search(name) for name in found):
        raise ValueError(f"model {model!r}: the {quant} GGUF is split in parts "
                         f"({', '.join(found)}); give one merged .gguf file")  # fmt: skip
    if len(found) != 1:
        raise ValueError(f"model {model!r}: expected one .gguf file of type {quant} in the "
                         f"repository, found {', '.join(found) or 'none'}")  # fmt: skip
    return found[0]
