"""vLLM's --disable-access-log-for-endpoints: the real server logs no access line for the
listed paths (a query string does not matter), and every other request as before."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx
import pytest
from server_utils import RemoteServer

from ironlm.entrypoints.openai.access_log import AccessLogFilter, excluded_paths


def _record(path: str) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                             ("127.0.0.1:5000", "GET", path, "1.1", 200), None)


def test_filter_drops_the_listed_paths_only() -> None:
    quiet = AccessLogFilter(excluded_paths(" /health, /metrics ,,"))
    assert quiet.paths == {"/health", "/metrics"}
    assert not quiet.filter(_record("/health"))
    assert not quiet.filter(_record("/metrics?name=x"))
    assert quiet.filter(_record("/healthz"))
    assert quiet.filter(_record("/v1/models"))
    other = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, "no args", None, None)
    assert quiet.filter(other)
    assert excluded_paths(None) == frozenset()


@pytest.mark.server
def test_server_leaves_the_listed_endpoints_out_of_its_access_log(tiny_llama_dir: Path) -> None:
    args = ["--max-model-len", "128", "--kv-cache-memory", "16MiB", "--disable-log-stats",
            "--disable-access-log-for-endpoints", "/health,/metrics"]
    with RemoteServer(tiny_llama_dir, args) as server:
        for path in ("/health", "/metrics?x=1", "/v1/models", "/health"):
            assert httpx.get(server.url(path)).status_code == 200
        deadline = time.monotonic() + 10
        while '"GET /v1/models' not in server.log_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        log = server.log_text()
    assert '"GET /v1/models HTTP/1.1" 200' in log
    assert '"GET /health' not in log and '"GET /metrics' not in log
