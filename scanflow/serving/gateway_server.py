"""The gateway's server: one endpoint per service in front of its replicas (its state and its app).

POST /predict goes (raw ASGI, keep-alive aiohttp pool, TCP_NODELAY) to the healthy replica with the
fewest outstanding requests. A request that fails because its replica died (connection refused or
reset) or is draining (503) is retried on another, and a second failure goes to the backup (if any, see
routing.choose_attempt): predict is idempotent, so scale-down and crashes do not fail clients.
Health checks (`GET /ready`) run every interval; a failing replica leaves
the set and comes back when healthy. With no healthy primary replica, traffic fails over to the backup
URL (another service's gateway or replica) and fails back when one is healthy again; `PUT /admin/route`
overrides. With `discovery="dns"` the replica URLs are names, each standing for one replica
per address it resolves to (a Kubernetes headless Service; scanflow.serving.discovery says why). The
standard protocols (/v2, /invocations: scanflow.serving.protocols) are forwarded with the same retries
and failover.

Separate from scanflow.serving.gateway, the command line the platforms start (`python -m
scanflow.serving.gateway`), so tests and the fast front build the app without it; the calls to the
replicas themselves (one by one or coalesced) are scanflow.serving.gateway_forwarding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import orjson
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from pydantic import SecretStr

from scanflow.serving import discovery
from scanflow.serving.asgi import (
    JSON_HEADERS,
    BodyDeadlines,
    BodyTimeout,
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    UnsupportedMediaType,
    read_body,
    send_error,
    send_error_and_close,
    send_raw,
)
from scanflow.serving.challenger import Challenger, ChallengerMode
from scanflow.serving.gateway_admin import BackupRequest, ChallengerRequest, ReplicasRequest, RouteRequest
from scanflow.serving.gateway_forwarding import Forwarding
from scanflow.serving.hotmetrics import HotCounter, HotHistogram
from scanflow.serving.outcomes import NO_ANSWER, RETRY_STATUSES, Outcome, final
from scanflow.serving.protocols import install_gateway
from scanflow.serving.routing import (
    MAX_ATTEMPTS,
    RouteMode,
    Target,
    Upstream,
    choose_attempt,
    normalize_url,
    route_of,
)
from scanflow.serving.server import LATENCY_BUCKETS, HotPathApp, alive, base_api
from scanflow.serving.upstream import UpstreamPool

log = logging.getLogger("scanflow.serving.gateway")

# What a client gets: (status, body, headers, route label for the metrics).
Answer = tuple[int, bytes, list[tuple[bytes, bytes]], str]



@dataclass
class GatewayConfig:
    service: str = "default"
    replicas: tuple[str, ...] = ()
    backup: str | None = None
    health_interval_s: float = 0.5
    token: SecretStr | None = None
    allow_anonymous: bool = False
    max_body_bytes: int = 4 << 20
    upstream_timeout_s: float = 30.0
    body_timeout_s: float = 10.0  # a client's body must be in within this (408 and close, else)
    # Coalescing (see `Gateway._coalesced`): at most this many client requests per upstream call
    # (0 or 1: off, every request forwarded on its own), bodies up to coalesce_item_bytes each.
    coalesce_max: int = 64
    coalesce_max_bytes: int = 1 << 20
    coalesce_item_bytes: int = 64 << 10
    batches_per_replica: int = 1
    # "static": `replicas` are the replicas; "dns": each is a name standing for one replica per address
    # it resolves to, re-resolved every health interval (a Kubernetes headless Service: see discovery)
    discovery: str = "static"


class _Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        # the two updated on every request: plain-int collectors (scanflow.serving.hotmetrics)
        self.latency = HotHistogram(
            "scanflow_gateway_request_latency_seconds", "predict latency through the gateway", LATENCY_BUCKETS, r
        )
        self.requests = HotCounter(
            "scanflow_gateway_requests", "predict requests by status and route", ["status", "route"], r
        )
        self.upstream_errors = Counter(
            "scanflow_gateway_upstream_errors", "failed upstream attempts", ["kind"], registry=r
        )
        self.retries = Counter("scanflow_gateway_retries", "requests retried on another upstream", registry=r)
        self.failovers = Counter("scanflow_gateway_failovers", "switches from primary to backup", registry=r)
        self.failbacks = Counter("scanflow_gateway_failbacks", "switches from backup back to primary", registry=r)
        self.healthy = Gauge("scanflow_gateway_healthy_replicas", "healthy primary replicas", registry=r)
        self.outstanding = Gauge("scanflow_gateway_outstanding", "requests in flight upstream", registry=r)
        # when these counters started (as process_start_time_seconds): a reader summing several gateways
        # tells a restart at the same address from more traffic (scanflow.agentkit.gateways)
        self.started = Gauge("scanflow_gateway_start_time_seconds", "when this gateway's counters started, "
                             "Unix seconds", registry=r)
        self.started.set(time.time())


class Gateway(Forwarding):
    """Routing state and handlers of one gateway (the upstream calls: `Forwarding`). Built by `create_app`; tests reach it as `app.gateway`."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.metrics = _Metrics()
        if config.discovery not in ("static", "dns"):
            raise ValueError(f"discovery {config.discovery!r}: use static or dns")
        # dns: the configured URLs are names to resolve; the replicas are what they resolve to (at start-up
        # and every health interval), none until the first resolution
        self.sources: tuple[str, ...] = tuple(normalize_url(u) for u in config.replicas)
        self.discovered: dict[str, list[str]] = {}
        self.resolver: discovery.Resolver = discovery.resolve_host
        self.replicas: tuple[Upstream, ...] = () if config.discovery == "dns" else tuple(
            Upstream(u) for u in self.sources)
        self.backup: Upstream | None = Upstream(normalize_url(config.backup)) if config.backup else None
        self.mode: RouteMode = "auto"
        self.routed_to: Target | None = None
        self.draining: dict[str, Upstream] = {}  # removed replicas still finishing requests
        self.challenger: Challenger | None = None  # a progressive delivery's model (scanflow.serving.challenger)
        self._tick = 0
        self.counts = {"retries": 0, "failovers": 0, "failbacks": 0, "upstream_errors": 0,
                       "coalesced_calls": 0, "coalesced_requests": 0, "coalesced_refused": 0}
        self.body_deadlines = BodyDeadlines(config.body_timeout_s)
        self._pools: dict[str, UpstreamPool] = {}
        self._session: aiohttp.ClientSession | None = None
        self._health_session: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task[None] | None = None
        super().__init__()  # the coalescing state (gateway_forwarding)

    # ---- life cycle -------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        # One pool for predict traffic, one for health checks, so a slow check never waits behind load.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=self.config.upstream_timeout_s, sock_connect=2.0),
            skip_auto_headers=("User-Agent",),
        )
        self._health_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=60),
        )
        await self._discover()
        await self.check_health(self._checked())
        self._health_task = asyncio.create_task(self._health_loop(), name="health-checks")
        try:
            yield
        finally:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            for task in list(self._batch_tasks):
                task.cancel()
            await self._session.close()
            await self._health_session.close()
            for pool in self._pools.values():
                pool.close()

    async def _check_one(self, up: Upstream) -> None:
        assert self._health_session is not None
        timeout = aiohttp.ClientTimeout(total=max(0.25, self.config.health_interval_s))
        try:
            async with self._health_session.get(up.url + "/ready", timeout=timeout) as resp:
                await resp.read()
                ok = resp.status == 200
                err = None if ok else f"/ready answered {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            ok, err = False, f"{type(exc).__name__}: {exc}"
        if up.healthy != ok:
            log.warning("%s is now %s%s", up.url, "healthy" if ok else "unhealthy", f" ({err})" if err else "")
        up.healthy = ok
        if err:
            up.last_error = err

    async def check_health(self, ups: tuple[Upstream, ...]) -> None:
        if ups:
            await asyncio.gather(*(self._check_one(u) for u in ups))
        self._update_route()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            await self._discover()
            await self.check_health(self._checked())

    def _checked(self) -> tuple[Upstream, ...]:
        """Every upstream the health loop checks: the replicas, the backup, the challenger."""
        return (self.replicas + ((self.backup,) if self.backup else ())
                + ((self.challenger.up,) if self.challenger else ()))

    async def _discover(self) -> None:
        """dns discovery: re-resolve the sources; a changed address set replaces the replicas (new ones
        health-checked first, removed ones drain: `set_replicas`)."""
        if self.config.discovery != "dns":
            return
        found = await discovery.discover(self.sources, self.discovered, self.resolver)
        urls = [u for src in self.sources for u in found.get(src, [])]
        if found != self.discovered:
            log.info("service %s: %s resolve to %s", self.config.service, ", ".join(self.sources), urls or "nothing")
        self.discovered = found
        if urls != [r.url for r in self.replicas]:
            await self._replace_replicas(urls)

    def _update_route(self, route: Target | None = None) -> None:
        """Record where traffic goes now; count failovers and failbacks on each change."""
        if route is None:
            primary_ok = any(r.healthy for r in self.replicas)
            route = route_of(self.mode, primary_ok, self.backup is not None)
        if route != self.routed_to:
            if self.routed_to == "primary" and route == "backup":
                self.metrics.failovers.inc()
                self.counts["failovers"] += 1
                log.warning("service %s: failover to backup %s", self.config.service, self.backup and self.backup.url)
            elif self.routed_to == "backup" and route == "primary":
                self.metrics.failbacks.inc()
                self.counts["failbacks"] += 1
                log.warning("service %s: failback to primary", self.config.service)
            self.routed_to = route
        self.metrics.healthy.set(sum(r.healthy for r in self.replicas))

    # ---- hot path ---------------------------------------------------------------------------
    async def predict(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        try:
            body = await read_body(scope, receive, self.config.max_body_bytes, json_only=True,
                                   deadlines=self.body_deadlines)
        except BodyTooLarge as exc:
            await send_error(send, 413, str(exc))
            self.metrics.requests.inc("413", "none")
            return
        except UnsupportedMediaType as exc:
            await send_error(send, 415, str(exc))
            self.metrics.requests.inc("415", "none")
            return
        except BodyTimeout as exc:
            await send_error_and_close(send, 408, str(exc))
            self.metrics.requests.inc("408", "none")
            return
        except ClientGone:
            return
        if self._coalescable(body):
            outcome = await self._coalesced(body)
            if final(outcome):
                assert outcome is not None
                status, payload, ctype, up = outcome
                await send_raw(send, status, payload, [(b"content-type", ctype), (b"x-scanflow-upstream", up.url.encode())])
                self._count(status, self.route_label(up))
                self.metrics.latency.observe(time.perf_counter() - t0)
                return
        else:
            outcome = await self.challenger_outcome(body)
            if final(outcome):
                assert outcome is not None
                status, payload, ctype, up = outcome
                await send_raw(send, status, payload, [(b"content-type", ctype), (b"x-scanflow-upstream", up.url.encode())])
                self._count(status, "challenger")
                self.metrics.latency.observe(time.perf_counter() - t0)
                return
        status, payload, headers, route = await self.forward_with_retries(body, outcome)
        await send_raw(send, status, payload, headers)
        self._count(status, route)
        ch = self.challenger
        if ch is not None and ch.mode == "shadow" and outcome is None and status == 200 and ch.mirrors():
            self.mirror(ch, body, payload)
        if route != "none" or status != 503:
            self.metrics.latency.observe(time.perf_counter() - t0)

    async def forward_with_retries(self, body: bytes, outcome: Outcome = None, path: bytes = b"/predict") -> Answer:
        """Forward one client body (to `path` upstream) until some upstream answers it, after `outcome`,
        the answer of a coalesced call that was not final (dead replica, 502/503) or None when none was
        tried. Returns (status, body, headers, route). Shared by `predict` and scanflow.serving.fastfront."""
        exclude: frozenset[str] = frozenset()
        status, payload, ctype, route, up = 503, b"", b"application/json", None, None
        first_attempt = 0
        if outcome is not None:
            status, payload, ctype, up = outcome
            route = "primary"
            if status == NO_ANSWER:
                status, payload = 503, b""
            self.metrics.retries.inc()
            self.counts["retries"] += 1
            exclude = frozenset({up.url})
            first_attempt = 1
        for attempt in range(first_attempt, MAX_ATTEMPTS):
            self._tick += 1
            route, up = choose_attempt(
                self.mode, self.replicas, self.backup, exclude, self._tick, last=attempt == MAX_ATTEMPTS - 1
            )
            if up is None:
                break
            if route is not None and route != self.routed_to:
                self._update_route(route)
            result = await self._forward(up, body, path)
            if result is not None:
                status, payload, ctype = result
                if status not in RETRY_STATUSES:
                    break
            if attempt < MAX_ATTEMPTS - 1:
                self.metrics.retries.inc()
                self.counts["retries"] += 1
            exclude = exclude | {up.url}
        if up is None and not payload:
            detail = f"service {self.config.service!r} has no healthy replica and no backup"
            return 503, orjson.dumps({"detail": detail}), JSON_HEADERS, "none"
        if not payload and status == 503:
            return 503, orjson.dumps({"detail": "upstream replicas failed; try again"}), JSON_HEADERS, route or "none"
        headers = [(b"content-type", ctype), (b"x-scanflow-upstream", up.url.encode() if up else b"")]
        return status, payload, headers, route or "none"

    def _count(self, status: int, route: str) -> None:
        self.metrics.requests.inc(str(status), route)

    def route_label(self, up: Upstream) -> str:
        """The metrics' route of an answer a coalesced call or the canary gave: challenger or primary."""
        return "challenger" if self.challenger is not None and up is self.challenger.up else "primary"

    # ---- admin ------------------------------------------------------------------------------
    async def set_replicas(self, urls: list[str]) -> dict[str, object]:
        """Atomic replace: new URLs are health-checked first; removed ones finish what they have. With dns
        discovery the URLs are the names to resolve (resolved at once)."""
        if self.config.discovery == "dns":
            self.sources = tuple(urls)
            await self._discover()
            self._update_route()
            return self.state()
        return await self._replace_replicas(urls)

    async def _replace_replicas(self, urls: list[str]) -> dict[str, object]:
        current = {r.url: r for r in self.replicas}
        new = tuple(current.get(u) or Upstream(u) for u in urls)
        await self.check_health(tuple(r for r in new if r.url not in current))
        removed = [r for r in self.replicas if r.url not in set(urls)]
        self.replicas = new  # one assignment: a request sees the old set or the new one
        for r in removed:
            if r.outstanding:
                self.draining[r.url] = r
            pool = self._pools.pop(r.url, None)
            if pool is not None:
                pool.close()  # idle connections now; busy ones after their request
        self.draining = {u: r for u, r in self.draining.items() if r.outstanding and u not in urls}
        self._update_route()
        return self.state()

    async def set_backup(self, url: str | None) -> dict[str, object]:
        if self.backup is not None and self.backup.url != url and self.backup.url not in {
            r.url for r in self.replicas
        }:
            pool = self._pools.pop(self.backup.url, None)
            if pool is not None:
                pool.close()
        if url is None:
            self.backup = None
            if self.mode == "backup":
                self.mode = "auto"
        elif self.backup is None or self.backup.url != url:
            up = Upstream(url)
            await self.check_health((up,))
            self.backup = up
        self._update_route()
        return self.state()

    async def set_challenger(self, url: str, mode: ChallengerMode, share: float,
                             service: str | None = None, delivery: str | None = None) -> dict[str, object]:
        """Set the challenger, or move the same one (same URL and delivery) to another stage: its figures keep
        counting from when it was set; another URL or delivery starts from zero. Health-checked first, and
        only used while healthy. The same call again changes nothing (the Executor repeats it, so a
        restarted gateway gets its challenger back)."""
        ch = self.challenger
        if ch is not None and ch.up.url == url and ch.delivery == delivery:
            changed = (ch.mode, ch.share) != (mode, share)
            ch.mode, ch.share = mode, share
        else:
            changed = True
            up = Upstream(url)
            await self.check_health((up,))
            self.challenger = Challenger(up, mode, share, service, delivery)
            if ch is not None and ch.up.url != url:
                self._close_pool_unless_used(ch.up.url)
        if changed:
            log.warning("service %s: challenger %s in %s at %.0f%%", self.config.service, url, mode, 100 * share)
        return self.state()

    def clear_challenger(self) -> dict[str, object]:
        """No challenger any more (promoted or rolled back): every request to the champion's replicas."""
        ch, self.challenger = self.challenger, None
        if ch is not None:
            log.warning("service %s: challenger %s cleared", self.config.service, ch.up.url)
            self._close_pool_unless_used(ch.up.url)
        return self.state()

    def _close_pool_unless_used(self, url: str) -> None:
        """A former challenger's connections go, unless a replica or the backup has the same URL."""
        if url in {r.url for r in self.replicas} or (self.backup is not None and self.backup.url == url):
            return
        pool = self._pools.pop(url, None)
        if pool is not None:
            pool.close()  # idle connections now; busy ones after their request

    def set_route(self, to: RouteMode) -> dict[str, object]:
        if to == "backup" and self.backup is None:
            raise HTTPException(422, "no backup configured: PUT /admin/backup first")
        self.mode = to
        self._update_route()
        return self.state()

    def state(self) -> dict[str, object]:
        self.draining = {u: r for u, r in self.draining.items() if r.outstanding}
        return {
            "service": self.config.service,
            "discovery": {"mode": self.config.discovery, "sources": list(self.sources)}
            if self.config.discovery == "dns" else {"mode": "static"},
            "route": self.mode,
            "routed_to": self.routed_to,
            "replicas": [r.snapshot() for r in self.replicas],
            "draining": [r.snapshot() for r in self.draining.values()],
            "backup": self.backup.snapshot() if self.backup else None,
            "challenger": self.challenger.snapshot() if self.challenger else None,
            "counts": {"requests": sum(r.requests for r in self.replicas), **self.counts},
        }

    def render_metrics(self) -> bytes:
        self.metrics.outstanding.set(
            sum(r.outstanding for r in self.replicas) + (self.backup.outstanding if self.backup else 0)
        )
        return generate_latest(self.metrics.registry)


class GatewayApp(HotPathApp):
    """ASGI entry: POST /predict straight to the forwarder, the rest to FastAPI."""

    def __init__(self, gateway: Gateway, api: FastAPI) -> None:
        super().__init__({"/predict": gateway.predict}, api)
        self.gateway = gateway


def create_app(config: GatewayConfig) -> GatewayApp:
    gw = Gateway(config)
    api, admin = base_api(f"scanflow gateway {config.service}", gw.lifespan, gw.render_metrics,
                          alive(service=config.service), config.token, config.allow_anonymous)

    @api.get("/ready")
    async def ready() -> JSONResponse:
        ok = any(r.healthy for r in gw.replicas) or (gw.backup is not None and gw.backup.healthy)
        return JSONResponse({"ready": ok, "routed_to": gw.routed_to}, status_code=200 if ok else 503)

    @api.get("/admin/state")
    async def state() -> dict[str, object]:
        return gw.state()

    @api.put("/admin/replicas", dependencies=admin)
    async def replicas(body: ReplicasRequest) -> dict[str, object]:
        return await gw.set_replicas(body.replicas)

    @api.put("/admin/backup", dependencies=admin)
    async def backup(body: BackupRequest) -> dict[str, object]:
        return await gw.set_backup(body.url)

    @api.put("/admin/challenger", dependencies=admin)
    async def challenger(body: ChallengerRequest) -> dict[str, object]:
        return await gw.set_challenger(body.url, body.mode, body.share, body.service, body.delivery)

    @api.delete("/admin/challenger", dependencies=admin)
    async def no_challenger() -> dict[str, object]:
        return gw.clear_challenger()

    @api.put("/admin/route", dependencies=admin)
    async def route(body: RouteRequest) -> dict[str, object]:
        return gw.set_route(body.to)

    install_gateway(api, gw)  # OIP v2, MLflow /invocations, the OpenAPI document
    return GatewayApp(gw, api)
