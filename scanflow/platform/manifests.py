"""Workflow spec -> Kubernetes manifests (plain dicts), and the pure decisions around them.

Everything here is a pure function of its arguments: no client, no I/O. `KubernetesPlatform` applies
what these functions build, `scanflow deploy --dry-run` prints it, and the tests validate it against
the Kubernetes 1.33+ JSON schemas. Keeping the shape of every object in one module means the
platform, the CLI and the kustomize base cannot drift apart silently. The rules the objects follow
live beside it: container resources, QoS and the resize decision in `k8s_resources`, pod confinement
and credentials in `k8s_security`.

Conventions (also used by deploy/base):
- one Deployment and one Service per workflow service, both named after the service; pods carry
  `scanflow.io/service=<name>`; the Service selects on that single label, so failover is a selector
  switch to the backup's label;
- containers are named `replica` (services) and `job` (jobs); port 8080 named `http`;
- non-root (uid 10001), read-only root filesystem with an emptyDir on /tmp, no capabilities
  (k8s_security);
- secrets only by `secretKeyRef` (Secret `scanflow-secrets`), never as literal values; each component
  its own (scanflow.deploy_secrets): a replica holds the replica's token (it can only append prediction
  records) and a read-only MLflow login, a Job only the `job` MLflow login (it cannot move `champion`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from scanflow.platform.jobruns import jobs_experiment
from scanflow.platform.k8s_resources import default_threads, normalise, resources_block
from scanflow.platform.k8s_security import container_security_context, credential_env, pod_security_context
from scanflow.secrets import public_params  # params minus secrets: the only ones in a Job's env
from scanflow.spec import Affinity, Job, Resources, Service, Workflow, parse_memory

Manifest = dict[str, Any]

DEFAULT_IMAGE = "scanflow:0.1.0"
DEFAULT_NAMESPACE = "scanflow"
HTTP_PORT = 8080
HEALTH_PATH = "/health"  # liveness: the process answers (replicas, gateways, agents)
READY_PATH = "/ready"  # readiness: a replica's model is loaded / a gateway has a healthy replica
MANAGED_BY = "scanflow-executor"  # app.kubernetes.io/managed-by of what the Executor creates and owns
LEGACY_MANAGED_BY = "scanflow"  # what deploy/base labelled the replicas with before the Executor owned them
FIELD_MANAGER = "scanflow-executor"  # server-side apply field manager of the Executor
OWNER_LABEL = "app.kubernetes.io/managed-by"
SPOOL_DIR = "/tmp/scanflow-spool"  # replica's durable prediction spool (emptyDir: survives a container restart)
SERVICE_LABEL = "scanflow.io/service"
WORKFLOW_LABEL = "scanflow.io/workflow"
AFFINITY_ANNOTATION = "scanflow.io/affinity"
# on a Deployment (not its pod template): the resources its pods were resized to in place, as JSON
# {"resources": <a container's resources block>, "threads": n}. The template keeps what it had, so the
# resize starts no rollout; pods created later are resized to it as they appear (k8s_resize)
RESIZED_ANNOTATION = "scanflow.io/resized"
ROUTED_TO_ANNOTATION = "scanflow.io/routed-to"
REPLICA_CONTAINER = "replica"
JOB_CONTAINER = "job"


# -- pod template pieces ------------------------------------------------------------------------------


def labels(service: str, workflow: str | None = None, component: str = "replica") -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": service,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "scanflow",
        OWNER_LABEL: MANAGED_BY,
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



def probes(ready: str = READY_PATH, alive: str = HEALTH_PATH, startup_s: int = 300) -> dict[str, Any]:
    """Readiness on `ready` (a replica answers /health before its model is loaded; /ready only after),
    liveness on `alive`, and a startupProbe on `ready` that gives start-up (model download and load)
    `startup_s` before liveness counts."""
    def get(path: str) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}}

    return {
        "readinessProbe": {**get(ready), "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 3},
        "livenessProbe": {**get(alive), "periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 6},
        "startupProbe": {**get(ready), "periodSeconds": 5, "timeoutSeconds": 2,
                         "failureThreshold": max(1, startup_s // 5)},
    }


def scrape_annotations(path: str = "/metrics", port: int = HTTP_PORT) -> dict[str, str]:
    """Prometheus' conventional pod annotations (kubernetes_sd_configs relabelling)."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": path}


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
    tracker_url: str | None = None,
) -> dict[str, Any]:
    """The replica container. `tracker_url`: where it posts its prediction records (SCANFLOW_TRACKER_URL,
    spooled under /tmp first so a Tracker outage loses nothing); None: records stay in the pod."""
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
        *credential_env("replica"),
    ]
    if tracker_url:
        env += [{"name": "SCANFLOW_TRACKER_URL", "value": tracker_url},
                {"name": "SCANFLOW_SPOOL_DIR", "value": SPOOL_DIR}]
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
    tracker_url: str | None = None,
) -> Manifest:
    """The Deployment of a service's replicas (rolling updates never drop below the desired count),
    labelled as the Executor's (app.kubernetes.io/managed-by=scanflow-executor)."""
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
                tracking_uri=tracking_uri, tracker_url=tracker_url,
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
                    "annotations": {AFFINITY_ANNOTATION: aff.policy, **scrape_annotations()},
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


