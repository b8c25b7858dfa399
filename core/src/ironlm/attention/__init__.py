"""Core attention: the pure-torch reference backend and batch-building helpers."""
