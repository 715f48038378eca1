"""How FiloPy's HTTP servers listen: uvicorn's options from the settings, TLS included.

One place for `filopy serve`, `filopy head`, `filopy up` and `filopy gateway`, so a setting such
as a certificate applies to every server the same way (docs/security.md).
"""

from __future__ import annotations

import ssl
from typing import Any

from core.config import Settings


def scheme(settings: Settings) -> str:
    """`https` when the servers serve TLS, else `http` (for the URLs they print)."""
    return "https" if settings.tls.enabled else "http"


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's keyword arguments for TLS (none for plain HTTP); with a client CA, a client
    must present a certificate that CA signed."""
    tls = settings.tls
    if not tls.enabled:
        return {}
    options: dict[str, Any] = {"ssl_certfile": tls.cert_file, "ssl_keyfile": tls.key_file}
    if tls.client_ca_file:
        options |= {"ssl_ca_certs": tls.client_ca_file, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options