OWN_SUFFIX = "-own"


def own_service_name(service: str) -> str:
    """Name of the Service that always selects `service`'s own pods (never re-routed)."""
    return f"{service[:63 - len(OWN_SUFFIX)]}{OWN_SUFFIX}"


def own_service(service: Service, *, namespace: str = DEFAULT_NAMESPACE, workflow: str | None = None) -> Manifest:
    """A headless Service on the service's own pods only, whatever the routable Service selects.

    Why its own: the gateway must see the primary's replicas as they are. Behind the routable Service a
    failover (selector switched to the backup) shows the gateway, and the Checker that reads it,
    healthy replicas while the primary's own pods may be down, and the Planner would route back
    too early. The gateway names this one as its upstream and the backup's as its SCANFLOW_BACKUP.
    Why headless (clusterIP None): its DNS name resolves to each ready pod's address, and the gateway
    (SCANFLOW_UPSTREAM_DISCOVERY=dns, scanflow.serving.discovery) balances over the pods themselves;
    through a ClusterIP its kept-alive connections would pin traffic to the pods they first reached."""
    out = k8s_service(service, namespace=namespace, workflow=workflow)
    out["metadata"]["name"] = own_service_name(service.name)
    out["metadata"].pop("annotations")
    out["spec"]["clusterIP"] = "None"
    return out


def route_patch(target: str) -> Manifest:
    """Merge patch that points a Service at `target`'s pods (the selector has this one key only)."""
    return {
        "metadata": {"annotations": {ROUTED_TO_ANNOTATION: target}},
        "spec": {"selector": {SERVICE_LABEL: target}},
    }


def rollout_complete(dep: Manifest, want: int | None = None) -> bool:
    """True once a Deployment's rollout is over, as `kubectl rollout status` judges it (pure).

    The controller saw the latest spec (observedGeneration), every wanted pod runs the new template
    (updatedReplicas), no old pod is left (status.replicas == updated: readyReplicas alone counts old
    pods still serving, which let _wait_ready return while the rollout had barely started), and every
    updated pod is available. `want` defaults to spec.replicas."""
    spec, st = dep.get("spec") or {}, dep.get("status") or {}
    wanted = int(spec.get("replicas") or 0) if want is None else want
    if int(st.get("observedGeneration") or 0) < int((dep.get("metadata") or {}).get("generation") or 0):
        return False
    updated = int(st.get("updatedReplicas") or 0)
    total = int(st.get("replicas") or 0)
    available = int(st.get("availableReplicas") or st.get("readyReplicas") or 0)
    return updated >= wanted and total <= updated and available >= wanted


def hpa_bounds(current_min: int | None, current_max: int, wanted: int) -> tuple[int, int]:
    """The HPA rule (pure): the Planner's replica count becomes the HPA's floor; the ceiling stays the
    team's, and the floor stays under it so the HPA keeps a replica to decide on.

    (min, max) after the Planner asks for `wanted` replicas of a Deployment an HPA targets: max = the
    current max (a budget someone set: an agent does not raise it), min = wanted, at most max - 1. The
    HPA still scales between them on its own metric, so it is never disabled (min == max would); a
    Planner that asks for the ceiling or more gets max - 1 and the HPA decides the last replica. A
    scale-down lowers the floor, letting the HPA shrink the Deployment when its metric agrees. An HPA
    whose max is 1 stays at [1, 1]: its owner pinned it."""
    if wanted < 1:
        raise ValueError("an HPA cannot scale to 0: delete it first")
    ceiling = max(1, int(current_max))
    return min(wanted, max(1, ceiling - 1)), ceiling


