"""vLLM's ``--enable-ssl-refresh``: a server started with ``--ssl-keyfile`` / ``--ssl-certfile``
(and ``--ssl-ca-certs``) picks up new files without a restart, as a certificate manager
(cert-manager, a renewal cron job) rewrites them.

The files are polled (vLLM watches them with watchfiles; polling needs no package): when one
changes, the new key and certificate are first loaded into a scratch context, so a half-written
pair (the certificate renewed, the key not yet) is skipped until it matches, and only then into
the server's own ``SSLContext``: new connections get the new certificate, open ones keep theirs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable

log = logging.getLogger("ironlm.server")

POLL_S = 1.0


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:  # being replaced: look again at the next poll
        return None
    return st.st_mtime_ns, st.st_size


class CertificateWatcher:
    def __init__(self, keyfile: str, certfile: str, ca_certs: str | None) -> None:
        self.keyfile, self.certfile, self.ca_certs = keyfile, certfile, ca_certs
        self._stamps = self._read_stamps()

    def _files(self) -> list[str]:
        return [self.keyfile, self.certfile, *([self.ca_certs] if self.ca_certs else [])]

    def _read_stamps(self) -> list[tuple[int, int] | None]:
        return [_stamp(path) for path in self._files()]

    def reload_if_changed(self, context: ssl.SSLContext) -> bool:
        """Load the files into ``context`` if they changed since the last load and form a
        valid pair; whether it did."""
        stamps = self._read_stamps()
        if stamps == self._stamps or None in stamps:
            return False
        try:
            scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            scratch.load_cert_chain(self.certfile, self.keyfile)
            if self.ca_certs:
                scratch.load_verify_locations(self.ca_certs)
        except (ssl.SSLError, OSError) as exc:  # mid-rewrite: try again at the next poll
            log.warning("--enable-ssl-refresh: the changed certificate files do not load yet "
                        "(%s); the server keeps its certificate", exc)
            return False
        context.load_cert_chain(self.certfile, self.keyfile)
        if self.ca_certs:
            context.load_verify_locations(self.ca_certs)
        self._stamps = stamps
        log.info("--enable-ssl-refresh: loaded the new certificate from %s", self.certfile)
        return True

    async def watch(self, context: Callable[[], ssl.SSLContext | None]) -> None:
        """Poll until cancelled; ``context()`` is the server's SSLContext (None until the
        server has loaded its configuration)."""
        while True:
            await asyncio.sleep(POLL_S)
            ctx = context()
            if ctx is not None:
                self.reload_if_changed(ctx)
