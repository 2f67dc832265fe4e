"""Workflow spec -> Kubernetes manifests (plain dicts), and the pure decisions around them.

Everything here is a pure function of its arguments: no client, no I/O. `KubernetesPlatform` applies
what these functions build, `scanflow deploy --dry-run` prints it, and the tests validate it against
the Kubernetes 1.33+ JSON schemas. Keeping the shape of every object in one module means the
platform, the CLI and the kustomize base cannot drift apart silently.

Conventions (also used by deploy/base):
- one Deployment and one Service per workflow service, both named after the service; pods carry
  `scanflow.io/service=<name>`; the Service selects on that single label, so failover is a selector
  switch to the backup's label;
- containers are named `replica` (services) and `job` (jobs); port 8080 named `http`;
- non-root (uid 10001), read-only root filesystem with an emptyDir on /tmp, no capabilities;
- secrets only by `secretKeyRef` (Secret `scanflow-secrets`), never as literal values.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from scanflow.secrets import public_params  # params minus secrets: the only ones in a Job's env
from scanflow.spec import Affinity, Job, Resources, Service, Workflow

Manifest = dict[str, Any]
QoS = Literal["Guaranteed", "Burstable", "BestEffort"]

DEFAULT_IMAGE = "scanflow:0.1.0"
DEFAULT_NAMESPACE = "scanflow"
SECRET_NAME = "scanflow-secrets"  # keys: token, postgres-password
HTTP_PORT = 8080
HEALTH_PATH = "/health"  # what replicas, gateways and agents answer when alive and ready
SERVICE_LABEL = "scanflow.io/service"
WORKFLOW_LABEL = "scanflow.io/workflow"
AFFINITY_ANNOTATION = "scanflow.io/affinity"
ROUTED_TO_ANNOTATION = "scanflow.io/routed-to"
REPLICA_CONTAINER = "replica"
JOB_CONTAINER = "job"
RUN_AS_USER = 10001


# -- resources and QoS -------------------------------------------------------------------------------


def cpu_quantity(cores: float) -> str:
    """1.0 -> '1', 0.5 -> '500m', 2.25 -> '2250m' (millicores, rounded up: never less than asked)."""
    milli = math.ceil(round(cores * 1000, 6))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def resources_block(resources: Resources, affinity: Affinity | None = None) -> dict[str, dict[str, str]]:
    """The container `resources` for a replica.

    affinity none: Burstable (requests cpu+memory, limit memory only: no CFS throttling, the pod may
    borrow idle cores). pinned / numa: Guaranteed with integer CPUs (requests == limits, cpu rounded
    up to whole cores), the only pods the kubelet's static CPU manager gives exclusive cores to.
    """
    memory = resources.memory
    if affinity is not None and affinity.policy in ("pinned", "numa"):
        cores = str(max(1, math.ceil(resources.cpu - 1e-9)))
        both = {"cpu": cores, "memory": memory}
        return {"requests": dict(both), "limits": dict(both)}
    return {"requests": {"cpu": cpu_quantity(resources.cpu), "memory": memory}, "limits": {"memory": memory}}


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
                _normalise(kind, requests[kind]) != _normalise(kind, limits[kind]))
            if kind not in limits or differs:
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _normalise(kind: str, value: Any) -> float:
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
    cpu = _normalise("cpu", limits["cpu"])
    return cpu == int(cpu) and _normalise("cpu", requests.get("cpu", limits["cpu"])) == cpu


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
    return ResizePlan("in-place", f"cluster v{server_version[0]}.{server_version[1]} supports pods/resize")


def parse_server_version(major: str, minor: str) -> tuple[int, int]:
    """VersionInfo fields ('1', '34+' on some providers) -> (1, 34)."""
    def num(text: str) -> int:
        m = re.match(r"\d+", text or "")
        if not m:
            raise ValueError(f"cannot read a Kubernetes version number from {text!r}")
        return int(m.group(0))

    return num(major), num(minor)


# -- pod template pieces ------------------------------------------------------------------------------


def labels(service: str, workflow: str | None = None, component: str = "replica") -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": service,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "scanflow",
        "app.kubernetes.io/managed-by": "scanflow",
        SERVICE_LABEL: service,
    }
    if workflow:
        out[WORKFLOW_LABEL] = workflow
    return out


def placement(service: str, affinity: Affinity) -> dict[str, Any]:
    """Pod spec fields for node affinity and topology spread (empty when neither is asked)."""
    spec: dict[str, Any] = {}
    if affinity.node_selector:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": k, "operator": "In", "values": [v]}
                                for k, v in sorted(affinity.node_selector.items())
                            ]
                        }
                    ]
                }
            }
        }
    if affinity.spread_across_nodes:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {SERVICE_LABEL: service}},
            }
        ]
    return spec


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def secret_env(name: str, key: str, *, optional: bool = False) -> dict[str, Any]:
    """An env var read from the Secret `scanflow-secrets` (the only way secrets enter a pod)."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": SECRET_NAME, "key": key, "optional": optional}}}


