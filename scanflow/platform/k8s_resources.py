"""Container resources, the QoS class they give a pod, and how a change of them can be applied (pure).

`resources_block` is the `resources` a replica or Job container asks for (its CPU limit is what the
replica sizes its thread pool from), `qos_class` the class Kubernetes gives a pod for such blocks, and
`choose_resize_method` the rule for applying a change in place (pods/resize) or by a rolling update.
Separate from the object builders in `manifests` because these are the rules both the builders and
`KubernetesPlatform.set_resources` follow (and the Planner and tests may ask), with no object shape of
their own; no client, no I/O.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from scanflow.spec import Affinity, Resources

QoS = Literal["Guaranteed", "Burstable", "BestEffort"]


# -- resources and QoS -------------------------------------------------------------------------------


def cpu_quantity(cores: float) -> str:
    """1.0 -> '1', 0.5 -> '500m', 2.25 -> '2250m' (millicores, rounded up: never less than asked)."""
    milli = math.ceil(round(cores * 1000, 6))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def resources_block(resources: Resources, affinity: Affinity | None = None) -> dict[str, dict[str, str]]:
    """The container `resources` for a replica.

    affinity none: a CPU limit equal to the request, because the replica sizes its thread pool from
    its cgroup CPU limit (scanflow.serving.replica): without a limit the pool never follows a resize.
    That makes the pod Guaranteed; with a fractional CPU no CPU manager pins it, and a kubelet with
    the static policy that refuses to resize an integer-CPU pod in place reports it Infeasible, which
    set_resources turns into a rolling update. pinned / numa: Guaranteed with integer CPUs (requests
    == limits, cpu rounded up to whole cores), the only pods the static CPU manager gives exclusive
    cores to.
    """
    memory = resources.memory
    if affinity is not None and affinity.policy in ("pinned", "numa"):
        cores = str(max(1, math.ceil(resources.cpu - 1e-9)))
        both = {"cpu": cores, "memory": memory}
        return {"requests": dict(both), "limits": dict(both)}
    both = {"cpu": cpu_quantity(resources.cpu), "memory": memory}
    return {"requests": dict(both), "limits": dict(both)}


def qos_class(containers_resources: list[dict[str, Any]]) -> QoS:
    """The QoS class Kubernetes would give a pod with these container `resources` blocks."""
    any_set = False
    guaranteed = True
    for res in containers_resources:
        requests = dict(res.get("requests") or {})
        limits = dict(res.get("limits") or {})
        if requests or limits:
            any_set = True
        for kind in ("cpu", "memory"):
            # a missing request defaults to the limit
            differs = kind in requests and kind in limits and (
                normalise(kind, requests[kind]) != normalise(kind, limits[kind]))
            if kind not in limits or differs:
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def normalise(kind: str, value: Any) -> float:
    text = str(value)
    if kind == "cpu":
        return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    from scanflow.spec import parse_memory

    return float(parse_memory(text))


def has_integer_cpus(res: dict[str, Any]) -> bool:
    """True when the container asks whole cores with requests == limits (static CPU manager pins it)."""
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    if "cpu" not in limits:
        return False
    cpu = normalise("cpu", limits["cpu"])
    return cpu == int(cpu) and normalise("cpu", requests.get("cpu", limits["cpu"])) == cpu


def default_threads(resources: Resources) -> int:
    """Intra-op threads when the spec leaves them unset: one per whole core given, at least one."""
    return max(1, math.floor(resources.cpu + 1e-9))


# -- resize decision ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResizePlan:
    """How a CPU/memory change should be applied, and why (the why goes into ResourceChange.notes)."""

    method: Literal["in-place", "rolling-update"]
    reason: str


def choose_resize_method(
    server_version: tuple[int, int],
    current: dict[str, Any],
    desired: dict[str, Any],
    current_policy: str,
    desired_policy: str,
    placement_changed: bool = False,
) -> ResizePlan:
    """Pick in-place (pods/resize) or a rolling update; pure, so the Planner and tests can ask too.

    In-place needs K8s >= 1.33 (pods/resize beta, on by default), the same QoS class before and after,
    and no pod pinned by the static CPU manager (exclusive cores cannot be resized in place).
    A placement change (node affinity, spread) needs new pods anyway.
    """
    if server_version < (1, 33):
        return ResizePlan("rolling-update", f"cluster v{server_version[0]}.{server_version[1]} < 1.33 has no "
                          "in-place resize (pods/resize)")
    before, after = qos_class([current]), qos_class([desired])
    if before != after:
        return ResizePlan("rolling-update", f"QoS class would change {before} -> {after}; Kubernetes "
                          "forbids that in place")
    pinned = {"pinned", "numa"}
    if (current_policy in pinned and has_integer_cpus(current)) or (
        desired_policy in pinned and has_integer_cpus(desired)
    ):
        return ResizePlan("rolling-update", "pods pinned by the static CPU manager (Guaranteed, integer "
                          "CPUs) cannot be resized in place")
    if placement_changed:
        return ResizePlan("rolling-update", "node affinity / topology spread changed: pods must be "
                          "rescheduled")
    if server_version < (1, 35) and memory_limit_decreases(current, desired):
        return ResizePlan("rolling-update", f"cluster v{server_version[0]}.{server_version[1]} < 1.35 refuses "
                          "an in-place memory-limit decrease with restartPolicy NotRequired")
    return ResizePlan("in-place", f"cluster v{server_version[0]}.{server_version[1]} supports pods/resize")


def memory_limit_decreases(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    """True when the desired memory limit is below the current one (a missing limit is unbounded)."""
    cur = (current.get("limits") or {}).get("memory")
    new = (desired.get("limits") or {}).get("memory")
    if new is None:
        return False
    return cur is None or normalise("memory", new) < normalise("memory", cur)


def parse_server_version(major: str, minor: str) -> tuple[int, int]:
    """VersionInfo fields ('1', '34+' on some providers) -> (1, 34)."""
    def num(text: str) -> int:
        m = re.match(r"\d+", text or "")
        if not m:
            raise ValueError(f"cannot read a Kubernetes version number from {text!r}")
        return int(m.group(0))

    return num(major), num(minor)
