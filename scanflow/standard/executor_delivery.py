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
so a plan that arrives twice (a retry) finds the step already done. Each has an id, given to the gateways
with the challenger and echoed by them, so the Checker's and the Planner's records name it and a plan meant
for another delivery is ignored. While it runs, the Executor repeats the stage on the gateways (`tend`): a
gateway that restarted, or a pod added since, gets its challenger back. One step at a time (`STEPS`): a
repeat never lands after the step that ended the delivery.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from scanflow import messages
from scanflow.platform.base import PlatformError
from scanflow.spec import Service

GRACE_S = 120.0  # beyond the declared stage timeouts, how long a delivery may run without a verdict

SUFFIX = "-challenger"
STEPS = threading.Lock()  # start, apply, end and tend of any delivery, one at a time


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


def start(plat: Any, svc: Service, model_name: str, version: str, deliveries: dict[str, Any] | None = None,
          cause: str = "") -> dict[str, Any]:
    """Deploy the challenger's replicas and put them on the champion's gateway at the first stage. Blocking.
    The delivery's record is stored in `deliveries` under the service's name (under STEPS, so two starts
    never both pass the one-at-a-time check) and returned. The same version again while its delivery runs
    is that delivery (a retried step); another version is refused."""
    with STEPS:
        return _start(plat, svc, model_name, version, {} if deliveries is None else deliveries, cause)


def _start(plat: Any, svc: Service, model_name: str, version: str, deliveries: dict[str, Any],
           cause: str) -> dict[str, Any]:
    if svc.delivery.mode != "progressive":
        raise DeliveryRefused(f"service {svc.name!r} declares no progressive delivery (delivery: none)")
    running = deliveries.get(svc.name)
    if running and running.get("state") in ("running", "ending"):
        if running.get("version") == version and running.get("state") == "running":
            return dict(running)
        raise DeliveryRefused(f"a delivery of v{running.get('version')} is running for {svc.name!r}; it ends "
                              "with its promotion or rollback")
    try:  # clears a challenger left on the gateway, and refuses before anything is deployed where the
        plat.set_challenger(svc.name, None)  # platform cannot split traffic (its gateway is not found)
    except PlatformError as exc:
        if exc.retryable:
            raise
        raise DeliveryRefused(str(exc)) from None
    spec = challenger_spec(svc, f"models:/{model_name}/{version}")
    plat.deploy(spec)
    first, started = svc.delivery.stages[0], time.time()
    rec = {"id": f"{svc.name}:v{version}@{started:.3f}", "service": svc.name, "challenger": spec.name,
           "version": version, "stage": 0, "kind": first.kind, "share": first.share, "state": "running",
           "started": started, "steps": [], "cause": cause}
    try:
        plat.set_challenger(svc.name, spec.name, first.kind, first.share, rec["id"])
    except PlatformError:
        try:  # the gateways it did reach lose it again, then no challenger replicas are left behind
            plat.set_challenger(svc.name, None)
        finally:
            plat.delete(spec.name)
        raise
    deliveries[svc.name] = rec
    return dict(rec)


def end(plat: Any, rec: dict[str, Any]) -> None:
    """Take the challenger off the gateway, then remove its replicas (idempotent). Blocking; the caller
    holds STEPS. A gateway that cannot be found (no gateway pod, the service gone: not retryable) has no
    challenger to take off; the replicas are removed all the same."""
    try:
        plat.set_challenger(rec["service"], None)
    except PlatformError as exc:
        if exc.retryable:
            raise
    plat.delete(rec["challenger"])


def _ending(rec: dict[str, Any], action: str, reason: str, metrics: dict[str, float] | None = None) -> dict[str, Any]:
    """Mark `rec` as ending (before any platform call): from then on nothing puts its stage back on the
    gateways, and a step that failed half-way is finished by a retry or by `tend`."""
    if rec.get("state") != "ending" or not isinstance(rec.get("ending"), dict):
        rec["ending"] = {"action": action, "reason": reason, "promoted": False, "metrics": metrics or {}}
        rec["state"] = "ending"  # after `ending`: a save of the state in between never lacks it
    return dict(rec["ending"])


def tend_all(plat: Any, deliveries: dict[str, Any], workflow: Any,
             promote_for: Callable[[dict[str, float]], Callable[[str, str], list[str]]],
             record_rollback: Callable[[str, str], None], log: Any) -> None:
    """The Executor's sensor: `tend` each delivery still running or ending. `promote_for(metrics)` gives the
    promotion a half-done one still needs; `record_rollback(version, reason)` tags a rollback finished here.
    Never raises: what failed is logged, and the next round tries again."""
    for name, rec in list(deliveries.items()):
        if rec.get("state") not in ("running", "ending"):
            continue
        try:
            why = overdue(rec, workflow.service(name), time.time())
        except KeyError:  # the service left the workflow: its delivery ends too
            why = f"service {name!r} is no longer declared"
        try:
            done, reason = tend(plat, rec, why, promote_for((rec.get("ending") or {}).get("metrics") or {}))
        except Exception as exc:  # noqa: BLE001 - a platform, registry or swap failure: the next round retries
            step = "repeating its stage" if rec.get("state") == "running" and not why else "ending it"
            log.warning("delivery of v%s to %s: %s failed (next round retries): %s", rec.get("version"), name, step, exc)
            continue
        if done == "rolled_back":
            record_rollback(str(rec["version"]), str(reason))
            log.warning("delivery of v%s to %s rolled back: %s", rec.get("version"), name, reason)


