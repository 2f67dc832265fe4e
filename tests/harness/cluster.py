"""An emulated cluster: kmock as the API server, plus a kubelet and a kube-proxy played by this process.

It exists to catch wiring (env, args, Service names, probes, what the Executor creates), not to replace
a cluster. Run it only inside `unshare -m -n` (tests/harness/__main__.py does): it creates a bridge,
one network namespace per pod, addresses for Services, and bind mounts, all private to that namespace
pair, so the host's network and /etc/hosts are untouched and everything vanishes with the process.

- kubelet: watches (polls) Deployments, StatefulSets and Jobs in kmock, makes Pods, and runs each
  container's command+args as an OS process in the pod's own network namespace (its own IP on a
  bridge, so every pod binds 0.0.0.0:8080 as in a cluster), under a private mount namespace whose root
  is a bind-built image filesystem (/app = the repository, read-only; emptyDir/PVC/ConfigMap/Secret
  volumes at their mountPath). Env is resolved as a kubelet does (model.resolve_env). Readiness and
  startup probes (httpGet, exec) run against the pod and are written to the Pod's and the owner's status.
  Rollouts: Recreate, or RollingUpdate with maxUnavailable 0. Crashed containers restart with
  CrashLoopBackOff's 10 s doubling delay. Jobs: restartPolicy Never, backoffLimit, Complete/Failed.
  CPU limits: each container's process in its own cgroup with the limit's CFS quota, rewritten by an
  in-place resize (pod_cgroups.py); memory limits are not applied.
- kube-proxy: every Service gets its own address (10.96.0.0/16) and a TCP forwarder per port to the
  ready pods its selector matches at the moment a connection is accepted (a selector patch, S4's
  failover, takes effect for the next connection as on a cluster).
- NetworkPolicies (ingress): enforced by iptables in each pod's network namespace and by the
  kube-proxy for Service addresses (netpolicy.py).
- API server: kmock, with list calls filtered by their `labelSelector` (`=`, `!=`, `in`, `notin`,
  exists, `!`; model.parse_label_selector), which kmock alone ignores. Field selectors are not honoured.
- DNS: a private /etc/hosts in the pods' root with name, name.ns, name.ns.svc, name.ns.svc.cluster.local.
- ServiceAccount token: kmock speaks plain HTTP, so a pod whose ServiceAccount token is mounted gets
  KUBECONFIG pointing at a kubeconfig in that mount instead of the in-cluster config (the one deviation
  from the manifests' env, stated in docs/kubernetes.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import random
import shutil
import signal
import string
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from . import model, netpolicy
from .pod_cgroups import PodCgroups

log = logging.getLogger("harness")
ROOT = Path(__file__).resolve().parents[2]
# the host's top-level directories the image root does not show (fresh ones instead): a checkout or an
# interpreter under one of them is invisible to the containers (tests/harness/test_emulated_cluster.py
# skips with that reason rather than time out on containers that cannot exec)
REPLACED = ("tmp", "run", "var", "app", "mlartifacts")
BRIDGE, GATEWAY, POD_NET = "kbr0", "10.244.0.1", "10.244.0.0/16"
SVC_NET = "10.96.0.0/16"
API_PORT = 6443
PLURALS = {"NetworkPolicy": "networkpolicies"}
RESOURCES = ("v1/pods", "v1/services", "v1/secrets", "v1/configmaps", "v1/persistentvolumeclaims",
             "v1/serviceaccounts", "apps/v1/deployments", "apps/v1/statefulsets",
             "batch/v1/jobs", "autoscaling/v2/horizontalpodautoscalers",
             "rbac.authorization.k8s.io/v1/roles", "rbac.authorization.k8s.io/v1/rolebindings",
             "policy/v1/poddisruptionbudgets", "networking.k8s.io/v1/networkpolicies")


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def plural(kind: str) -> str:
    return PLURALS.get(kind, kind.lower() + "s")


def api_path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    ns = f"/namespaces/{namespace}" if namespace and kind != "Namespace" else ""
    return f"{base}{ns}/{plural(kind)}" + (f"/{name}" if name else "")


def is_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


@dataclass
class Pod:
    """One pod's sandbox (network namespace, IP, volumes) and its container process."""

    name: str
    owner: tuple[str, str]  # (kind, name)
    hash: str
    ip: str
    labels: dict[str, str]
    spec: dict[str, Any]
    dir: Path
    proc: subprocess.Popen[bytes] | None = None  # the first container (probes' exec runs in its namespaces)
    sidecars: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # the others, by name
    ready: bool = False
    started: bool = False  # startupProbe passed (or none)
    restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # the container's, for exec probes
    restart_at: float = 0.0
    exit_code: int | None = None
    terminating: bool = False
    done: bool = False  # a Job's pod that exited
    stop: threading.Event = field(default_factory=threading.Event)
    unschedulable: str | None = None  # the scheduler's message: no node can take it, it never starts
    resize_infeasible: str | None = None  # the kubelet's message for a resize its node can never give
    resize_in_progress: bool = False  # accepted by the kubelet, actuated on its next pass

    @property
    def container(self) -> dict[str, Any]:
        return self.spec["containers"][0]

    def processes(self) -> list[subprocess.Popen[bytes]]:
        """Every container's process that was started (the first container's first)."""
        return [p for p in (self.proc, *self.sidecars.values()) if p is not None]


REQUESTS_KEPT = 200  # the API server's request history the harness keeps (see _selecting_emulator)
# the Content-Type of the request being handled: how its patch merges lists (see Cluster._start_kmock)
_PATCH_CONTENT_TYPE: contextvars.ContextVar[str] = contextvars.ContextVar("patch_content_type", default="")


