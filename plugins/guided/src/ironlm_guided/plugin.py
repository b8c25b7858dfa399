"""Entry point of ironlm-guided: registers guided-decoding backends."""

from __future__ import annotations
