"""The plugin core: discovery, allow-list, autoload switch, clashes, selection errors,
provenance, listings, and a third-party plugin found through a real entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Callable

import ironlm
import pluggy
import pytest
from ironlm import hookimpl
from ironlm.contract_version import PluginContractError
from ironlm.interfaces.platform import Availability, Platform
from ironlm.plugin_manager import PluginManager
from ironlm.registry import PluginClashError, UnavailableError, UnknownNameError

OUR_PLUGINS = {
    "cpu": "ironlm-cpu",
    "cuda": "ironlm-cuda",
    "ascend": "ironlm-ascend",
    "guided": "ironlm-guided",
    "toolparsers": "ironlm-toolparsers",
}


def _ironlm(
    *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("IRONLM_")}
    full_env.update(env or {})
    res = subprocess.run(
        [sys.executable, "-m", "ironlm.cli", *args],
        capture_output=True, text=True, env=full_env, timeout=120,
    )
    assert not check or res.returncode == 0, res.stderr
    return res


def test_discovery_finds_every_installed_plugin_with_provenance() -> None:
    pm = PluginManager(autoload=True, allow=None)
    names = set(pm.plugin_names())
    assert set(OUR_PLUGINS) <= names and "ironlm" in names
    for plugin, dist in OUR_PLUGINS.items():
        prov = pm.provenance(plugin)
        assert prov.distribution == dist
        assert prov.version == "0.1.0"
    entry = pm.registries.platforms.entry("cpu")
    assert (entry.provenance.plugin, entry.provenance.distribution) == ("cpu", "ironlm-cpu")
    # built-ins go through the same hooks and carry the core's provenance
    ref = pm.registries.attention_backends.entry("torch_ref")
    assert ref.provenance.plugin == "ironlm" and ref.provenance.distribution == "ironlm"
    assert "LlamaForCausalLM" in pm.registries.models


def test_discovery_is_idempotent() -> None:
    pm = PluginManager(autoload=True, allow=None)
    before = pm.plugin_names()
    pm.load_entrypoints()
    pm.load_entrypoints()
    assert pm.plugin_names() == before
    assert pm.registries.platforms.names() == sorted(pm.registries.platforms.names())


def test_allow_list_and_disable_autoload_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IRONLM_PLUGINS", "cpu, toolparsers")
    assert set(PluginManager().plugin_names()) == {"ironlm", "cpu", "toolparsers"}
    monkeypatch.delenv("IRONLM_PLUGINS")
    monkeypatch.setenv("IRONLM_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = PluginManager()
    assert pm.plugin_names() == ["ironlm"]
    assert pm.registries.platforms.names() == []


class _Clash:
    class Dup(Platform):
        name = "cpu"
        device_type = "cpu"
        default_attention_backend = "torch_ref"

        def is_available(self) -> Availability:
            return Availability.yes()

        def memory_info(self, device_index: int = 0) -> tuple[int, int]:
            return (1, 1)

    @hookimpl
    def register_platforms(self, register: Callable[[type], None]) -> None:
        register(self.Dup)


def test_name_clash_names_both_plugins() -> None:
    pm = PluginManager(autoload=True, allow=["cpu"])
    pm.register(_Clash(), "dup-maker")
    with pytest.raises(PluginClashError) as err:
        pm.registries
    msg = str(err.value)
    assert "'cpu'" in msg and "dup-maker" in msg and "ironlm-cpu" in msg


def test_unknown_and_unavailable_names_explain_themselves() -> None:
    pm = PluginManager(autoload=True, allow=None)
    with pytest.raises(UnknownNameError) as err:
        pm.select_platform("tpu")
    assert "unknown device 'tpu'" in str(err.value)
    assert "cpu" in str(err.value) and "cuda" in str(err.value) and "npu" in str(err.value)
    with pytest.raises(UnavailableError) as err:
        pm.select_platform("cuda")
    assert "device 'cuda' is unavailable" in str(err.value) and "torch" in str(err.value)
    with pytest.raises(UnavailableError) as err:
        pm.select_platform("npu")
    assert "torch_npu" in str(err.value)
    assert pm.select_platform("auto").name == "cpu"
    with pytest.raises(UnknownNameError) as err:
        pm.select_attention_backend("flashinfer", pm.select_platform("cpu"))
    assert "installed attention backends" in str(err.value) and "torch_ref" in str(err.value)
    with pytest.raises(UnknownNameError) as err:
        pm.select_executor("slurm")
    assert "uni" in str(err.value)
    with pytest.raises(UnknownNameError) as err:
        pm.select_tool_parser("nonexistent")
    assert "installed tool parsers" in str(err.value)
    with pytest.raises(UnknownNameError) as err:
        pm.select_model(["BertModel"])
    assert "LlamaForCausalLM" in str(err.value)


def test_misspelled_hook_fails_loudly() -> None:
    class Typo:
        @hookimpl
        def register_platform(self, register: Callable[[type], None]) -> None:  # missing "s"
            pass

    pm = PluginManager(autoload=False)
    with pytest.raises(pluggy.PluginValidationError):
        pm.register(Typo(), "typo")


def test_registering_a_non_subclass_is_a_type_error() -> None:
    class Wrong:
        @hookimpl
        def register_executors(self, register: Callable[[type], None]) -> None:
            register(dict)

    pm = PluginManager(autoload=False, plugins={"wrong": Wrong()})
    with pytest.raises(TypeError, match="not a subclass"):
        pm.registries


def test_cli_listing_table_and_json() -> None:
    table = _ironlm("plugins")
    assert table.returncode == 0, table.stderr
    assert "platform:cpu" in table.stdout and "ironlm-cuda" in table.stdout
    assert "unavailable:" in table.stdout  # cuda / npu here, each with its reason
    listed = _ironlm("plugins", "--json")
    rows = json.loads(listed.stdout)
    by_plugin = {r["plugin"]: r for r in rows}
    cuda = by_plugin["cuda"]
    assert cuda["distribution"] == "ironlm-cuda" and cuda["version"] == "0.1.0"
    plat = next(i for i in cuda["registered"] if i["kind"] == "platform")
    assert plat["name"] == "cuda" and plat["available"] is False and plat["reason"]
    cpu_plat = next(i for i in by_plugin["cpu"]["registered"] if i["kind"] == "platform")
    assert cpu_plat["available"] is True


def test_serve_without_a_platform_exits_2_naming_the_packages() -> None:
    res = _ironlm("serve", "some-model", env={"IRONLM_DISABLE_PLUGIN_AUTOLOAD": "1"}, check=False)
    assert res.returncode == 2
    assert "ironlm-cpu" in res.stderr and "ironlm-cuda" in res.stderr


def test_core_imports_no_hardware_module() -> None:
    code = textwrap.dedent(
        """
        import sys
        import ironlm, ironlm.engine.llm_engine, ironlm.entrypoints.llm, ironlm.plugin_manager
        from ironlm.plugin_manager import PluginManager
        PluginManager().describe()
        bad = [m for m in ("triton", "torch_npu") if m in sys.modules]
        assert not bad, bad
        assert not any(m.startswith("ironlm_cuda.kernels") for m in sys.modules)
        print("clean")
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "clean" in res.stdout, res.stderr


