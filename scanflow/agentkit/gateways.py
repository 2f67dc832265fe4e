"""Reading a service's gateways: every instance behind the configured endpoint, summed.

Why: a service can run more than one gateway (the Kubernetes prod overlay runs two, spread over nodes).
Behind one ClusterIP, each scrape lands on whichever gateway kube-proxy picks for that connection, so
two consecutive reads of a cumulative histogram can come from different processes and their difference
is noise: the SLO percentile and the arrival rate the Planner decides on would be made up. Prometheus
avoids it by scraping each pod; the Checker does the same when told to (SCANFLOW_GATEWAY_DISCOVERY=dns,
the Kubernetes manifests set it): its endpoint's name resolves to every gateway (a headless Service),
each address is read, and the counters are summed into one exposition. Each read also says which
gateway processes answered (`Member`: address, when its counters started, its request count), and an
interval is judged only when the same processes answered in full both times (`continues`): a gateway
that came, went, restarted at its address or did not answer makes the sums jump, and deciding on that
interval would scale on made-up figures. By default (`static`) the endpoint
is read as configured: one process (the embedded stack, compose) or a name that is not a set of
gateways (a load balancer with several addresses would be counted once per address).

Pure parts: `merge_expositions`, `merge_states`, `member_of`, `continues`. Who calls:
scanflow.standard.checker's `watch` sensor.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import httpx

from scanflow.serving import discovery


def merge_expositions(texts: list[str]) -> str:
    """Pure: Prometheus text expositions with every sample summed by (name, labels): the counters and
    histograms of N gateways read as those of one. Gauges are summed too (what the Checker reads of them,
    the requests outstanding, adds up); `*_created` timestamps are left out (a sum of them means nothing)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                key = (s.name, tuple(sorted(s.labels.items())))
                sums[key] = sums.get(key, 0.0) + float(s.value)
    lines = []
    for (name, labels), value in sums.items():
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
        lines.append(f"{name}{{{inner}}} {value!r}" if inner else f"{name} {value!r}")
    return "\n".join(lines) + ("\n" if lines else "")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """Pure: the gateways' /admin/state answers as one: the first one's route, each replica (by URL)
    healthy when any gateway finds it healthy, its outstanding requests summed over the gateways."""
    if not states:
        return {}
    out = dict(states[0])
    replicas: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for st in states:
        for r in st.get("replicas") or []:
            url = str(r.get("url"))
            if url not in replicas:
                replicas[url] = dict(r)
                order.append(url)
                continue
            merged = replicas[url]
            merged["healthy"] = bool(merged.get("healthy")) or bool(r.get("healthy"))
            merged["outstanding"] = int(merged.get("outstanding", 0)) + int(r.get("outstanding", 0))
    out["replicas"] = [replicas[u] for u in order]
    out["challenger"] = merge_challengers([st.get("challenger") for st in states])
    return out


_CHALLENGER_COUNTS = ("requests", "answered", "mirrored", "failed", "dropped", "in_flight", "timed", "recent_timed",
                      "compared", "agreed", "champion_timed")


def merge_challengers(challengers: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Pure: the gateways' challengers (scanflow.serving.challenger) as one: counts summed, the worst
    p99, healthy when any gateway finds it so. None when no gateway has one. When gateways hold different
    deliveries (one not yet reached by the Executor's latest call), only those of the delivery most of them
    hold (ties: the one set last) count, and `other_deliveries` says how many gateways were left out."""
    got = [c for c in challengers if c]
    if not got:
        return None
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in got:
        groups.setdefault(str(c.get("delivery")), []).append(c)
    kept = max(groups.values(), key=lambda g: (len(g), max(float(c.get("since") or 0.0) for c in g)))
    left_out, got = len(got) - len(kept), kept
    out = dict(got[0])
    out["other_deliveries"] = left_out
    for key in _CHALLENGER_COUNTS:
        out[key] = sum(int(c.get(key) or 0) for c in got)
    for key in ("p99_ms", "champion_p99_ms", "recent_p99_ms", "champion_recent_p99_ms"):
        p99s = [float(c[key]) for c in got if c.get(key) is not None]
        out[key] = max(p99s) if p99s else None
    out["healthy"] = any(bool(c.get("healthy")) for c in got)
    sinces = [float(c["since"]) for c in got if c.get("since") is not None]
    out["since"] = min(sinces) if sinces else None  # the first gateway it was set on, whatever the order read
    out["agreement"] = round(out["agreed"] / out["compared"], 6) if out["compared"] else None
    return out


async def instances(url: str, discovery_mode: str) -> list[str]:
    """The gateway URLs behind `url`. `dns` (http only): one per address its host resolves to (every pod
    of a headless Service), or `url` itself when its host is an address or has no answer now (read as
    configured; its failure is reported by the read). `static`: `url` itself."""
    u = urlsplit(url)
    host = u.hostname or ""
    if discovery_mode != "dns" or u.scheme != "http" or discovery.is_address(host):
        return [url]
    try:
        addresses = await discovery.resolve_host(host, u.port or 80)
    except discovery.DiscoveryError:
        return [url]
    # a dual-stack name lists each host once per family: one family, or a gateway would count twice
    v4 = [a for a in addresses if ":" not in a]
    return discovery.expand(url, v4 or addresses) or [url]


# one gateway process as a read saw it: (its URL, when its counters started, requests so far)
Member = tuple[str, float | None, float]


def member_of(url: str, text: str) -> Member:
    """Pure: the gateway process behind one /metrics answer."""
    from prometheus_client.parser import text_string_to_metric_families

    created: float | None = None
    count = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "scanflow_gateway_start_time_seconds":
                created = float(s.value)
            elif s.name == "scanflow_gateway_request_latency_seconds_count":
                count = float(s.value)
    return url, created, count


def continues(prev: list[Member] | None, cur: list[Member], complete: bool) -> bool:
    """Pure: whether this read's summed counters continue the last one's, so the difference between them
    is one interval's traffic: every gateway answered (`complete`), the same processes as last time (same
    URLs, same start times), and no request count went down (what still tells a restart of a gateway
    that exports no start time). The first read (`prev` None) is judged as a single gateway's was."""
    if not complete:
        return False
    if prev is None:
        return True
    before = {u: (c, n) for u, c, n in prev}
    now = {u: (c, n) for u, c, n in cur}
    return before.keys() == now.keys() and all(
        now[u][0] == before[u][0] and now[u][1] >= before[u][1] for u in now)


async def scrape(http: httpx.AsyncClient, url: str,
                 discovery_mode: str) -> tuple[dict[str, Any], str, list[Member], bool]:
    """(merged /admin/state, merged /metrics text, the gateway processes read, whether every gateway
    behind `url` answered). One that does not answer is left out; none answering raises the first error,
    as a single gateway's failure did."""
    urls = await instances(url, discovery_mode)

    async def one(u: str) -> tuple[str, dict[str, Any], str]:
        state = (await http.get(f"{u}/admin/state")).json()
        return u, state, (await http.get(f"{u}/metrics")).text

    got = await asyncio.gather(*(one(u) for u in urls), return_exceptions=True)
    ok = [g for g in got if not isinstance(g, BaseException)]
    if not ok:
        err = next(g for g in got if isinstance(g, BaseException))
        raise err
    return (merge_states([s for _, s, _ in ok]), merge_expositions([t for _, _, t in ok]),
            [member_of(u, t) for u, _, t in ok], len(ok) == len(urls))