def _content_type(headers: Any) -> str:
    return next((str(v) for k, v in (headers or {}).items() if str(k).lower() == "content-type"), "")


def install_list_merge() -> Any:
    """Make kmock's patches merge lists of named objects (containers, env, ports, volumes) by `name`, as
    an API server's strategic merge and server-side apply do (model.merge_named_lists); a JSON merge
    patch (the request's Content-Type) still replaces lists whole, as on a real server. kmock alone
    replaces every list. Process-wide: returns the original, to put back (tests)."""
    from kmock._internal import dicts

    original = dicts.patch_dict

    def strategic(value: Any, patch: Any, /, **kwargs: Any) -> Any:
        if (isinstance(value, dict) and isinstance(patch, dict)
                and not _PATCH_CONTENT_TYPE.get().startswith("application/merge-patch")):
            patch = model.merge_named_lists(value, patch, strategic)
        return original(value, patch, **kwargs)

    dicts.patch_dict = strategic
    return original


def _selecting_emulator() -> type:
    """kmock's emulator with list calls filtered by their `labelSelector` as an API server filters them
    (kmock returns every object of the resource): a client that trusts the selector sees only what
    it asked for here too. A selector kmock cannot parse is a 400, as on a real server. Its request
    history is bounded (REQUESTS_KEPT)."""
    from kmock import KubernetesEmulator
    from kmock._internal import enums, rendering

    class SelectingEmulator(KubernetesEmulator):  # type: ignore[misc]
        async def _handle(self, request: rendering.Request) -> Any:
            # kmock keeps every request for assertions, and finds each new one's reaction by walking
            # that history (`request in payload._source`): O(n) per request, so a long run's kubelet
            # polling made the API server use most of a core and answer slower and slower. The harness
            # asserts on objects, never on requests: keep only the recent ones.
            if len(self._requests) > 2 * REQUESTS_KEPT:
                del self._requests[:-REQUESTS_KEPT]
                for payload in self._payloads:
                    del payload._requests[:-REQUESTS_KEPT]
            _PATCH_CONTENT_TYPE.set(_content_type(request.headers))  # this request's task only
            key = self._spec_change(request)
            before = self._spec_of(key)
            response = await super()._handle(request)
            if key is not None and self._spec_of(key) != before:
                # an API server bumps metadata.generation with every spec change (kmock does not): a
                # client waiting on observedGeneration then never mistakes the last rollout for this one
                async with self._lock:
                    obj = self._objects[key]
                    obj.patch({"metadata": {"generation": int(obj.raw.get("metadata", {}).get("generation") or 1) + 1}})
            return response

        def _spec_change(self, request: rendering.Request) -> Any:
            """The object key of a patch or update that may change a workload's spec, else None."""
            data = request.data
            if (request.resource is None or request.action != enums.action.UPDATE or not request.name
                    or request.resource.plural not in ("deployments", "statefulsets")
                    or not isinstance(data, dict) or "spec" not in data):
                return None
            return (request.resource, request.namespace, request.name)

        def _spec_of(self, key: Any) -> str | None:
            if key is None or key not in self._objects:
                return None
            obj = self._objects[key]
            return None if obj.deleted else json.dumps(obj.raw.get("spec"), sort_keys=True)

        async def _serve_list(self, request: rendering.Request) -> Any:
            payload = await super()._serve_list(request)
            selector = (request.params or {}).get("labelSelector")
            if not selector:
                return payload
            try:
                model.parse_label_selector(selector)
            except ValueError as exc:
                from kmock._internal.k8s import KubernetesError

                raise KubernetesError(status=400, reason="BadRequest", message=str(exc)) from None
            return {**payload, "items": [o for o in payload["items"] if model.list_selects(
                selector, ((o or {}).get("metadata") or {}).get("labels"))]}

    return SelectingEmulator


