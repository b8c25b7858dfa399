"""Plugin discovery and the registries built from the hooks.

One ``PluginManager`` per process that needs plugins (CLI, server, engine, each worker); nothing
is stored in module globals. Construction is cheap and safe to repeat: discovery loads entry
points once per manager, and registries are filled on first use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from ironlm import hookspecs
from ironlm.contract_version import PluginContractError, incompatibility
from ironlm.interfaces import (
    AttentionBackend,
    Executor,
    GuidedBackend,
    LogitsProcessor,
    ModelArchitecture,
    Platform,
    QuantizationMethod,
    ReasoningParser,
    SpeculativeProposer,
    ToolParser,
)
from ironlm.interfaces.platform import Availability
from ironlm.registry import Provenance, Registry, UnavailableError, UnknownNameError

ENTRY_POINT_GROUP = "ironlm"
# The core's own plugin (ironlm.builtin_plugin), declared by the ironlm distribution in the same
# entry-point group as every other plugin and always loaded, whatever the allow-list says.
BUILTIN_PLUGIN = "ironlm"


@dataclass
class Registries:
    """Every registry, filled from the hooks."""

    platforms: Registry[type[Platform]] = field(
        default_factory=lambda: Registry("platform", "device")
    )
    attention_backends: Registry[type[AttentionBackend]] = field(
        default_factory=lambda: Registry("attention backend", "attention_backend")
    )
    quantization_methods: Registry[type[QuantizationMethod]] = field(
        default_factory=lambda: Registry("quantization method", "quantization")
    )
    guided_backends: Registry[type[GuidedBackend]] = field(
        default_factory=lambda: Registry("guided decoding backend", "guided_decoding_backend")
    )
    tool_parsers: Registry[type[ToolParser]] = field(
        default_factory=lambda: Registry("tool parser", "tool_call_parser")
    )
    reasoning_parsers: Registry[type[ReasoningParser]] = field(
        default_factory=lambda: Registry("reasoning parser", "reasoning_parser")
    )
    executors: Registry[type[Executor]] = field(
        default_factory=lambda: Registry("executor", "distributed_executor_backend")
    )
    models: Registry[type[ModelArchitecture]] = field(
        default_factory=lambda: Registry("model architecture", "architecture")
    )
    speculative_proposers: Registry[type[SpeculativeProposer]] = field(
        default_factory=lambda: Registry("speculative proposer", "speculative_model")
    )
    logits_processors: Registry[type[LogitsProcessor]] = field(
        default_factory=lambda: Registry("logits processor", "logits_processors")
    )


# hook name -> (Registries attribute, base class the registered object must subclass)
_HOOKS: dict[str, tuple[str, type]] = {
    "register_platforms": ("platforms", Platform),
    "register_attention_backends": ("attention_backends", AttentionBackend),
    "register_quantization_methods": ("quantization_methods", QuantizationMethod),
    "register_guided_backends": ("guided_backends", GuidedBackend),
    "register_tool_parsers": ("tool_parsers", ToolParser),
    "register_reasoning_parsers": ("reasoning_parsers", ReasoningParser),
    "register_executors": ("executors", Executor),
    "register_models": ("models", ModelArchitecture),
    "register_speculative_proposers": ("speculative_proposers", SpeculativeProposer),
    "register_logits_processors": ("logits_processors", LogitsProcessor),
}


def _env_allow_list() -> list[str] | None:
    raw = os.environ.get("IRONLM_PLUGINS")
    if raw is None or not raw.strip():
        return None
    return [n.strip() for n in raw.split(",") if n.strip()]


def _env_autoload() -> bool:
    return os.environ.get("IRONLM_DISABLE_PLUGIN_AUTOLOAD", "").strip().lower() not in (
        "1",
        "true",
        "yes",
    )


class PluginManager:
    """Discovers plugins and exposes the registries and selection-by-name.

    :param autoload: load entry points of group ``ironlm`` (default: unless
        ``IRONLM_DISABLE_PLUGIN_AUTOLOAD=1``). The core's own plugin is always loaded.
    :param allow: entry-point names to load (default: ``IRONLM_PLUGINS=a,b``, else all).
    :param plugins: extra plugin objects to register (name -> module/object), e.g. in tests.

    A plugin written for another contract version (``ironlm.hookspecs``) is not registered;
    it is listed in ``incompatible`` and ``check_compatible()`` raises naming it.
    """

    def __init__(
        self,
        *,
        autoload: bool | None = None,
        allow: list[str] | None = None,
        plugins: dict[str, object] | None = None,
    ) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self._dists: dict[str, tuple[str | None, str | None]] = {}
        # plugin name -> why it was not loaded (another contract version)
        self.incompatible: dict[str, str] = {}
        self._registries: Registries | None = None
        self.load_entrypoints([BUILTIN_PLUGIN])
        if BUILTIN_PLUGIN not in self.plugin_names():
            raise PluginContractError(
                "the core's own plugin is missing: the ironlm distribution is not installed "
                "(pip install ./core), so its entry point 'ironlm' cannot be found"
            )
        if autoload if autoload is not None else _env_autoload():
            self.load_entrypoints(allow if allow is not None else _env_allow_list())
        for name, plugin in (plugins or {}).items():
            self.register(plugin, name)

    # -- discovery -------------------------------------------------------------------------
    def load_entrypoints(self, allow: list[str] | None = None) -> None:
        """Load plugins of the ``ironlm`` entry-point group (idempotent); ``allow``: only
        these entry-point names."""
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if allow is not None and ep.name not in allow:
                continue
            if self.pm.get_plugin(ep.name) is not None or ep.name in self.incompatible:
                continue
            dist = ep.dist
            self._dists[ep.name] = (
                dist.metadata["name"] if dist else None, dist.version if dist else None
            )
            plugin = ep.load()
            reason = incompatibility(plugin, required=True)
            if reason is not None:
                self.incompatible[ep.name] = reason
                continue
            self.pm.register(plugin, name=ep.name)
        self.pm.check_pending()
        self._registries = None

    def register(self, plugin: object, name: str) -> None:
        """Register a plugin object directly (tests, single-file plugins)."""
        reason = incompatibility(plugin, required=False)
        if reason is not None:
            raise PluginContractError(f"plugin {name!r} {reason}")
        if self.pm.get_plugin(name) is None:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
            self._dists.setdefault(name, (None, None))
        self._registries = None

    def check_compatible(self) -> None:
        """Raise PluginContractError naming every installed plugin written for another
        contract version (called at engine and server start-up)."""
        if self.incompatible:
            lines = [f"{self.provenance(n).describe()} {why}"
                     for n, why in self.incompatible.items()]
            raise PluginContractError(
                "installed plugin(s) do not fit this core's plugin contract "
                f"{hookspecs.CONTRACT_VERSION}: " + "; ".join(lines)
            )

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self._dists.pop(name, None)
        self._registries = None

    def plugin_names(self) -> list[str]:
        return [n for n, _ in self.pm.list_name_plugin()]

    def provenance(self, plugin_name: str) -> Provenance:
        dist, version = self._dists.get(plugin_name, (None, None))
        return Provenance(plugin_name, dist, version)

    # -- registries ------------------------------------------------------------------------
    @property
    def registries(self) -> Registries:
        if self._registries is None:
            self._registries = self._collect()
        return self._registries

    def _collect(self) -> Registries:
        regs = Registries()
        for hook_name, (attr, base) in _HOOKS.items():
            registry: Registry[Any] = getattr(regs, attr)
            caller = getattr(self.pm.hook, hook_name)
            for impl in caller.get_hookimpls():
                prov = self.provenance(impl.plugin_name)
                impl.function(register=_registrar(registry, base, prov, hook_name == "register_models"))
        return regs

    # -- selection -------------------------------------------------------------------------
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

    # -- listing ---------------------------------------------------------------------------
    def describe(self) -> list[dict[str, Any]]:
        """One dict per plugin: name, distribution, version, registered items (kind:name), and
        each registered platform's / backend's availability with reason."""
        regs = self.registries
        rows: dict[str, dict[str, Any]] = {}
        for name in self.plugin_names():
            prov = self.provenance(name)
            rows[name] = {
                "plugin": name,
                "distribution": prov.distribution,
                "version": prov.version,
                "contract": getattr(self.pm.get_plugin(name), hookspecs.CONTRACT_ATTRIBUTE, None),
                "registered": [],
            }
        for name, why in self.incompatible.items():
            prov = self.provenance(name)
            rows[name] = {
                "plugin": name,
                "distribution": prov.distribution,
                "version": prov.version,
                "incompatible": why,
                "registered": [],
            }
        for attr in _HOOKS.values():
            registry: Registry[Any] = getattr(regs, attr[0])
            for e in registry:
                item: dict[str, Any] = {"kind": registry.kind, "name": e.name}
                status = _availability_of(attr[0], e.obj)
                if status is not None:
                    item["available"] = status.available
                    item["reason"] = status.reason
                details = _details_of(attr[0], e.obj)
                if details:
                    item["details"] = details
                rows[e.provenance.plugin]["registered"].append(item)
        return list(rows.values())


def _availability_of(attr: str, obj: Any) -> Availability | None:
    try:
        if attr == "platforms":
            return obj().is_available()
        if attr in ("attention_backends", "guided_backends", "executors"):
            return obj.is_available()
    except Exception as exc:  # a plugin's availability check must never break the listing
        return Availability.no(f"availability check failed: {exc!r}")
    return None


def _details_of(attr: str, obj: Any) -> dict[str, Any]:
    """A platform's ``describe()`` (empty for other kinds, or when it fails)."""
    if attr != "platforms":
        return {}
    try:
        details = obj().describe()
    except Exception as exc:  # a plugin's description must never break the listing
        return {"error": f"describe() failed: {exc!r}"}
    return details if isinstance(details, dict) else {}


def _registrar(
    registry: Registry[Any], base: type, prov: Provenance, keyed: bool
) -> Callable[..., None]:
    """The ``register`` callback handed to one plugin's hook implementation."""

    def register(*args: Any) -> None:
        if keyed:  # register_models(register): register(arch_name, cls)
            name, obj = args
        else:
            (obj,) = args
            name = getattr(obj, "name", None)
        if not (isinstance(obj, type) and issubclass(obj, base)):
            raise TypeError(
                f"{prov.describe()} registered {obj!r} as a {registry.kind}, "
                f"but it is not a subclass of {base.__module__}.{base.__qualname__}"
            )
        registry.add(name, obj, prov)

    return register


