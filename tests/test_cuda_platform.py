"""The cuda plugin as the host sees it: registration through the hooks, availability with its
reason on a machine without CUDA, selection errors, and no triton import at plugin load."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

import ironlm_cuda.plugin
from ironlm.plugin_manager import BUILTIN_PLUGIN, PluginManager
from ironlm.registry import UnavailableError
from ironlm_cuda.platform import CudaPlatform
from ironlm_cuda.triton_attention import TritonAttentionBackend

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")


def cuda_plugin_manager() -> PluginManager:
    """A manager holding only the cuda plugin: its hooks, isolated from the core's own plugin
    (whose hooks import the model and executor modules)."""
    pm = PluginManager(autoload=False)
    pm.unregister(BUILTIN_PLUGIN)
    pm.register(ironlm_cuda.plugin, "cuda")
    return pm


def test_hooks_register_platform_and_triton_backend() -> None:
    regs = cuda_plugin_manager().registries
    assert regs.platforms.get("cuda") is CudaPlatform
    assert regs.attention_backends.get("triton") is TritonAttentionBackend
    assert TritonAttentionBackend.supported_platforms == ("cuda",)
    assert CudaPlatform.default_attention_backend == "triton"


@no_cuda
def test_unavailable_without_cuda_with_reason() -> None:
    status = CudaPlatform().is_available()
    assert not status.available
    assert "torch" in status.reason and ("CPU-only" in status.reason or "CUDA" in status.reason)
    backend_status = TritonAttentionBackend.is_available()
    assert not backend_status.available and "CUDA" in backend_status.reason


@no_cuda
def test_select_platform_cuda_raises_with_the_reason() -> None:
    pm = cuda_plugin_manager()
    reason = CudaPlatform().is_available().reason
    with pytest.raises(UnavailableError, match=re.escape(reason)):
        pm.select_platform("cuda")


@no_cuda
def test_plugins_listing_shows_cuda_unavailable_with_reason() -> None:
    (row,) = [r for r in cuda_plugin_manager().describe() if r["plugin"] == "cuda"]
    items = {(i["kind"], i["name"]): i for i in row["registered"]}
    platform = items[("platform", "cuda")]
    assert platform["available"] is False and platform["reason"]
    backend = items[("attention backend", "triton")]
    assert backend["available"] is False and "CUDA" in backend["reason"]


def test_plugin_import_does_not_import_triton() -> None:
    code = (
        "import sys\n"
        "import ironlm_cuda.plugin, ironlm_cuda.platform, ironlm_cuda.triton_attention\n"
        "import ironlm_cuda.triton_attention_metadata\n"
        "from ironlm.plugin_manager import BUILTIN_PLUGIN, PluginManager\n"
        "pm = PluginManager(autoload=False)\n"
        "pm.unregister(BUILTIN_PLUGIN)\n"
        "pm.register(ironlm_cuda.plugin, 'cuda')\n"
        "pm.describe()\n"
        "assert 'triton' not in sys.modules, 'triton imported at plugin load'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_available_on_a_gpu_and_layer_ops_are_fused() -> None:
    from ironlm_cuda.triton_layer_ops import TritonLayerOps

    platform = cuda_plugin_manager().select_platform("cuda")
    assert platform.is_available().available
    assert TritonAttentionBackend.is_available().available
    assert isinstance(platform.layer_ops(), TritonLayerOps)