THIRD_PARTY_MODULE = '''
"""A third-party device plugin: one module."""
from typing import Callable
import torch
from ironlm import hookimpl
from ironlm.interfaces.platform import Availability, Platform

IRONLM_CONTRACT_VERSION = "1.0"


class FakeDevicePlatform(Platform):
    name = "fakedev"
    device_type = "cpu"  # computes on the host: proves the engine needs no vendor import
    priority = -10
    supported_dtypes = (torch.float32,)
    default_attention_backend = "torch_ref"

    def is_available(self) -> Availability:
        return Availability.yes("always")

    def memory_info(self, device_index: int = 0) -> tuple[int, int]:
        return (1 << 30, 1 << 31)


@hookimpl
def register_platforms(register: Callable[[type], None]) -> None:
    register(FakeDevicePlatform)
'''


def _install_fake(folder: Path, module_text: str) -> Path:
    """A plugin 'installed' the way pip leaves it: module + dist-info with an entry point. The
    module is named after the folder, so that each test imports its own."""
    module = "fakedev_" + "".join(c if c.isalnum() else "_" for c in folder.name)
    (folder / f"{module}.py").write_text(module_text)
    info = folder / "ironlm_fakedev-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ironlm-fakedev\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[ironlm]\nfakedev = {module}\n")
    return folder