class Cluster:
    """kmock + kubelet + kube-proxy in this (private) network and mount namespace."""

    def __init__(self, workdir: Path, namespace: str = "scanflow", repo: Path = ROOT) -> None:
        self.workdir, self.namespace, self.repo = workdir, namespace, repo
        self.rootfs = workdir / "rootfs"
        self.hosts = workdir / "hosts"
        self.pods: dict[str, Pod] = {}
        self.pod_ips = model.AddressPool(POD_NET, skip=1)
        self.svc_ips = model.AddressPool(SVC_NET, skip=1)
        self.api = f"http://{GATEWAY}:{API_PORT}"
        self.http = httpx.Client(base_url=self.api, timeout=10)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._hosts_lock = threading.Lock()
        self._hosts_content = ""
        self._veth = 0
        self._svc_servers: dict[tuple[str, int], asyncio.AbstractServer] = {}
        self._services: dict[str, dict[str, Any]] = {}
        self._api_pods: list[dict[str, Any]] = []
        self.events: list[str] = []
        self.policies: list[dict[str, Any]] = []  # the NetworkPolicies in force (netpolicy.py)
        self._firewalls: dict[str, str] = {}  # pod -> the iptables rules its namespace has now
        self.policy_drops: list[str] = []  # Service connections the policies refused: "src -> service:port"
        self.cgroups = PodCgroups()  # each container under its CPU limit, as a kubelet's cgroup

    # -- setup ------------------------------------------------------------------------------------
    def start(self) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("the emulated cluster needs root (network and mount namespaces)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._network()
        self._build_rootfs()
        self._start_kmock()
        self._proxy_loop = asyncio.new_event_loop()
        threading.Thread(target=self._proxy_loop.run_forever, name="kube-proxy", daemon=True).start()
        threading.Thread(target=self._kubelet, name="kubelet", daemon=True).start()
        threading.Thread(target=self._proxy_sync, name="kube-proxy-sync", daemon=True).start()

    def _network(self) -> None:
        sh("mount", "--make-rprivate", "/")
        Path("/run/netns").mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "tmpfs", "/run/netns")  # this namespace's netns handles only
        sh("ip", "link", "set", "lo", "up")
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{GATEWAY}/16", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")

    def _build_rootfs(self) -> None:
        """The image's filesystem: the host's directories bound in, /app the repository (read-only),
        fresh /tmp, /run, /var, /mlartifacts; /etc/hosts and /etc/resolv.conf private."""
        r = self.rootfs
        r.mkdir()
        sh("mount", "-t", "tmpfs", "tmpfs", str(r))
        for name in sorted(os.listdir("/")):
            src, dst = Path("/") / name, r / name
            if src.is_symlink():
                os.symlink(os.readlink(src), dst)
            elif name in REPLACED or name in ("old_root", "lost+found"):
                continue
            elif src.is_dir():
                dst.mkdir()
                sh("mount", "--rbind", str(src), str(dst))
        for d in ("tmp", "run", "var/tmp", "mlartifacts", "app"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.symlink("../run", r / "var/run")
        sh("mount", "--bind", str(self.repo), str(r / "app"))
        sh("mount", "-o", "remount,bind,ro", str(r / "app"))
        self.hosts.write_text(model.hosts_file([]))
        sh("mount", "--bind", str(self.hosts), str(r / "etc/hosts"))
        sh("mount", "--bind", str(self.hosts), "/etc/hosts")  # the harness (a client in the cluster) too
        (self.workdir / "resolv.conf").write_text("# no DNS server: names are in /etc/hosts\n")
        sh("mount", "--bind", str(self.workdir / "resolv.conf"), str(r / "etc/resolv.conf"))

    def _start_kmock(self) -> None:
        from kmock import Server

        install_list_merge()  # this process only: it runs nothing but the emulated cluster

        ready = threading.Event()
        box: dict[str, Any] = {}

        async def main() -> None:
            box["loop"] = asyncio.get_running_loop()
            box["stop"] = asyncio.Event()
            async with _selecting_emulator()() as emulator, Server(emulator, host=GATEWAY, port=API_PORT):
                for res in RESOURCES:
                    emulator.resources[res] = {}
                emulator["get /version/"] << {
                    "major": "1", "minor": "34", "gitVersion": "v1.34.0", "gitCommit": "0" * 40,
                    "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                    "compiler": "gc", "platform": "linux/amd64"}
                box["emulator"] = emulator
                ready.set()
                await box["stop"].wait()

        threading.Thread(target=asyncio.run, args=(main(),), name="kmock", daemon=True).start()
        if not ready.wait(30):
            raise RuntimeError("kmock did not start in 30 s")
        self._kmock = box
        self.emulator = box["emulator"]
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.api}}],
            "users": [{"name": "sa", "user": {"token": "emulated"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "sa",
                                                       "namespace": self.namespace}}]}
        (self.workdir / "kubeconfig").write_text(json.dumps(kubeconfig))

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            pods = list(self.pods.values())
        for pod in pods:  # all at once: SIGTERM, a shared grace period, then SIGKILL whatever is left
            pod.stop.set()
            for proc in pod.processes():
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
        deadline = time.monotonic() + 10
        for pod in pods:
            for proc in pod.processes():
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        reap(self.rootfs)
        for left in self.cgroups.close():
            log.warning("cgroup left behind: %s", left)
        if hasattr(self, "_kmock"):
            self._kmock["loop"].call_soon_threadsafe(self._kmock["stop"].set)
        self.http.close()

    # -- API helpers ------------------------------------------------------------------------------
    def apply(self, docs: list[dict[str, Any]]) -> None:
        """Create every object (as `kubectl apply` of a fresh install)."""
        for doc in docs:
            if doc["kind"] == "Namespace":  # kmock keeps namespaced objects without one (and cannot create it)
                continue
            ns = doc["metadata"].get("namespace") or self.namespace
            doc["metadata"].setdefault("namespace", ns)
            r = self.http.post(api_path(doc["apiVersion"], doc["kind"], ns), json=doc)
            if r.status_code >= 400:
                raise RuntimeError(f"create {doc['kind']}/{doc['metadata']['name']}: {r.status_code} {r.text[:300]}")

    def list(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        r = self.http.get(api_path(api_version, kind, self.namespace))
        r.raise_for_status()
        return [i for i in r.json().get("items") or [] if not (i.get("metadata") or {}).get("deletionTimestamp")]

    def get(self, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        r = self.http.get(api_path(api_version, kind, self.namespace, name))
        return r.json() if r.status_code == 200 else None

    def _merge(self, api_version: str, kind: str, name: str, body: dict[str, Any]) -> None:
        self.http.patch(api_path(api_version, kind, self.namespace, name), json=body,
                        headers={"Content-Type": "application/merge-patch+json"})

    # -- kubelet ----------------------------------------------------------------------------------
    def _kubelet(self) -> None:
        while not self._stop.is_set():
            try:
                self._reconcile()
            except Exception as exc:  # noqa: BLE001  # keep playing the kubelet; say what went wrong
                log.warning("kubelet: %s: %s", type(exc).__name__, exc)
            self._stop.wait(0.25)

    def _reconcile(self) -> None:
        secrets = {s["metadata"]["name"]: s for s in self.list("v1", "Secret")}
        cms = {c["metadata"]["name"]: c for c in self.list("v1", "ConfigMap")}
        self._refs = (secrets, cms)
        wanted: set[tuple[str, str]] = set()
        for dep in self.list("apps/v1", "Deployment"):
            wanted.add(("Deployment", dep["metadata"]["name"]))
            self._deployment(dep)
        for sts in self.list("apps/v1", "StatefulSet"):
            wanted.add(("StatefulSet", sts["metadata"]["name"]))
            self._statefulset(sts)
        for job in self.list("batch/v1", "Job"):
            wanted.add(("Job", job["metadata"]["name"]))
            self._job(job)
        with self._lock:
            pods = list(self.pods.values())
        for pod in pods:
            if pod.owner not in wanted and not pod.terminating:
                self._terminate(pod)
            self._supervise(pod)
        self._resizes(pods)

    def _resizes(self, pods: list[Pod]) -> None:
        """Play the kubelet's in-place resize (`pods/resize`): a running pod whose containers' resources the
        API server now holds differently takes them, and its status reports the new allocation
        (status.containerStatuses[].resources), as a kubelet's does once it actuated the resize; the pod
        keeps its name, process and owner's template. A resize beyond the emulated node
        (model.NODE_ALLOCATABLE) is not applied: the pod reports PodResizePending, reason Infeasible, until
        its spec asks for what the node has again. A resize that fits is reported PodResizeInProgress for
        one pass (the status still showing the old allocation), then actuated: the container's CPU quota
        rewritten (pod_cgroups.py) and the new allocation reported. An emulation: never Deferred."""
        stored = {p["metadata"]["name"]: p for p in self.list("v1", "Pod")}
        for pod in pods:
            obj = stored.get(pod.name)
            if obj is None or pod.terminating or pod.done or pod.unschedulable:
                continue
            want = {c.get("name"): c.get("resources") or {} for c in (obj.get("spec") or {}).get("containers") or []}
            changed = [c for c in pod.spec["containers"]
                       if c["name"] in want and want[c["name"]] != (c.get("resources") or {})]
            infeasible = model.resize_infeasible(
                [{**c, "resources": want.get(c["name"], c.get("resources") or {})} for c in pod.spec["containers"]])
            if changed and infeasible:
                if pod.resize_infeasible != infeasible:
                    pod.resize_infeasible = infeasible
                    self.events.append(f"pod {pod.name} resize infeasible: {infeasible}")
                    self._write_status(pod)
                continue
            if pod.resize_infeasible:  # asked back to what it has, or to a size that fits
                pod.resize_infeasible = None
                self._write_status(pod)
            if changed != [] and not pod.resize_in_progress:
                # accepted: reported PodResizeInProgress (the old allocation still in the status) until
                # the next pass actuates it, as a node's kubelet reports between accepting and applying
                pod.resize_in_progress = True
                self.events.append(f"pod {pod.name} resize in progress")
                self._write_status(pod)
                continue
            if not changed and pod.resize_in_progress:  # asked back before it was actuated
                pod.resize_in_progress = False
                self._write_status(pod)
            for c in changed:
                c["resources"] = json.loads(json.dumps(want[c["name"]]))
                proc = pod.proc if c is pod.container else pod.sidecars.get(c["name"])
                if proc is not None and proc.poll() is None:  # the kubelet rewrites the container's cgroup
                    for note in self.cgroups.apply(pod.name, c, proc.pid):
                        self.events.append(f"pod {pod.name} resize: {note}")
            if changed:
                pod.resize_in_progress = False
                self.events.append(f"pod {pod.name} resized in place")
                self._write_status(pod)

    def _owned(self, kind: str, name: str) -> list[Pod]:
        with self._lock:
            return [p for p in self.pods.values() if p.owner == (kind, name) and not p.terminating]

    def _deployment(self, dep: dict[str, Any]) -> None:
        name, spec = dep["metadata"]["name"], dep["spec"]
        want = int(spec.get("replicas", 1))
        tmpl = spec["template"]
        cur = model.template_hash(tmpl)
        mine = self._owned("Deployment", name)
        new = [p for p in mine if p.hash == cur]
        old = [p for p in mine if p.hash != cur]
        recreate = (spec.get("strategy") or {}).get("type") == "Recreate"
        if recreate and old:
            for p in old:
                self._terminate(p)
        elif not (recreate and self._terminating_of(("Deployment", name))):
            create, terminate = model.rolling_step(want, spec.get("strategy"), [(p.name, p.ready) for p in new],
                                                   [(p.name, p.ready) for p in old])
            for _ in range(create):
                self._create(("Deployment", name), tmpl, cur, f"{name}-{cur[:8]}-{_suffix()}")
            for p in mine:
                if p.name in terminate:
                    self._terminate(p)
        pods = [(p.hash, p.ready) for p in self._owned("Deployment", name)]
        status = model.rollout_status(int(dep["metadata"].get("generation") or 0), want, pods, cur)
        if {k: (dep.get("status") or {}).get(k) for k in status} != status:
            self._merge("apps/v1", "Deployment", name, {"status": status})

    def _terminating_of(self, owner: tuple[str, str]) -> bool:
        with self._lock:
            return any(p.owner == owner and p.terminating for p in self.pods.values())

    def _statefulset(self, sts: dict[str, Any]) -> None:
        name, spec = sts["metadata"]["name"], sts["spec"]
        want = int(spec.get("replicas", 1))
        cur = model.template_hash(spec["template"])
        have = {p.name for p in self._owned("StatefulSet", name)}
        for i in range(want):
            if f"{name}-{i}" not in have:
                self._create(("StatefulSet", name), spec["template"], cur, f"{name}-{i}",
                             claims=spec.get("volumeClaimTemplates") or [])
        ready = sum(p.ready for p in self._owned("StatefulSet", name))
        if (sts.get("status") or {}).get("readyReplicas") != ready:
            self._merge("apps/v1", "StatefulSet", name, {"status": {
                "replicas": want, "readyReplicas": ready, "availableReplicas": ready,
                "observedGeneration": int(sts["metadata"].get("generation") or 0)}})

    def _job(self, job: dict[str, Any]) -> None:
        name, spec, st = job["metadata"]["name"], job["spec"], job.get("status") or {}
        if any(c.get("status") == "True" for c in st.get("conditions") or []):
            return
        with self._lock:
            pods = [p for p in self.pods.values() if p.owner == ("Job", name)]
        if any(not p.done for p in pods):
            return
        failed = sum(1 for p in pods if p.exit_code not in (0, None))
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if any(p.exit_code == 0 for p in pods):
            self._merge("batch/v1", "Job", name, {"status": {"succeeded": 1, "failed": failed, "completionTime": now,
                        "conditions": [{"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                                       {"type": "Complete", "status": "True", "lastTransitionTime": now}]}})
            self.events.append(f"job {name} complete")
        elif failed > int(spec.get("backoffLimit", 6)):
            self._merge("batch/v1", "Job", name, {"status": {"failed": failed, "conditions": [
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": now}]}})
            self.events.append(f"job {name} failed")
        elif not pods or time.monotonic() >= max(p.restart_at for p in pods):
            tmpl = json.loads(json.dumps(spec["template"]))
            tmpl.setdefault("metadata", {}).setdefault("labels", {}).update(
                {"batch.kubernetes.io/job-name": name, "job-name": name})
            self._create(("Job", name), tmpl, "job", f"{name}-{_suffix()}")
            self._merge("batch/v1", "Job", name, {"status": {"active": 1, "failed": failed}})

    # -- pods -------------------------------------------------------------------------------------
    def _create(self, owner: tuple[str, str], tmpl: dict[str, Any], hash_: str, name: str,
                claims: list[dict[str, Any]] | None = None) -> Pod:
        ip = self.pod_ips.get(name)
        labels = dict((tmpl.get("metadata") or {}).get("labels") or {})
        if owner[0] == "Deployment":
            labels["pod-template-hash"] = hash_[:10]
        pod = Pod(name, owner, hash_, ip, labels, json.loads(json.dumps(tmpl["spec"])), self.workdir / "pods" / name)
        pod.dir.mkdir(parents=True, exist_ok=True)
        pod.unschedulable = model.unschedulable(pod.spec["containers"])
        if pod.unschedulable:  # Pending for good: no node, no sandbox, no process
            self.http.post(api_path("v1", "Pod", self.namespace), json=self._pod_object(pod))
            with self._lock:
                self.pods[name] = pod
            self.events.append(f"pod {name} unschedulable ({owner[0]}/{owner[1]}): {pod.unschedulable}")
            return pod
        self._sandbox(pod)
        with self._lock:  # its filter before its first process: a new pod is never open to all
            sources = [(p.ip, p.labels) for p in self.pods.values() if p.spec.get("_netns") and not p.done]
        self._firewall(pod, [*sources, (pod.ip, pod.labels)])
        obj = self._pod_object(pod)
        r = self.http.post(api_path("v1", "Pod", self.namespace), json=obj)
        if r.status_code >= 400:
            log.warning("create pod %s: %s %s", name, r.status_code, r.text[:200])
        pod.spec["_claims"] = claims or []
        with self._lock:
            self.pods[name] = pod
        self.events.append(f"pod {name} created ({owner[0]}/{owner[1]}, {ip})")
        if model.DNS_LABEL in labels:
            self._write_hosts()
        self._start(pod)
        return pod

    def _pod_object(self, pod: Pod) -> dict[str, Any]:
        spec = {k: v for k, v in pod.spec.items() if not k.startswith("_")}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod.name, "namespace": self.namespace, "labels": pod.labels,
                             "uid": f"uid-{pod.name}"},
                "spec": {**spec, **({} if pod.unschedulable else {"nodeName": "emulated"})},
                "status": self._pod_status(pod)}

    def _pod_status(self, pod: Pod) -> dict[str, Any]:
        if pod.unschedulable:
            return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                        "reason": "Unschedulable", "message": pod.unschedulable}]}
        phase = "Running" if pod.proc is not None and pod.proc.poll() is None else (
            "Succeeded" if pod.exit_code == 0 else "Failed" if pod.done else "Pending")
        cond = "True" if pod.ready else "False"
        resize = [{"type": "PodResizePending", "status": "True", "reason": "Infeasible",
                   "message": pod.resize_infeasible}] if pod.resize_infeasible else []
        if pod.resize_in_progress:
            resize.append({"type": "PodResizeInProgress", "status": "True"})
        return {"phase": phase, "podIP": pod.ip, "podIPs": [{"ip": pod.ip}], "hostIP": GATEWAY,
                "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": cond},
                               {"type": "ContainersReady", "status": cond}, *resize],
                "containerStatuses": [{"name": c["name"], "ready": pod.ready, "restartCount": pod.restarts,
                                       "image": c.get("image"), "imageID": f"emulated://{c.get('image')}",
                                       "containerID": f"emulated://{pod.name}/{c['name']}",
                                       "started": phase == "Running",
                                       "resources": c.get("resources") or {}}
                                      for c in pod.spec["containers"]]}

    def _write_status(self, pod: Pod) -> None:
        self._merge("v1", "Pod", pod.name, {"status": self._pod_status(pod)})

    def _sandbox(self, pod: Pod) -> None:
        """The pod's network namespace: a veth on the bridge, its IP, a default route via the bridge."""
        ns = f"pod-{pod.name}"[:60]
        self._veth += 1
        host = f"veth{self._veth}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", host, "master", BRIDGE, "up")
        sh("ip", "-n", ns, "addr", "add", f"{pod.ip}/16", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "route", "add", "default", "via", GATEWAY)
        pod.spec["_netns"] = ns

    def _volumes(self, pod: Pod) -> dict[str, str]:
        """volume name -> host directory, created as the kubelet would."""
        secrets, cms = self._refs
        out: dict[str, str] = {}
        for vol in pod.spec.get("volumes") or []:
            d = pod.dir / "volumes" / vol["name"]
            if "hostPath" in vol:
                out[vol["name"]] = vol["hostPath"]["path"]
                continue
            if "persistentVolumeClaim" in vol:
                d = self.workdir / "pvc" / vol["persistentVolumeClaim"]["claimName"]
            elif "configMap" in vol or "secret" in vol:
                d.mkdir(parents=True, exist_ok=True)
                ref = vol.get("configMap") or {"name": vol["secret"].get("secretName")}
                src = (cms if "configMap" in vol else secrets).get(ref["name"]) or {}
                for key, value in (src.get("data") or {}).items():
                    import base64
                    text = base64.b64decode(value).decode() if "secret" in vol else value
                    (d / key).write_text(text)
            d.mkdir(parents=True, exist_ok=True)
            out[vol["name"]] = str(d)
        for claim in pod.spec.get("_claims") or []:
            d = self.workdir / "pvc" / f"{claim['metadata']['name']}-{pod.name}"
            d.mkdir(parents=True, exist_ok=True)
            out[claim["metadata"]["name"]] = str(d)
        return out

    def _start(self, pod: Pod) -> None:
        """Start (or restart) the pod: its first container, then the others (sidecars such as MLflow's auth
        proxy) in the same network namespace, so they reach each other on the pod's loopback as on a node."""
        proc = self._launch(pod, pod.container, "container.json")
        if proc is None:
            return
        pod.proc = proc
        pod.sidecars = {}
        for c in pod.spec["containers"][1:]:
            side = self._launch(pod, c, f"container-{c['name']}.json")
            if side is not None:
                pod.sidecars[c["name"]] = side
        c = pod.container
        pod.ready, pod.started, pod.exit_code = False, not c.get("startupProbe"), None
        pod.stop = threading.Event()
        self._write_status(pod)
        threading.Thread(target=self._probe_loop, args=(pod, pod.proc, pod.stop), name=f"probe-{pod.name}",
                         daemon=True).start()

    def _launch(self, pod: Pod, c: dict[str, Any], spec_name: str) -> subprocess.Popen[bytes] | None:
        """One container's process in the pod's network namespace (None: its config cannot be resolved)."""
        secrets, cms = self._refs
        obj = self._pod_object(pod)
        image = str(c.get("image") or "")
        try:
            env = model.resolve_env(c, obj, secrets, cms, base=model.IMAGE_ENV)
            if image.startswith("postgres"):  # the postgres image's entrypoint, played (pg_entrypoint.py)
                argv = [sys.executable, "-m", "tests.harness.pg_entrypoint"]
            else:
                argv = model.expand_argv(model.pod_argv(c), env)
        except model.ResolveError as exc:
            self.events.append(f"pod {pod.name}: CreateContainerConfigError: {exc}")
            pod.restart_at = time.monotonic() + 5
            return None
        vols = self._volumes(pod)
        mounts = [(vols[m["name"]], m["mountPath"]) for m in c.get("volumeMounts") or [] if m["name"] in vols]
        sa_mount = pod.spec.get("automountServiceAccountToken", True) and pod.spec.get("serviceAccountName")
        if sa_mount:
            sa = pod.dir / "serviceaccount"
            sa.mkdir(exist_ok=True)
            shutil.copy(self.workdir / "kubeconfig", sa / "kubeconfig")
            mounts.append((str(sa), "/var/run/secrets/kubernetes.io/serviceaccount"))
            env["KUBECONFIG"] = "/var/run/secrets/kubernetes.io/serviceaccount/kubeconfig"
        spec = {"rootfs": str(self.rootfs), "mounts": mounts, "workdir": c.get("workingDir") or model.IMAGE_WORKDIR,
                "argv": argv, "env": env}
        spec_file = pod.dir / spec_name
        spec_file.write_text(json.dumps(spec))
        logf = open(pod.dir / "log", "ab")  # noqa: SIM115  # held by the child
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{pod.spec['_netns']}", "--", "unshare", "-m", "--propagation", "private",
             "--", sys.executable, str(Path(__file__).with_name("podrun.py")), str(spec_file)],
            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        logf.close()
        for note in self.cgroups.apply(pod.name, c, proc.pid):
            self.events.append(f"pod {pod.name}: {note}")
        if c is pod.container:
            pod.env = env
        return proc

    def _supervise(self, pod: Pod) -> None:
        """A container that exited: a Job's pod is done; others restart after CrashLoopBackOff's delay."""
        if pod.terminating or pod.done or pod.unschedulable:
            return
        if pod.proc is None:
            if time.monotonic() >= pod.restart_at:
                self._start(pod)
            return
        code = pod.proc.poll()
        if code is None:
            for c in pod.spec["containers"][1:]:  # a sidecar that exited restarts on its own, as the kubelet does
                side = pod.sidecars.get(c["name"])
                if side is not None and side.poll() is not None:
                    self.events.append(f"pod {pod.name} container {c['name']} exited {side.returncode}: restarted")
                    again = self._launch(pod, c, f"container-{c['name']}.json")
                    if again is not None:
                        pod.sidecars[c["name"]] = again
            return
        pod.stop.set()
        self._stop_sidecars(pod)
        pod.exit_code, pod.ready = code, False
        if pod.owner[0] == "Job":
            pod.done = True
            pod.restart_at = time.monotonic() + min(10 * 2 ** sum(
                1 for p in self.pods.values() if p.owner == pod.owner and p.exit_code not in (0, None)), 360)
            self.events.append(f"pod {pod.name} exited {code}")
            self._write_status(pod)
            return
        delay = min(10.0 * 2 ** pod.restarts, 300.0)
        pod.restarts += 1
        pod.proc, pod.restart_at = None, time.monotonic() + delay
        self.events.append(f"pod {pod.name} exited {code}: restart in {delay:.0f}s")
        self._write_status(pod)

    def _probe_loop(self, pod: Pod, proc: subprocess.Popen[bytes], stop: threading.Event) -> None:
        c = pod.container
        startup, readiness = c.get("startupProbe"), c.get("readinessProbe")
        ok_run = bad_run = 0
        if not startup and readiness:
            stop.wait(float(readiness.get("initialDelaySeconds", 0)))
        while not stop.is_set() and proc.poll() is None:
            checks = [(c, c["readinessProbe"]) for c in pod.spec["containers"] if c.get("readinessProbe")]
            if not pod.started:
                probe = startup
                checks = [(c, startup)]
            else:
                probe = readiness or (checks[0][1] if checks else None)
            if probe is None:
                if not pod.ready:
                    pod.ready = True
                    self._write_status(pod)
                stop.wait(1.0)
                continue
            ok = all(self._probe(pod, p, container) for container, p in checks)  # ready: every container is
            ok_run, bad_run = (ok_run + 1, 0) if ok else (0, bad_run + 1)
            if not pod.started:
                if ok:
                    pod.started, ok_run = True, 0
                    continue  # readiness right after startup, as the kubelet does
            else:
                was = pod.ready
                if ok and ok_run >= int(probe.get("successThreshold", 1)):
                    pod.ready = True
                elif not ok and bad_run >= int(probe.get("failureThreshold", 3)):
                    pod.ready = False
                if pod.ready != was and not stop.is_set():
                    self.events.append(f"pod {pod.name} ready={pod.ready}")
                    self._write_status(pod)
            stop.wait(float(probe.get("periodSeconds", 10)))

    def _probe(self, pod: Pod, probe: dict[str, Any], container: dict[str, Any] | None = None) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        container = container or pod.container
        if "httpGet" in probe:
            g = probe["httpGet"]
            port = model.container_port(container, g["port"])
            try:
                r = httpx.get(f"http://{pod.ip}:{port}{g.get('path', '/')}", timeout=timeout)
                return 200 <= r.status_code < 400
            except httpx.HTTPError:
                return False
        if "exec" in probe and pod.proc is not None:
            try:
                r = subprocess.run(["nsenter", "-t", str(pod.proc.pid), "-n", "-m", "-r", "-w", "--", *probe["exec"]["command"]],
                                   capture_output=True, timeout=timeout + 5, check=False, env=pod.env)
                return r.returncode == 0
            except (subprocess.TimeoutExpired, OSError):
                return False
        if "tcpSocket" in probe:
            import socket
            try:
                socket.create_connection((pod.ip, model.container_port(container, probe["tcpSocket"]["port"])),
                                         timeout=timeout).close()
                return True
            except OSError:
                return False
        return False

    def _terminate(self, pod: Pod) -> None:
        pod.terminating = True
        pod.ready = False
        self.events.append(f"pod {pod.name} terminating")
        threading.Thread(target=self._kill, args=(pod,), daemon=True).start()

    def _stop_sidecars(self, pod: Pod) -> None:
        for side in pod.sidecars.values():
            if side.poll() is None:
                try:
                    os.killpg(side.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                side.wait(10)
        pod.sidecars = {}

    def _kill(self, pod: Pod, grace_s: float = 30.0) -> None:
        pod.stop.set()
        self._write_status(pod)
        self._stop_sidecars(pod)
        if pod.proc is not None and pod.proc.poll() is None:
            try:
                os.killpg(pod.proc.pid, signal.SIGTERM)
                pod.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait(10)
            except ProcessLookupError:
                pass
        if pod.owner[0] != "Job" or self._stop.is_set():
            self.http.delete(api_path("v1", "Pod", self.namespace, pod.name)) if not self._stop.is_set() else None
            with self._lock:
                self.pods.pop(pod.name, None)

    def crash(self, owner: tuple[str, str]) -> int:
        """SIGKILL the running containers of an owner's pods (a crash: the kubelet restarts them)."""
        n = 0
        for pod in self._owned(*owner):
            if pod.proc is not None and pod.proc.poll() is None:
                try:
                    os.killpg(pod.proc.pid, signal.SIGKILL)
                    n += 1
                except ProcessLookupError:
                    pass
        return n

    def pod_logs(self, prefix: str = "", tail: int = 3000) -> str:
        out = []
        for d in sorted((self.workdir / "pods").glob(f"{prefix}*")):
            f = d / "log"
            if f.exists():
                out.append(f"==> {d.name} <==\n" + f.read_text(errors="replace")[-tail:])
        return "\n".join(out)

    # -- kube-proxy -------------------------------------------------------------------------------
    def _proxy_sync(self) -> None:
        while not self._stop.is_set():
            try:
                services = {s["metadata"]["name"]: s for s in self.list("v1", "Service")}
                self._api_pods = self.list("v1", "Pod")
                self._services = services
                self.policies = self.list("networking.k8s.io/v1", "NetworkPolicy")
                self._enforce()
                fut = asyncio.run_coroutine_threadsafe(self._listen(services), self._proxy_loop)
                fut.result(30)
            except Exception as exc:  # noqa: BLE001
                log.warning("kube-proxy: %s: %s", type(exc).__name__, exc)
            self._stop.wait(0.25)

    def _enforce(self) -> None:
        """Each pod's namespace filters new connections as the NetworkPolicies say (netpolicy.py);
        rewritten only for pods whose rules changed (a pod came or went, a policy changed)."""
        with self._lock:
            pods = [p for p in self.pods.values() if p.spec.get("_netns") and not p.done]
        sources = [(p.ip, p.labels) for p in pods]
        for pod in pods:
            self._firewall(pod, sources)
        live = {p.name for p in pods}
        for name in [n for n in self._firewalls if n not in live]:
            self._firewalls.pop(name)

    def _firewall(self, pod: Pod, sources: list[tuple[str, dict[str, str]]]) -> None:
        """Write a pod's iptables rules (netpolicy.iptables_rules) when they differ from what it has."""
        rules = netpolicy.iptables_rules(pod.labels, netpolicy.container_ports(pod.spec), sources,
                                         self.policies, self.namespace, GATEWAY)
        if self._firewalls.get(pod.name, netpolicy.iptables_rules({}, (), (), [], "", "")) == rules:
            return
        r = subprocess.run(["nsenter", f"--net=/run/netns/{pod.spec['_netns']}", "iptables-restore"],
                           input=rules.encode(), capture_output=True, timeout=30, check=False)
        if r.returncode == 0:
            self._firewalls[pod.name] = rules
        elif not pod.terminating:
            log.warning("network policy of pod %s: %s", pod.name, r.stderr.decode(errors="replace")[-300:])

    def _client_labels(self, ip: str | None) -> dict[str, str] | None:
        """The labels of the pod a connection comes from; None for the node (probes, the test's calls)."""
        with self._lock:
            return next((dict(p.labels) for p in self.pods.values() if p.ip == ip), None)

    def service_ip(self, name: str) -> str:
        return self.svc_ips.get(name)

    async def _listen(self, services: dict[str, dict[str, Any]]) -> None:
        for name, svc in services.items():
            if model.headless(svc):
                continue  # no address of its own, no proxy: its name resolves to its ready pods
            ip = self.svc_ips.get(name)
            for port in (svc.get("spec") or {}).get("ports") or []:
                key = (name, int(port["port"]))
                if key in self._svc_servers:
                    continue
                if not any(k[0] == name for k in self._svc_servers):
                    sh("ip", "addr", "add", f"{ip}/32", "dev", "lo")

                async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                 name: str = name, port: dict[str, Any] = port) -> None:
                    await self._forward(name, port, reader, writer)
                self._svc_servers[key] = await asyncio.start_server(handle, ip, int(port["port"]))
        for key in [k for k in self._svc_servers if k[0] not in services]:
            self._svc_servers.pop(key).close()
        self._write_hosts()  # (when it changed) new Services, and headless ones' ready pods

    def _write_hosts(self) -> None:
        """Every Service's names, a headless Service's once per ready pod it selects (cluster DNS answers
        its name with their addresses), and the pods that carry a DNS name (compose: the service name is
        the container's own address). Written only when it changed."""
        with self._hosts_lock:
            entries = [(self.svc_ips.get(n), model.service_names(n, self.namespace))
                       for n in sorted({k[0] for k in self._svc_servers})]
            for name, svc in sorted(self._services.items()):
                if model.headless(svc):
                    entries += [(ip, model.service_names(name, self.namespace))
                                for ip, _ in model.pick_target(svc, self._api_pods)]
            with self._lock:
                entries += [(p.ip, [p.labels[model.DNS_LABEL]]) for p in self.pods.values()
                            if model.DNS_LABEL in p.labels and not p.terminating]
            content = model.hosts_file(entries)
            if content == self._hosts_content:
                return
            self._hosts_content = content
            with open(self.hosts, "r+") as f:  # in place: the bind mounts hold this inode
                f.seek(0)
                f.write(content)
                f.truncate()

    async def _forward(self, name: str, port: dict[str, Any], reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        svc = self._services.get(name)
        targets = model.pick_target(svc, self._api_pods) if svc else []
        random.shuffle(targets)
        client = self._client_labels((writer.get_extra_info("peername") or [None])[0])
        upstream, refused = None, False
        for ip, pod in targets:
            try:
                cport = model.pod_port(pod["spec"]["containers"] or [{}], port.get("targetPort", port["port"]))
                if client is not None and not netpolicy.admitted(
                        self.policies, client, (pod.get("metadata") or {}).get("labels") or {}, cport, self.namespace):
                    refused = True  # kube-proxy chose this endpoint; the policy at the pod drops it
                    break
                upstream = await asyncio.wait_for(asyncio.open_connection(ip, cport), 2)
                break
            except (TimeoutError, OSError, model.ResolveError):
                continue
        if upstream is None and refused:  # dropped by a policy: no answer until the client gives up
            src = (client or {}).get("app.kubernetes.io/name") or (client or {}).get("scanflow.io/service")
            self.policy_drops.append(f"{src} -> {name}:{port['port']}")
            try:
                await asyncio.wait_for(reader.read(), 120)
            except (TimeoutError, OSError):
                pass
            writer.close()
            return
        if upstream is None:
            writer.close()  # no endpoint: the connection is refused, as on a cluster
            return
        up_reader, up_writer = upstream

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                try:
                    dst.close()
                except Exception:  # noqa: BLE001, S110
                    pass
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


def _suffix(n: int = 5) -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=n))


def reap(rootfs: Path) -> int:
    """SIGKILL every process whose root is `rootfs` (every container of this cluster, forked workers
    included): none outlives the harness, even one whose parent died first."""
    n = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/root") == str(rootfs):
                os.kill(int(entry), signal.SIGKILL)
                n += 1
        except OSError:
            continue
    return n
