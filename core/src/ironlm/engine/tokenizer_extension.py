"""``--tokenizer-extension-path``: a Python file that customises the tokenizer at start-up.

The contract: the file defines ``extend_tokenizer(tokenizer) -> tokenizer``. It is imported
from its path (importlib, no dotted names) and called once, right after the engine loads the
HF tokenizer; what it returns is the tokenizer the whole engine and server use (prompt
tokenization, chat template, detokenization, stop strings, guided decoding, tool parsers).
A missing file, a file without the function, an import error, an exception inside the
function or a returned ``None`` stops start-up with a ValueError naming the flag.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ironlm.python_file import import_python_file

FLAG = "tokenizer_extension_path (--tokenizer-extension-path)"
FUNCTION = "extend_tokenizer"


def load_tokenizer_extension(path: str) -> Callable[[Any], Any]:
    """The file's ``extend_tokenizer`` function (the file is imported, nothing is called)."""
    function = getattr(import_python_file(path, FLAG), FUNCTION, None)
    if not callable(function):  # a ValueError, as every start-up error `serve` reports
        raise ValueError(  # noqa: TRY004
            f"{FLAG} {path!r} defines no function {FUNCTION}(tokenizer) -> tokenizer"
        )
    return function


def extend_tokenizer(tokenizer: Any, path: str) -> Any:
    """The tokenizer as the file's ``extend_tokenizer`` returns it (called once)."""
    function = load_tokenizer_extension(path)
    try:
        extended = function(tokenizer)
    except Exception as exc:  # the user's code failed: a start-up error
        raise ValueError(
            f"{FLAG} {path!r}: {FUNCTION} raised {type(exc).__name__}: {exc}"
        ) from exc
    if extended is None or not callable(getattr(extended, "encode", None)):
        raise ValueError(
            f"{FLAG} {path!r}: {FUNCTION} must return the tokenizer, got {type(extended).__name__}"
        )
    return extended
