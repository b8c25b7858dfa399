"""Worker: one rank's device, model, KV cache and model runner (``WorkerBase``'s core
implementation, the class every executor builds, in whatever process it runs)."""

from __future__ import annotations

import torch

from ironlm.config import EngineConfig
from ironlm.distributed.layout import ParallelLayout
from ironlm.distributed.parallel_group import CommStats
from ironlm.distributed.process_groups import Distributed, init_distributed
from ironlm.interfaces.attention import AttentionBackend
from ironlm.interfaces.model import ModelArchitecture, ModelContext
from ironlm.interfaces.platform import LayerOps, Platform
from ironlm.interfaces.quantization import QuantizationMethod, UnquantizedMethod
from ironlm.interfaces.spec_decode import SpeculativeProposer
from ironlm.interfaces.step import ModelInput, ModelOutput
from ironlm.interfaces.worker import WorkerBase, WorkerRank
from ironlm.lora.request import LoRARequest
from ironlm.model_loader import (
    HubOptions,
    ModelSource,
    load_model,
    resolve_model,
)
from ironlm.plugin_manager import PluginManager
from ironlm.registry import UnavailableError
from ironlm.worker.decode_graphs import DecodeGraphs, capture_sizes
from ironlm.worker.draft_runner import DraftModelRunner
from ironlm.worker.kv_cache import KVCache
from ironlm.worker.kv_transfer import KVTransferCalls, build_kv_connector
from ironlm.worker.lora_manager import WorkerLoRAManager
from ironlm.worker.model_runner import ModelRunner, StageInfo
from ironlm.worker.proposer_context import WorkerProposerContext
from ironlm.worker.sleep import SleepingMemory
from ironlm.worker.speculator import Speculator
from ironlm.worker.weight_calls import WeightCalls


