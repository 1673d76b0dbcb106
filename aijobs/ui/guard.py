"""What every request passes before a page sees it, and what every answer carries (docs/ui.md, Security).

- The Host header must name this server (a loopback name, or the address it was bound to): a page
  on another site whose name an attacker points at 127.0.0.1 (DNS rebinding) is refused with 421.
- A request that may change something (any method but GET and HEAD) must come from a page of this
  server: its Origin, or without one its Sec-Fetch-Site, or without both its Referer, says so;
  otherwise 403. Browsers set these headers themselves, so a page elsewhere cannot forge them.
- Every answer carries a Content-Security-Policy that runs no inline script or style and loads
  nothing from elsewhere, nosniff, no referrer, no framing, no caching of job data, and
  Server-Timing (the time the app took, which `make bench` reads).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "frame-ancestors 'none'",
        "form-action 'self'",
        "base-uri 'none'",
    ]
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
_READS = frozenset({"GET", "HEAD"})


def host_name(host: str) -> str | None:
    """The name in a Host header (`127.0.0.1:8765` -> `127.0.0.1`, `[::1]:80` -> `::1`), lower case."""
    try:
        return urlsplit(f"//{host}").hostname
    except ValueError:
        return None


def same_origin(headers: Headers, host: str) -> bool:
    """Whether the browser says the request comes from a page of `http://<host>` (this server).

    Under `Referrer-Policy: no-referrer` a browser sends `Origin: null` even for a form of this
    server, so "null" counts as no Origin, and Sec-Fetch-Site decides.
    """
    ours = f"http://{host}"
    origin = headers.get("origin")
    if origin and origin != "null":
        return origin == ours
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site:
        return fetch_site == "same-origin"
    referer = headers.get("referer")
    if referer:
        parts = urlsplit(referer)
        return f"{parts.scheme}://{parts.netloc}" == ours
    return False


class Guard:
    """ASGI middleware: the Host and same-origin checks, and the security headers on every answer."""

    def __init__(self, app: ASGIApp, hosts: Iterable[str] = LOOPBACK_NAMES) -> None:
        self.app = app
        self.hosts = frozenset(host.lower() for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                headers.setdefault("cache-control", "no-store")
                headers["server-timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
            await send(message)

        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if host_name(host) not in self.hosts:
            refused = PlainTextResponse(
                f"421 this dashboard answers to {', '.join(sorted(self.hosts))} only, not {host[:100]!r}\n", 421
            )
            await refused(scope, receive, send_with_headers)
            return
        if scope["method"] not in _READS and not same_origin(headers, host):
            refused = PlainTextResponse("403 refused: the request does not come from a page of this dashboard\n", 403)
            await refused(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)
