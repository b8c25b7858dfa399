"""Whether a plugin's declared contract version fits the core's (``hookspecs.CONTRACT_VERSION``)."""

from __future__ import annotations

from ironlm.hookspecs import CONTRACT_ATTRIBUTE, CONTRACT_VERSION


class PluginContractError(RuntimeError):
    """An installed plugin was written for another version of the contract."""


def parse_version(text: str) -> tuple[int, int]:
    """"MAJOR.MINOR" -> (major, minor); ValueError for anything else."""
    major, _, minor = text.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ValueError(f"contract version {text!r} is not MAJOR.MINOR")
    return int(major), int(minor)


def incompatibility(plugin: object, required: bool) -> str | None:
    """Why ``plugin`` (a module or object) cannot be loaded, or None when it can. ``required``:
    a missing declaration is itself a reason (installed distributions)."""
    declared = getattr(plugin, CONTRACT_ATTRIBUTE, None)
    if declared is None:
        if not required:
            return None
        return (f"declares no contract version (set {CONTRACT_ATTRIBUTE} = "
                f'"{CONTRACT_VERSION}" in the plugin module)')
    try:
        major, minor = parse_version(str(declared))
    except ValueError as exc:
        return str(exc)
    core_major, core_minor = parse_version(CONTRACT_VERSION)
    if major != core_major or minor > core_minor:
        return (f"was written for contract {declared}, this core provides {CONTRACT_VERSION} "
                f"(compatible: {core_major}.0 to {CONTRACT_VERSION}); install a matching "
                "version of the plugin or of ironlm")
    return None
