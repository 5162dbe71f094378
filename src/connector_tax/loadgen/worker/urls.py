"""The server URL, read the way curl reads it, checked before anything starts.

- No scheme: `http://` is assumed (`localhost:8000`, `[::1]:8000`, `10.0.0.5`).
- `http` defaults to port 80, `https` to 443; `https` is TLS through the standard library's
  `ssl` (certificates verified unless told otherwise, SNI set to the host name).
- IPv6 literals go in brackets; the Host header keeps the brackets and a non-default port.
- A path is a base the endpoint is appended to (`/v1/completions` or `/v1/chat/completions`),
  a base ending in `/v1` gets `/completions` or `/chat/completions` (an OpenAI client's base
  URL), and a path that already names an endpoint (ends in `/completions`) is used as given;
  a query string is kept, a fragment dropped (curl sends neither a fragment nor the `#`).
- User info (`user:pass@host`), other schemes, an empty host and a port outside 1–65535 are
  refused with one line naming the problem.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # without brackets, for connecting
    port: int
    host_header: str  # as sent in Host:
    path: str  # request target: path and query

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    def describe(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def parse_url(url: str, endpoint: str = "completions") -> Target:
    """A Target, or ValueError with one line that says what is wrong with the URL."""
    text = url.strip()
    if not text:
        raise ValueError("empty URL")
    if "://" not in text:
        text = "http://" + text  # curl's default
    try:
        parts = urlsplit(text)
        parts.hostname  # noqa: B018 - checks a bracketed host
    except ValueError as exc:
        raise ValueError(f"{url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"{url!r}: scheme {parts.scheme!r} is not supported (http or https)")
    if "@" in parts.netloc:
        raise ValueError(f"{url!r}: credentials in the URL are not supported (use --api-key-env)")
    host = parts.hostname
    if not host:
        raise ValueError(f"{url!r}: no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{url!r}: port {parts.netloc.rpartition(':')[2]!r} is not a number in 1-65535") from None
    if port is None:
        if parts.netloc.endswith(":"):
            raise ValueError(f"{url!r}: empty port")
        port = DEFAULT_PORTS[scheme]
    elif not 1 <= port <= 65535:
        raise ValueError(f"{url!r}: port {port} is not in 1-65535")
    if "[" in parts.netloc:
        try:
            ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            raise ValueError(f"{url!r}: {host!r} in brackets is not an IPv6 address") from None
    elif any(c in host for c in " /\\"):
        raise ValueError(f"{url!r}: bad host {host!r}")
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == DEFAULT_PORTS[scheme] else f"{shown}:{port}"
    path = _endpoint_path(parts.path, endpoint)
    if parts.query:
        path += "?" + parts.query
    return Target(scheme, host, port, host_header, path)


def _endpoint_path(base: str, endpoint: str) -> str:
    if endpoint not in ENDPOINT_PATHS:
        raise ValueError(f"endpoint {endpoint!r} is not one of {sorted(ENDPOINT_PATHS)}")
    base = base.rstrip("/")
    if base.endswith("/completions"):
        return base
    if base.endswith("/v1"):
        return base + ENDPOINT_PATHS[endpoint].removeprefix("/v1")
    return base + ENDPOINT_PATHS[endpoint]
