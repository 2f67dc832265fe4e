"""Workflow declarations: what a team runs (jobs, services) and who supervises it (agents).

Everything here is a frozen pydantic model, so a workflow is a value: it validates on construction
(an error names the field, the value and what is allowed), round-trips exactly through JSON/YAML,
and can be passed between processes. Who uses it: the CLI (`scanflow validate`, `deploy`), the
platforms (what to run), the agents (the SLO they defend).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

NAME_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a DNS-1123 label: valid for K8s and for files
_MEMORY_RE = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_MEMORY_FACTORS = {
    None: 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


_CPU_RE = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(m?)$")


def parse_cpu(value: Any) -> float:
    """Kubernetes-style CPU quantity (0.5, 2, '0.5', '500m') -> cores. Not kubernetes.utils.parse_quantity:
    importing the client costs ~1 s in every agent and CLI process that reads a workflow, and the
    kubernetes package is only needed by one platform; CPU takes these two forms only."""
    if isinstance(value, bool):
        raise ValueError(f"cpu {value!r} is not a number of cores")  # noqa: TRY004 - pydantic reports ValueError only
    if isinstance(value, int | float):
        return float(value)
    m = _CPU_RE.match(str(value).strip())
    if not m:
        raise ValueError(f"cpu {value!r} is not a quantity: use cores (0.5, 2) or millicores ('500m')")
    return float(m.group(1)) / (1000.0 if m.group(2) else 1.0)


class SpecError(ValueError):
    """A workflow declaration is wrong; the message names the field, the value and what is allowed.

    `items`: for a shape error, one (field path, value, message) per problem, so that `scanflow
    validate` (scanflow.validation) prints one line each; empty for a file-level error."""

    def __init__(self, message: str, items: tuple[tuple[str, Any, str], ...] = ()) -> None:
        super().__init__(message)
        self.items = items


def parse_memory(value: str | int) -> int:
    """Kubernetes-style quantity ('512Mi', '2G', 1048576) -> bytes."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"memory must be >= 0 bytes, got {value}")
        return value
    m = _MEMORY_RE.match(str(value).strip())
    if not m:
        raise ValueError(
            f"memory {value!r} is not a quantity: use bytes or a number with Ki, Mi, Gi, Ti, K, M, G, T "
            "(for example '512Mi')"
        )
    return int(float(m.group(1)) * _MEMORY_FACTORS[m.group(2)])


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Resources(_Spec):
    """CPU (cores, may be fractional) and memory (a Kubernetes quantity) for one replica or job."""

    cpu: float = Field(1.0, gt=0, le=512, description="cores per replica, e.g. 0.5, 2 or '500m'")
    memory: str = Field("512Mi", description="memory per replica, Kubernetes quantity e.g. '512Mi'",
                        json_schema_extra={"pattern": _MEMORY_RE.pattern})

    @field_validator("cpu", mode="before")
    @classmethod
    def _check_cpu(cls, v: Any) -> float:
        return parse_cpu(v)

    @field_validator("memory", mode="before")
    @classmethod
    def _check_memory(cls, v: Any) -> str:
        if isinstance(v, int):
            v = str(v)
        parse_memory(v)
        return str(v)

    @property
    def memory_bytes(self) -> int:
        return parse_memory(self.memory)


class Affinity(_Spec):
    """Where replicas may run.

    none: anywhere (the OS / scheduler decides). pinned: exclusive whole cores per replica (local:
    sched_setaffinity; Kubernetes: Guaranteed QoS with integer CPUs under the static CPU manager).
    numa: pinned and memory from the replica's socket (the paper's CPUMEM policy).
    """

    policy: Literal["none", "pinned", "numa"] = "none"
    node_selector: dict[str, str] = Field(default_factory=dict)
    spread_across_nodes: bool = False


class SLO(_Spec):
    """Service level objective: `percentile` latency below `latency_ms`, errors below `error_rate`."""

    latency_ms: float = Field(50.0, gt=0)
    percentile: float = Field(99.0, gt=0, lt=100)
    error_rate: float = Field(0.01, ge=0, le=1)


class DeliveryStage(_Spec):
    """One stage of a progressive delivery. shadow: `share` of the answered requests are mirrored to the
    challenger (its answers recorded, never returned); canary: `share` of the requests are answered by
    it. The stage passes after `min_seconds` once `min_labelled` rows are labelled (shadow: rows both
    models answered; canary: rows the challenger answered, counted since the delivery began) and the
    challenger is shown not worse; it rolls back at `timeout_s` otherwise."""

    kind: Literal["shadow", "canary"]
    share: float = Field(gt=0, le=1)
    min_labelled: int = Field(200, ge=0)
    min_seconds: float = Field(30.0, ge=0)
    timeout_s: float = Field(900.0, gt=0)

    @model_validator(mode="after")
    def _check_times(self) -> DeliveryStage:
        if self.timeout_s <= self.min_seconds:
            raise ValueError(f"timeout_s={self.timeout_s} must be above min_seconds={self.min_seconds}")
        return self


