"""The serving TLS context, and certificate files reloaded in place.

Like controller-runtime's certwatcher: the files are checked every few seconds; a change builds a new
SSL context that each new handshake switches to through the SNI callback, so the listener is never
restarted and connections in flight are never dropped. Files that do not load keep the old context.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from pathlib import Path

from .. import certs
from ..metrics import Metrics

__all__ = ["tls_context"]

logger = logging.getLogger("hami_mt_webhook")

CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def tls_context(certfile: str | Path, keyfile: str | Path,
                client_ca: str | Path | None = None) -> ssl.SSLContext:
    """TLS 1.2 at least (1.3 preferred), forward-secret AEAD ciphers, HTTP/1.1 only.

    No session tickets: their key would live as long as the process, and the API server keeps its
    connections open rather than resuming sessions.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_TICKET
    ctx.num_tickets = 0  # TLS 1.3 sends tickets unless told not to
    ctx.set_alpn_protocols(["http/1.1"])
    ctx.load_cert_chain(str(certfile), str(keyfile))
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=str(client_ca))
    return ctx


class CertReloader:
    """The current SSL context for a certificate, key and optional client CA, swapped when the files
    change."""

    def __init__(self, certfile: str, keyfile: str, client_ca: str | None, metrics: Metrics) -> None:
        self.certfile, self.keyfile, self.client_ca = certfile, keyfile, client_ca
        self.metrics = metrics
        self.current: ssl.SSLContext | None = None
        self._digest = b""

    def load(self) -> ssl.SSLContext:
        """The first context; files that do not load raise, so a bad start fails loudly."""
        self._digest = self._files_digest()
        self.current = self._context()
        self._note_expiry()
        return self.current

    def reload(self) -> bool:
        """Load changed files; keep serving the old ones if the new ones do not load. True when swapped."""
        try:
            digest = self._files_digest()
            if digest == self._digest:
                return False
            fresh = self._context()
        except (OSError, ssl.SSLError, ValueError) as err:
            logger.error("certificate files changed but do not load (%s); still serving the previous ones",
                         err)
            self.metrics.cert_reloads.labels("failed").inc()
            return False
        self.current, self._digest = fresh, digest
        self._note_expiry()
        self.metrics.cert_reloads.labels("loaded").inc()
        logger.info("serving a renewed certificate from %s", self.certfile)
        return True

    def _context(self) -> ssl.SSLContext:
        ctx = tls_context(self.certfile, self.keyfile, self.client_ca)
        ctx.sni_callback = self._pick_context
        return ctx

    def _pick_context(self, sslobj: ssl.SSLObject, server_name: str | None, _ctx: ssl.SSLContext) -> None:
        if self.current is not None and sslobj.context is not self.current:
            sslobj.context = self.current

    def _files_digest(self) -> bytes:
        h = hashlib.sha256()
        for name in (self.certfile, self.keyfile, self.client_ca):
            if name:
                h.update(Path(name).read_bytes())
        return h.digest()

    def _note_expiry(self) -> None:
        try:
            self.metrics.cert_expiry.set(certs.expiry(Path(self.certfile)).timestamp())
        except (OSError, ValueError):
            pass