class Worker(WorkerBase, WeightCalls, KVTransferCalls):
    def __init__(
        self, config: EngineConfig, rank: WorkerRank, plugins: PluginManager | None = None
    ) -> None:
        super().__init__(config, rank, plugins)
        self.plugins = plugins if plugins is not None else PluginManager()
        self.source: ModelSource = resolve_model(config.model, config.trust_remote_code,
                                                 config.hf_overrides, HubOptions.of(config))
        if config.disable_sliding_window and getattr(self.source.hf_config, "sliding_window", None):
            # vLLM's: every layer attends to the whole context (the engine capped the length
            # to the window first, so the outputs are the windowed model's)
            self.source.hf_config.sliding_window = None
        self._platform: Platform | None = None
        self._runner: ModelRunner | None = None
        self._kv: KVCache | None = None
        self._proposer: SpeculativeProposer | None = None
        self.layout = ParallelLayout(config.tensor_parallel_size, config.pipeline_parallel_size)
        self.dist: Distributed | None = None  # process groups when world_size > 1
        self._asleep = SleepingMemory()  # what sleep mode freed, until wake-up
        # vLLM's KV transfer: the store this rank's prompt blocks go to and come from
        self.kv_connector = build_kv_connector(self.plugins, config.kv_transfer_config) \
            if config.kv_transfer_config is not None else None

    # -- set-up, in call order ---------------------------------------------------------------
    def init_device(self) -> None:
        if self.worker_rank.world_size != self.layout.world_size:
            raise ValueError(
                f"worker rank {self.rank}: world size {self.worker_rank.world_size} != "
                f"tensor_parallel_size x pipeline_parallel_size = {self.layout.world_size}"
            )
        platform = self.plugins.select_platform(self.config.device)
        self.config = self.config.with_block_size(platform.default_block_size)  # engine: fixed
        platform.check_block_size(self.config.block_size)
        platform.configure_process(self.worker_rank.local_world_size)
        platform.set_device(self.local_rank)
        self._platform = platform
        self.device = platform.device(self.local_rank)
        if self.worker_rank.world_size > 1:
            if self.worker_rank.init_method is None:
                raise ValueError("a worker of a world larger than one needs an init_method")
            # the backend is the platform's (gloo, nccl, hccl): no per-platform branch here
            self.dist = init_distributed(
                platform.dist_backend, self.worker_rank.init_method, self.rank, self.layout,
                platform.synchronize,
            )  # fmt: skip
        self.dtype = self.config.torch_dtype(
            self.source.checkpoint_dtype, platform.default_dtype(self.source.checkpoint_dtype)
        )
        if self.dtype not in platform.supported_dtypes:
            raise ValueError(
                f"dtype {self.dtype} is not supported on device {platform.name!r}; "
                f"supported: {[str(d) for d in platform.supported_dtypes]}"
            )

    def load_model(self) -> None:
        platform = self.platform
        attention = self._attention_backend(platform)
        layer_ops = platform.layer_ops()
        rank = self.rank
        ctx = ModelContext(
            attention=attention,
            layer_ops=layer_ops,
            quantization=self._quantization(platform, layer_ops),
            dtype=self.dtype,
            device=self.device,
            tp_rank=self.layout.tp_rank(rank),
            tp_size=self.layout.tp_size,
            tp_group=self.dist.tp if self.dist is not None else None,
            pp_rank=self.layout.pp_rank(rank),
            pp_size=self.layout.pp_size,
        )
        model_cls = self.plugins.select_model(self.source.architectures)
        model: ModelArchitecture = load_model(
            self.source, model_cls, ctx, self.config.load_format, self.config.seed
        )
        self.ctx = ctx
        self._kv = KVCache(
            self.config, platform, attention, model.attention_layers(), self.dtype,
            self.device, self.local_rank,
        )  # fmt: skip
        hf_config = self.source.hf_config
        lora = WorkerLoRAManager(model, self.config, layer_ops, self.dtype, self.device) \
            if self.config.enable_lora else None
        self._runner = ModelRunner(
            self.config, model, attention, self.device, int(hf_config.vocab_size), lora=lora,
            ops=layer_ops,
            stage=StageInfo(
                is_last=ctx.is_last_stage,
                samples=rank == self.layout.sampling_rank,
                channel=self.dist.pipeline_channel(model.pipeline_tensors)
                if self.dist is not None and self.layout.pp_size > 1 else None,
                hidden_size=int(hf_config.hidden_size),
                dtype=self.dtype,
            ),
        )  # fmt: skip
        # the proposer sits next to the sampling rank's target: it verifies and drafts there
        if self.config.speculative_model is not None and rank == self.layout.sampling_rank:
            self._load_proposer(self._runner)

    def _load_proposer(self, runner: ModelRunner) -> None:
        """The speculative proposer, next to the target (this worker samples)."""
        spec = self.config.speculative_model
        assert spec is not None
        model_type = None
        if self.config.speculative_proposer_name is None:
            draft = resolve_model(spec, self.config.trust_remote_code, None,
                                  HubOptions.cache_of(self.config))  # fmt: skip
            model_type = getattr(draft.hf_config, "model_type", None)
        proposer_cls = self.plugins.select_speculative_proposer(spec, model_type)

        def load_draft(path: str) -> DraftModelRunner:
            return DraftModelRunner(path, self.config, self.plugins, self.platform,
                                    self._attention_backend(self.platform), self.dtype,
                                    self.device, self.local_rank)  # fmt: skip

        ctx = WorkerProposerContext(self.config, runner.model, self.device, self.dtype,
                                    runner.vocab_size, runner.sampler, runner.states,
                                    load_draft)  # fmt: skip
        proposer = proposer_cls(ctx)
        proposer.load()
        self._proposer = proposer
        runner.speculator = Speculator(proposer, runner.sampler, runner.states, runner.vocab_size)

    def determine_num_kv_blocks(self) -> int:
        extra = self._proposer.kv_cache_bytes_per_block() if self._proposer else 0
        return self.kv_cache.num_blocks_that_fit(extra)

    def weight_bytes(self) -> int:
        """Bytes of the model's weights as this rank holds them: parameters, buffers and the
        tensors a quantization method keeps in module attributes (packed dicts, segments),
        each byte of a storage counted once however many tensors view it (an opaque library
        tensor, which has no storage, by its elements). Storage no tensor views is not
        counted: a second layout a kernel keeps after a weight (the cpu plugin's row-major copy)
        is memory, not weight a forward pass reads."""
        opaque: dict[int, int] = {}
        spans: list[tuple[int, int]] = []  # (first, last + 1) address of each tensor's bytes

        def visit(obj: object) -> None:
            if isinstance(obj, torch.Tensor) and obj.layout != torch.strided:
                opaque[id(obj)] = obj.numel() * obj.element_size()
            elif isinstance(obj, torch.Tensor):
                # a strided view's span includes its gaps (an upper bound on its own bytes)
                extent = 1 + sum((n - 1) * st for n, st in zip(obj.shape, obj.stride()))
                if obj.numel():
                    spans.append((obj.data_ptr(), obj.data_ptr() + extent * obj.element_size()))
            elif isinstance(obj, (list, tuple)):
                for item in obj:
                    visit(item)
            elif isinstance(obj, dict):
                for item in obj.values():
                    visit(item)

        for module in self.model_runner.model.modules():
            visit(list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)))
            visit([v for k, v in vars(module).items() if not k.startswith("_")])
        return sum(opaque.values()) + _union_length(spans)

    def kv_cache_bytes_per_block(self) -> int:
        """Bytes one KV block takes on this rank, over all its attention layers (and the
        speculative proposer's cache, when it has one)."""
        extra = self._proposer.kv_cache_bytes_per_block() if self._proposer else 0
        return self.kv_cache.bytes_per_block() + extra

    def initialize_kv_cache(self, num_kv_blocks: int) -> None:
        kv_caches = self.kv_cache.allocate(num_kv_blocks)
        if self._proposer is not None:
            self._proposer.initialize_kv_cache(num_kv_blocks)
        runner = self.model_runner
        runner.kv_caches = kv_caches
        capture = None if self.config.enforce_eager else self.platform.graph_capture(self.ctx)
        if self._proposer is not None and self._proposer.needs_target_hidden_states:
            capture = None  # decode graphs do not expose the hidden states it reads
        if capture is not None:
            # the longest context a sequence can reach: the model's limit, or the whole cache
            cache_tokens = num_kv_blocks * self.config.block_size
            longest = self.config.max_model_len or self.source.max_position_embeddings
            runner.graphs = DecodeGraphs(
                capture, runner.model, runner.attention, kv_caches, self.config.block_size,
                min(longest or cache_tokens, cache_tokens), self.device,
                runner.lora.state if runner.lora is not None else None,
                capture_sizes(self.config.cudagraph_capture_sizes,
                              self.config.max_cudagraph_capture_size, capture.max_batch_size,
                              self.config.max_num_seqs, self.config.num_speculative_tokens or 0),
            )  # fmt: skip

    def num_swap_blocks(self) -> int:
        """KV blocks of this rank that fit the host swap space (``swap_space`` GiB)."""
        return self.kv_cache.num_swap_blocks()

    def initialize_swap_space(self, num_blocks: int) -> None:
        """Allocate ``num_blocks`` host blocks per layer for swap preemption (the engine asks
        every rank through collective_rpc, with the minimum over ranks)."""
        self.model_runner.swap_caches = self.kv_cache.allocate_swap(num_blocks)

    # -- steps -------------------------------------------------------------------------------
    def execute_model(self, model_input: ModelInput) -> ModelOutput | None:
        return self.model_runner.execute(model_input)

    # -- LoRA adapters (the engine's collective_rpc; vLLM's worker methods) ----------------------
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Read, check and hold an adapter (False: held already); ValueError naming the
        problem when it cannot run on this model."""
        return self._lora().add(lora_request)

    def check_lora(self, lora_request: LoRARequest) -> None:
        """Read and check an adapter without holding it (ValueError naming the problem)."""
        self._lora().check(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self._lora().remove(lora_id)

    def list_loras(self) -> set[int]:
        return self._lora().ids()

    def _lora(self) -> WorkerLoRAManager:
        lora = self.model_runner.lora
        if lora is None:
            raise ValueError("LoRA is not enabled: start the engine with enable_lora=True "
                             "(--enable-lora)")
        return lora

    def check_health(self) -> None:
        self.model_runner  # raises when not loaded or shut down

    def collective_stats(self, reset: bool = False) -> dict[str, float]:
        """Time this rank spent in collectives and pipeline sends / receives, and the steps
        run meanwhile (zeros with one rank); ``reset`` starts the counts again."""
        stats = self.dist.stats if self.dist is not None else CommStats()
        stats.steps = self.model_runner.steps
        out = stats.to_dict()
        if reset:
            stats.reset()
            self.model_runner.steps = 0
        return out

    def synchronize_collective_timing(self, enabled: bool) -> None:
        """Wait for the device around each collective so that its time is its own (for
        asynchronous devices; costs a synchronisation per call)."""
        if self.dist is not None and self.dist.tp is not None:
            self.dist.tp.synchronize_timing = enabled

    def shutdown(self) -> None:
        self._runner = None
        self._kv = None
        self._proposer = None
        if self.dist is not None:
            self.dist.close()
            self.dist = None

    # -- parts ---------------------------------------------------------------------------------
    @property
    def platform(self) -> Platform:
        if self._platform is None:
            raise RuntimeError("worker: init_device() has not run")
        return self._platform

    @property
    def model_runner(self) -> ModelRunner:
        if self._runner is None:
            raise RuntimeError("worker: the model is not loaded (or the worker was shut down)")
        return self._runner

    @property
    def kv_cache(self) -> KVCache:
        if self._kv is None:
            raise RuntimeError("worker: the model is not loaded (or the worker was shut down)")
        return self._kv

    def _attention_backend(self, platform: Platform) -> AttentionBackend:
        backend_cls = self.plugins.select_attention_backend(self.config.attention_backend, platform)
        options = dict(self.config.attention_backend_options)
        if self.config.kv_cache_dtype != "auto":  # only backends with a quantized cache take it
            options["kv_cache_dtype"] = self.config.kv_cache_dtype
        return backend_cls(**options)

    def _quantization(self, platform: Platform, layer_ops: LayerOps) -> QuantizationMethod:
        quant_config = self.source.quantization_config
        name = self.plugins.resolve_quantization(self.config.quantization, quant_config)
        if not name:
            return UnquantizedMethod()
        method = self.plugins.select_quantization(name, platform).from_config(quant_config)
        for layout in method.layouts():
            status = layer_ops.quantized_support(layout)
            if not status.available:
                raise UnavailableError(
                    f"quantization {name!r} ({layout.describe()} weights) cannot run on device "
                    f"{platform.name!r}: {status.reason}"
                )
        return method


def _union_length(spans: list[tuple[int, int]]) -> int:
    """Bytes covered by (start, end) address ranges that may overlap (shared storages, views)."""
    total, reach = 0, 0
    for start, end in sorted(spans):
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total
