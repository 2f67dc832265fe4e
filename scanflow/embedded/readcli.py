"""`scanflow decisions | plans | logs`: read what the agents of a running stack did, from the terminal.

`decisions` lists the strategies that fired or were refused (each agent's `GET /decisions`), `plans`
the Planner's policy decisions with their reasons (`GET /plans`), `logs` the tail of a component's log
file. They read the stack found as `status` finds it (--home, --workflow-name, or the one stack under
./.scanflow) and need no token: the agents' reads are open to whoever reaches their loopback port, and
the log files to the stack's own user (mode 0600). Exit codes: 0, 1 when an agent does not answer, 2 for
bad input or no stack. Who calls: scanflow/cli.py registers these commands.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from scanflow.embedded.cli import HomeOpt, _fail, _home, _state_or_exit

ROLES = ("tracker", "checker", "planner", "executor")
NameOpt = Annotated[str | None, typer.Option("--workflow-name", help="home .scanflow/NAME")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (one list), not a table")]
READ_TIMEOUT_S = 10.0


def _get(url: str, params: dict[str, Any]) -> Any:
    import httpx

    try:
        resp = httpx.get(url, params=params, timeout=READ_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise _fail(f"{url}: {type(exc).__name__}: {exc}", 1) from None
    if resp.status_code != 200:
        raise _fail(f"{url}: HTTP {resp.status_code}: {resp.text[:200]}", 1)
    return resp.json()


def _agent_url(urls: dict[str, Any], role: str) -> str:
    url = (urls.get("agents") or {}).get(role)
    if not url:
        raise _fail(f"the stack has no {role} address yet (still starting? see `scanflow status`)")
    return str(url).rstrip("/")


def when(at: Any) -> str:
    """Pure: a decision's time (epoch seconds) as local HH:MM:SS, '-' when missing."""
    try:
        return time.strftime("%H:%M:%S", time.localtime(float(at)))
    except (TypeError, ValueError):
        return "-"


def decision_rows(by_role: dict[str, list[dict[str, Any]]], limit: int) -> list[dict[str, Any]]:
    """Pure: the agents' decisions as one list, newest last, at most `limit` (the newest)."""
    rows = [{**d, "agent": role} for role, ds in by_role.items() for d in ds]
    rows.sort(key=lambda d: float(d.get("at") or 0.0))
    return rows[-limit:]


def decision_line(d: dict[str, Any]) -> str:
    """Pure: one decision as a line: time, agent, strategy, result, reason, and what its actions did."""
    line = (f"{when(d.get('at'))}  {d.get('agent', ''):<8}  {d.get('strategy', '')!s:<24}  "
            f"{d.get('result', '')!s:<8}  {str(d.get('reason') or '')[:100]}")
    done = outcome_summary(d.get("outcomes") or {})
    return f"{line}  -> {done}" if done else line


def outcome_summary(outcomes: dict[str, Any], width: int = 120) -> str:
    """Pure: the actions' outcomes of a decision in a few words: each action's status, then its error
    or its result's plain values (`version=3`), cut at `width`. Nested values are left to `--json`."""
    parts = []
    for key, o in outcomes.items():
        if not isinstance(o, dict):
            continue
        action = str(key).split(":")[0]
        detail = o.get("error") or ", ".join(
            f"{k}={v}" for k, v in (o.get("result") or {}).items() if isinstance(v, (str, int, float, bool)))
        parts.append(f"{action} {o.get('status')}" + (f" ({detail})" if detail else ""))
    text = "; ".join(parts)
    return text if len(text) <= width else text[: width - 3] + "..."


def plan_line(p: dict[str, Any]) -> str:
    """Pure: one policy decision as a line: time, policy, action, reason."""
    return (f"{when(p.get('at'))}  {p.get('policy', '')!s:<10}  {p.get('action') or ''!s:<8}  "
            f"{str(p.get('reason') or '')[:120]}")


def decisions(
    home: HomeOpt = None,
    workflow_name: NameOpt = None,
    agent: Annotated[list[str] | None, typer.Option("--agent", "-a", help="only this agent's (repeatable): "
                                                    "tracker, checker, planner, executor")] = None,
    strategy: Annotated[str | None, typer.Option("--strategy", help="only this strategy's")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1000, help="the newest N")] = 20,
    json_output: JsonOpt = False,
) -> None:
    """What the agents' strategies decided (fired, refused by a constraint, failed), newest last."""
    roles = agent or list(ROLES)
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise _fail(f"--agent {', '.join(unknown)}: not an agent role (use {', '.join(ROLES)})")
    state = _state_or_exit(_home(home, workflow_name))
    params: dict[str, Any] = {"limit": limit, **({"strategy": strategy} if strategy else {})}
    by_role = {role: _get(f"{_agent_url(state.urls, role)}/decisions", params) for role in roles}
    _show(decision_rows(by_role, limit), json_output, decision_line, "no decisions yet")


def plans(
    home: HomeOpt = None,
    workflow_name: NameOpt = None,
    policy: Annotated[str | None, typer.Option("--policy", help="only this policy's, e.g. autoscale, retrain, "
                                               "failover")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=200, help="the newest N (it keeps 200)")] = 20,
    json_output: JsonOpt = False,
) -> None:
    """The Planner's policy decisions (retrain, autoscale, failover, ...) with their reasons, newest last."""
    state = _state_or_exit(_home(home, workflow_name))
    params: dict[str, Any] = {"limit": limit, **({"policy": policy} if policy else {})}
    _show(list(_get(f"{_agent_url(state.urls, 'planner')}/plans", params)), json_output, plan_line, "no plans yet")


def _show(rows: list[dict[str, Any]], json_output: bool, line: Callable[[dict[str, Any]], str], empty: str) -> None:
    """Print rows as one JSON list, or one line each (`empty` when there are none)."""
    if json_output:
        typer.echo(json.dumps(rows, indent=1, default=str))
        return
    typer.echo("\n".join(line(r) for r in rows) if rows else empty)


def log_names(log_dir: Path) -> list[str]:
    """The components with a log file in `log_dir` (file stem of each *.log), sorted."""
    return sorted(p.stem for p in Path(log_dir).glob("*.log"))


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of a text file, read once from the start (logs here are small; a
    deque keeps memory at `lines`)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n") for line in deque(f, maxlen=lines)]


def logs(
    component: Annotated[str | None, typer.Argument(help="e.g. planner, executor, mlflow; none: list them")] = None,
    home: HomeOpt = None,
    workflow_name: NameOpt = None,
    lines: Annotated[int, typer.Option("--lines", "-n", min=1, help="how many of the last lines")] = 50,
) -> None:
    """The last lines of a component's log in the stack's home; without a component, the logs there are."""
    state = _state_or_exit(_home(home, workflow_name))
    log_dir = Path(state.log_dir)
    names = log_names(log_dir)
    if component is None:
        typer.echo("\n".join(names) if names else f"no logs in {log_dir} yet")
        return
    path = log_dir / f"{component}.log"
    if component not in names:
        raise _fail(f"no log {component!r} in {log_dir}: there are {', '.join(names) or 'none'}")
    for line in tail(path, lines):
        typer.echo(line)
