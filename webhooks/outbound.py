"""Posting to a URL that a tenant chose, without reaching the portal's own network (SSRF).

The host is resolved once; every address it resolves to must be public (not loopback, private,
link-local — a cloud's metadata service at 169.254.169.254 included —, shared, reserved or
multicast) or inside a network a platform admin allowed (AllowedRange). The connection then goes
to the address that was checked, with the host name kept for the Host header and TLS (SNI and
the certificate's name): a name that resolves elsewhere a moment later (DNS rebinding) changes
nothing. https only, unless the address is in an allowed network. A redirect is an answer, not
followed. Neither the URL nor an answer's body is ever written to a log or an error."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

TIMEOUT_S = 10.0
SIGNATURE_HEADER = "X-Portal-Signature"
TIMESTAMP_HEADER = "X-Portal-Timestamp"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(Exception):
    """The URL may not be posted to; the message names why, never the URL."""


class NoAnswer(Exception):
    """The destination did not answer (refused, timed out, TLS failed); never names the URL."""


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """sha256=HMAC-SHA256(secret, "<timestamp>." + body), hex: what X-Portal-Signature carries."""
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def _address(text: str) -> Address:
    address = ipaddress.ip_address(text.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    return address


def allowed_networks(cidrs: list[str]) -> list[Network]:
    return [ipaddress.ip_network(cidr, strict=False) for cidr in cidrs]


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    address: Address
    path: str  # path and query


def resolve(url: str, allowed: list[Network]) -> Target:
    """The checked destination of the URL, or Refused saying why."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        raise Refused("is not a URL") from None
    if parts.scheme not in ("https", "http"):
        raise Refused("must be https")
    if parts.username or parts.password:
        raise Refused("must not hold a user or password")
    if not host:
        raise Refused("has no host")
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        raise Refused("has a host that does not resolve") from None
    addresses = sorted({_address(info[4][0]) for info in infos}, key=lambda a: (a.version, int(a)))
    if not addresses:
        raise Refused("has a host that does not resolve")
    inside = [any(address in network for network in allowed) for address in addresses]
    for address, is_allowed in zip(addresses, inside, strict=True):
        if not address.is_global and not is_allowed:
            raise Refused("points to a loopback, private, link-local or reserved address")
    if parts.scheme == "http" and not all(inside):
        raise Refused("must be https")
    path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    return Target(parts.scheme, host, port, addresses[0], path)


def post(url: str, body: bytes, headers: dict[str, str], allowed: list[Network]) -> int:
    """POST the body to the URL's checked address; returns the HTTP status (a 3xx included)."""
    target = resolve(url, allowed)
    literal = f"[{target.address}]" if target.address.version == 6 else str(target.address)
    default_port = 443 if target.scheme == "https" else 80
    host_header = target.host if target.port == default_port else f"{target.host}:{target.port}"
    request_url = f"{target.scheme}://{literal}:{target.port}{target.path}"
    try:
        with httpx.Client(timeout=TIMEOUT_S, follow_redirects=False, trust_env=False) as client:
            response = client.post(
                request_url,
                content=body,
                headers={
                    "Host": host_header,
                    "Content-Type": "application/json",
                    "User-Agent": "gpu-portal-webhooks/1",
                    **headers,
                },
                extensions={"sni_hostname": target.host} if target.scheme == "https" else {},
            )
            return response.status_code
    except httpx.HTTPError as exc:
        raise NoAnswer(f"no answer: {type(exc).__name__}") from None