def tend(plat: Any, rec: dict[str, Any], why_end: str | None,
         promote: Callable[[str, str], list[str]] | None = None) -> tuple[str, str | None]:
    """One reconcile of a delivery (the Executor's sensor), as (what was done, the rollback's reason):
    - running: rolled back when `why_end` (overdue): ("rolled_back", why); else its stage put on the gateways
      again: ("repeated", None);
    - ending (a step's calls failed half-way): a promotion not done yet is done (`promote`, repeatable; without
      it: "skipped"), then the challenger taken off and its replicas removed: ("rolled_back", reason) or
      ("promoted", None);
    - ("skipped", None) when another step runs now, or the delivery ended.
    Blocking; PlatformError when the platform failed (the next round tries again)."""
    if not STEPS.acquire(timeout=0):
        return "skipped", None  # a step is running (a deploy can take a while): the next round repeats
    try:
        if rec.get("state") == "running" and why_end is None:
            plat.set_challenger(rec["service"], rec["challenger"], rec.get("kind") or "canary",
                                float(rec.get("share") or 0.0), rec.get("id"))
            return "repeated", None
        if rec.get("state") == "running":
            _ending(rec, "rollback", str(why_end))
        if rec.get("state") != "ending":
            return "skipped", None
        ending = rec.get("ending") or _ending(rec, "rollback", "the delivery's end was cut short")
        if ending["action"] == "promote" and not ending.get("promoted"):
            if promote is None:
                return "skipped", None
            promote(str(rec["version"]), str(ending["reason"]))
            ending["promoted"] = True
        end(plat, rec)
        return _ended(rec, str(ending["action"]), str(ending["reason"])), (
            str(ending["reason"]) if ending["action"] == "rollback" else None)
    finally:
        STEPS.release()


def _ended(rec: dict[str, Any], action: str, reason: str) -> str:
    rec["state"] = "promoted" if action == "promote" else "rolled_back"
    rec.pop("ending", None)
    rec["steps"] = [*rec.get("steps", []), {"action": action, "at": time.time(), "stage": rec.get("stage"),
                                            "reason": reason}][-20:]
    return str(rec["state"])


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
    `rolled_back(version, reason)` records the rollback in the registry. Blocking. A promotion or rollback
    marks the delivery as ending first: when its platform calls fail, the retried plan (or `tend`) finishes
    it, and its stage is never put back on the gateways meanwhile."""
    with STEPS:
        return _apply(plat, deliveries, p, promote, rolled_back)


def _apply(plat: Any, deliveries: dict[str, Any], p: messages.DeliveryPlan, promote: Callable[[str, str], list[str]],
           rolled_back: Callable[[str, str], None]) -> dict[str, Any]:
    rec = deliveries.get(p.service)
    if rec is None or rec.get("challenger") != p.challenger_service:
        return {"service": p.service, "ignored": f"no delivery of {p.service!r} with challenger {p.challenger_service!r}"}
    # a plan about an earlier delivery of this service is ignored. A gateway that does not echo delivery ids
    # (an older process) names the delivery by its URL and when it was set: one set since this delivery began
    if rec.get("id") and p.delivery != rec["id"] and not _set_since(p.delivery, float(rec.get("started") or 0.0)):
        return {"service": p.service, "ignored": f"the plan is about delivery {p.delivery!r}, not {rec['id']!r}"}
    state = rec.get("state")
    if state not in ("running", "ending") or (state == "ending" and (rec.get("ending") or {}).get("action") != p.action):
        return {"service": p.service, "ignored": f"delivery already {state}", "version": rec.get("version")}
    out: dict[str, Any] = {"service": p.service, "action": p.action, "version": rec["version"], "reason": p.reason,
                           "challenger_requests": p.figures.get("requests")}
    if p.action == "advance" and p.stage <= int(rec.get("stage", 0)):  # a stale or repeated plan
        return {**out, "ignored": f"the delivery is at stage {rec.get('stage')} already"}
    if p.action == "advance":  # the record first: when a gateway fails the call, `tend` brings it to this stage
        rec.update(stage=p.stage, kind=p.kind, share=p.share)
        plat.set_challenger(p.service, rec["challenger"], p.kind or "canary", p.share, rec.get("id"))
        rec["steps"] = [*rec.get("steps", []), {"action": p.action, "at": time.time(), "stage": p.stage,
                                                "share": p.share, "reason": p.reason}][-20:]
    elif p.action == "promote":
        if not _ending(rec, "promote", p.reason, numeric(p.figures)).get("promoted"):
            out["swapped"] = promote(rec["version"], p.reason)
            rec["ending"]["promoted"] = True
        end(plat, rec)
        _ended(rec, "promote", p.reason)
    else:
        _ending(rec, "rollback", p.reason)
        end(plat, rec)
        rolled_back(rec["version"], p.reason)
        _ended(rec, "rollback", p.reason)
    return {**out, "kind": p.kind, "share": p.share, "stage": p.stage}


CLOCK_SKEW_S = 5.0  # between the Executor's clock and a gateway's


def _set_since(key: str, started: float) -> bool:
    """Pure: whether `key` is a gateway's own name for a challenger (`<url>@<when it was set>`, from a gateway
    that does not echo delivery ids) set since `started`, the delivery's start."""
    url, _, since = key.rpartition("@")
    if not url.startswith(("http://", "https://")):
        return False
    try:
        return float(since) >= started - CLOCK_SKEW_S
    except ValueError:
        return False
