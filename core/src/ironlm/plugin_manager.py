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
from ironlm.plugin_selection import PluginSelection
from ironlm.registry import Provenance, Registry

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
    kv_connectors: Registry[type[KVConnector]] = field(
        default_factory=lambda: Registry("KV connector", "kv_connector")
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
    "register_kv_connectors": ("kv_connectors", KVConnector),
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


class PluginManager(PluginSelection):
    """Discovers plugins and exposes the registries (selection by name: ``PluginSelection``).

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