def running_service(dep: Manifest) -> dict[str, Any]:
    """What a running Deployment the Executor owns says about its service (pure): the fields a
    restarted Executor adopts instead of resetting them: replicas, model_uri, image, resources,
    affinity, threads. Keys it cannot read are left out."""
    spec = dep.get("spec") or {}
    tmpl = spec.get("template") or {}
    pod = tmpl.get("spec") or {}
    c = next((c for c in pod.get("containers") or [] if c.get("name") == REPLICA_CONTAINER), None)
    out: dict[str, Any] = {}
    if spec.get("replicas") is not None:
        out["replicas"] = int(spec["replicas"])
    if c is None:
        return out
    if c.get("image"):
        out["image"] = c["image"]
    cmd = list(c.get("command") or []) + list(c.get("args") or [])
    if "--model-uri" in cmd and cmd.index("--model-uri") + 1 < len(cmd):
        out["model_uri"] = cmd[cmd.index("--model-uri") + 1]
    resources = _service_resources(c.get("resources") or {})
    if resources is not None:
        out["resources"] = resources
    policy = ((tmpl.get("metadata") or {}).get("annotations") or {}).get(AFFINITY_ANNOTATION)
    if policy:
        out["affinity"] = {"policy": policy}
    env = {e.get("name"): e.get("value") for e in c.get("env") or []}
    if str(env.get("SCANFLOW_THREADS", "")).isdigit():
        out["threads"] = int(env["SCANFLOW_THREADS"])
    resized = resized_to(dep)
    if resized is not None:  # resized in place since the template was written: that is what runs
        resources, threads = _service_resources(resized[0]), resized[1]
        if resources is not None:
            out["resources"] = resources
        if threads is not None:
            out["threads"] = threads
    return out


def _service_resources(res: dict[str, Any]) -> dict[str, Any] | None:
    """Pure: a Service's `resources` ({"cpu", "memory"}) from a container's resources block: the CPU
    request (else limit) and the memory limit (else request); None when either is missing."""
    cpu = (res.get("requests") or {}).get("cpu") or (res.get("limits") or {}).get("cpu")
    mem = (res.get("limits") or {}).get("memory") or (res.get("requests") or {}).get("memory")
    if cpu is None or mem is None:
        return None
    parse_memory(str(mem))  # a quantity the spec cannot read raises here, naming it
    return {"cpu": normalise("cpu", cpu), "memory": str(mem)}


def resized_to(dep: Manifest) -> tuple[dict[str, Any], int | None] | None:
    """Pure: (resources block, threads) a Deployment's pods were resized to in place
    (RESIZED_ANNOTATION), or None when its template says what its pods run."""
    raw = ((dep.get("metadata") or {}).get("annotations") or {}).get(RESIZED_ANNOTATION)
    if not raw:
        return None
    try:
        value = json.loads(raw)
        res, threads = dict(value["resources"]), value.get("threads")
    except (ValueError, KeyError, TypeError):
        return None  # not ours to read (edited by hand): the template stands
    return res, int(threads) if isinstance(threads, int) else None


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
    files: dict[str, str] | None = None,
) -> Manifest:
    """A batch/v1 Job for one run of `job` (named `run_name`, unique per run). `run_id`: the MLflow
    run the platform opened for it; the job runner logs into that run (MLFLOW_RUN_ID) instead of
    opening its own. `files`: {param: artifact path in that run} of the params naming files of the
    caller's filesystem (SCANFLOW_JOB_FILES: the runner downloads them)."""
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
            {"name": "MLFLOW_EXPERIMENT_NAME", "value": jobs_experiment(workflow or namespace)},
            {"name": "OMP_NUM_THREADS", "value": str(default_threads(job.resources))},
            *credential_env("job", token=False),
            *([{"name": "MLFLOW_RUN_ID", "value": run_id}] if run_id else []),
            *([{"name": "SCANFLOW_JOB_FILES", "value": json.dumps(files, sort_keys=True)}] if files else []),
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
    tracker_url: str | None = None,
) -> list[Manifest]:
    """Deployments and Services (routable and `-own`) for every service of the workflow (jobs run on
    demand, not here)."""
    out: list[Manifest] = []
    for svc in workflow.services:
        out.append(deployment(svc, namespace=namespace, image=image, workflow=workflow.name,
                              tracking_uri=workflow.tracking_uri, tracker_url=tracker_url))
        out.append(k8s_service(svc, namespace=namespace, workflow=workflow.name))
        out.append(own_service(svc, namespace=namespace, workflow=workflow.name))
    return out