def probes(path: str = HEALTH_PATH) -> dict[str, Any]:
    def get() -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}}

    return {
        "readinessProbe": {**get(), "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 3},
        "livenessProbe": {**get(), "initialDelaySeconds": 20, "periodSeconds": 10, "timeoutSeconds": 3,
                          "failureThreshold": 6},
        "startupProbe": {**get(), "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 60},
    }


def replica_command(model_uri: str, port: int = HTTP_PORT) -> list[str]:
    return ["python", "-m", "scanflow.serving.replica", "--model-uri", model_uri, "--port", str(port)]


def replica_container(
    service: Service,
    *,
    image: str,
    resources: Resources | None = None,
    affinity: Affinity | None = None,
    threads: int | None = None,
    tracking_uri: str | None = None,
) -> dict[str, Any]:
    res = resources or service.resources
    aff = affinity or service.affinity
    n_threads = threads or service.threads or default_threads(res)
    env: list[dict[str, Any]] = [
        {"name": "SCANFLOW_HOST", "value": "0.0.0.0"},
        {"name": "SCANFLOW_SERVICE", "value": service.name},
        {"name": "SCANFLOW_THREADS", "value": str(n_threads)},
        {"name": "SCANFLOW_MAX_BATCH_SIZE", "value": str(service.max_batch_size)},
        {"name": "SCANFLOW_MAX_BATCH_WAIT_MS", "value": str(service.max_batch_wait_ms)},
        {"name": "OMP_NUM_THREADS", "value": str(n_threads)},
        {"name": "MLFLOW_TRACKING_URI", "value": tracking_uri or "http://mlflow:5000"},
        secret_env("SCANFLOW_TOKEN", "token"),
    ]
    return {
        "name": REPLICA_CONTAINER,
        "image": service.image or image,
        "imagePullPolicy": "IfNotPresent",
        "command": replica_command(service.model_uri),
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "env": env,
        "resources": resources_block(res, aff),
        "resizePolicy": [
            {"resourceName": "cpu", "restartPolicy": "NotRequired"},
            {"resourceName": "memory", "restartPolicy": "NotRequired"},
        ],
        **probes(),
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def deployment(
    service: Service,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    image: str = DEFAULT_IMAGE,
    workflow: str | None = None,
    tracking_uri: str | None = None,
    resources: Resources | None = None,
    affinity: Affinity | None = None,
    threads: int | None = None,
    service_account: str = "scanflow",
) -> Manifest:
    """The Deployment of a service's replicas (rolling updates never drop below the desired count)."""
    aff = affinity or service.affinity
    meta_labels = labels(service.name, workflow)
    pod_spec: dict[str, Any] = {
        "serviceAccountName": service_account,
        "automountServiceAccountToken": False,  # replicas never talk to the API server
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": 30,
        "containers": [
            replica_container(
                service, image=image, resources=resources, affinity=aff, threads=threads,
                tracking_uri=tracking_uri,
            )
        ],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}],
        **placement(service.name, aff),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": service.name, "namespace": namespace, "labels": meta_labels},
        "spec": {
            "replicas": service.replicas,
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": {SERVICE_LABEL: service.name}},
            "strategy": rolling_strategy(),
            "template": {
                "metadata": {
                    "labels": dict(meta_labels),
                    "annotations": {AFFINITY_ANNOTATION: aff.policy},
                },
                "spec": pod_spec,
            },
        },
    }


def rolling_strategy() -> dict[str, Any]:
    """Never fewer ready pods than desired during an update: one extra first, then the old one goes."""
    return {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def k8s_service(
    service: Service, *, namespace: str = DEFAULT_NAMESPACE, workflow: str | None = None,
    routed_to: str | None = None,
) -> Manifest:
    """The ClusterIP Service in front of the replicas; `routed_to` selects a backup's pods instead."""
    target = routed_to or service.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service.name,
            "namespace": namespace,
            "labels": labels(service.name, workflow),
            "annotations": {ROUTED_TO_ANNOTATION: target},
        },
        "spec": {
            "type": "ClusterIP",
            "selector": {SERVICE_LABEL: target},
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def route_patch(target: str) -> Manifest:
    """Merge patch that points a Service at `target`'s pods (the selector has this one key only)."""
    return {
        "metadata": {"annotations": {ROUTED_TO_ANNOTATION: target}},
        "spec": {"selector": {SERVICE_LABEL: target}},
    }


# -- jobs ---------------------------------------------------------------------------------------------


def job_command(job: Job) -> list[str]:
    """A command list runs as given; 'pkg.mod:func' runs through the job runner (params from env)."""
    if isinstance(job.entrypoint, list):
        return list(job.entrypoint)
    return ["python", "-m", "scanflow.platform.jobrunner", job.entrypoint]


def batch_job(
    job: Job,
    run_name: str,
    *,
    params: dict[str, Any] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    image: str = DEFAULT_IMAGE,
    workflow: str | None = None,
    tracking_uri: str | None = None,
    backoff_limit: int = 1,
    ttl_after_finished_s: int = 3600,
    service_account: str = "scanflow",
    run_id: str | None = None,
) -> Manifest:
    """A batch/v1 Job for one run of `job` (named `run_name`, unique per run). `run_id`: the MLflow
    run the platform opened for it; the job runner logs into that run (MLFLOW_RUN_ID) instead of
    opening its own."""
    merged = public_params({**job.params, **(params or {})})
    job_labels = labels(job.name, workflow, component="job")
    job_labels.pop(SERVICE_LABEL)
    job_labels["scanflow.io/job"] = job.name
    container = {
        "name": JOB_CONTAINER,
        "image": job.image or image,
        "imagePullPolicy": "IfNotPresent",
        "command": job_command(job),
        "env": [
            {"name": "SCANFLOW_JOB_NAME", "value": job.name},
            {"name": "SCANFLOW_JOB_PARAMS", "value": json.dumps(merged, sort_keys=True)},
            {"name": "MLFLOW_TRACKING_URI", "value": tracking_uri or "http://mlflow:5000"},
            {"name": "MLFLOW_EXPERIMENT_NAME", "value": f"scanflow-jobs/{workflow or namespace}"},
            {"name": "OMP_NUM_THREADS", "value": str(default_threads(job.resources))},
            secret_env("SCANFLOW_TOKEN", "token"),
            *([{"name": "MLFLOW_RUN_ID", "value": run_id}] if run_id else []),
        ],
        "resources": resources_block(job.resources),
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": run_name, "namespace": namespace, "labels": job_labels},
        "spec": {
            "backoffLimit": backoff_limit,
            "activeDeadlineSeconds": max(1, math.ceil(job.timeout_s)),
            "ttlSecondsAfterFinished": ttl_after_finished_s,
            "template": {
                "metadata": {"labels": dict(job_labels)},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": service_account,
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security_context(),
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
                },
            },
        },
    }


# -- whole workflow -----------------------------------------------------------------------------------


def workflow_manifests(
    workflow: Workflow,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    image: str = DEFAULT_IMAGE,
) -> list[Manifest]:
    """Deployments and Services for every service of the workflow (jobs run on demand, not here)."""
    out: list[Manifest] = []
    for svc in workflow.services:
        out.append(deployment(svc, namespace=namespace, image=image, workflow=workflow.name,
                              tracking_uri=workflow.tracking_uri))
        out.append(k8s_service(svc, namespace=namespace, workflow=workflow.name))
    return out
