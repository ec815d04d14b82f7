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


# Not public, whatever ipaddress's is_global says (Python before 3.11.10 gets some wrong,
# CVE-2024-4032): special-purpose registries of IANA, multicast, IPv6 site-local.
NOT_PUBLIC = [ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
    "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
    "::/128", "::1/128", "100::/64", "2001::/23", "2001:db8::/32", "fc00::/7", "fe80::/10", "fec0::/10",
    "ff00::/8", "64:ff9b:1::/48",
)]  # fmt: skip
NAT64 = ipaddress.ip_network("64:ff9b::/96")
TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT's IPv4-translated, ::ffff:0:a.b.c.d
COMPATIBLE = ipaddress.ip_network(
    "::/96"
)  # IPv4-compatible IPv6, ::a.b.c.d (deprecated, still routed by some)


def _address(text: str) -> Address:
    return ipaddress.ip_address(text.split("%")[0])


def _carried(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries to its destination: mapped (::ffff:a.b.c.d),
    compatible (::a.b.c.d), translated (::ffff:0:a.b.c.d), NAT64 (64:ff9b::a.b.c.d), 6to4
    (2002:…) and Teredo's client."""
    if address.version != 6:
        return None
    if address.ipv4_mapped:
        return address.ipv4_mapped
    if address.sixtofour:
        return address.sixtofour
    if address.teredo:
        return address.teredo[1]
    if address in NAT64 or address in TRANSLATED or (address in COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_public(address: Address) -> bool:
    """Whether the address is one the open internet reaches, judged by what it carries too."""
    if (carried := _carried(address)) is not None:
        return is_public(carried)
    return address.is_global and not address.is_multicast and not any(address in net for net in NOT_PUBLIC)


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
    try:
        host = host.encode("idna").decode("ascii") if not host.isascii() else host  # bücher.example
    except UnicodeError:
        raise Refused("has a host that is not a valid name") from None
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError, ValueError):
        raise Refused("has a host that does not resolve") from None
    addresses = sorted({_address(info[4][0]) for info in infos}, key=lambda a: (a.version, int(a)))
    if not addresses:
        raise Refused("has a host that does not resolve")
    inside = [any(address in network for network in allowed) for address in addresses]
    for address, is_allowed in zip(addresses, inside, strict=True):
        if not is_allowed and not is_public(address):
            raise Refused("points to a loopback, private, link-local, multicast or reserved address")
    if parts.scheme == "http" and not all(inside):
        raise Refused("must be https")
    path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    return Target(parts.scheme, host, port, addresses[0], path)


def post(url: str, body: bytes, headers: dict[str, str], allowed: list[Network]) -> int:
    """POST the body to the URL's checked address; returns the HTTP status (a 3xx included).
    The answer's body is never read: a receiver that trickles or never ends it costs nothing.
    Each read waits TIMEOUT_S at most; the delivery task's time limit bounds the whole."""
    target = resolve(url, allowed)
    literal = f"[{target.address}]" if target.address.version == 6 else str(target.address)
    default_port = 443 if target.scheme == "https" else 80
    name = f"[{target.host}]" if ":" in target.host else target.host  # an IPv6 literal
    host_header = name if target.port == default_port else f"{name}:{target.port}"
    request_url = f"{target.scheme}://{literal}:{target.port}{target.path}"
    try:
        with (
            httpx.Client(timeout=TIMEOUT_S, follow_redirects=False, trust_env=False) as client,
            client.stream(
                "POST",
                request_url,
                content=body,
                headers={
                    "Host": host_header,
                    "Content-Type": "application/json",
                    "User-Agent": "gpu-portal-webhooks/1",
                    **headers,
                },
                extensions={"sni_hostname": target.host} if target.scheme == "https" else {},
            ) as response,
        ):
            return response.status_code
    except (httpx.HTTPError, OSError, ValueError, UnicodeError) as exc:
        raise NoAnswer(f"no answer: {type(exc).__name__}") from None
