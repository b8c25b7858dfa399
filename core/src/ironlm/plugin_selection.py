"""Selection by name: which registered plugin object an engine uses for each role.

``PluginSelection`` is the half of ``PluginManager`` that reads the filled registries (the
other half discovers plugins and fills them): a platform by name or priority, an attention
backend that runs on it, the quantization method a flag or a checkpoint names, guided-decoding
backends in fallback order, parsers, executors, a model class by architecture, a speculative
proposer by name or draft type. Each failure names the option and lists what is installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ironlm.interfaces import (
    AttentionBackend,
    Executor,
    GuidedBackend,
    KVConnector,
    LogitsProcessor,
    ModelArchitecture,
    Platform,
    QuantizationMethod,
    ReasoningParser,
    SpeculativeProposer,
    ToolParser,
)
from ironlm.interfaces.platform import Availability
from ironlm.python_file import import_class
from ironlm.registry import UnavailableError, UnknownNameError

if TYPE_CHECKING:
    from ironlm.plugin_manager import Registries


class PluginSelection:
    """Mixed into ``PluginManager``, which supplies ``registries``."""

    if TYPE_CHECKING:
        @property
        def registries(self) -> Registries: ...

    def select_platform(self, name: str = "auto") -> Platform:
        """The platform called ``name`` (``auto``: the available one of highest priority)."""
        reg = self.registries.platforms
        if name != "auto":
            cls = reg.get(name)
            platform = cls()
            status = platform.is_available()
            if not status.available:
                raise UnavailableError(f"device {name!r} is unavailable: {status.reason}")
            return platform
        ranked = sorted(reg, key=lambda e: -e.obj.priority)
        for entry in ranked:
            platform = entry.obj()
            if platform.is_available().available:
                return platform
        if not len(reg):
            raise UnknownNameError(
                "no device platform is installed; install one of the platform plugins: "
                "pip install ./plugins/cpu (ironlm-cpu), ./plugins/cuda (ironlm-cuda) or "
                "./plugins/ascend (ironlm-ascend)"
            )
        raise UnavailableError(
            "no installed device platform is available: "
            + reg.explain_unavailable(lambda c: c().is_available())
        )

    def select_attention_backend(self, name: str | None, platform: Platform) -> type[AttentionBackend]:
        reg = self.registries.attention_backends
        chosen = name or platform.default_attention_backend
        cls = reg.select(chosen, lambda c: c.is_available())
        if "*" not in cls.supported_platforms and platform.name not in cls.supported_platforms:
            raise UnavailableError(
                f"attention_backend {chosen!r} does not run on device {platform.name!r} "
                f"(it supports: {', '.join(cls.supported_platforms)}); backends for "
                f"{platform.name!r}: {', '.join(self.attention_backends_for(platform)) or 'none'}"
            )
        return cls

    def check_kv_cache_dtype(self, kv_cache_dtype: str, backend_name: str | None,
                             platform: Platform) -> None:
        """Refuse a ``kv_cache_dtype`` the selected attention backend cannot store, before any
        worker loads (both ``LLM`` and ``ironlm serve`` call this at engine start-up).

        The backend takes the cache dtype as a constructor option and raises ValueError for
        one it cannot store; the message here names the parameter, the platform and the
        backend, instead of the late option error a worker would raise.
        """
        if kv_cache_dtype == "auto":
            return
        backend = self.select_attention_backend(backend_name, platform)
        try:
            backend(kv_cache_dtype=kv_cache_dtype)
        except ValueError as exc:
            raise ValueError(
                f"kv_cache_dtype={kv_cache_dtype!r} (--kv-cache-dtype {kv_cache_dtype}) is not "
                f"supported on platform {platform.name!r} (attention backend "
                f"{backend.name!r}); use kv_cache_dtype='auto' there. Backend said: {exc}"
            ) from None

    def attention_backends_for(self, platform: Platform) -> list[str]:
        return [
            e.name
            for e in self.registries.attention_backends
            if "*" in e.obj.supported_platforms or platform.name in e.obj.supported_platforms
        ]

    def select_quantization(self, name: str, platform: Platform) -> type[QuantizationMethod]:
        cls = self.registries.quantization_methods.select(name, lambda c: Availability.yes())
        if "*" not in cls.supported_platforms and platform.name not in cls.supported_platforms:
            raise UnavailableError(
                f"quantization {name!r} does not run on device {platform.name!r} "
                f"(it supports: {', '.join(cls.supported_platforms)})"
            )
        return cls

    def resolve_quantization(
        self, name: str | None, quant_config: dict[str, Any] | None
    ) -> str | None:
        """The quantization method to run: ``name`` (the flag) when given, else the method
        that reads the checkpoint's ``quantization_config`` (vLLM's rule: a quantized
        checkpoint needs no flag); None for a plain checkpoint and no flag. A flag whose method
        cannot read the checkpoint's format is an error naming both; an unknown name lists the
        registered methods."""
        reg = self.registries.quantization_methods
        quant_method = (quant_config or {}).get("quant_method")
        if name:
            cls = reg.get(name)  # UnknownNameError lists the registered methods
            if quant_method and not cls.reads_checkpoint(str(quant_method)):
                raise ValueError(
                    f"quantization {name!r} was requested, but the checkpoint's "
                    f"quantization_config says quant_method={quant_method!r}; drop the flag "
                    "(the checkpoint selects its own method) or give a matching one"
                )
            return name
        if not quant_method:
            return None
        for entry in reg:
            if entry.obj.reads_checkpoint(str(quant_method)):
                return entry.name
        raise UnknownNameError(
            f"the checkpoint is quantized with quant_method={quant_method!r}, which no "
            f"installed quantization method reads; installed quantization methods: "
            f"{', '.join(reg.names()) or 'none'}"
        )

    def select_guided_backend(self, name: str) -> type[GuidedBackend]:
        """The backend called ``name``; ``auto``: the available one of highest priority."""
        return self.guided_backend_candidates(name)[0]

    def guided_backend_candidates(self, name: str) -> list[type[GuidedBackend]]:
        """``[backend]`` for a name; for ``auto`` every available backend, highest priority
        first (ties by name): the order in which a request falls back."""
        reg = self.registries.guided_backends
        if name == "auto":
            ranked = sorted(reg, key=lambda e: (-e.obj.priority, e.name))
            found = [e.obj for e in ranked if e.obj.is_available().available]
            if found:
                return found
            raise UnknownNameError(
                "guided decoding needs a guided-decoding backend; none is installed and "
                "available (install ironlm-guided: pip install ./plugins/guided). Installed: "
                + reg.explain_unavailable(lambda c: c.is_available())
            )
        if name not in reg:
            hint = "" if len(reg) else " (install ironlm-guided: pip install ./plugins/guided)"
            raise UnknownNameError(
                f"unknown guided_decoding_backend {name!r}; installed guided decoding "
                f"backends: {', '.join(reg.names()) or 'none'}{hint}"
            )
        return [reg.select(name, lambda c: c.is_available())]

    def select_tool_parser(self, name: str) -> type[ToolParser]:
        return self.registries.tool_parsers.get(name)

    def select_reasoning_parser(self, name: str) -> type[ReasoningParser]:
        reg = self.registries.reasoning_parsers
        if name not in reg:
            hint = "" if len(reg) else \
                " (install ironlm-toolparsers: pip install ./plugins/toolparsers)"
            raise UnknownNameError(
                f"unknown reasoning_parser {name!r}; installed reasoning parsers: "
                f"{', '.join(reg.names()) or 'none'}{hint}"
            )
        parser = reg.get(name)
        markers = (getattr(parser, "end_marker", None), getattr(parser, "start_marker", ""))
        if not (isinstance(markers[0], str) and markers[0]) or not isinstance(markers[1], str):
            raise ValueError(
                f"reasoning parser {name!r} ({reg.entry(name).provenance.describe()}) needs a "
                f"nonempty end_marker and a start_marker string, got {markers!r}"
            )
        return parser

    def select_logits_processor(self, name: str) -> type[LogitsProcessor]:
        return self.registries.logits_processors.get(name)

    def select_kv_connector(self, name: str, module_path: str | None = None) -> type[KVConnector]:
        """The KV connector ``name`` (kv_transfer_config's kv_connector): a registered one, or
        with ``module_path`` (vLLM's kv_connector_module_path) the class of that name there."""
        if module_path is None:
            return self.registries.kv_connectors.get(name)
        cls = import_class(f"{module_path}:{name}", "kv_transfer_config kv_connector")
        if not issubclass(cls, KVConnector):
            raise ValueError(f"kv_transfer_config kv_connector {name!r} in {module_path!r} is "
                             "not a subclass of ironlm.interfaces.kv_connector.KVConnector")
        return cls

    def select_executor(self, name: str) -> type[Executor]:
        return self.registries.executors.select(name, lambda c: c.is_available())

    def select_model(self, architectures: list[str]) -> type[ModelArchitecture]:
        reg = self.registries.models
        for arch in architectures:
            if arch in reg:
                return reg.get(arch)
        raise UnknownNameError(
            f"model architecture(s) {architectures} are not supported; registered "
            f"architectures: {', '.join(reg.names()) or 'none'}"
        )

    def select_speculative_proposer(
        self, speculative_model: str, model_type: str | None = None
    ) -> type[SpeculativeProposer]:
        """The proposer for ``speculative_model``: ``"[name]"`` names one; a model path goes to
        the proposer whose ``model_types`` holds ``model_type`` (the path's config.json),
        else to ``draft_model``."""
        reg = self.registries.speculative_proposers
        if speculative_model.startswith("[") and speculative_model.endswith("]"):
            name = speculative_model[1:-1]
            if name not in reg:
                named = sorted(f"[{e.name}]" for e in reg if not e.obj.needs_model)
                by_path = sorted(e.name for e in reg if e.obj.needs_model)
                raise UnknownNameError(
                    f"unknown speculative_model {speculative_model!r}; installed speculative "
                    f"proposers named in brackets: {', '.join(named) or 'none'}; given a "
                    f"model path: {', '.join(by_path) or 'none'}"
                )
            cls = reg.get(name)
            if cls.needs_model:
                raise ValueError(
                    f"speculative proposer {name!r} loads a model: pass the model's path as "
                    "speculative_model instead of its name"
                )
            return cls
        for entry in reg:
            if model_type is not None and model_type in entry.obj.model_types:
                return entry.obj
        return reg.get("draft_model")
