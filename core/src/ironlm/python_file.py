"""Importing a user's single Python file by its path (start-up flags that name a file:
``--tool-parser-plugin``, ``--tokenizer-extension-path``); no dotted module names."""

from __future__ import annotations

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
