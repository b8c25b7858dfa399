"""Entry point of ironlm-guided: registers the guided-decoding backends.

Classes are imported inside the hook so that loading the plugin costs nothing; each backend
imports its library only when it is constructed (``is_available`` says whether it can be).
"""

from __future__ import annotations

from typing import Callable

from ironlm import hookimpl

IRONLM_CONTRACT_VERSION = "1.0"  # the plugin contract this module is written against


@hookimpl
def register_guided_backends(register: Callable[[type], None]) -> None:
    from ironlm_guided.lmfe_backend import LMFormatEnforcerBackend
    from ironlm_guided.outlines_backend import OutlinesBackend
    from ironlm_guided.xgrammar_backend import XGrammarBackend

    register(OutlinesBackend)
    register(LMFormatEnforcerBackend)
    register(XGrammarBackend)
