"""``ironlm collect-env``: the environment facts of a bug report or a benchmark figure, read
from this machine (CPU flags as /proc/cpuinfo lists them, torch's build, library versions,
the platforms' own descriptions) and the IronLM / vLLM variables with secrets masked."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from ironlm.cli import Cli
from ironlm.commands.collect_env_cmd import cpu_facts

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16 avx_vnni amx_tile amx_bf16 amx_int8 sha_ni

processor\t: 1
model name\t: another
"""


def test_json_report_of_this_machine(monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("IRONLM_CPU_TUNE", "0")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("VLLM_API_KEY", "sk-secret")
    monkeypatch.setenv("RAY_ADDRESS", "ray://user:pw@head:10001")
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example/hf")
    monkeypatch.setenv("IRONLM_S3_ACCESS_ID", "AKIA")
    monkeypatch.setenv("UNRELATED_VARIABLE", "x")
    assert Cli().run(["collect-env", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["torch"]["version"] == torch.__version__
    assert facts["libraries"]["transformers"] == version("transformers")
    assert facts["libraries"]["torch_npu"] == "not installed"
    cpuinfo = Path("/proc/cpuinfo").read_text()
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "").split()
    assert ("avx2" in flags) == ("avx2" in facts["cpu"]["vector_flags"])
    assert set(facts["cpu"]["vector_flags"]) <= set(flags)
    assert facts["platforms"]["cpu"]["available"] is True
    assert facts["platforms"]["cpu"]["details"]["isa_target"]
    env = facts["environment"]
    assert env["IRONLM_CPU_TUNE"] == "0"
    assert env["HF_TOKEN"] == "***" and env["VLLM_API_KEY"] == "***"
    assert env["IRONLM_S3_ACCESS_ID"] == "***"
    assert env["RAY_ADDRESS"] == "ray://***@head:10001"  # the login of a URL
    assert env["HF_ENDPOINT"] == "https://mirror.example/hf"
    assert "UNRELATED_VARIABLE" not in env


def test_cpu_facts_of_a_xeon_with_amx(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(XEON)
    facts = cpu_facts(cpuinfo)
    assert facts["model"] == "Intel(R) Xeon(R) Platinum 8480+"  # the first processor's
    assert (facts["family"], facts["model_number"]) == ("6", "143")
    assert facts["vector_flags"] == ["amx_bf16", "amx_int8", "amx_tile", "avx", "avx2",
                                     "avx512_bf16", "avx512_vnni", "avx512bw", "avx512f",
                                     "avx_vnni", "f16c", "fma"]


def test_text_report_has_every_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert Cli().run(["collect-env"]) == 0
    out = capsys.readouterr().out
    for section in ("ironlm", "system", "cpu", "torch", "libraries", "platforms"):
        assert f"== {section} ==" in out
    assert f"  torch: {torch.__version__}" in out
