"""DNS discovery of a service's replicas: one upstream per address a name resolves to.

Who calls: scanflow.serving.gateway, every health interval, when started with `--upstream-discovery dns`
(SCANFLOW_UPSTREAM_DISCOVERY=dns; the Kubernetes manifests set it). Why: on Kubernetes the gateway's
upstream is a Service. Through a ClusterIP, kube-proxy picks a pod per *connection*, and the gateway
keeps its connections open, so it sees one "replica" however many pods run: least-outstanding
balancing, per-replica health and batches in flight cannot work, and a pod added by a scale-up gets
traffic only when a new connection happens to land on it. The Executor's `<service>-own` Service is
headless (clusterIP: None): its DNS name resolves to the ready pods' addresses, which this module turns
into one upstream URL each, re-resolved every interval (a pod that turns ready joins; one that goes
leaves and drains), as Envoy's STRICT_DNS clusters or gRPC's DNS resolver do with headless Services.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

# getaddrinfo answers that mean "this name has no address now" (a headless Service with no ready pod)
# rather than "the resolver failed" (EAI_AGAIN, EAI_FAIL...: keep what was known)
_NO_ADDRESS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}

Resolver = Callable[[str, int], Awaitable[list[str]]]


class DiscoveryError(Exception):
    """The name could not be resolved now (the resolver failed, not "no address")."""


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def expand(url: str, addresses: Iterable[str]) -> list[str]:
    """Pure: `url` with its host replaced by each address (sorted, de-duplicated; IPv6 in brackets; the
    port made explicit, a base path kept)."""
    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    out = []
    for addr in sorted(set(addresses), key=lambda a: (":" in a, a)):
        host = f"[{addr}]" if ":" in addr else addr
        out.append(f"{u.scheme}://{host}:{port}{u.path.rstrip('/')}")
    return out


async def resolve_host(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to now (system resolver: /etc/hosts, cluster DNS); [] when it has
    none; DiscoveryError when the resolver failed."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in _NO_ADDRESS:
            return []
        raise DiscoveryError(f"cannot resolve {host!r}: {exc}") from exc
    return [str(info[4][0]) for info in infos]


async def discover(sources: Iterable[str], previous: dict[str, list[str]],
                   resolver: Resolver = resolve_host) -> dict[str, list[str]]:
    """Each source URL -> the upstream URLs it stands for now. A source whose host is an address stands
    for itself; a name for one URL per address. A resolver failure keeps the source's previous URLs (a
    DNS hiccup must not empty the replica set and fail traffic over)."""
    out: dict[str, list[str]] = {}
    for src in sources:
        u = urlsplit(src)
        host = u.hostname or ""
        if is_address(host):
            out[src] = [src]
            continue
        try:
            out[src] = expand(src, await resolver(host, u.port or 80))
        except DiscoveryError:
            out[src] = list(previous.get(src, []))
    return out
