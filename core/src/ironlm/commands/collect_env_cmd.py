"""``ironlm collect-env``: the facts a bug report or a benchmark figure needs (vLLM's
``vllm collect-env``): the OS and Python, the CPU (model, family, cores, the vector
instruction flags IronLM's kernels care about), torch's build and devices, the versions of the
libraries IronLM runs on, each device platform's own description (its ISA target, kernel
choices, devices), and the environment variables that change IronLM's behaviour, secrets
masked (a variable whose name says key, token, secret, password, auth, credential, cookie or
access; a user and password inside a URL). ``--json`` prints the same as one JSON object."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# The libraries whose versions change what IronLM does (absent ones print "not installed").
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "gguf", "huggingface_hub",
             "numpy", "fastapi", "uvicorn", "pydantic", "httpx", "prometheus_client", "ray",
             "peft", "xgrammar", "outlines", "lm-format-enforcer", "triton", "torch_npu",
             "openai")
# /proc/cpuinfo flags of the instruction sets the kernels are built for
CPU_FLAGS = re.compile(r"^(avx|avx2|fma|f16c|avx512\w*|avx_vnni\w*|amx\w*)$")
# environment variables shown: IronLM's and vLLM's own, and those of the libraries under them
ENV_PREFIXES = ("IRONLM_", "VLLM_", "OMP_", "MKL_", "KMP_", "CUDA_", "NCCL_", "ASCEND_", "HF_",
                "TRANSFORMERS_", "TORCH_", "TRITON_", "RAY_")
SECRET = re.compile(r"TOKEN|KEY|SECRET|PASS|AUTH|CRED|COOKIE|ACCESS", re.IGNORECASE)
URL_LOGIN = re.compile(r"(?<=://)[^/@\s]+@")  # user:password@ in a URL


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("collect-env", help="print the environment for a bug report or a "
                       "benchmark (vLLM's collect-env)")
    p.add_argument("--json", action="store_true", help="print it as one JSON object")
    p.set_defaults(func=run)


def collect() -> dict[str, Any]:
    import torch

    from ironlm import __version__
    from ironlm.contract_version import CONTRACT_VERSION
    from ironlm.plugin_manager import PluginManager

    return {
        "ironlm": {"version": __version__, "contract": CONTRACT_VERSION},
        "system": {"os": platform.platform(), "python": sys.version.split()[0],
                   "libc": " ".join(platform.libc_ver()).strip() or "unknown",
                   "machine": platform.machine()},
        "cpu": cpu_facts(),
        "torch": torch_facts(torch),
        "libraries": {name: _version(name) for name in LIBRARIES},
        "platforms": platform_facts(PluginManager()),
        "environment": environment(),
    }


def cpu_facts(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """Model, family / model numbers, logical CPUs usable here, and the vector flags."""
    fields: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())  # the first processor's
    except OSError:
        pass
    flags = sorted(f for f in fields.get("flags", "").split() if CPU_FLAGS.match(f))
    return {"model": fields.get("model name") or platform.processor() or "unknown",
            "family": fields.get("cpu family"), "model_number": fields.get("model"),
            "logical_cpus_usable": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity") else os.cpu_count(),  # (not on macOS)
            "logical_cpus_total": os.cpu_count(), "vector_flags": flags}


def torch_facts(torch: Any) -> dict[str, Any]:
    try:  # a broken driver raises here: the report says so instead of failing
        cuda = torch.cuda.is_available()
        devices: list[str] | str = [torch.cuda.get_device_name(i)
                                    for i in range(torch.cuda.device_count())] if cuda else []
    except Exception as exc:  # noqa: BLE001 (any driver error is a fact to report)
        cuda, devices = False, f"error: {exc}"
    return {"version": torch.__version__, "cuda_build": torch.version.cuda,
            "cuda_available": cuda, "cuda_devices": devices,
            "threads": torch.get_num_threads(),
            "mkldnn": torch.backends.mkldnn.is_available(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def platform_facts(pm: Any) -> dict[str, Any]:
    """Each device platform plugin: whether it can run here (why not), and its description."""
    out: dict[str, Any] = {}
    for row in pm.describe():
        for item in row["registered"]:
            if item["kind"] != "platform":
                continue
            fact: dict[str, Any] = {"plugin": row["distribution"] or row["plugin"],
                                    "available": item.get("available"),
                                    "reason": item.get("reason")}
            if item.get("details"):
                fact["details"] = item["details"]
            out[item["name"]] = fact
    return out


def environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of ``ENV_PREFIXES``, a secret's value masked, and a URL's login."""
    env = dict(os.environ) if env is None else env
    return {k: "***" if SECRET.search(k) else URL_LOGIN.sub("***@", v)
            for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def format_text(facts: dict[str, Any]) -> str:
    """Section per key; a nested mapping one indented ``key: value`` line per entry."""
    lines: list[str] = []

    def emit(value: Any, indent: int) -> None:
        for key, item in value.items():
            if isinstance(item, dict):
                lines.append(" " * indent + f"{key}:")
                emit(item, indent + 2)
            else:
                shown = ", ".join(map(str, item)) if isinstance(item, list) else item
                lines.append(" " * indent + f"{key}: {shown}")

    for section, value in facts.items():
        lines.append(f"== {section} ==")
        emit(value if value else {"(none)": ""}, 2)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    facts = collect()
    print(json.dumps(facts, indent=2, default=str) if args.json else format_text(facts))
    return 0
