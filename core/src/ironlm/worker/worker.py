"""Worker: one rank's device, model, KV cache and model runner (``WorkerBase``'s core
implementation, the class every executor builds, in whatever process it runs)."""

from __future__ import annotations

from ironlm.config import EngineConfig
from ironlm.interfaces.attention import AttentionBackend
from ironlm.interfaces.model import ModelArchitecture, ModelContext
from ironlm.interfaces.platform import LayerOps, Platform
from ironlm.interfaces.quantization import QuantizationMethod, UnquantizedMethod
from ironlm.interfaces.step import ModelInput, ModelOutput
from ironlm.interfaces.worker import WorkerBase, WorkerRank
from ironlm.lora.request import LoRARequest
from ironlm.model_loader import ModelSource, load_model, resolve_model
from ironlm.plugin_manager import PluginManager
from ironlm.registry import UnavailableError
from ironlm.worker.decode_graphs import DecodeGraphs
from ironlm.worker.kv_cache import KVCache
from ironlm.worker.lora_manager import WorkerLoRAManager
from ironlm.worker.model_runner import ModelRunner


class Worker(WorkerBase):
    def __init__(
        self, config: EngineConfig, rank: WorkerRank, plugins: PluginManager | None = None
    ) -> None:
        super().__init__(config, rank, plugins)
        self.plugins = plugins if plugins is not None else PluginManager()
        self.source: ModelSource = resolve_model(config.model, config.trust_remote_code)
        self._platform: Platform | None = None
        self._runner: ModelRunner | None = None
        self._kv: KVCache | None = None

    # -- set-up, in call order ---------------------------------------------------------------
    def init_device(self) -> None:
        if self.rank.world_size > 1:
            raise ValueError(
                f"this worker runs one rank; world size {self.rank.world_size} "
                "(tensor_parallel_size > 1) is not supported"
            )
        platform = self.plugins.select_platform(self.config.device)
        platform.check_block_size(self.config.block_size)
        platform.configure_process()
        platform.set_device(self.rank.local_rank)
        self._platform = platform
        self.device = platform.device(self.rank.local_rank)
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
        ctx = ModelContext(
            attention=attention,
            layer_ops=layer_ops,
            quantization=self._quantization(platform, layer_ops),
            dtype=self.dtype,
            device=self.device,
            tp_rank=0,
            tp_size=self.config.tensor_parallel_size,
        )
        model_cls = self.plugins.select_model(self.source.architectures)
        model: ModelArchitecture = load_model(
            self.source, model_cls, ctx, self.config.load_format, self.config.seed
        )
        self.ctx = ctx
        self._kv = KVCache(
            self.config, platform, attention, model.attention_layers(), self.dtype,
            self.device, self.rank.local_rank,
        )  # fmt: skip
        lora = WorkerLoRAManager(model, self.config, layer_ops, self.dtype, self.device) \
            if self.config.enable_lora else None
        self._runner = ModelRunner(
            self.config, model, attention, self.device, int(self.source.hf_config.vocab_size),
            lora,
        )

    def determine_num_kv_blocks(self) -> int:
        return self.kv_cache.num_blocks_that_fit()

    def kv_cache_bytes_per_block(self) -> int:
        """Bytes one KV block takes on this rank, over all its attention layers."""
        return self.kv_cache.bytes_per_block()

    def initialize_kv_cache(self, num_kv_blocks: int) -> None:
        kv_caches = self.kv_cache.allocate(num_kv_blocks)
        runner = self.runner
        runner.kv_caches = kv_caches
        capture = None if self.config.enforce_eager else self.platform.graph_capture(self.ctx)
        if capture is not None:
            # the longest context a sequence can reach: the model's limit, or the whole cache
            cache_tokens = num_kv_blocks * self.config.block_size
            longest = self.config.max_model_len or self.source.max_position_embeddings
            runner.graphs = DecodeGraphs(
                capture, runner.model, runner.attention, kv_caches, self.config.block_size,
                min(longest or cache_tokens, cache_tokens), self.device,
                runner.lora.state if runner.lora is not None else None,
            )  # fmt: skip

    # -- steps -------------------------------------------------------------------------------
    def execute_model(self, model_input: ModelInput) -> ModelOutput | None:
        return self.runner.execute(model_input)

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
        lora = self.runner.lora
        if lora is None:
            raise ValueError("LoRA is not enabled: start the engine with enable_lora=True "
                             "(--enable-lora)")
        return lora

    def check_health(self) -> None:
        self.runner  # raises when not loaded or shut down

    def shutdown(self) -> None:
        self._runner = None
        self._kv = None

    # -- parts ---------------------------------------------------------------------------------
    @property
    def platform(self) -> Platform:
        if self._platform is None:
            raise RuntimeError("worker: init_device() has not run")
        return self._platform

    @property
    def runner(self) -> ModelRunner:
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
        name = self.config.quantization
        if not name:
            return UnquantizedMethod()
        method = self.plugins.select_quantization(name, platform).from_config(
            self.source.quantization_config
        )
        layout = method.layout()
        if layout is not None:
            status = layer_ops.quantized_support(layout)
            if not status.available:
                raise UnavailableError(
                    f"quantization {name!r} ({layout.describe()} weights) cannot run on device "
                    f"{platform.name!r}: {status.reason}"
                )
        return method
