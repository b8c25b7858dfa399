"""vLLM's ``--disable-access-log-for-endpoints /health,/metrics``: no uvicorn access-log line
for requests to those paths (probes and scrapes every few seconds would drown the log), the
others logged as before."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit


def excluded_paths(text: str | None) -> frozenset[str]:
    """The flag's comma-separated paths (blanks dropped, spaces trimmed)."""
    return frozenset(p.strip() for p in (text or "").split(",") if p.strip())


class AccessLogFilter(logging.Filter):
    """Drops ``uvicorn.access`` records whose path (without its query) is excluded. uvicorn's
    access record args: (client address, method, path with query, HTTP version, status)."""

    def __init__(self, paths: frozenset[str]) -> None:
        super().__init__()
        self.paths = paths

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) < 3:
            return True
        return urlsplit(str(args[2])).path not in self.paths
