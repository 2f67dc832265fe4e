"""`scanflow status`: ask each part of a running stack how it is, then judge the answers.

Two halves: `probe` does the I/O (is the `up` process alive, MLflow's /health, each agent's /health
and /status, the Executor's GET /services), `classify` is pure (the answers -> one row per part and
an exit code), so the rules are unit-tested without a stack. A service is down with no ready replica,
degraded with fewer than it should have (e.g. while scaling); only "down" fails the check.
Who calls: scanflow.embedded.cli (status), tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import httpx

from scanflow.embedded.statefile import StackState, is_alive, read_token

Health = Literal["up", "degraded", "starting", "down"]
HTTP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class AgentProbe:
    """What one agent answered: the name /health gave (None: no healthy answer) and its /status."""

    role: str
    url: str
    name: str | None = None
    status: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class Probe:
    """Everything `status` asked, as answered (None / error strings where there was no answer)."""

    state: StackState
    up_alive: bool
    mlflow_ok: bool
    agents: list[AgentProbe] = field(default_factory=list)
    services: dict[str, Any] | None = None  # the Executor's GET /services body
    services_error: str | None = None


@dataclass(frozen=True)
class Row:
    """One line of the status table."""

    kind: str  # "up", "mlflow", "agent", "service"
    name: str
    health: Health
    detail: str
    url: str = ""


@dataclass(frozen=True)
class Report:
    rows: list[Row]
    rc: int  # 0 all up, 1 something down (or still starting)

    def to_dict(self, state: StackState) -> dict[str, Any]:
        return {"workflow": state.workflow, "home": state.home, "state": state.state, "phase": state.phase,
                "rc": self.rc, "components": [asdict(r) for r in self.rows]}


def service_row(name: str, url: str, body: Any) -> Row:
    """Pure: one service's row from its entry in GET /services (a ServiceStatus as a dict)."""
    if not isinstance(body, dict) or "error" in body:
        why = body.get("error") if isinstance(body, dict) else "not reported by the Executor"
        return Row("service", name, "down", str(why), url)
    replicas = [r for r in body.get("replicas") or [] if isinstance(r, dict)]
    ready = sum(1 for r in replicas if r.get("ready"))
    desired = int(body.get("desired_replicas") or 0)
    versions = sorted({str(r["model_version"]) for r in replicas if r.get("model_version") is not None})
    health: Health = "down" if ready == 0 and desired > 0 else "degraded" if ready < desired else "up"
    detail = f"replicas {ready}/{desired} ready, model {','.join(versions) or '-'}"
    routed = body.get("routed_to")
    if routed and routed != name:
        detail += f", routed to {routed}"
    return Row("service", name, health, detail, url)


def agent_row(a: AgentProbe) -> Row:
    """Pure: an agent is up when /health named it; the detail comes from /status."""
    if a.name is None:
        return Row("agent", a.role, "down", a.error or "no answer to /health", a.url)
    s = a.status or {}
    uptime = s.get("uptime_s")
    detail = (f"{a.name}: queue {s.get('queue_depth', '?')}, processed {s.get('processed', '?')}"
              + (f", up {float(uptime):.0f}s" if isinstance(uptime, int | float) else ""))
    return Row("agent", a.role, "up", detail, a.url)


def classify(p: Probe) -> Report:
    """Pure: the rows of the table and the exit code (0 only when nothing is down and start-up is over)."""
    st = p.state
    up_health: Health = "down" if not p.up_alive else "starting" if st.state != "running" else "up"
    up_detail = f"pid {st.pid.pid}" + (f", {st.phase}" if up_health == "starting" and st.phase else "")
    if not p.up_alive:
        up_detail += " is gone (run `scanflow down` to sweep what it left)"
    rows = [Row("up", st.workflow, up_health, up_detail)]
    mlflow_url = str(st.urls.get("mlflow") or "")
    rows.append(Row("mlflow", "mlflow", "up" if p.mlflow_ok else "down",
                    "healthy" if p.mlflow_ok else "no answer to /health", mlflow_url))
    rows += [agent_row(a) for a in p.agents]
    services: dict[str, str] = dict(st.urls.get("services") or {})
    for name, url in services.items():
        if p.services is None:
            rows.append(Row("service", name, "down", p.services_error or "the Executor did not answer", url))
        else:
            rows.append(service_row(name, url, p.services.get(name)))
    rc = 0 if all(r.health in ("up", "degraded") for r in rows) else 1
    return Report(rows, rc)


def render(report: Report, state: StackState) -> str:
    """The compact table `scanflow status` prints."""
    head = f"stack {state.workflow!r} in {state.home}: {'all up' if report.rc == 0 else 'NOT all up'}"
    w_kind = max(len(r.kind) for r in report.rows)
    w_name = max(len(r.name) for r in report.rows)
    lines = [head]
    for r in report.rows:
        url = f"  {r.url}" if r.url else ""
        lines.append(f"  {r.kind:<{w_kind}}  {r.name:<{w_name}}  {r.health:<9} {r.detail}{url}")
    return "\n".join(lines)


# -- the I/O half --------------------------------------------------------------------------------------
def _get_json(client: httpx.Client, url: str) -> tuple[Any, str | None]:
    """(JSON body, None) on 200, else (None, a short reason)."""
    try:
        r = client.get(url)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__} on {url}"
    if r.status_code != 200:
        return None, f"HTTP {r.status_code} on {url}"
    try:
        return r.json(), None
    except ValueError:
        return None, f"no JSON from {url}"


def probe(state: StackState, timeout_s: float = HTTP_TIMEOUT_S) -> Probe:
    """Ask each part named in `state`; never raises for a part that does not answer."""
    token = read_token(state.token_file)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    agents: list[AgentProbe] = []
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        mlflow = state.urls.get("mlflow")
        mlflow_ok = False
        if mlflow:  # MLflow's /health answers a plain "OK", not JSON
            try:
                mlflow_ok = client.get(f"{mlflow}/health").status_code == 200
            except httpx.HTTPError:
                pass
        for role, url in dict(state.urls.get("agents") or {}).items():
            health, err = _get_json(client, f"{url}/health")
            name = health.get("agent") if isinstance(health, dict) else None
            status = _get_json(client, f"{url}/status")[0] if name else None
            agents.append(AgentProbe(role, url, name if isinstance(name, str) else None,
                                     status if isinstance(status, dict) else None, err))
        services: dict[str, Any] | None = None
        services_error: str | None = "no executor in stack.json"
        executor = dict(state.urls.get("agents") or {}).get("executor")
        if executor:
            body, services_error = _get_json(client, f"{executor}/services")
            services = body if isinstance(body, dict) else None
    return Probe(state, is_alive(state.pid), mlflow_ok, agents, services, services_error)
