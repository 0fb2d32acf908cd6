"""Fetching an image a client named by http(s) URL: only where the node's user allows it
(SHOAL_FETCH_IMAGES=on; off by default), bounded in bytes and time, and never to a
private, loopback or link-local address unless that network is allowed
(SHOAL_FETCH_IMAGES_PRIVATE, CIDRs). Each name is resolved once, every address checked,
and the connection made to a checked one (no DNS rebinding); each redirect is checked
again."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.resolver import ThreadedResolver
from yarl import URL

from engine.errors import BadRequest

MAX_BYTES = 20 * 2**20  # one image's encoded bytes, fetched or inline (images.py)
TIMEOUT_S = 10.0  # the whole fetch, redirects included
MAX_REDIRECTS = 5
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Policy:
    allowed: bool = False
    private: tuple[Network, ...] = ()  # private networks that may be fetched from
    timeout_s: float = TIMEOUT_S
    max_bytes: int = MAX_BYTES


def policy_from_env() -> Policy:
    """The node's setting: SHOAL_FETCH_IMAGES=on allows public URLs; SHOAL_FETCH_IMAGES_PRIVATE
    (comma-separated CIDRs, e.g. 192.168.1.0/24) adds private networks."""
    on = os.environ.get("SHOAL_FETCH_IMAGES", "off").strip().lower() in ("on", "1", "true")
    nets = []
    for part in os.environ.get("SHOAL_FETCH_IMAGES_PRIVATE", "").split(","):
        if part.strip():
            try:
                nets.append(ipaddress.ip_network(part.strip(), strict=False))
            except ValueError:
                continue  # a typo allows nothing more
    return Policy(allowed=on, private=tuple(nets))


def refusal(host: str, addr: str, policy: Policy) -> str | None:
    """Why `addr` (what `host` resolved to) may not be fetched from, or None."""
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_global and not ip.is_multicast:
        return None
    if any(ip in n for n in policy.private):
        return None
    return (f"{host} is a private, loopback or link-local address ({ip}); this node "
            "fetches images only from public addresses (SHOAL_FETCH_IMAGES_PRIVATE allows "
            "a network)")


class CheckedResolver(ThreadedResolver):
    """Resolves once and refuses the name if any of its addresses is not allowed; aiohttp
    connects to the addresses returned, so a second lookup can't swap them."""

    def __init__(self, policy: Policy):
        super().__init__()
        self.policy = policy
        self.refused: str | None = None

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[Any]:
        found = await super().resolve(host, port, family)
        for r in found:
            why = refusal(host, r["host"], self.policy)
            if why:
                self.refused = why
                raise OSError(why)
        return found


def _check_url(url: URL, param: str, policy: Policy) -> None:
    if url.scheme not in ("http", "https") or not url.host:
        raise BadRequest(f"'{param}': only http(s) URLs are fetched, got "
                         f"{str(url)[:60]!r}.", param=param)
    try:
        ipaddress.ip_address(url.host.strip("[]"))
    except ValueError:
        return  # a name: the resolver checks its addresses
    why = refusal(url.host, url.host.strip("[]"), policy)  # aiohttp skips the resolver
    if why:
        raise BadRequest(f"'{param}': {why}.", param=param)


async def fetch(url: str, param: str, policy: Policy | None) -> tuple[bytes, str | None]:
    """(the bytes, the Content-Type's media type) of the image at `url`."""
    policy = policy or Policy()
    if not policy.allowed:
        raise BadRequest(f"'{param}': this node doesn't fetch images from URLs; send the "
                         "image inline as a data: URL (base64), or start the node with "
                         "SHOAL_FETCH_IMAGES=on.", param=param)
    resolver = CheckedResolver(policy)
    # no proxies from the environment; a compressed body stays compressed (not an image),
    # so no gzip bomb is inflated here
    conn = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False, limit=1)
    try:
        async with asyncio.timeout(policy.timeout_s), aiohttp.ClientSession(
                connector=conn, trust_env=False, auto_decompress=False) as s:
            return await _follow(s, URL(url), param, policy)
    except TimeoutError:
        raise BadRequest(f"'{param}': fetching the image took over {policy.timeout_s:g} s.",
                         param=param) from None
    except (aiohttp.ClientError, OSError, ValueError) as e:
        why = resolver.refused or f"fetching it failed ({type(e).__name__}: {str(e)[:80]})"
        raise BadRequest(f"'{param}': {why}.", param=param) from None


async def _follow(s: aiohttp.ClientSession, url: URL, param: str,
                  policy: Policy) -> tuple[bytes, str | None]:
    for _ in range(MAX_REDIRECTS + 1):
        _check_url(url, param, policy)
        async with s.get(url, allow_redirects=False,
                         headers={"Accept": "image/*",
                                  "Accept-Encoding": "identity"}) as r:
            if r.status in (301, 302, 303, 307, 308) and "Location" in r.headers:
                url = url.join(URL(r.headers["Location"]))
                continue
            if r.status != 200:
                raise BadRequest(f"'{param}': the image's server answered {r.status}.",
                                 param=param)
            if (r.content_length or 0) > policy.max_bytes:
                raise _too_big(param, policy)
            body = bytearray()
            async for chunk in r.content.iter_chunked(65536):
                body += chunk
                if len(body) > policy.max_bytes:
                    raise _too_big(param, policy)
            kind = r.content_type.lower() if r.content_type.startswith("image/") else None
            return bytes(body), kind
    raise BadRequest(f"'{param}': more than {MAX_REDIRECTS} redirects.", param=param)


def _too_big(param: str, policy: Policy) -> BadRequest:
    n = policy.max_bytes
    size = f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n} bytes"
    return BadRequest(f"'{param}': the image is over {size}.",
                      param=param)
