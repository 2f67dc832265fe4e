"""Whether a `resources` plan pins its replicas to exclusive cores (the CPUMEM layout). Pure.

Why its own policy: pinning pays only with whole cores to give (a fractional quota time-slices on
shared cores anyway), and it is risky on a small node: replicas pinned onto cores that other work
needs (the gateway, the agents, another service's replicas) serve slower than unpinned ones. So it is
opt-in (`mode`, the Planner's `autoscale.pin` setting: off by default) and conservative: a plan pins
only when every replica's allotment is a whole number of cores and the replicas' cores fit the node's
CPUs less `reserved_cores` kept for everything else. Otherwise the plan asks for no pinning and says
why (fractional cores, not enough cores, node size unknown).

What the platforms make of a pinned plan (scanflow.platform.topology.place_replicas, the paper's
CPUMEM layout: replica i on contiguous cores of one socket, sockets filled in turn; `numa` also takes
memory from that socket): locally sched_setaffinity on every thread of the replica (and a cpuset
cgroup for `numa`), read back from /proc/PID/status Cpus_allowed_list; on Kubernetes a Guaranteed pod
with integer CPU requests == limits, which the kubelet's static CPU manager pins (no cpuset in the plan:
the kubelet chooses the cores).

Inputs are the Planner's own decision (cores per replica, replicas) and the Checker's observation of
the node (`node_cpus`, as the replicas read it). Who calls: scanflow/standard/planner.py (`plan_scale`), tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from scanflow.policies.types import Decision

Mode = Literal["none", "pinned", "numa"]
MODES: tuple[Mode, ...] = ("none", "pinned", "numa")
WHOLE = 1e-6  # cores: a quota this close to an integer is whole (cpu_step multiples are exact anyway)


@dataclass(frozen=True)
class PinConfig:
    """mode: 'none' (never pin: the plan carries no affinity, the declared one stays), 'pinned' (exclusive
    cores) or 'numa' (exclusive cores and memory of their socket: CPUMEM).
    reserved_cores: the node's cores never given to pinned replicas (gateway, agents, other services)."""

    mode: Mode = "none"
    reserved_cores: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"pin mode must be one of {MODES}, got {self.mode!r}")
        if not math.isfinite(self.reserved_cores) or self.reserved_cores < 0:
            raise ValueError(f"reserved_cores must be >= 0, got {self.reserved_cores}")


@dataclass(frozen=True)
class PinContext:
    """cpu: cores per replica the plan asks; replicas: how many replicas there will be after this tick;
    node_cpus: CPUs of the replicas' node as observed (None: not measured)."""

    cpu: float
    replicas: int
    node_cpus: float | None = None
    config: PinConfig = field(default_factory=PinConfig)


@dataclass(frozen=True)
class PinDecision(Decision):
    """affinity: the policy the plan asks for, or None when pinning is off (the plan leaves affinity alone)."""

    affinity: Mode | None = None


def whole_cores(cpu: float) -> int | None:
    """The integer a quota is (at least 1), or None when it is fractional."""
    n = round(cpu)
    return n if n >= 1 and abs(cpu - n) <= WHOLE else None


def decide(ctx: PinContext) -> PinDecision:
    cfg = ctx.config
    inputs = {"mode": cfg.mode, "cpu": ctx.cpu, "replicas": ctx.replicas, "node_cpus": ctx.node_cpus,
              "reserved_cores": cfg.reserved_cores}
    if cfg.mode == "none":
        return PinDecision("pinning off (autoscale.pin): affinity left as it is", inputs, None)
    n = whole_cores(ctx.cpu)
    if n is None:
        return PinDecision(f"not pinned: {ctx.cpu:g} cores per replica is not a whole number of cores", inputs,
                           "none")
    if ctx.node_cpus is None or ctx.node_cpus <= 0:
        return PinDecision("not pinned: the node's CPU count was not observed", inputs, "none")
    exclusive = math.floor(ctx.node_cpus - cfg.reserved_cores + 1e-9)
    need = n * max(1, ctx.replicas)
    inputs |= {"exclusive_cores": exclusive, "cores_needed": need}
    if need > exclusive:
        return PinDecision(f"not pinned: {max(1, ctx.replicas)} x {n} cores > {max(exclusive, 0)} exclusive cores "
                           f"({ctx.node_cpus:g} CPUs less {cfg.reserved_cores:g} reserved)", inputs, "none")
    layout = "CPUMEM: cores and memory of one socket" if cfg.mode == "numa" else "CPUMEM cores"
    return PinDecision(f"{cfg.mode}: {max(1, ctx.replicas)} x {n} exclusive cores of {exclusive} ({layout})",
                       inputs, cfg.mode)
