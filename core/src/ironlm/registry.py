"""Registries keyed by name, with provenance and selection errors that explain themselves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Iterator, TypeVar

from ironlm.interfaces.platform import Availability

T = TypeVar("T")


class PluginClashError(RuntimeError):
    """Two plugins registered the same name for the same kind."""


class UnknownNameError(ValueError):
    """A name was selected that no installed plugin registered."""


class UnavailableError(ValueError):
    """A registered item was selected but cannot run here (its own reason is in the message)."""


@dataclass(frozen=True)
class Provenance:
    """Where a registered item came from."""

    plugin: str  # the plugin's registration name (entry-point name, or "ironlm" for built-ins)
    distribution: str | None  # the installed distribution that declared it
    version: str | None  # that distribution's version

    def describe(self) -> str:
        dist = f"{self.distribution} {self.version}" if self.distribution else "no distribution"
        return f"plugin {self.plugin!r} ({dist})"


@dataclass(frozen=True)
class Entry(Generic[T]):
    kind: str
    name: str
    obj: T
    provenance: Provenance


class Registry(Generic[T]):
    """Items of one kind (platform, attention_backend, ...) keyed by name."""

    def __init__(self, kind: str, flag: str) -> None:
        self.kind = kind
        self.flag = flag  # the user-facing selector, used in error messages
        self._entries: dict[str, Entry[T]] = {}

    def add(self, name: str, obj: T, provenance: Provenance) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{provenance.describe()} registered a {self.kind} without a name")
        old = self._entries.get(name)
        if old is not None:
            raise PluginClashError(
                f"{self.kind} {name!r} is registered twice: by {old.provenance.describe()} "
                f"and by {provenance.describe()}; uninstall one of them or narrow "
                "IRONLM_PLUGINS"
            )
        self._entries[name] = Entry(self.kind, name, obj, provenance)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            installed = ", ".join(self.names()) or "none"
            raise UnknownNameError(
                f"unknown {self.flag} {name!r}; installed {self.kind}s: {installed}"
            ) from None

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def select(self, name: str, availability: Callable[[T], Availability]) -> T:
        """The item called ``name``, if it can run here; else UnknownNameError/UnavailableError."""
        obj = self.get(name)
        status = availability(obj)
        if not status.available:
            raise UnavailableError(f"{self.flag} {name!r} is unavailable: {status.reason}")
        return obj

    def explain_unavailable(self, availability: Callable[[T], Availability]) -> str:
        """One line per item: its name and availability (for error messages)."""
        parts = []
        for e in self:
            status = availability(e.obj)
            parts.append(f"{e.name} ({'available' if status.available else status.reason})")
        return "; ".join(parts) or "none installed"
