"""Vertical-first autoscaling: grow a saturated replica in place before adding replicas, shrink an idle
one before removing it; horizontal scaling takes over past the per-replica ceiling. Pure.

Why vertical first: an in-place resize (a cgroup quota locally, `pods/resize` on Kubernetes) takes
effect in about a second, a new replica only after its start-up (process start + model load, ~10 s),
so the first answer to a load step is a resize (Sponge, Themis report large SLO gains from it).
Every input is an observation the Checker sends in `latency.checked` (scanflow.agentkit.observe):
the arrival rate, the CPU each request costs (`cpu_per_request_ms`, else the replica's service time),
the requests in flight, the per-replica CPU limit, utilization and throttling, the cores of the
replicas' nodes left unallocated and the SLO percentile; none of them is an oracle.

One tick, in order:
1. demand: the cores the traffic needs at `target_utilization` (rate * CPU per request, plus the
   backlog drained within `drain_s`), `need` below;
2. ceiling: what one replica may grow to now: `max_cpu` (else the node's CPU count), and no more than
   its present size plus its share of the node's cores not allocated to the service's replicas
   (`headroom_cores_per_replica`; else its share of the node's measured idle cores);
3. replicas: the autoscale policy (scanflow.policies.autoscale: latency bands, down-scale window,
   guardrails) sized at the ceiling, so it adds replicas only when `need` exceeds what the present
   ones can grow to, and it removes them only when the rest, grown to the ceiling, carry the demand;
   while a resize settles (`settle_s`), latency above the SLO alone adds no replica, nor while the
   replicas measurably have CPU to spare (`spare_cpu`: under `saturated_utilization` of their cores,
   hardly throttled): that latency is the host's contention, and a replica beside them on the same
   host would not serve faster;
4. per-replica cores for that replica count: up to the need (`cpu_step` multiples) when the replica is
   saturated (throttled, or using nearly its whole limit); otherwise only a need seen on two ticks
   running and past `grow_margin`, so measurement noise never grows it, and latency alone never
   does: on a busy host latency rises with the neighbours' work while the replica's own CPU use stays
   under its limit, and more cores would not help. By half again when the replica is saturated while
   latency breaks the SLO although the estimate says it should not (not while an earlier resize
   settles, `settle_s`). Down only to the largest need of the last `down_window_s` with `shrink_headroom`
   on top (so the need lands well inside the new size's hold band, not near its top edge, where the
   next noisy tick at a size not yet observed grows it back), once that window has been observed
   whole (not in the first `down_window_s` after a start or a gap in the observations), after `cpu_down_ticks` agreeing ticks in the low latency
   band, and no sooner than `cooldown_down_s` and a whole `down_window_s` after any change and
   `flap_window_s` after a move up, and only by `shrink_margin` or more (small moves are noise, and each
   one risks a flap).
5. flaps: a capacity move (cores in all, up or down) that reverses the previous one within
   `flap_window_s` while the arrival rate held (within `STEADY_BAND`) counts as a flap
   (`ElasticState.flaps`, in every decision's inputs): 0 is what a stable controller shows on a steady
   load. A shrink waits out the flap window after a move up while the load holds.

`decide(ctx) -> (ElasticDecision, ElasticState)`; the caller owns the clock and applies `cpu` (a
`resources` plan) before `replicas` (a `scale` plan), so replicas that stay grow before others go.
With `vertical=False` it is the horizontal-only autoscale policy on the same observations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from scanflow.policies import autoscale
from scanflow.policies.types import Decision, Streak, slo_breached

SETTLE_TICKS = 3  # decisions a resize settles for at least, whatever settle_s says
STEADY_BAND = 0.3  # arrival rates within this ratio of each other (either way) are one steady load


def steady(rate: float | None, then: float | None, unknown: bool = False) -> bool:
    """Pure: whether the load held between two ticks (arrival rates within STEADY_BAND of each other);
    `unknown` when either rate was not observed."""
    if rate is None or then is None or rate <= 0 or then <= 0:
        return unknown
    return abs(math.log(rate / then)) < math.log(1 + STEADY_BAND)


@dataclass(frozen=True)
class ElasticConfig:
    """`scale`: the horizontal policy's config (its target_utilization, drain_s, latency bands, down
    window and guardrails are shared). CPU figures are cores per replica."""

    scale: autoscale.AutoscaleConfig = field(default_factory=autoscale.AutoscaleConfig)
    vertical: bool = True
    min_cpu: float = 0.25
    max_cpu: float | None = None  # None: the node's CPU count as observed
    cpu_step: float = 0.25
    throttled_high: float = 0.2  # share of CFS periods throttled that counts as saturated
    saturated_utilization: float = 0.9  # share of the CPU limit used that counts as saturated
    grow_margin: float = 0.2  # calm (low latency, not saturated): grow only past (1 + margin) x cpu
    shrink_margin: float = 0.2  # shrink only to (1 - margin) x cpu or less: small moves are noise
    # a shrink lands where the window's peak need with this much on top fits. More than grow_margin: a
    # shrink moves to a size not yet observed, where the need reads higher (CFS throttles the bursts of a
    # smaller quota, batches fill differently), and a steady load's need spreads tick to tick
    shrink_headroom: float = 0.5
    cpu_down_ticks: int = 3
    cooldown_down_s: float = 60.0  # no shrink within this long of any capacity change
    flap_window_s: float = 300.0  # a move reversing the previous one this soon on a steady load is a flap (HPA: 300 s)

    def __post_init__(self) -> None:
        if not 0 < self.min_cpu <= (self.max_cpu or math.inf) or self.cpu_step <= 0:
            raise ValueError("need 0 < min_cpu <= max_cpu and cpu_step > 0")
        if self.cpu_down_ticks < 1 or self.cooldown_down_s < 0 or not 0 <= self.shrink_margin < 1 \
                or self.grow_margin < 0 or self.shrink_headroom < self.grow_margin:
            raise ValueError("need cpu_down_ticks >= 1, cooldown_down_s >= 0, 0 <= shrink_margin < 1, grow_margin >= 0, "
                             "shrink_headroom >= grow_margin")


@dataclass(frozen=True)
class ElasticState:
    scale: autoscale.AutoscaleState = field(default_factory=autoscale.AutoscaleState)
    needs: tuple[tuple[float, float], ...] = ()  # (time, cores needed in all) within the down window
    shrink: Streak = field(default_factory=Streak)
    cpu_changed_at: float | None = None
    changed_at: float | None = None  # last capacity change of either kind
    ticks_since_cpu_change: int = 0  # decisions since the last resize (its observations lag a tick or two)
    # (time, +1 up / -1 down, arrival rate then) of the last change of cores in all
    last_move: tuple[float, int, float | None] | None = None
    flaps: int = 0  # moves that reversed the previous one within flap_window_s on a steady load
    # since when the needs were observed without a gap of a whole down window (None: not yet): a shrink
    # goes to the largest need of the window, which needs the window observed whole
    observed_since: float | None = None


@dataclass(frozen=True)
class ElasticContext:
    """One tick's observations (fields of `latency.checked`) and the service's present size.

    cpu: cores per replica now (what the replicas report as their limit, or a resize still in flight).
    cpu_per_request_ms: CPU time per request; service_time_ms: time in the model per request (used
      when the CPU cost is unknown: at `cpu` < 1 core it is stretched by throttling, so it is scaled back).
    """

    now: float
    current_replicas: int
    cpu: float
    slo_latency_ms: float
    latency_ms: float | None = None
    latency_lower_bound: bool = False
    in_flight: float = 0.0
    arrival_rate: float | None = None
    cpu_per_request_ms: float | None = None
    service_time_ms: float | None = None
    cpu_utilization: float | None = None
    throttled_ratio: float | None = None
    node_cpus: float | None = None
    node_idle_cores: float | None = None
    headroom_cores_per_replica: float | None = None
    ready_replicas: int | None = None
    config: ElasticConfig = field(default_factory=ElasticConfig)
    state: ElasticState = field(default_factory=ElasticState)

    def __post_init__(self) -> None:
        if self.cpu <= 0:
            raise ValueError(f"cpu must be > 0, got {self.cpu}")


@dataclass(frozen=True)
class ElasticDecision(Decision):
    replicas: int = 0
    current: int = 0
    cpu: float = 0.0
    current_cpu: float = 0.0
    threads: int = 1
    action: Literal["up", "down", "grow", "shrink", "hold"] = "hold"


def quantize_up(cores: float, step: float) -> float:
    return round(math.ceil(cores / step - 1e-9) * step, 6)


def quantize_down(cores: float, step: float) -> float:
    return round(math.floor(cores / step + 1e-9) * step, 6)


def threads_for(cpu: float, node_cpus: float | None) -> int:
    """One thread per whole core, at least one, never more than the node has."""
    n = max(1, math.floor(cpu + 1e-9))
    return min(n, int(node_cpus)) if node_cpus else n


def effective_cpu(limit: float | None, threads: int | None) -> float | None:
    """Cores a replica can use: its CPU limit, unless its thread pool is smaller than the whole cores of
    that limit (a replica with 1 thread on an unlimited 2-core node uses one core, and growing its pool
    is then a real change). Consistent with `threads_for` (threads = whole cores), so a resize this
    policy asked for reads back as the cores it asked."""
    if limit is None or limit <= 0:
        return None
    if threads is not None and threads >= 1 and threads < math.floor(limit + 1e-9):
        return float(threads)
    return limit


def cpu_cost_s(ctx: ElasticContext) -> float | None:
    """CPU seconds one request costs: measured CPU per request, else the model time at `cpu` cores."""
    if ctx.cpu_per_request_ms is not None and ctx.cpu_per_request_ms > 0:
        return ctx.cpu_per_request_ms / 1000.0
    if ctx.service_time_ms is not None and ctx.service_time_ms > 0:
        return ctx.service_time_ms / 1000.0 * min(1.0, ctx.cpu)
    return None


def demand_cores(ctx: ElasticContext, cost: float) -> float:
    """Cores the traffic needs at the target utilization, the backlog drained within drain_s."""
    cfg = ctx.config.scale
    starting = ctx.ready_replicas is not None and ctx.ready_replicas < ctx.current_replicas
    backlog = 0.0 if starting else ctx.in_flight * cost / (cfg.drain_s / cfg.guardrails.time_scale)
    return ((ctx.arrival_rate or 0.0) * cost + backlog) / cfg.target_utilization


def decide(ctx: ElasticContext) -> tuple[ElasticDecision, ElasticState]:
    cfg, st, now = ctx.config, ctx.state, ctx.now
    ts = cfg.scale.guardrails.time_scale
    r, c = ctx.current_replicas, ctx.cpu
    cost = cpu_cost_s(ctx)
    ceiling = cfg.max_cpu or (float(ctx.node_cpus) if ctx.node_cpus else c)
    # vertical room now: the replica's share of the node's idle cores on top of its present size
    free = ctx.headroom_cores_per_replica
    if free is None and ctx.node_idle_cores is not None:
        free = ctx.node_idle_cores / max(1, r)  # as if all replicas shared one node
    room = ceiling if free is None else min(ceiling, c + free)
    room = max(c, cfg.min_cpu, quantize_down(room, cfg.cpu_step)) if cfg.vertical else c
    settle = cfg.scale.settle_s / ts
    # a resize settles for settle_s and at least SETTLE_TICKS decisions: the interval the Checker measured
    # may straddle it (a demo's time_scale can make settle_s shorter than one interval)
    settling = st.cpu_changed_at is not None and (now - st.cpu_changed_at < settle
                                                   or st.ticks_since_cpu_change < SETTLE_TICKS)
    over = slo_breached(ctx.latency_ms, ctx.slo_latency_ms, ctx.latency_lower_bound)
    saturated = ((ctx.throttled_ratio or 0.0) >= cfg.throttled_high
                 or (ctx.cpu_utilization or 0.0) >= cfg.saturated_utilization)
    # replicas: the horizontal policy with each replica counted at the size it can grow to now
    size = room if cfg.vertical else c
    service_ms = None if cost is None else cost * 1000.0 / size
    # measured CPU to spare: under the saturated share of their cores, hardly throttled, and the arrivals'
    # CPU under that share too (a single thread under a larger limit reads a low utilization while the
    # thread is the bottleneck). Latency over the SLO is then a busy host's, not a load another replica
    # serves, and a replica added could not help (docs/benchmarks/constants.md)
    ready_now = max(1, r if ctx.ready_replicas is None else ctx.ready_replicas)
    spare_cpu = (ctx.cpu_utilization is not None and ctx.throttled_ratio is not None and not saturated
                 and (cost is None or (ctx.arrival_rate or 0.0) * cost < cfg.saturated_utilization * c * ready_now))
    # latency above the SLO while vertical room is left: the resize answers it, not another replica
    grow_room = cfg.vertical and over and saturated and c < room
    sdec, sst = autoscale.decide(autoscale.AutoscaleContext(
        now=now, current_replicas=r, ready_replicas=ctx.ready_replicas, slo_latency_ms=ctx.slo_latency_ms,
        latency_ms=ctx.latency_ms, latency_lower_bound=ctx.latency_lower_bound, in_flight=ctx.in_flight,
        arrival_rate=None if cost is None else ctx.arrival_rate, service_time_ms=service_ms,
        capacity_changed_at=now if grow_room else st.cpu_changed_at if settling else None,
        spare_cpu=spare_cpu, config=cfg.scale, state=st.scale))
    replicas = sdec.replicas
    need = None if cost is None else demand_cores(ctx, cost)
    window = cfg.scale.down_window_s / ts
    kept = tuple((t, n) for t, n in st.needs if now - t < window)
    needs = kept + (((now, need),) if need is not None else ())
    if kept:  # (a state saved before observed_since existed: its oldest need)
        observed_since: float | None = st.observed_since if st.observed_since is not None else kept[0][0]
    else:  # nothing within the window: the evidence starts again
        observed_since = now if need is not None else None
    whole_window = observed_since is not None and now - observed_since >= window
    target, why, shrink = c, "hold", Streak()
    if cfg.vertical:
        # sized for the replicas serving now while added ones start (they would arrive after the step)
        ready = r if ctx.ready_replicas is None else ctx.ready_replicas
        per = None if need is None else need / max(1, min(replicas, ready))
        low = ctx.latency_ms is None or ctx.latency_ms <= cfg.scale.latency_low * ctx.slo_latency_ms
        # the grow margin holds unless the replica itself is out of CPU: latency alone is no sign of that
        calm = not saturated
        if calm and per is not None and len(needs) >= 2:
            # calm: a need seen on one tick only is measurement noise; the lower of the last two must ask
            per = min(per, needs[-2][1] / max(1, min(replicas, ready)))
        if per is not None and need is not None and replicas < r:
            # replicas going: the ones that stay take the largest need of the window, with the grow
            # margin on top so the next noisy tick does not grow them again, but never more cores in
            # all than now (a removal that grows the total is a move up: a flap); when the cores there
            # are cannot carry that need on fewer replicas, none goes this tick
            peak = max(n for _, n in needs)
            total = quantize_down(c * r / replicas, cfg.cpu_step)
            if quantize_up(peak / replicas, cfg.cpu_step) > min(room, total):
                replicas, why = r, f"no removal: {peak:.2f} cores needed do not fit {r - 1} replicas"
                sst = replace(sst, guard=st.scale.guard)  # the removal did not happen: no cooldown from it
                per = need / max(1, min(r, ready))
            else:
                per = min(max(per, peak / replicas * (1 + cfg.grow_margin)), total)
        want = c if per is None else min(room, max(cfg.min_cpu, quantize_up(per, cfg.cpu_step)))
        if calm and replicas >= r and (per is None or per <= c * (1 + cfg.grow_margin)):
            want = min(want, c)
        if over and saturated and c < room and not settling:
            # the latency says the estimate lags (a step in load, a backlog): half again on top of the
            # larger of the estimate and the present size, to drain what queued before the resize lands
            boosted = min(room, quantize_up(max(c, want) * 1.5, cfg.cpu_step))
            if boosted > want:
                want, why = boosted, f"latency over the SLO while saturated: x1.5 -> {boosted:g}"
        if want > c:
            target = want
            if why == "hold" or why.startswith("no removal"):
                why = f"need {need:.2f} cores over {replicas} replicas -> {want:g} each (room {room:g})"
        elif per is not None and replicas <= r:
            # shrink: to the largest need of the window with the shrink headroom on top (it lands inside the
            # new size's hold band), only in the low band, after the cooldown and a whole window since any change
            peak = max(n for _, n in needs) / max(1, replicas)
            down = shrink_to(peak, cfg)
            if down <= c * (1 - cfg.shrink_margin) + 1e-9 and low and not over:
                shrink = st.shrink.update(-1, now)
                # and, while the load holds, never within the flap window of a move up (as the HPA's 300 s
                # scale-down stabilization): a boost that drained a backlog is taken back after it, not as a
                # reversal on a steady load; a load that fell (past STEADY_BAND) may shrink it sooner
                held = (st.last_move is not None and st.last_move[1] > 0 and now - st.last_move[0] < cfg.flap_window_s / ts
                        and steady(ctx.arrival_rate, st.last_move[2]))
                cooled = (st.changed_at is None
                          or now - st.changed_at >= max(cfg.cooldown_down_s, cfg.scale.down_window_s) / ts) and not held
                if shrink.count >= cfg.cpu_down_ticks and cooled and whole_window:
                    target, why, shrink = down, f"idle: peak need {peak:.2f} per replica over the window -> {down:g}", Streak()
                else:
                    why = (f"shrink to {down:g} waits: {shrink.count}/{cfg.cpu_down_ticks} ticks, cooled {cooled}, "
                           f"window observed {whole_window}")
    changed_cpu = target != c
    changed = changed_cpu or replicas != r
    last_move, flaps = st.last_move, st.flaps
    direction = (replicas * target > r * c + 1e-9) - (replicas * target < r * c - 1e-9)
    if direction:
        if (last_move is not None and last_move[1] == -direction and now - last_move[0] < cfg.flap_window_s / ts
                and steady(ctx.arrival_rate, last_move[2], unknown=True)):
            flaps += 1
        last_move = (now, direction, ctx.arrival_rate)
    action: Literal["up", "down", "grow", "shrink", "hold"] = (
        "up" if replicas > r else "down" if replicas < r else "grow" if target > c else "shrink" if target < c
        else "hold")
    reason = f"{action}: cpu {c:g} -> {target:g} ({why}); replicas {r} -> {replicas} ({sdec.reason})"
    inputs = {**sdec.inputs, "cpu": c, "cpu_target": target, "room": room, "need_cores": need,
              "cpu_per_request_ms": ctx.cpu_per_request_ms, "cpu_utilization": ctx.cpu_utilization,
              "throttled_ratio": ctx.throttled_ratio, "node_idle_cores": ctx.node_idle_cores,
              "headroom_cores_per_replica": ctx.headroom_cores_per_replica,
              "saturated": saturated, "spare_cpu": spare_cpu, "vertical": cfg.vertical, "flaps": flaps,
              "shrink_pending": shrink.count}  # agreeing ticks of a shrink not made yet (0: none pending)
    new = ElasticState(scale=sst, needs=needs, shrink=shrink,
                       cpu_changed_at=now if changed_cpu else st.cpu_changed_at,
                       changed_at=now if changed else st.changed_at,
                       ticks_since_cpu_change=0 if changed_cpu else min(st.ticks_since_cpu_change + 1, 1000),
                       last_move=last_move, flaps=flaps, observed_since=observed_since)
    return (ElasticDecision(reason=reason, inputs=inputs, replicas=replicas, current=r, cpu=target, current_cpu=c,
                            threads=threads_for(target, ctx.node_cpus), action=action), new)


def shrink_to(peak: float, config: ElasticConfig) -> float:
    """Pure: the size a shrink lands on for a per-replica peak need: the need with `shrink_headroom` on
    top, in `cpu_step` multiples, at least `min_cpu`. The headroom is the hysteresis: the need then sits
    well inside the new size's hold band, under the size itself (where a throttled replica grows), so
    the next noisy tick at the new size does not grow it back."""
    return max(config.min_cpu, quantize_up(peak * (1 + config.shrink_headroom), config.cpu_step))


def hold_band(cpu: float, config: ElasticConfig, saturated: bool = False) -> tuple[float, float]:
    """Pure: (lo, hi) such that a tick holds a replica of `cpu` cores (replicas unchanged) when every
    recent per-replica need lies in (lo, hi]: above hi it grows; at or under lo it shrinks (the need with
    `shrink_headroom` on top fits a size `shrink_margin` or more below `cpu`, in `cpu_step` multiples and
    never under `min_cpu`; lo is 0 where no shrink is possible). A replica that is not saturated grows
    only past `grow_margin` on top of `cpu`, whatever the latency; a saturated one (throttled, or using
    nearly all of its limit) grows on any need above `cpu`, so its band ends at `cpu`. What a
    "right-sized" replica means to this policy: a load whose need sits inside the band, away from its
    edges, is one it leaves alone."""
    hi = cpu if saturated else cpu * (1 + config.grow_margin)
    top = quantize_down(cpu * (1 - config.shrink_margin), config.cpu_step)  # the largest size a shrink goes to
    if top < config.min_cpu or top >= cpu:
        return 0.0, hi
    return top / (1 + config.shrink_headroom), hi


def horizontal(config: ElasticConfig) -> ElasticConfig:
    """The same config with vertical scaling off (the horizontal-only Planner)."""
    return replace(config, vertical=False)