@pytest.fixture()
def third_party_plugin(tmp_path: Path) -> Path:
    return _install_fake(tmp_path, THIRD_PARTY_MODULE)


@pytest.mark.parametrize(
    ("declaration", "reason"),
    [('IRONLM_CONTRACT_VERSION = "2.0"', "was written for contract 2.0"),
     ('IRONLM_CONTRACT_VERSION = "1.9"', "was written for contract 1.9"),
     ("", "declares no contract version")],
)
def test_plugin_for_another_contract_is_refused_naming_it(
    tmp_path: Path, tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch, declaration: str,
    reason: str,
) -> None:
    module = THIRD_PARTY_MODULE.replace('IRONLM_CONTRACT_VERSION = "1.0"', declaration)
    folder = _install_fake(tmp_path, module)
    res = _ironlm("plugins", "--json", env={"PYTHONPATH": str(folder)})
    rows = {r["plugin"]: r for r in json.loads(res.stdout)}
    assert reason in rows["fakedev"]["incompatible"] and rows["fakedev"]["registered"] == []
    table = _ironlm("plugins", env={"PYTHONPATH": str(folder)}).stdout
    assert "fakedev" in table and f"incompatible: {reason}" in table
    res = _ironlm("serve", str(tiny_llama_dir), env={"PYTHONPATH": str(folder)}, check=False)
    assert res.returncode == 2
    assert "plugin 'fakedev' (ironlm-fakedev 1.2.3)" in res.stderr and reason in res.stderr
    monkeypatch.syspath_prepend(str(folder))
    with pytest.raises(PluginContractError, match=f"'fakedev'.*{reason}"):
        ironlm.LLM(str(tiny_llama_dir), kv_cache_memory=8 << 20)
    other = PluginManager(autoload=False)
    with pytest.raises(PluginContractError, match="'x' was written for contract 7.0"):
        other.register(types.SimpleNamespace(IRONLM_CONTRACT_VERSION="7.0"), "x")


def test_third_party_plugin_is_listed_and_selectable(
    third_party_plugin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = _ironlm("plugins", "--json", env={"PYTHONPATH": str(third_party_plugin)})
    rows = {r["plugin"]: r for r in json.loads(res.stdout)}
    assert rows["fakedev"]["distribution"] == "ironlm-fakedev"
    assert rows["fakedev"]["version"] == "1.2.3"
    assert rows["fakedev"]["registered"][0]["name"] == "fakedev"
    monkeypatch.syspath_prepend(str(third_party_plugin))
    pm = PluginManager(autoload=True, allow=["fakedev"])
    platform = pm.select_platform("fakedev")
    assert platform.name == "fakedev"
    assert pm.select_attention_backend(None, platform).name == "torch_ref"


def test_fake_device_runs_the_engine(
    third_party_plugin: Path, monkeypatch: pytest.MonkeyPatch, tiny_llama_dir: Path
) -> None:
    """The whole engine on a device the core has never heard of."""
    monkeypatch.syspath_prepend(str(third_party_plugin))
    pm = PluginManager(autoload=True, allow=["fakedev"])
    llm = ironlm.LLM(
        str(tiny_llama_dir), device="fakedev", plugin_manager=pm,
        kv_cache_memory=8 << 20, max_model_len=128,
    )
    out = llm.generate([[1, 2, 3, 4]], ironlm.SamplingParams(max_tokens=5, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 5
    assert llm.engine.block_manager.num_used_blocks == 0
    assert llm.engine.config.block_size == 16  # a platform that sets none: the base default
