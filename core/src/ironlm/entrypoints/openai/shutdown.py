"""A bounded, clean shutdown: SIGTERM (or SIGINT) drains, then aborts, then exits 0.

On the first signal the server stops accepting connections and new requests on open ones get
503; requests in flight run on for ``--timeout-graceful-shutdown`` seconds. Those still running
then end with an error event (a 503 body when not streamed), and the process exits with status
0, as a Kubernetes pod should within its grace period. A second SIGINT forces the exit.

uvicorn's own handler records the signal and raises it again after shutdown (exit 143 for
SIGTERM); this server handles it fully instead, so a drained shutdown is a clean exit.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn

from ironlm.engine.async_engine import ServerShuttingDownError
from ironlm.engine.engine_client import EngineClient
from ironlm.entrypoints.openai.ssl_refresh import CertificateWatcher

log = logging.getLogger("ironlm.server")
BACKSTOP_S = 10.0  # uvicorn's own wait for connections, past the grace period


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: EngineClient, grace: float,
                 certificates: CertificateWatcher | None = None) -> None:
        """``certificates``: reload the TLS files when they change (--enable-ssl-refresh)."""
        config.timeout_graceful_shutdown = int(grace + BACKSTOP_S)
        super().__init__(config)
        self.engine = engine
        self.grace = grace
        self.certificates = certificates
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False
        self._watching: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.certificates is not None:
            self._watching = asyncio.create_task(self.certificates.watch(lambda: self.config.ssl))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._watching is not None:
            self._watching.cancel()
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
            return
        self.should_exit = True
        if self._draining or self._loop is None:
            return
        self._draining = True
        self.engine.draining = True
        log.info("shutting down: %d sequence(s) in flight may run %g s more",
                 self.engine.num_in_flight, self.grace)
        self._loop.call_soon_threadsafe(self._loop.call_later, self.grace, self._abort_rest)

    def _abort_rest(self) -> None:
        if self.engine.num_in_flight:
            log.warning("grace period over: aborting %d sequence(s) still in flight",
                        self.engine.num_in_flight)
        self.engine.abort_all(ServerShuttingDownError(
            f"the server is shutting down: the request did not finish within the "
            f"{self.grace:g} s grace period (--timeout-graceful-shutdown)"
        ))
