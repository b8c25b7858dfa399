"""Entry point of ironlm-toolparsers: registers tool-call parsers."""

from __future__ import annotations