def _default_stages() -> list[DeliveryStage]:
    return [DeliveryStage(kind="shadow", share=1.0), DeliveryStage(kind="canary", share=0.1),
            DeliveryStage(kind="canary", share=0.5)]


class Delivery(_Spec):
    """How a challenger that passed the offline gate reaches the traffic. `none`: every replica swaps at
    once. `progressive`: the challenger gets its own replicas (`challenger_replicas`), then goes through
    `stages` (by default shadow, canary 10 %, canary 50 %) to full promotion, judged live on the rows
    feedback labels: promoted when not worse than the champion by more than `margin` at `confidence`,
    rolled back at once when its answers fail beyond `max_error_rate` or its p99 breaks the SLO while more
    than `latency_tolerance` (relative) above the champion's on the same gateways, or when a stage times out.
    `delivery: none` and `delivery: progressive` are shorthands."""

    mode: Literal["none", "progressive"] = "progressive"
    stages: list[DeliveryStage] = Field(default_factory=_default_stages, min_length=1, max_length=8)
    margin: float = Field(0.02, ge=0)
    confidence: float = Field(0.95, ge=0.5, lt=1)
    max_error_rate: float = Field(0.001, ge=0, lt=1)
    latency_tolerance: float = Field(1.0, ge=0, le=100)
    challenger_replicas: int = Field(1, ge=1, le=16)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"mode": data} if isinstance(data, str) else data


class Job(_Spec):
    """A batch job, such as training: `entrypoint` is 'module:function' or a command list."""

    name: str = Field(pattern=NAME_RE, max_length=63)
    entrypoint: str | list[str]
    params: dict[str, Any] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    timeout_s: float = Field(1800.0, gt=0)
    image: str | None = None

    @field_validator("entrypoint")
    @classmethod
    def _check_entrypoint(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, str):
            if not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", v):
                raise ValueError(f"entrypoint {v!r} must be 'package.module:function' or a command list")
        elif not v:
            raise ValueError("entrypoint command list must not be empty")
        return v


class Service(_Spec):
    """An online service: replicas serving one registered model, behind one gateway endpoint."""

    name: str = Field(pattern=NAME_RE, max_length=63)
    model_uri: str = Field(description="'models:/name@alias', 'models:/name/3', 'runs:/...' or a path")
    replicas: int = Field(1, ge=0, le=256)
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(8, ge=1, le=256)
    threads: int | None = Field(None, ge=1, le=512, description="intra-op threads; default from cpu")
    resources: Resources = Field(default_factory=Resources)
    affinity: Affinity = Field(default_factory=Affinity)
    slo: SLO = Field(default_factory=SLO)
    backup: str | None = Field(None, description="name of another service that takes traffic on failover")
    port: int | None = Field(None, ge=1024, le=65535, description="gateway port; free port if unset")
    max_batch_size: int = Field(32, ge=1, le=4096)
    max_batch_wait_ms: float = Field(2.0, ge=0, le=1000)
    image: str | None = None
    delivery: Delivery = Field(default_factory=lambda: Delivery(mode="none"),
                               description="how a promoted challenger reaches traffic: none (swap) or progressive")

    @field_validator("model_uri")
    @classmethod
    def _check_model_uri(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("model_uri must not be empty")
        if v.startswith("models:/") and not re.match(r"^models:/[^/@]+(@[\w-]+|/\d+|/latest)?$", v):
            raise ValueError(f"model_uri {v!r}: use models:/NAME@ALIAS or models:/NAME/VERSION")
        return v

    @model_validator(mode="after")
    def _check_bounds(self) -> Service:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas={self.min_replicas} is above max_replicas={self.max_replicas}"
            )
        if not self.min_replicas <= self.replicas <= self.max_replicas and self.replicas != 0:
            raise ValueError(
                f"replicas={self.replicas} must lie in [min_replicas={self.min_replicas}, "
                f"max_replicas={self.max_replicas}]"
            )
        if self.backup == self.name:
            raise ValueError(f"backup={self.backup!r} cannot be the service itself")
        return self


class ActionSpec(_Spec):
    """One action of a strategy: a local actuator, or an actuator of another agent over REST."""

    actuator: str = Field(min_length=1)
    agent: str | None = Field(None, description="another agent's name; None = this agent")
    args: dict[str, Any] = Field(default_factory=dict)


