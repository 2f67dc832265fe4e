"""The Executor's side of a progressive delivery: the challenger's own replicas, its stage on the champion's
gateway, and the end (promotion everywhere, or rollback).

Who calls: the Executor's `evaluate_and_promote` (scanflow/standard/executor.py) once a challenger passed
the offline gate of a service that declares `delivery: progressive` (`start`), and its `deliver`
actuator on each `delivery` plan of the Planner (`apply`).

The challenger runs as a service of its own (`<service>-challenger`: the service's declaration with the
challenger's model version, `delivery.challenger_replicas` replicas, no backup), deployed by the platform
as any service, and its gateway becomes the champion gateway's challenger
(`Platform.set_challenger`). Its replicas record their predictions under its name, which is how the
Checker tells the two models' rows apart. The deliveries are kept in the Executor's state by service,
so a plan that arrives twice (a retry) finds the step already done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from scanflow import messages
from scanflow.platform.base import PlatformError
from scanflow.spec import Service

GRACE_S = 120.0  # beyond the declared stage timeouts, how long a delivery may run without a verdict

SUFFIX = "-challenger"


def challenger_name(service: str) -> str:
    """Pure: the challenger's service name (a DNS label: at most 63 characters)."""
    return service[: 63 - len(SUFFIX)].rstrip("-") + SUFFIX


def challenger_spec(svc: Service, model_uri: str) -> Service:
    """Pure: the challenger's service: the champion's declaration with its model and its own replicas."""
    n = svc.delivery.challenger_replicas
    return Service.model_validate({**svc.model_dump(), "name": challenger_name(svc.name), "model_uri": model_uri,
                                   "replicas": n, "min_replicas": n, "max_replicas": n, "backup": None, "port": None,
                                   "delivery": "none"})


class DeliveryRefused(ValueError):
    """A delivery that cannot start: the service declares none, or one is already running for it."""


def start(plat: Any, svc: Service, model_name: str, version: str,
          deliveries: dict[str, Any] | None = None) -> dict[str, Any]:
    """Deploy the challenger's replicas and put them on the champion's gateway at the first stage. Blocking.
    Returns the delivery's record (kept by the caller under the service's name in `deliveries`). The same
    version again while its delivery runs is that delivery (a retried step); another version is refused."""
    if svc.delivery.mode != "progressive":
        raise DeliveryRefused(f"service {svc.name!r} declares no progressive delivery (delivery: none)")
    running = (deliveries or {}).get(svc.name)
    if running and running.get("state") == "running":
        if running.get("version") == version:
            return dict(running)
        raise DeliveryRefused(f"a delivery of v{running.get('version')} is running for {svc.name!r}; it ends "
                              "with its promotion or rollback")
    try:  # clears a challenger left on the gateway, and refuses before anything is deployed where the
        plat.set_challenger(svc.name, None)  # platform cannot split traffic (Kubernetes, for now)
    except PlatformError as exc:
        raise DeliveryRefused(str(exc)) from None
    spec = challenger_spec(svc, f"models:/{model_name}/{version}")
    plat.deploy(spec)
    first = svc.delivery.stages[0]
    try:
        plat.set_challenger(svc.name, spec.name, first.kind, first.share)
    except PlatformError:
        plat.delete(spec.name)  # no challenger replicas left behind a delivery that did not start
        raise
    return {"service": svc.name, "challenger": spec.name, "version": version, "stage": 0, "kind": first.kind,
            "share": first.share, "state": "running", "started": time.time(), "steps": []}


def end(plat: Any, rec: dict[str, Any]) -> None:
    """Take the challenger off the gateway, then remove its replicas (idempotent). Blocking."""
    plat.set_challenger(rec["service"], None)
    plat.delete(rec["challenger"])


def overdue(rec: dict[str, Any], svc: Service, now: float) -> str | None:
    """Pure: why a running delivery must end without the Planner (None while it may go on): longer than
    its declared stage timeouts allow since it began, plus GRACE_S. It happens when the verdicts stop
    coming (a restarted gateway forgot its challenger, so the Checker has nothing to judge): the
    challenger's replicas must not run for ever, nor block the service's next delivery."""
    if rec.get("state") != "running":
        return None
    budget = sum(s.timeout_s for s in svc.delivery.stages) + GRACE_S
    age = now - float(rec.get("started") or now)
    return None if age <= budget else f"no verdict within {budget:.0f} s of the delivery's start: rolled back"


def numeric(figures: dict[str, Any]) -> dict[str, float]:
    """Pure: the plan's figures that are numbers (for the alias history's metrics)."""
    return {k: float(v) for k, v in figures.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def apply(plat: Any, deliveries: dict[str, Any], p: messages.DeliveryPlan, promote: Callable[[str, str], list[str]],
          rolled_back: Callable[[str, str], None]) -> dict[str, Any]:
    """Carry out one `delivery` plan on the running delivery of `p.service`. `promote(version, reason)` moves
    the champion alias and swaps every service of the model onto it (returns the services swapped);
    `rolled_back(version, reason)` records the rollback in the registry. Blocking."""
    rec = deliveries.get(p.service)
    if rec is None or rec.get("challenger") != p.challenger_service:
        return {"service": p.service, "ignored": f"no delivery of {p.service!r} with challenger {p.challenger_service!r}"}
    if rec.get("state") != "running":
        return {"service": p.service, "ignored": f"delivery already {rec.get('state')}", "version": rec.get("version")}
    out: dict[str, Any] = {"service": p.service, "action": p.action, "version": rec["version"], "reason": p.reason,
                           "challenger_requests": p.figures.get("requests")}
    if p.action == "advance" and p.stage <= int(rec.get("stage", 0)):  # a stale or repeated plan
        return {**out, "ignored": f"the delivery is at stage {rec.get('stage')} already"}
    if p.action == "advance":
        plat.set_challenger(p.service, rec["challenger"], p.kind or "canary", p.share)
        rec.update(stage=p.stage, kind=p.kind, share=p.share)
    elif p.action == "promote":
        out["swapped"] = promote(rec["version"], p.reason)
        end(plat, rec)
        rec["state"] = "promoted"
    else:
        end(plat, rec)
        rolled_back(rec["version"], p.reason)
        rec["state"] = "rolled_back"
    rec["steps"] = [*rec.get("steps", []), {"action": p.action, "at": time.time(), "stage": p.stage, "share": p.share,
                                            "reason": p.reason}][-20:]
    return {**out, "kind": p.kind, "share": p.share, "stage": p.stage}
