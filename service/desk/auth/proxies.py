"""Which headers of a request the desk believes: those a reverse proxy sets, only when the
connection comes from one of ``desk.trusted_proxies`` (none by default).

From a trusted peer, the client is the rightmost address of ``X-Forwarded-For`` that is
not itself a trusted proxy (what the nearest proxy saw; anything left of it was written by
the client and proves nothing), ``X-Forwarded-Proto`` says whether people reach the desk
over HTTPS (the cookie is then ``Secure``) and ``X-Forwarded-Host`` which host they asked
for (the same-origin check). From anyone else those headers, and the person named in
``desk.proxy_header`` with ``auth = proxy``, are ignored: the client is the peer.

>>> proxies = Proxies(["10.0.0.0/8"])
>>> proxies.client("10.1.1.1", ["198.51.100.7, 10.2.2.2"]), proxies.client("192.0.2.9", ["1.2.3.4"])
('198.51.100.7', '192.0.2.9')
>>> proxies.client("10.1.1.1", ["6.6.6.6, 198.51.100.7"])  # the client wrote 6.6.6.6
'198.51.100.7'
"""  # noqa: E501

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Final

from aiohttp import web

__all__ = ["PROXIED", "Proxies"]

#: set on a request that came through a trusted proxy (its headers were believed)
PROXIED: Final = web.RequestKey("abstain.desk.proxied", bool)
_HOST: Final = re.compile(r"^(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::\d{1,5})?$")
_MAX_HOPS: Final = 32

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Proxies:
    """The trusted proxies (addresses or networks, as ``desk.trusted_proxies`` gives them)."""

    def __init__(self, networks: Iterable[str]) -> None:
        self.networks: tuple[Network, ...] = tuple(ipaddress.ip_network(n) for n in networks)

    def trusts(self, address: str | None) -> bool:
        """True if ``address`` is one of the trusted proxies."""
        if not self.networks or not address:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in network for network in self.networks)

    def client(self, peer: str | None, forwarded_for: Iterable[str]) -> str | None:
        """The client's address: ``peer``, or from a trusted ``peer`` the rightmost hop of
        ``X-Forwarded-For`` (every header, in order) that is not a trusted proxy."""
        if not self.trusts(peer):
            return peer
        hops = [h.strip() for header in forwarded_for for h in header.split(",")][-_MAX_HOPS:]
        client = peer
        for hop in reversed(hops):
            try:
                client = str(ipaddress.ip_address(hop))
            except ValueError:
                break  # not an address: what lies left of it cannot be told apart either
            if not self.trusts(client):
                break
        return client

    def resolve(self, request: web.Request) -> web.Request:
        """``request`` as the client made it: from a trusted proxy, with the client's
        address, scheme and host the proxy reported (and marked :data:`PROXIED`);
        unchanged from anyone else."""
        if not self.trusts(request.remote):
            return request
        client = self.client(request.remote, request.headers.getall("X-Forwarded-For", []))
        proto = _last(request.headers.get("X-Forwarded-Proto", "")).lower()
        host = _last(request.headers.get("X-Forwarded-Host", ""))
        resolved = request.clone(
            remote=client or request.remote or "",
            scheme=proto if proto in ("http", "https") else request.scheme,
            host=host if _HOST.match(host) else request.host,
        )
        resolved[PROXIED] = True
        return resolved


def _last(header: str) -> str:
    """The value the nearest proxy added (the last of a comma-separated header)."""
    return header.rsplit(",", 1)[-1].strip()