class StrategySpec(_Spec):
    """Event -> constraint -> actions, with a cooldown and a maximum rate."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=100)
    event: str = Field(min_length=1, description="event name or glob pattern, e.g. 'drift.*'")
    constraint: str = Field("True", description="safe expression over event, state, since(...)")
    actions: list[ActionSpec] = Field(min_length=1)
    cooldown_s: float = Field(0.0, ge=0)
    max_per_minute: float | None = Field(None, gt=0)


class AgentSpec(_Spec):
    """An agent of the workflow: role, where it listens, its declarative strategies."""

    name: str = Field(pattern=NAME_RE, max_length=63)
    role: Literal["tracker", "checker", "planner", "executor", "custom"] = "custom"
    module: str | None = Field(None, description="'package.module:agent' that builds the Agent object")
    port: int | None = Field(None, ge=1024, le=65535)
    strategies: list[StrategySpec] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict)


class Workflow(_Spec):
    """A whole declaration: the jobs, services and agents of one ML application."""

    name: str = Field(pattern=NAME_RE, max_length=63)
    jobs: list[Job] = Field(default_factory=list)
    services: list[Service] = Field(default_factory=list)
    agents: list[AgentSpec] = Field(default_factory=list)
    tracking_uri: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_references(self) -> Workflow:
        for kind, items in (("jobs", self.jobs), ("services", self.services), ("agents", self.agents)):
            names = [i.name for i in items]
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"{kind}: duplicate names {sorted(dup)}")
        services = {s.name for s in self.services}
        for s in self.services:
            if s.backup is not None and s.backup not in services:
                raise ValueError(
                    f"services.{s.name}.backup={s.backup!r} is not a service of this workflow "
                    f"(services: {sorted(services)})"
                )
        return self

    def service(self, name: str) -> Service:
        for s in self.services:
            if s.name == name:
                return s
        raise KeyError(f"no service {name!r} in workflow {self.name!r}")

    def job(self, name: str) -> Job:
        for j in self.jobs:
            if j.name == name:
                return j
        raise KeyError(f"no job {name!r} in workflow {self.name!r}")

    # -- serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, data: Any) -> Workflow:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(format_validation_error(exc), validation_error_items(exc)) from None

    @classmethod
    def from_yaml(cls, text: str) -> Workflow:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(f"not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise SpecError(f"a workflow file must hold a mapping at the top, got {type(data).__name__}")
        return cls.from_dict(data)


def validation_error_items(exc: ValidationError) -> tuple[tuple[str, Any, str], ...]:
    """(field path, value, message) per problem: ('services.0.replicas', 500, 'Input should be ...')."""
    return tuple(
        (".".join(str(p) for p in err["loc"]) or "<root>", err.get("input"), str(err["msg"]))
        for err in exc.errors()
    )


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: 'services.0.replicas = 500: Input should be less than or equal to 256'."""
    lines = []
    for loc, value, msg in validation_error_items(exc):
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        lines.append(f"{loc} = {shown}: {msg}")
    return "invalid workflow:\n  " + "\n  ".join(lines)


def code_root(path: str | Path) -> Path:
    """The directory a workflow file's code imports from: the file's directory, or above it the first
    one that is not a package (no __init__.py). `team/churn/workflow.py` in package `churn` -> `team/`,
    so `churn.train:train` imports. Pure but for reading the file system."""
    d = Path(path).resolve().parent
    while (d / "__init__.py").exists() and d.parent != d:
        d = d.parent
    return d


def make_importable(root: str | Path) -> None:
    """Put `root` first on sys.path and on PYTHONPATH, so this process and the ones it starts (the
    bootstrap, agents, jobs, replicas) import the workflow's own modules: a team's code lives outside
    this package, and the console script's sys.path does not hold the current directory."""
    r = str(Path(root).resolve())
    if r not in sys.path:
        sys.path.insert(0, r)
    parts = [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]
    if r not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([r, *parts])


def load_workflow(path: str | Path) -> Workflow:
    """Read a workflow from YAML/JSON, or from a Python file that defines `workflow` (a Workflow).

    The Python file runs as a module (user code: load only files you trust, as with any import). The
    file's code root (`code_root`) becomes importable here and in child processes (`make_importable`).
    """
    p = Path(path)
    if not p.exists():
        raise SpecError(f"workflow file {str(p)!r} does not exist")
    make_importable(code_root(p))
    if p.suffix in {".yaml", ".yml", ".json"}:
        return Workflow.from_yaml(p.read_text())
    if p.suffix == ".py":
        module = load_python_file(p)
        wf = getattr(module, "workflow", None)
        if wf is None:
            raise SpecError(f"{p}: defines no variable named 'workflow'")
        if isinstance(wf, Workflow):
            return wf
        if isinstance(wf, dict):
            return Workflow.from_dict(wf)
        raise SpecError(f"{p}: 'workflow' is a {type(wf).__name__}, expected scanflow.spec.Workflow")
    raise SpecError(f"{p}: unknown file type {p.suffix!r}; use .py, .yaml, .yml or .json")


def load_python_file(path: str | Path) -> Any:
    """Import a user's Python file as a module (name derived from the path) and return it."""
    p = Path(path).resolve()
    name = "scanflow_user_" + re.sub(r"\W", "_", p.stem)
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise SpecError(f"cannot import {p}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)  # a half-run module must not be found by a later import
        raise
    return module
