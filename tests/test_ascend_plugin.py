"""ironlm-ascend as a plugin: discovery, provenance, and availability without torch_npu."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import ironlm_ascend.plugin
from ironlm.plugin_manager import BUILTIN_PLUGIN, PluginManager

FAKES = Path(__file__).parent / "fakes"


@pytest.fixture
def no_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch_npu is not importable: neither installed nor the test fake on sys.path."""
    for name in [m for m in sys.modules if m == "torch_npu" or m.startswith("torch_npu.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p) != FAKES])
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("a real torch_npu is installed here")


def _ascend_only(manager: PluginManager) -> PluginManager:
    # Only ironlm-ascend: the core's built-in plugin imports engine modules that other work is
    # still changing, and this test is about this plugin alone.
    manager.unregister(BUILTIN_PLUGIN)
    return manager


def test_entry_point_discovery_and_provenance() -> None:
    manager = _ascend_only(PluginManager(autoload=False))
    manager.load_entrypoints(allow=["ascend"])
    regs = manager.registries
    for registry, name in (
        (regs.platforms, "npu"),
        (regs.attention_backends, "ascend"),
        (regs.quantization_methods, "ascend_w8a8"),
    ):
        entry = registry.entry(name)
        assert entry.provenance.plugin == "ascend"
        assert entry.provenance.distribution == "ironlm-ascend"
        assert entry.provenance.version == "0.1.0"


def test_direct_registration() -> None:
    manager = _ascend_only(PluginManager(autoload=False))
    manager.register(ironlm_ascend.plugin, "ascend")
    regs = manager.registries
    assert regs.attention_backends.entry("ascend").provenance.plugin == "ascend"
    assert regs.quantization_methods.entry("ascend_w8a8").provenance.plugin == "ascend"
    backend = regs.attention_backends.get("ascend")
    assert backend.supported_platforms == ("npu",)
    assert regs.quantization_methods.get("ascend_w8a8").supported_platforms == ("npu",)


def test_unavailable_without_torch_npu(no_torch_npu: None) -> None:
    from ironlm_ascend.attention import AscendAttentionBackend
    from ironlm_ascend.platform import AscendPlatform

    platform = AscendPlatform().is_available()
    assert not platform.available and "torch_npu" in platform.reason
    backend = AscendAttentionBackend.is_available()
    assert not backend.available and "torch_npu" in backend.reason
    with pytest.raises(RuntimeError, match="torch_npu"):
        AscendAttentionBackend()


def test_listing_explains_unavailability(no_torch_npu: None) -> None:
    manager = _ascend_only(PluginManager(autoload=False))
    manager.register(ironlm_ascend.plugin, "ascend")
    (row,) = manager.describe()
    assert row["plugin"] == "ascend"
    items = {(i["kind"], i["name"]): i for i in row["registered"]}
    assert set(items) == {
        ("platform", "npu"),
        ("attention backend", "ascend"),
        ("quantization method", "ascend_w8a8"),
    }
    for key in (("platform", "npu"), ("attention backend", "ascend")):
        assert items[key]["available"] is False and "torch_npu" in items[key]["reason"]


def test_importing_the_plugin_does_not_import_torch_npu(
    no_torch_npu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m.startswith("ironlm_ascend")]:
        monkeypatch.delitem(sys.modules, name)  # restored after the test
    importlib.import_module("ironlm_ascend.plugin")
    importlib.import_module("ironlm_ascend.attention")
    importlib.import_module("ironlm_ascend.w8a8")
    assert "torch_npu" not in sys.modules
