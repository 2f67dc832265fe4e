"""KubernetesPlatform: the Platform protocol on a cluster, through the official `kubernetes` client.

Who calls: the Executor agent's actuators (through `asyncio.to_thread`), `scanflow deploy`, tests
(against kmock on loopback) and benchmarks. It only applies desired state; the shapes come from
`manifests` (pure) and the decisions (how many replicas, which CPUs) from the Planner.

How each operation maps onto the API (docs/kubernetes.md has the why):
- ownership: what the Executor creates carries app.kubernetes.io/managed-by=scanflow-executor and is
  written by server-side apply with the field manager `scanflow-executor`; kustomize/GitOps own the
  agents, MLflow and the database, never these;
- services (adoption): the Deployments it owns are read back (replicas, image, model, resources,
  threads, affinity) so a restarted Executor re-applies what runs instead of resetting it;
- deploy: Deployment + Service per service by server-side apply (created when missing); an
  existing Service keeps its selector (a failover route survives a restart); plus `<name>-own`, a
  headless Service that always selects the service's own pods (the gateway's upstream, resolved to
  one address per ready pod: manifests.own_service);
- scale: the `deployments/scale` subresource (merge patch); when an HPA targets the Deployment the
  Planner's count becomes the HPA's floor, under its ceiling (manifests.hpa_bounds) instead, since
  the HPA would overwrite replicas within 15 s;
- set_resources: `pods/resize` on clusters >= 1.33, the template left alone (no rollout) and the size
  kept in a Deployment annotation that pods started later are resized to (reconcile_resized); rolling
  update (maxUnavailable 0) where in-place cannot work (older cluster, QoS change, static CPU manager)
  (k8s_resize);
- route: the Service selector is switched to the backup's pods, and back;
- set_image: an upgrade (the configured image is not the running one) rolls the replicas, surge 1,
  unavailable 0; adoption deploys what runs first, so the upgrade is a step of its own;
- set_challenger: `/admin/challenger` on every ready pod of the service's gateway (k8s_gateways);
- run_job: one MLflow run per Job, opened first and passed in the Job's env (MLFLOW_RUN_ID) so the job
  runner logs into it; a batch/v1 Job, waited on through its conditions; pod logs and outputs.json read
  back (k8s_jobs).
Every call carries `_request_timeout` and bounded retries with backoff (tenacity); API errors become
PlatformError subclasses naming the verb and resource (a 403 names what the Role lacks: k8s_api).
Methods block: calling them on a running event loop raises at once (use asyncio.to_thread).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from scanflow.extras import missing_extra
from scanflow.platform import manifests as mf

try:
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException
except ModuleNotFoundError as _exc:
    raise missing_extra(_exc, "k8s", "the Kubernetes platform") from None
from scanflow.platform.base import JobResult, PlatformError, ReplicaStatus, ResourceChange, ServiceStatus
from scanflow.platform.k8s_api import (
    APPLY_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    KubernetesNotFound,
    map_api_error,
    retryable,
)
from scanflow.platform.k8s_gateways import set_on_gateways
from scanflow.platform.k8s_jobs import run_k8s_job
from scanflow.platform.k8s_resize import ResizeLocks, apply_after_resize, reconcile_resized, resize_service
from scanflow.platform.k8s_resources import normalise, parse_server_version
from scanflow.spec import Affinity, Job, Resources, Service, parse_memory

log = logging.getLogger(__name__)
T = TypeVar("T")


def _ensure_not_on_event_loop(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"KubernetesPlatform.{what} blocks on the API server: call it with asyncio.to_thread, "
        "not on a running event loop"
    )


class KubernetesPlatform:
    """Apply services and jobs to one namespace of a cluster. Pass the API objects in (tests: kmock)."""

    def __init__(
        self,
        api_client: k8s.ApiClient | None = None,
        *,
        core: k8s.CoreV1Api | None = None,
        apps: k8s.AppsV1Api | None = None,
        batch: k8s.BatchV1Api | None = None,
        autoscaling: k8s.AutoscalingV2Api | None = None,
        version: k8s.VersionApi | None = None,
        namespace: str = mf.DEFAULT_NAMESPACE,
        image: str = mf.DEFAULT_IMAGE,
        workflow: str | None = None,
        tracking_uri: str | None = None,
        request_timeout_s: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        ready_timeout_s: float = 180.0,
        resize_timeout_s: float = 60.0,
        poll_interval_s: float = 1.0,
        sync_template_after_resize: bool = False,
        job_grace_s: float = 30.0,
        tracker_url: str | None = None,
        field_manager: str = mf.FIELD_MANAGER,
        gateway_token: str | None = None,
    ) -> None:
        if api_client is None and None in (core, apps, batch, autoscaling):
            api_client = k8s.ApiClient()  # from the loaded kubeconfig / in-cluster config
        self.api_client = api_client or (core or apps or batch).api_client  # type: ignore[union-attr]
        self.core = core or k8s.CoreV1Api(self.api_client)
        self.apps = apps or k8s.AppsV1Api(self.api_client)
        self.batch = batch or k8s.BatchV1Api(self.api_client)
        self.autoscaling = autoscaling or k8s.AutoscalingV2Api(self.api_client)
        self.version_api = version or k8s.VersionApi(self.api_client)
        self.namespace = namespace
        self.image = image
        self.workflow = workflow
        self.tracking_uri = tracking_uri
        self.request_timeout_s = request_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.ready_timeout_s = ready_timeout_s
        self.resize_timeout_s = resize_timeout_s
        self.resizing = ResizeLocks()  # one resize of a service at a time in this process (k8s_resize)
        self.poll_interval_s = poll_interval_s
        self.sync_template_after_resize = sync_template_after_resize
        self.job_grace_s = job_grace_s  # past timeout_s: activeDeadlineSeconds should have fired first
        self._server_version: tuple[int, int] | None = None
        self.tracker_url = tracker_url  # replicas post prediction records here (SCANFLOW_TRACKER_URL)
        self.field_manager = field_manager
        self.gateway_token = gateway_token  # for the gateways' /admin (serving:admin): set_challenger

    @classmethod
    def from_settings(cls, settings: Any, *, workflow: str, tracking_uri: str | None,
                      tracker_url: str | None = None, **kwargs: Any) -> KubernetesPlatform:
        """The Executor's platform, from configuration only: namespace SCANFLOW_NAMESPACE (required:
        deploy/base sets it from the pod's own namespace), image SCANFLOW_IMAGE, else the image of the
        Executor's own pod (SCANFLOW_POD_NAME, downward API), so kustomize's `images:` pins one image
        for everything; never a built-in default that would replace what runs."""
        if not settings.namespace:
            raise PlatformError("SCANFLOW_NAMESPACE is not set: the Executor must know its namespace "
                                "(deploy/base sets it from metadata.namespace)")
        kwargs.setdefault("sync_template_after_resize", bool(settings.sync_template_after_resize))
        kwargs.setdefault("gateway_token", settings.token.get_secret_value() if settings.token else None)
        plat = cls.from_config(namespace=settings.namespace, workflow=workflow, tracking_uri=tracking_uri,
                               tracker_url=tracker_url, **kwargs)
        plat.image = settings.image or plat.own_image(settings.pod_name)
        return plat

    def own_image(self, pod_name: str | None) -> str:
        """The image of this process's pod (first container): the image the Executor's pods should run."""
        if not pod_name:
            raise PlatformError("neither SCANFLOW_IMAGE nor SCANFLOW_POD_NAME is set: the Executor cannot "
                                "tell which image its pods should run")
        pod = self._dict(self._call("get", "pods", self.core.read_namespaced_pod, pod_name, self.namespace))
        containers = (pod.get("spec") or {}).get("containers") or []
        if not containers or not containers[0].get("image"):
            raise PlatformError(f"pod {pod_name!r} names no container image")
        return str(containers[0]["image"])

    @classmethod
    def from_config(cls, *, context: str | None = None, **kwargs: Any) -> KubernetesPlatform:
        """In a pod: the ServiceAccount's in-cluster config; elsewhere: ~/.kube/config (`context`)."""
        from kubernetes import config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config(context=context)
        return cls(k8s.ApiClient(), **kwargs)

    # -- plumbing --------------------------------------------------------------------------------------

    def _call(self, verb: str, resource: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One API call: timeout, bounded retries with exponential backoff, errors mapped."""
        kwargs.setdefault("_request_timeout", self.request_timeout_s)
        try:
            for attempt in Retrying(
                stop=stop_after_attempt(self.retries + 1),
                wait=wait_exponential(multiplier=self.backoff_s, max=10 * self.backoff_s + 1),
                retry=retry_if_exception(retryable),
                reraise=True,
            ):
                with attempt:
                    return fn(*args, **kwargs)
        except ApiException as exc:
            raise map_api_error(exc, verb, resource, self.namespace) from None
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
            raise PlatformError(f"{verb} {resource} in namespace {self.namespace!r}: API server unreachable after "
                                f"{self.retries + 1} attempts ({type(exc).__name__})", retryable=True) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _dict(self, obj: Any) -> dict[str, Any]:
        """API model -> plain dict with the API's camelCase keys (one shape for the whole module)."""
        out = self.api_client.sanitize_for_serialization(obj)
        return out if isinstance(out, dict) else {}

    def server_version(self) -> tuple[int, int]:
        """(major, minor) of the API server, read once."""
        if self._server_version is None:
            info = self._dict(self._call("get", "/version", self.version_api.get_code))
            self._server_version = parse_server_version(str(info.get("major", "")), str(info.get("minor", "")))
        return self._server_version

    def _read_deployment(self, name: str) -> dict[str, Any]:
        return self._dict(self._call("get", "deployments", self.apps.read_namespaced_deployment, name, self.namespace))

    def _pods(self, service: str) -> list[dict[str, Any]]:
        pods = self._call(
            "list", "pods", self.core.list_namespaced_pod, self.namespace,
            label_selector=f"{mf.SERVICE_LABEL}={service}",
        )
        # the label checked again: an emulator or an old API server may ignore the selector, and a resize
        # or a read-back must never touch another service's pods
        return [p for p in self._dict(pods).get("items") or []
                if ((p.get("metadata") or {}).get("labels") or {}).get(mf.SERVICE_LABEL) == service]

    def _hpa_for(self, deployment: str) -> dict[str, Any] | None:
        hpas = self._call(
            "list", "horizontalpodautoscalers",
            self.autoscaling.list_namespaced_horizontal_pod_autoscaler, self.namespace,
        )
        for hpa in self._dict(hpas).get("items") or []:
            ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
            if ref.get("kind") == "Deployment" and ref.get("name") == deployment:
                return hpa
        return None

    def _patch_deployment(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._dict(self._call(
            "patch", "deployments", self.apps.patch_namespaced_deployment, name, self.namespace, body,
            _content_type=STRATEGIC_PATCH, field_manager=self.field_manager,
        ))

    # -- Platform --------------------------------------------------------------------------------------

    def services(self) -> dict[str, Service]:
        """The services this Executor owns that run now, as they run (adoption, read-only): replicas,
        image, model, resources, threads and affinity read back from each Deployment labelled
        managed-by=scanflow-executor (of this workflow). A restarted Executor merges them into its
        workflow's specs, so its start-up apply changes nothing the Planner decided."""
        # managed-by `scanflow` too: what deploy/base declared before the Executor owned the replicas,
        # so an upgrade adopts the running Deployment instead of resetting it
        selector = f"{mf.OWNER_LABEL} in ({mf.MANAGED_BY},{mf.LEGACY_MANAGED_BY}),{mf.SERVICE_LABEL}"
        if self.workflow:
            selector += f",{mf.WORKFLOW_LABEL}={self.workflow}"
        deps = self._dict(self._call("list", "deployments", self.apps.list_namespaced_deployment, self.namespace,
                                     label_selector=selector))
        out: dict[str, Service] = {}
        for dep in deps.get("items") or []:
            meta = dep.get("metadata") or {}
            labels = meta.get("labels") or {}
            if labels.get(mf.OWNER_LABEL) not in (mf.MANAGED_BY, mf.LEGACY_MANAGED_BY) or meta.get("deletionTimestamp"):
                continue  # an emulator or an old API server may ignore the selector
            if self.workflow and labels.get(mf.WORKFLOW_LABEL) != self.workflow:
                continue
            found = mf.running_service(dep)
            if "model_uri" not in found:
                continue  # not a replica Deployment
            try:
                # bounds wide open: they are the declaration's business (adoption.adopt_running)
                out[meta["name"]] = Service(name=meta["name"], min_replicas=0, max_replicas=256, **found)
            except ValueError as exc:  # e.g. replicas outside the spec's bounds: adopt what can be read
                log.warning("deployment %s: cannot adopt %s", meta.get("name"), exc)
        return out

    def _apply(self, verb_resource: str, patch_fn: Callable[..., Any], create_fn: Callable[..., Any],
               name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply `body` as the Executor's field manager (force: it owns these fields);
        create it when the server answers 404 (an API server creates on apply; some emulators do not)."""
        try:
            return self._dict(self._call("patch", verb_resource, patch_fn, name, self.namespace, body,
                                         field_manager=self.field_manager, force=True, _content_type=APPLY_PATCH))
        except KubernetesNotFound:
            return self._dict(self._call("create", verb_resource, create_fn, self.namespace, body,
                                         field_manager=self.field_manager))

    def deploy(self, service: Service) -> ServiceStatus:
        """Apply the Deployment and Service (server-side apply); wait for the rollout up to ready_timeout_s.

        Adoption: an existing Deployment keeps its image unless the spec names one, and its replicas
        are left out of the apply when an HPA targets it. Re-deploying keeps a failover route (an
        existing Service's selector is not applied again)."""
        _ensure_not_on_event_loop("deploy")
        existing = self._read_deployment_or_none(service.name)
        image = service.image or (mf.running_service(existing).get("image") if existing else None) or self.image
        dep = mf.deployment(service, namespace=self.namespace, image=image, workflow=self.workflow,
                            tracking_uri=self.tracking_uri, tracker_url=self.tracker_url)
        svc = mf.k8s_service(service, namespace=self.namespace, workflow=self.workflow)
        notes: list[str] = []
        dep, resized = apply_after_resize(dep, existing)
        if existing is not None and self._hpa_for(service.name) is not None:
            dep["spec"].pop("replicas")
            notes.append("an HPA targets this Deployment: replicas left to it")
        with self.resizing.of(service.name):  # no reconcile between the annotation and the template
            if resized is not None:  # first: the reconcile must not resize new pods to a stale size
                self._patch_deployment(service.name, {"metadata": {"annotations": resized}})
            self._apply("deployments", self.apps.patch_namespaced_deployment,
                        self.apps.create_namespaced_deployment, service.name, dep)
        if self._read_or_none("services", self.core.read_namespaced_service, service.name) is not None:
            svc["spec"].pop("selector")  # a failover route (selector on the backup) outlives restarts
            svc["metadata"].pop("annotations")
        self._apply("services", self.core.patch_namespaced_service, self.core.create_namespaced_service,
                    service.name, svc)
        own = mf.own_service(service, namespace=self.namespace, workflow=self.workflow)
        old_own = self._read_or_none("services", self.core.read_namespaced_service, own["metadata"]["name"])
        if old_own is not None and (old_own.get("spec") or {}).get("clusterIP") not in (None, "None"):
            # made by an earlier version with a ClusterIP: a Service's clusterIP is immutable, so the
            # headless one replaces it (the gateway re-resolves the name within its health interval)
            self._call("delete", "services", self.core.delete_namespaced_service, own["metadata"]["name"],
                       self.namespace)
            notes.append(f"service {own['metadata']['name']!r} re-created headless")
        self._apply("services", self.core.patch_namespaced_service, self.core.create_namespaced_service,
                    own["metadata"]["name"], own)
        self._wait_ready(service.name, None if "replicas" not in dep["spec"] else service.replicas)
        status = self.status(service.name)
        return ServiceStatus(**{**status.__dict__, "notes": status.notes + tuple(notes)})

    def _read_or_none(self, resource: str, fn: Callable[..., Any], name: str) -> dict[str, Any] | None:
        try:
            return self._dict(self._call("get", resource, fn, name, self.namespace))
        except KubernetesNotFound:
            return None

    def _read_deployment_or_none(self, name: str) -> dict[str, Any] | None:
        return self._read_or_none("deployments", self.apps.read_namespaced_deployment, name)

    def _wait_ready(self, name: str, replicas: int | None = None) -> None:
        """Poll the Deployment until its rollout is complete (manifests.rollout_complete: the new spec
        observed, every pod updated and available, no old pod left), or time out."""
        if self.ready_timeout_s <= 0:
            return
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            dep = self._read_deployment(name)
            if mf.rollout_complete(dep, replicas):
                return
            if time.monotonic() > deadline:
                st = dep.get("status") or {}
                want = replicas if replicas is not None else (dep.get("spec") or {}).get("replicas")
                raise PlatformError(
                    f"deployment {name!r}: rollout not complete after {self.ready_timeout_s:.0f}s "
                    f"({st.get('updatedReplicas', 0)} updated, {st.get('availableReplicas', 0)} available, "
                    f"{st.get('replicas', 0)} in all, {want} wanted; check `kubectl -n {self.namespace} "
                    f"describe deploy {name}`)", retryable=True,
                )
            time.sleep(self.poll_interval_s)

    def scale(self, service: str, replicas: int) -> ServiceStatus:
        """Set replicas through the scale subresource, or through the HPA's bounds when one exists."""
        _ensure_not_on_event_loop("scale")
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        notes: list[str] = []
        hpa = self._hpa_for(service)
        if hpa is not None:
            if replicas < 1:
                raise PlatformError(f"HPA {hpa['metadata']['name']!r} targets {service!r}: it cannot scale "
                                    "to 0; delete the HPA first")
            name = hpa["metadata"]["name"]
            old = hpa.get("spec") or {}
            lo, hi = mf.hpa_bounds(old.get("minReplicas"), int(old.get("maxReplicas") or replicas), replicas)
            self._call(
                "patch", "horizontalpodautoscalers",
                self.autoscaling.patch_namespaced_horizontal_pod_autoscaler, name, self.namespace,
                {"spec": {"minReplicas": lo, "maxReplicas": hi}}, _content_type=MERGE_PATCH,
                field_manager=self.field_manager,
            )
            notes.append(
                f"HPA {name!r} targets this Deployment: moved its bounds from "
                f"[{old.get('minReplicas', 1)}, {old.get('maxReplicas')}] to [{lo}, {hi}] (the Planner "
                "sets the floor, the HPA scales above it) instead of patching replicas"
                + (f"; asked for {replicas}, the HPA's ceiling {hi} stays" if lo < replicas else "")
            )
        else:
            self._call(
                "patch", "deployments/scale", self.apps.patch_namespaced_deployment_scale, service,
                self.namespace, {"spec": {"replicas": replicas}}, _content_type=MERGE_PATCH,
                field_manager=self.field_manager,
            )
        status = self.status(service)
        return ServiceStatus(**{**status.__dict__, "desired_replicas": replicas, "notes": status.notes + tuple(notes)})

    def set_resources(
        self, service: str, resources: Resources, affinity: Affinity | None = None,
        threads: int | None = None,
    ) -> ResourceChange:
        """Resize in place where the cluster allows it, else roll the pods (maxUnavailable 0):
        scanflow.platform.k8s_resize."""
        _ensure_not_on_event_loop("set_resources")
        return resize_service(self, service, resources, affinity, threads)

    def reconcile_resized(self, service: str) -> list[str]:
        """Resize pods created since an in-place resize (scale-up, restarts) to the service's size;
        the pods asked (scanflow.platform.k8s_resize.reconcile_resized)."""
        _ensure_not_on_event_loop("reconcile_resized")
        return reconcile_resized(self, service)

    def route(self, service: str, to: str | None = None) -> ServiceStatus:
        """Point the Service `service` at `to`'s pods (failover), or back at its own when `to` is None."""
        _ensure_not_on_event_loop("route")
        target = to or service
        if target != service:
            self._read_deployment(target)  # refuse a route to nothing: KubernetesNotFound names it
        self._call("patch", "services", self.core.patch_namespaced_service, service, self.namespace,
                   mf.route_patch(target), _content_type=MERGE_PATCH, field_manager=self.field_manager)
        return self.status(service)

    def swap_model(self, service: str, model_uri: str) -> ServiceStatus:
        """Roll the replicas onto another model (maxUnavailable 0: no request finds no replica)."""
        _ensure_not_on_event_loop("swap_model")
        Service(name=service, model_uri=model_uri)  # validates the URI with the spec's rules
        body = {"spec": {"strategy": mf.rolling_strategy(), "template": {"spec": {"containers": [
            {"name": mf.REPLICA_CONTAINER, "command": mf.replica_command(model_uri)}]}}}}
        self._patch_deployment(service, body)
        self._wait_ready(service)
        return self.status(service)

    def set_challenger(self, service: str, challenger: str | None, mode: str = "shadow", share: float = 0.0,
                       delivery: str | None = None) -> ServiceStatus:
        """On every ready pod of `service`'s gateway (k8s_gateways); the challenger is a service deployed here."""
        _ensure_not_on_event_loop("set_challenger")
        set_on_gateways(self, service, challenger, mode, share, delivery)
        return self.status(service)

    def set_image(self, service: str, image: str) -> ServiceStatus:
        """Roll the replicas onto another image (maxSurge 1, maxUnavailable 0: every old pod serves until
        a new one is ready), and wait for the rollout. The rest of the container stays as it runs (the
        patch carries the running container with only its image changed)."""
        _ensure_not_on_event_loop("set_image")
        if not image or any(c.isspace() for c in image):
            raise PlatformError(f"set_image {service!r}: {image!r} is not an image reference")
        dep = self._read_deployment(service)
        containers = ((dep.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
        container = next((c for c in containers if c.get("name") == mf.REPLICA_CONTAINER), None)
        if container is None:
            raise PlatformError(f"set_image {service!r}: the Deployment has no {mf.REPLICA_CONTAINER!r} container")
        body = {"spec": {"strategy": mf.rolling_strategy(),
                         "template": {"spec": {"containers": [{**container, "image": image}]}}}}
        self._patch_deployment(service, body)
        self._wait_ready(service)
        return self.status(service)

    def status(self, service: str) -> ServiceStatus:
        dep = self._read_deployment(service)
        svc = self._dict(self._call("get", "services", self.core.read_namespaced_service, service, self.namespace))
        routed = ((svc.get("spec") or {}).get("selector") or {}).get(mf.SERVICE_LABEL)
        replicas = tuple(self._replica_status(p) for p in self._pods(service))
        return ServiceStatus(name=service, desired_replicas=int((dep.get("spec") or {}).get("replicas") or 0),
                             replicas=replicas, endpoint=f"http://{service}.{self.namespace}.svc:{mf.HTTP_PORT}",
                             routed_to=routed)

    @staticmethod
    def _replica_status(pod: dict[str, Any]) -> ReplicaStatus:
        spec, st = pod.get("spec") or {}, pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
        container: dict[str, Any] = next((c for c in spec.get("containers") or [] if c.get("name") == mf.REPLICA_CONTAINER), {})
        actual = next((c.get("resources") for c in st.get("containerStatuses") or []
                       if c.get("name") == mf.REPLICA_CONTAINER and c.get("resources")), None)
        limits = (actual or container.get("resources") or {}).get("limits") or {}
        env = {e.get("name"): e.get("value") for e in container.get("env") or []}
        ip = st.get("podIP")
        return ReplicaStatus(
            name=pod["metadata"]["name"],
            ready=ready,
            address=f"http://{ip}:{mf.HTTP_PORT}" if ip else None,
            cpu_quota=normalise("cpu", limits["cpu"]) if "cpu" in limits else None,
            memory_limit=parse_memory(str(limits["memory"])) if "memory" in limits else None,
            threads=int(env["SCANFLOW_THREADS"]) if str(env.get("SCANFLOW_THREADS", "")).isdigit() else None,
        )

    def run_job(self, job: Job, params: dict[str, Any] | None = None) -> JobResult:
        """Run `job` as a batch/v1 Job in one MLflow run, waited on up to timeout_s (+ grace)
        (scanflow.platform.k8s_jobs)."""
        _ensure_not_on_event_loop("run_job")
        return run_k8s_job(self, job, params)


    def delete(self, service: str) -> None:
        _ensure_not_on_event_loop("delete")
        for resource, fn, name in (("deployments", self.apps.delete_namespaced_deployment, service),
                                   ("services", self.core.delete_namespaced_service, service),
                                   ("services", self.core.delete_namespaced_service, mf.own_service_name(service))):
            try:
                self._call("delete", resource, fn, name, self.namespace, propagation_policy="Background")
            except KubernetesNotFound:
                pass

    def close(self) -> None:
        """Close the HTTP pool of the ApiClient (this platform starts no processes)."""
        close = getattr(self.api_client, "close", None)
        if callable(close):
            close()
