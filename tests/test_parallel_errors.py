"""Bad parallel layouts fail at start-up with a clear error: a tensor-parallel size that does
not divide the heads or the vocabulary (naming both numbers), more ranks than the platform's
devices (naming its count), ``ray`` chosen where it is not installed (naming the install
command), a worker that cannot start (its exception raised in the engine, no process left),
``uni`` with more than one rank. Also the flags and the default executor backend."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from ironlm import LLM, hookimpl
from ironlm.config import EngineConfig
from ironlm.distributed.layout import ParallelLayout, check_model_fits, stage_layers
from ironlm.entrypoints.openai.cli_args import engine_config_from_args, make_parser
from ironlm.interfaces.platform import Availability, Platform
from ironlm.plugin_manager import PluginManager
from parallel_utils import worker_pids

IRONLM_CONTRACT_VERSION = "1.0"
SMALL = {"max_model_len": 128, "kv_cache_memory": 8 * 1024**2, "enforce_eager": True}


def test_layout_and_stages() -> None:
    layout = ParallelLayout(tp_size=2, pp_size=3)
    assert layout.world_size == 6
    assert layout.tp_groups() == [[0, 1], [2, 3], [4, 5]]
    assert [layout.next_stage_rank(r) for r in range(6)] == [2, 3, 4, 5, None, None]
    assert [layout.prev_stage_rank(r) for r in range(6)] == [None, None, 0, 1, 2, 3]
    assert layout.sampling_rank == 4
    assert [list(stage_layers(30, p, 4)) for p in range(4)] == [
        list(range(0, 8)), list(range(8, 16)), list(range(16, 23)), list(range(23, 30))]


def test_check_model_fits_names_both_numbers(smollm2_dir: Path) -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(smollm2_dir)  # 9 heads, 3 KV heads, vocab 49152
    check_model_fits(cfg, 3, 2)
    with pytest.raises(ValueError, match=r"9 attention heads .* tensor_parallel_size 2"):
        check_model_fits(cfg, 2, 1)
    cfg.vocab_size = 49153
    with pytest.raises(ValueError, match=r"vocabulary of 49153 .* tensor_parallel_size 3"):
        check_model_fits(cfg, 3, 1)
    with pytest.raises(ValueError, match=r"pipeline_parallel_size 31 .* 30 layers"):
        check_model_fits(cfg, 1, 31)


def test_real_model_tp_not_dividing_heads_fails_before_workers(smollm2_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"9 attention heads .* tensor_parallel_size 2"):
        LLM(str(smollm2_dir), tensor_parallel_size=2, distributed_executor_backend="mp", **SMALL)
    assert worker_pids(os.getpid()) == []


def test_vocab_not_divisible_is_refused(tiny_llama_dir: Path, tmp_path: Path) -> None:
    odd = tmp_path / "odd-vocab"
    shutil.copytree(tiny_llama_dir, odd)
    config = json.loads((odd / "config.json").read_text())
    config["vocab_size"] = 49153
    (odd / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"vocabulary of 49153 .* tensor_parallel_size 2"):
        LLM(str(odd), tensor_parallel_size=2, distributed_executor_backend="mp", **SMALL)


class _InlinePlatform(Platform):
    """A platform only this process knows (registered inline, not through an entry point)."""

    name = "inline-dev"
    device_type = "cpu"
    default_attention_backend = "torch_ref"
    devices: int | None = None

    def is_available(self) -> Availability:
        return Availability.yes("test platform")

    def memory_info(self, device_index: int = 0) -> tuple[int, int]:
        return 1 << 30, 1 << 31

    def device_count(self) -> int | None:
        return self.devices


class _OneDevicePlatform(_InlinePlatform):
    name = "one-dev"
    devices = 1


def _plugins(platform: type[Platform]) -> PluginManager:
    class Plugin:
        IRONLM_CONTRACT_VERSION = "1.0"

        @staticmethod
        @hookimpl
        def register_platforms(register: Callable[[type], None]) -> None:
            register(platform)

    return PluginManager(plugins={f"test-{platform.name}": Plugin})


def test_more_ranks_than_devices_names_the_count(tiny_llama_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"2 ranks, but platform 'one-dev' has 1 device"):
        LLM(str(tiny_llama_dir), plugin_manager=_plugins(_OneDevicePlatform), device="one-dev",
            tensor_parallel_size=2, distributed_executor_backend="mp", **SMALL)
    assert worker_pids(os.getpid()) == []


def test_worker_start_up_error_is_raised_by_the_engine(tiny_llama_dir: Path) -> None:
    # worker processes discover plugins through entry points: the inline platform is
    # unknown there, so rank 1 fails to start; the engine raises its error, nothing hangs
    with pytest.raises(ValueError, match="inline-dev") as info:
        LLM(str(tiny_llama_dir), plugin_manager=_plugins(_InlinePlatform), device="inline-dev",
            tensor_parallel_size=2, distributed_executor_backend="mp", **SMALL)
    assert "in worker rank 1" in str(info.value.__cause__)
    assert worker_pids(os.getpid()) == []
    # the driver rank, left waiting in the rendezvous by rank 1, ends with the executor's store
    # (a driver thread still waiting there once blocked the next engine in this process)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(
        t.name.startswith("ironlm-driver") for t in threading.enumerate()
    ):
        time.sleep(0.1)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("ironlm-driver")]


def test_uni_refuses_more_than_one_rank(tiny_llama_dir: Path) -> None:
    with pytest.raises(ValueError, match="'uni' runs one worker"):
        LLM(str(tiny_llama_dir), pipeline_parallel_size=2, distributed_executor_backend="uni",
            **SMALL)


def test_flags_and_default_backend() -> None:
    args = make_parser().parse_args(["m", "-tp", "3", "-pp", "2"])
    config = engine_config_from_args(args)
    assert (config.tensor_parallel_size, config.pipeline_parallel_size) == (3, 2)
    assert config.world_size == 6
    assert config.distributed_executor_backend == "ray"  # Ray is installed here
    assert EngineConfig(model="m").distributed_executor_backend == "uni"
    long = make_parser().parse_args(["m", "--tensor-parallel-size", "2",
                                     "--pipeline-parallel-size", "2",
                                     "--distributed-executor-backend", "mp"])
    assert engine_config_from_args(long).distributed_executor_backend == "mp"
    with pytest.raises(ValueError, match="pipeline_parallel_size must be at least 1"):
        EngineConfig(model="m", pipeline_parallel_size=0)


# Python without Ray: ``sys.modules["ray"] = None`` makes ``import ray`` fail and
# ``importlib.util.find_spec("ray")`` return None, as on a machine where it is not installed.
_WITHOUT_RAY = """
import sys
sys.modules["ray"] = None
from ironlm.config import EngineConfig
print("default:", EngineConfig(model="m", tensor_parallel_size=2).distributed_executor_backend)
from ironlm.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_ray_not_installed_names_the_install_command(smollm2_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_RAY, "serve", str(smollm2_dir), "-tp", "3",
         "--distributed-executor-backend", "ray", "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert "default: mp" in proc.stdout  # no silent Ray: mp when Ray is absent
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'ironlm[ray]'" in proc.stderr
    assert "distributed_executor_backend 'ray' is unavailable" in proc.stderr


