"""Reading a service's gateways: every instance behind the configured endpoint, summed.

Why: a service can run more than one gateway (the Kubernetes prod overlay runs two, spread over nodes).
Behind one ClusterIP, each scrape lands on whichever gateway kube-proxy picks for that connection, so
two consecutive reads of a cumulative histogram can come from different processes and their difference
is noise: the SLO percentile and the arrival rate the Planner decides on would be made up. Prometheus
avoids it by scraping each pod; the Checker does the same. Its endpoint may be a name that resolves to
every gateway (a headless Service): each address is read, the counters are summed into one exposition,
and the set of addresses read is returned, so the caller can tell when the set changed (a gateway
came or went: the cumulative sums jump, and that interval must not be judged). An endpoint that is an
address, or a name with one address (a single process, compose, a ClusterIP), is read as before.

Pure parts: `merge_expositions`, `merge_states`. Who calls: scanflow.standard.checker's `watch` sensor.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import httpx

from scanflow.serving import discovery


def merge_expositions(texts: list[str]) -> str:
    """Pure: Prometheus text expositions with every sample summed by (name, labels): the counters and
    histograms of N gateways read as those of one. Gauges summed too (requests outstanding add up)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
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
    return out


async def instances(url: str) -> list[str]:
    """The gateway URLs behind `url`: one per address its host resolves to (every pod of a headless
    Service; the one address of a ClusterIP), or `url` itself (an address, or a name without an answer
    now: read as configured, and its failure reported by the read)."""
    u = urlsplit(url)
    host = u.hostname or ""
    if discovery.is_address(host) or host == "localhost":
        return [url]
    try:
        addresses = await discovery.resolve_host(host, u.port or 80)
    except discovery.DiscoveryError:
        return [url]
    # a dual-stack name lists each host once per family: one family, or a gateway would count twice
    v4 = [a for a in addresses if ":" not in a]
    return discovery.expand(url, v4 or addresses) or [url]


async def scrape(http: httpx.AsyncClient, url: str) -> tuple[dict[str, Any], str, list[str]]:
    """(merged /admin/state, merged /metrics text, the instance URLs read) of every gateway behind
    `url`. One that does not answer is left out (and so the set read changes); none answering raises the
    last error, as a single gateway's failure did."""
    urls = await instances(url)

    async def one(u: str) -> tuple[str, dict[str, Any], str]:
        state = (await http.get(f"{u}/admin/state")).json()
        return u, state, (await http.get(f"{u}/metrics")).text

    got = await asyncio.gather(*(one(u) for u in urls), return_exceptions=True)
    ok = [g for g in got if not isinstance(g, BaseException)]
    if not ok:
        err = next(g for g in got if isinstance(g, BaseException))
        raise err
    return (merge_states([s for _, s, _ in ok]), merge_expositions([t for _, _, t in ok]), [u for u, _, _ in ok])
