"""Choose replica granularity, threads per replica and pinning for a machine and a workload (S3).

Pure: `decide(ctx) -> TuneDecision` (stateless, so no state goes in or out). Called by the Planner;
the Executor applies the choice with `Platform.scale` and `Platform.set_resources`.

Two sources, in order of trust:
1. measured throughput per configuration (from a short probe the caller ran): the best one wins,
   unless it beats the model's favourite by less than `min_gain` (noise), then the model's favourite;
2. otherwise a model of this workload class: a one-row inference request costs far more in HTTP and
   JSON than in the model (an order of magnitude and more for a small model), and
   that cost runs on one Python thread per replica. So throughput grows with the number of
   single-thread replicas up to the cores, extra intra-op threads buy nothing and oversubscription
   costs, and pinning each replica to its own cores (per socket when there are several: the paper's
   CPUMEM) removes migrations and CFS imbalance.

`cpusets` lays replicas on cores with the paper's CPUMEM formula (docs/policies.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from scanflow.policies.types import Decision

AffinityPolicy = Literal["none", "pinned", "numa"]


@dataclass(frozen=True)
class Machine:
    cores: int
    sockets: int = 1

    def __post_init__(self) -> None:
        if self.cores < 1 or self.sockets < 1 or self.cores % self.sockets:
            raise ValueError(f"need cores >= 1, sockets >= 1 and cores divisible by sockets, "
                             f"got cores={self.cores} sockets={self.sockets}")

    @property
    def cores_per_socket(self) -> int:
        return self.cores // self.sockets


@dataclass(frozen=True, order=True)
class TuneConfig:
    replicas: int
    threads: int
    affinity: AffinityPolicy = "none"

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.threads < 1:
            raise ValueError(f"replicas and threads must be >= 1, got {self.replicas}, {self.threads}")


def default_config(machine: Machine) -> TuneConfig:
    """What one gets without tuning: one replica using every core, no pinning."""
    return TuneConfig(1, machine.cores, "none")


def candidates(machine: Machine) -> tuple[TuneConfig, ...]:
    """Even splits of the machine: replicas dividing the cores, threads = cores per replica."""
    out: list[TuneConfig] = []
    for r in range(1, machine.cores + 1):
        if machine.cores % r:
            continue
        per = machine.cores // r
        out.append(TuneConfig(r, per, "none"))
        out.append(TuneConfig(r, per, "pinned"))
        if machine.sockets > 1 and (machine.cores_per_socket % per == 0):
            out.append(TuneConfig(r, per, "numa"))
    return tuple(out)


_PIN_BONUS = {"none": 1.0, "pinned": 1.05, "numa": 1.09}


def model_score(cfg: TuneConfig, machine: Machine) -> float:
    """A rank, not a forecast: higher is expected to serve more (1 busy replica-core = 1.0)."""
    busy_threads = cfg.replicas * cfg.threads
    score = float(min(cfg.replicas, machine.cores))
    if busy_threads > machine.cores:
        score *= machine.cores / busy_threads  # oversubscription: time-slicing and cache thrash
    bonus = _PIN_BONUS[cfg.affinity] if cfg.affinity != "numa" or machine.sockets > 1 else _PIN_BONUS["pinned"]
    return score * bonus


def cpusets(cfg: TuneConfig, machine: Machine) -> tuple[tuple[int, ...], ...]:
    """Cores each replica may use: all of them for 'none'; contiguous per-socket blocks otherwise.

    Replica i (1-based), N_cpu cores each, N_cps replicas per socket, P cores per socket:
    socket s_i = ceil(i / N_cps) - 1, cores [s_i*P + N_cpu*((i-1) - s_i*N_cps), s_i*P + N_cpu*(i - s_i*N_cps) - 1].
    """
    every = tuple(range(machine.cores))
    if cfg.affinity == "none":
        return tuple(every for _ in range(cfg.replicas))
    n_cpu = machine.cores // cfg.replicas
    if n_cpu < 1:
        raise ValueError(f"cannot pin {cfg.replicas} replicas on {machine.cores} cores")
    p = machine.cores_per_socket
    n_cps = max(1, p // n_cpu)
    out = []
    for i in range(1, cfg.replicas + 1):
        s = math.ceil(i / n_cps) - 1
        first = s * p + n_cpu * ((i - 1) - s * n_cps)
        out.append(tuple(range(first, first + n_cpu)))
    return tuple(out)


@dataclass(frozen=True)
class TuneContext:
    """measured: throughput (requests/s) per configuration probed; may be empty."""

    machine: Machine
    measured: Mapping[TuneConfig, float] = field(default_factory=dict)
    min_gain: float = 0.03


@dataclass(frozen=True)
class TuneDecision(Decision):
    config: TuneConfig = TuneConfig(1, 1)
    cpus_per_replica: float = 1.0
    cpusets: tuple[tuple[int, ...], ...] = ()
    source: Literal["measured", "model"] = "model"
    expected_gain_vs_default: float | None = None

    def service_update(self) -> dict[str, Any]:
        """Fields for `Service` / `Platform.set_resources`: replicas, threads, cpu, affinity policy."""
        return {"replicas": self.config.replicas, "threads": self.config.threads,
                "cpu": self.cpus_per_replica, "affinity": self.config.affinity}


def decide(ctx: TuneContext) -> TuneDecision:
    machine = ctx.machine
    for cfg, value in ctx.measured.items():
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"measured throughput for {cfg} must be a finite number >= 0, got {value}")
    ranked = sorted(candidates(machine), key=lambda c: (model_score(c, machine), -c.threads), reverse=True)
    favourite = ranked[0]
    default = default_config(machine)
    inputs: dict[str, Any] = {"cores": machine.cores, "sockets": machine.sockets,
                              "measured": {f"{c.replicas}x{c.threads}/{c.affinity}": v
                                           for c, v in sorted(ctx.measured.items())},
                              "model_favourite": f"{favourite.replicas}x{favourite.threads}/{favourite.affinity}"}
    source: Literal["measured", "model"]
    if ctx.measured:
        best = max(ctx.measured, key=lambda c: (ctx.measured[c], model_score(c, machine)))
        choice, source = best, "measured"
        fav_value = ctx.measured.get(favourite)
        if fav_value is not None and ctx.measured[best] < fav_value * (1 + ctx.min_gain):
            choice = favourite
        base = ctx.measured.get(default)
        kept = base is not None and base > 0 and choice != default \
            and ctx.measured[choice] < base * (1 + ctx.min_gain)
        if kept:  # a gain inside the measurement noise does not justify moving the system
            choice = default
        gain = None if not base else ctx.measured[choice] / base - 1.0
        reason = (f"measured: {choice.replicas}x{choice.threads}/{choice.affinity} at "
                  f"{ctx.measured[choice]:.0f} rps" + ("" if gain is None else f", {gain:+.0%} vs default")
                  + (f"; kept the default: no gain above min_gain {ctx.min_gain:.0%}" if kept else ""))
    else:
        choice, source = favourite, "model"
        gain = None  # the model ranks configurations; only a measurement can say by how much
        reason = (f"model: per-request HTTP cost dominates -> {choice.replicas} single-thread replicas "
                  f"on {machine.cores} cores, {choice.affinity}")
    return TuneDecision(
        reason=reason, inputs=inputs, config=choice,
        cpus_per_replica=machine.cores / choice.replicas, cpusets=cpusets(choice, machine),
        source=source, expected_gain_vs_default=gain,
    )
