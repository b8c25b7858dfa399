"""Importing a user's code: a single Python file by its path (start-up flags that name a
file: ``--tool-parser-plugin``, ``--tokenizer-extension-path``), or a class by vLLM's
"module.Class" name where vLLM takes one (``worker_extension_cls``, ``logits_processors``:
worker processes must import the same class, which a file loaded by path is not)."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType


def import_python_file(path: str, flag: str) -> ModuleType:
    """The module in ``path``; ValueError naming ``flag`` when the file is missing, is not
    Python, or fails to import."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{flag} {path!r} is not a file")
    name = "ironlm_user_" + "".join(c if c.isalnum() else "_" for c in file.stem)
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ValueError(f"{flag} {path!r} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # any import failure is the file's: say so
        raise ValueError(f"{flag} {path!r} failed to import: {type(exc).__name__}: {exc}") \
            from exc
    return module


def import_class(qualified_name: str, what: str) -> type:
    """The class ``qualified_name`` names: "package.module.Class", or vLLM's
    "package.module:Outer.Class" (``--logits-processors``); ValueError naming ``what`` when
    the module does not import or holds no such class."""
    if ":" in qualified_name:
        module_name, _, class_path = qualified_name.partition(":")
    else:
        module_name, _, class_path = qualified_name.rpartition(".")
    if not module_name or not class_path:
        raise ValueError(f"{what} {qualified_name!r} is not a 'module.Class' name")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is the module's: say so
        raise ValueError(f"{what} {qualified_name!r}: module {module_name!r} failed to "
                         f"import: {type(exc).__name__}: {exc}") from exc
    found: object = module
    for attr in class_path.split("."):
        found = getattr(found, attr, None)
    if not isinstance(found, type):
        raise ValueError(f"{what} {qualified_name!r}: module {module_name!r} has no class "
                         f"{class_path!r}")
    return found
