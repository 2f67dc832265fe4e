"""The pure parts of the emulated cluster: what a kubelet and kube-proxy decide, without processes.

Env resolution (value with $(VAR) expansion, secretKeyRef, configMapKeyRef, fieldRef, envFrom), label
selectors, address allocation, Service DNS names and the hosts file, the image's environment and a
pod's argv. Kept free of I/O so each rule has a unit test (tests/harness/test_model.py); the runtime
(tests/harness/cluster.py) only applies them.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]

# The image's ENV (deploy/Dockerfile), with the repository's venv in place of /opt/venv: the kubelet
# starts a container with its image's environment, then the container's `env` on top.
VENV_BIN = "/work/main/.venv/bin"
IMAGE_ENV = {
    "PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "SCANFLOW_HOME": "/tmp/scanflow",
    "MPLCONFIGDIR": "/tmp/matplotlib", "HOME": "/tmp", "PYTHONPATH": "/app",
}
IMAGE_WORKDIR = "/app"
_VAR_REF = re.compile(r"\$\((\w+)\)|\$\$")


class ResolveError(ValueError):
    """A reference the kubelet could not resolve (the pod would stay in CreateContainerConfigError)."""


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables are replaced, undefined ones kept literally,
    `$$` escapes a dollar."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR_REF.sub(sub, value)


def field_value(path: str, pod: Obj) -> str:
    """The downward API's fieldRef paths the manifests use."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    table = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"), "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    if path not in table or table[path] is None:
        raise ResolveError(f"fieldRef {path!r} not available")
    return str(table[path])


def _keyed(kind: str, ref: Obj, objects: Mapping[str, Obj]) -> str | None:
    obj = objects.get(ref.get("name", ""))
    if obj is None:
        if ref.get("optional"):
            return None
        raise ResolveError(f"{kind} {ref.get('name')!r} not found")
    if kind == "secret":
        data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        data.update(obj.get("stringData") or {})
    else:
        data = dict(obj.get("data") or {})
    if ref.get("key") not in data:
        if ref.get("optional"):
            return None
        raise ResolveError(f"{kind} {ref.get('name')!r} has no key {ref.get('key')!r}")
    return str(data[ref["key"]])


def resolve_env(container: Obj, pod: Obj, secrets: Mapping[str, Obj], configmaps: Mapping[str, Obj],
                base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a container starts with: the image's (`base`), then envFrom, then env in order,
    each value expanded against what is defined before it (as the kubelet does)."""
    env = dict(base or {})
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for kind, key in (("secret", "secretRef"), ("configmap", "configMapRef")):
            if key in src:
                ref = src[key]
                obj = (secrets if kind == "secret" else configmaps).get(ref.get("name", ""))
                if obj is None:
                    if ref.get("optional"):
                        continue
                    raise ResolveError(f"{kind} {ref.get('name')!r} not found")
                data = ({k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
                        if kind == "secret" else dict(obj.get("data") or {}))
                env.update({prefix + k: str(v) for k, v in data.items()})
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        src = item.get("valueFrom") or {}
        value: str | None
        if "secretKeyRef" in src:
            value = _keyed("secret", src["secretKeyRef"], secrets)
        elif "configMapKeyRef" in src:
            value = _keyed("configmap", src["configMapKeyRef"], configmaps)
        elif "fieldRef" in src:
            value = field_value(src["fieldRef"]["fieldPath"], pod)
        elif "resourceFieldRef" in src:
            value = None  # not emulated: the variable is left unset
        else:
            value = ""
        if value is not None:
            env[name] = value
    return env


def pod_argv(container: Obj) -> list[str]:
    """command + args with $(VAR) expansion (our image has no ENTRYPOINT/CMD the manifests rely on)."""
    cmd = list(container.get("command") or []) + list(container.get("args") or [])
    if not cmd:
        raise ResolveError(f"container {container.get('name')!r} has no command: the image's CMD is --help")
    return cmd


def expand_argv(argv: Iterable[str], env: Mapping[str, str]) -> list[str]:
    return [expand(a, env) for a in argv]


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """A Service selector (a plain map) or a LabelSelector (matchLabels/matchExpressions) against labels.
    An empty or absent selector matches nothing (a Service without selector has no endpoints)."""
    if not selector:
        return False
    labels = labels or {}
    if "matchLabels" in selector or "matchExpressions" in selector:
        if not all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
            return False
        for expr in selector.get("matchExpressions") or []:
            key, op, values = expr["key"], expr["operator"], expr.get("values") or []
            ok = {"In": key in labels and labels[key] in values,
                  "NotIn": key not in labels or labels[key] not in values,
                  "Exists": key in labels, "DoesNotExist": key not in labels}[op]
            if not ok:
                return False
        return bool(selector.get("matchLabels") or selector.get("matchExpressions"))
    return all(labels.get(k) == v for k, v in selector.items())


_REQUIREMENT = re.compile(
    r"\s*(?:(?P<not>!)\s*(?P<absent>[\w./-]+)"
    r"|(?P<key>[\w./-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[\w.-]*)"
    r"|\s+(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?)\s*(?:,|$)")


def parse_label_selector(text: str) -> Obj:
    """The API's `labelSelector` query parameter (`a=b,c!=d,e in (x,y),f notin (z),g,!h`) -> the
    LabelSelector object it means (matchExpressions), for `selector_matches`. ValueError on bad syntax:
    the API server answers 400 there."""
    exprs: list[Obj] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        m = _REQUIREMENT.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"unable to parse requirement at {text[pos:]!r}")
        pos = m.end()
        if m["absent"]:
            exprs.append({"key": m["absent"], "operator": "DoesNotExist"})
        elif m["op"]:
            exprs.append({"key": m["key"], "operator": "NotIn" if m["op"] == "!=" else "In", "values": [m["value"]]})
        elif m["set"]:
            values = [v.strip() for v in m["values"].split(",") if v.strip()]
            exprs.append({"key": m["key"], "operator": "In" if m["set"] == "in" else "NotIn", "values": values})
        else:
            exprs.append({"key": m["key"], "operator": "Exists"})
    return {"matchExpressions": exprs}


def list_selects(label_selector: str | None, labels: Mapping[str, str] | None) -> bool:
    """Whether a list call with this `labelSelector` parameter returns an object with these labels:
    no or an empty parameter returns everything (unlike a Service's empty selector)."""
    if not label_selector or not label_selector.strip():
        return True
    return selector_matches(parse_label_selector(label_selector), labels)


# The emulated cluster's one node: what it can give its pods. Fixed, not this machine's size, so a
# scenario can ask for more than the node has whatever machine the harness runs on.
NODE_ALLOCATABLE = {"cpu": "4", "memory": "8Gi"}


def pod_requests(containers: Iterable[Obj]) -> dict[str, float]:
    """Pure: what a pod asks its node for, summed over its containers: each container's request, or
    its limit where the request is missing (the API server defaults a request to the limit)."""
    from kubernetes.utils import parse_quantity

    total = {"cpu": 0.0, "memory": 0.0}
    for c in containers:
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        for key in total:
            value = requests.get(key, limits.get(key))
            if value is not None:
                total[key] += float(parse_quantity(value))
    return total


def _over(containers: Iterable[Obj], allocatable: Mapping[str, str]) -> list[tuple[str, float, float]]:
    from kubernetes.utils import parse_quantity

    return [(key, asked, float(parse_quantity(allocatable[key])))
            for key, asked in pod_requests(containers).items() if asked > float(parse_quantity(allocatable[key]))]


def unschedulable(containers: Iterable[Obj], allocatable: Mapping[str, str] = NODE_ALLOCATABLE) -> str | None:
    """Pure: the scheduler's message for a pod no node can take (its requests exceed the one node's
    allocatable), None when it fits. Other pods' requests are not counted: the emulation has no
    bin packing, only the per-node bound."""
    over = _over(containers, allocatable)
    if not over:
        return None
    return "0/1 nodes are available: " + ", ".join(f"1 Insufficient {key}" for key, _, _ in over) + "."


def resize_infeasible(containers: Iterable[Obj], allocatable: Mapping[str, str] = NODE_ALLOCATABLE) -> str | None:
    """Pure: the kubelet's message for an in-place resize its node can never give (the pod's new
    requests exceed the node's allocatable: PodResizePending, reason Infeasible), None when it fits."""
    over = _over(containers, allocatable)
    if not over:
        return None
    key, asked, has = over[0]
    scale = 1000 if key == "cpu" else 1  # the kubelet says millicores for CPU
    return f"Node didn't have enough capacity: {key}, requested: {asked * scale:.0f}, capacity: {has * scale:.0f}"


@dataclass
class AddressPool:
    """Hands out addresses of one network in order, one per name, stable for the name's lifetime."""

    network: str
    skip: int = 1  # the first host address (the bridge / gateway) is not handed out
    _taken: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._hosts = ipaddress.ip_network(self.network).hosts()
        for _ in range(self.skip):
            next(self._hosts)

    def get(self, name: str) -> str:
        if name not in self._taken:
            try:
                self._taken[name] = str(next(self._hosts))
            except StopIteration:
                raise RuntimeError(f"address pool {self.network} exhausted") from None
        return self._taken[name]

    def items(self) -> list[tuple[str, str]]:
        return list(self._taken.items())


def service_names(name: str, namespace: str) -> list[str]:
    """The DNS names a pod can use for a Service (search path svc.cluster.local)."""
    return [name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]


def hosts_file(entries: Iterable[tuple[str, list[str]]]) -> str:
    """/etc/hosts for the pods: localhost, then one line per (address, names)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    for addr, names in sorted(entries):
        lines.append(f"{addr}\t" + " ".join(names))
    return "\n".join(lines) + "\n"


def template_hash(template: Obj) -> str:
    """The Deployment controller's pod-template-hash: a change of template means a new ReplicaSet."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def container_port(container: Obj, port: int | str) -> int:
    """A probe's or a Service's targetPort: a number, or a named containerPort."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ResolveError(f"container {container.get('name')!r} has no port named {port!r}")


def pod_port(containers: list[Obj], port: int | str) -> int:
    """A Service's targetPort on a pod: a number, or a port named by any of its containers (a sidecar's,
    e.g. MLflow's auth proxy in front of MLflow)."""
    for c in containers:
        try:
            return container_port(c, port)
        except ResolveError:
            continue
    raise ResolveError(f"no container of the pod has a port named {port!r}")


def headless(service: Obj) -> bool:
    """A Service with clusterIP None: no virtual address, its DNS name answers with its ready pods."""
    return (service.get("spec") or {}).get("clusterIP") == "None"


def pick_target(service: Obj, pods: Iterable[Obj]) -> list[tuple[str, Obj]]:
    """The ready endpoints of a Service: (pod IP, pod) for each ready pod its selector matches now."""
    selector = (service.get("spec") or {}).get("selector")
    out = []
    for pod in pods:
        st = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
        if ready and st.get("podIP") and selector_matches(selector, (pod.get("metadata") or {}).get("labels")):
            out.append((st["podIP"], pod))
    return out


def _int_or_percent(value: int | str | None, want: int, default: str, round_up: bool) -> int:
    """maxSurge/maxUnavailable: an integer, or a percentage of the replicas (surge rounds up, unavailable down)."""
    value = default if value is None else value
    if isinstance(value, str) and value.endswith("%"):
        share = want * int(value[:-1]) / 100
        return int(-(-share // 1)) if round_up else int(share)
    return int(value)


def rolling_step(want: int, strategy: Obj | None, new: list[tuple[str, bool]],
                 old: list[tuple[str, bool]]) -> tuple[int, list[str]]:
    """One pass of the Deployment controller's rolling update: how many pods of the current template to
    create, and which pods ((name, ready) each; `new` on the current template, `old` on earlier ones) to
    terminate. As the controller does: at most want + maxSurge pods in all; an old pod goes only while at
    least want - maxUnavailable stay ready, unready old pods first (so with maxUnavailable 0 a rollout
    whose new pods never become ready keeps every old pod); extra current pods go when scaled down."""
    rolling = (strategy or {}).get("rollingUpdate") or {}
    surge = _int_or_percent(rolling.get("maxSurge"), want, "25%", round_up=True)
    unavailable = _int_or_percent(rolling.get("maxUnavailable"), want, "25%", round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1  # what the API server's validation leaves possible
    create = max(0, min(want, want + surge - len(old)) - len(new)) if old else max(0, want - len(new))
    total, min_available = len(new) + len(old) + create, want - unavailable
    new_unready = sum(not r for _, r in new) + create
    terminate: list[str] = []
    scale_down = total - min_available - new_unready
    if scale_down > 0:
        terminate += [name for name, ready in old if not ready][:scale_down]  # they cost no availability
        ready = sum(r for _, r in new) + sum(r for _, r in old)
        terminate += [name for name, r in old if r][:max(0, ready - min_available)]
    extra = len(new) - want
    for name, _ in sorted(new, key=lambda p: p[1])[:max(0, extra)]:
        terminate.append(name)
    return create, terminate


def rollout_status(generation: int, want: int, pods: Iterable[tuple[str, bool]], current: str) -> Obj:
    """A Deployment's status from its pods ((template hash, ready) each) and the current template's hash."""
    pods = list(pods)
    updated = [r for h, r in pods if h == current]
    return {"observedGeneration": generation, "replicas": len(pods), "updatedReplicas": len(updated),
            "readyReplicas": sum(r for _, r in pods), "availableReplicas": sum(r for _, r in pods),
            "unavailableReplicas": max(0, want - sum(updated))}


# -- docker-compose.yml: each service becomes the pod a Deployment (or, `restart: on-failure`, a Job)
# would run, so one kubelet plays both; names resolve to the pod's own address (compose has no proxy).
DNS_LABEL = "harness.scanflow.io/dns-name"


def duration_s(text: str | float | None, default: float) -> float:
    """A compose duration ('10s', '1m30s', '500ms') in seconds."""
    if text is None:
        return default
    if isinstance(text, (int, float)):
        return float(text)
    total, num = 0.0, ""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            num += ch
            i += 1
            continue
        unit = text[i:i + 2] if text[i:i + 2] in ("ms", "us") else ch
        total += float(num) * units[unit]
        num, i = "", i + len(unit)
    return total + (float(num) if num else 0.0)


def compose_probe(health: Mapping[str, Any] | None) -> Obj | None:
    """A compose healthcheck as an exec readiness probe (None: no healthcheck, or disabled)."""
    if not health or health.get("disable"):
        return None
    test = list(health.get("test") or [])
    if not test or test[0] == "NONE":
        return None
    command = test[1:] if test[0] == "CMD" else ["sh", "-c", " ".join(test[1:])] if test[0] == "CMD-SHELL" \
        else ["sh", "-c", " ".join(test)]
    return {"exec": {"command": command}, "periodSeconds": max(1, round(duration_s(health.get("interval"), 30))),
            "timeoutSeconds": max(1, round(duration_s(health.get("timeout"), 30))),
            "failureThreshold": int(health.get("retries", 3))}


def compose_objects(config: Mapping[str, Any], namespace: str, project_dir: str) -> dict[str, Obj]:
    """`docker-compose config` -> {service: Deployment or Job} with the same command, env, volumes
    (named volume -> PVC, host path -> hostPath, tmpfs -> emptyDir) and healthcheck (exec probe)."""
    named = set((config.get("volumes") or {}).keys())
    out: dict[str, Obj] = {}
    for name, svc in (config.get("services") or {}).items():
        mounts, volumes = [], []
        for i, spec in enumerate(svc.get("volumes") or []):
            src, dst = str(spec).split(":")[:2]
            vname = f"v{i}"
            if src in named:
                volumes.append({"name": vname, "persistentVolumeClaim": {"claimName": src}})
            else:
                path = src if src.startswith("/") else f"{project_dir}/{src}"
                volumes.append({"name": vname, "hostPath": {"path": path}})
            mounts.append({"name": vname, "mountPath": dst})
        for i, path in enumerate(svc.get("tmpfs") or []):
            volumes.append({"name": f"t{i}", "emptyDir": {"medium": "Memory"}})
            mounts.append({"name": f"t{i}", "mountPath": str(path).split(":")[0]})
        command = svc.get("command")
        container: Obj = {"name": name, "image": svc.get("image", ""),
                          "env": [{"name": k, "value": "" if v is None else str(v)}
                                  for k, v in (svc.get("environment") or {}).items()],
                          "volumeMounts": mounts}
        if command:
            container["command"] = command if isinstance(command, list) else ["sh", "-c", command]
        probe = compose_probe(svc.get("healthcheck"))
        if probe:
            container["readinessProbe"] = probe
        labels = {"compose.service": name, DNS_LABEL: name}
        template = {"metadata": {"labels": labels},
                    "spec": {"containers": [container], "volumes": volumes, "automountServiceAccountToken": False}}
        meta = {"name": name, "namespace": namespace, "labels": labels}
        if svc.get("restart") in ("on-failure", "no") or str(svc.get("restart", "")).startswith("on-failure"):
            template["spec"]["restartPolicy"] = "Never"
            out[name] = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
                         "spec": {"backoffLimit": 10, "template": template}}
        else:
            out[name] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                         "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                                  "selector": {"matchLabels": {"compose.service": name}}, "template": template}}
    return out


def compose_order(config: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """service -> {dependency: condition} (a list form of depends_on means service_started)."""
    out: dict[str, dict[str, str]] = {}
    for name, svc in (config.get("services") or {}).items():
        deps = svc.get("depends_on") or {}
        if isinstance(deps, list):
            deps = {d: {"condition": "service_started"} for d in deps}
        out[name] = {d: (c or {}).get("condition", "service_started") for d, c in deps.items()}
    return out


def _named(items: Any) -> bool:
    return isinstance(items, list) and bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def merge_named_lists(value: Mapping[str, Any], patch: Mapping[str, Any], merge: Any) -> dict[str, Any]:
    """A patch with every list of named objects (containers, env, ports, volumes, volumeMounts) merged
    into the stored one by `name`, as the API server's strategic merge and server-side apply do: items
    the patch names are merged (`merge(old, new)`), the others kept, new ones appended. kmock merges
    dicts but replaces lists, which dropped a replica's env, image and probes on `swap_model`'s patch."""
    out = dict(patch)
    for key, new in patch.items():
        old = value.get(key)
        if _named(old) and _named(new):
            by_name = {i["name"]: i for i in new}
            kept = [merge(i, by_name[i["name"]]) if i["name"] in by_name else i for i in old]
            have = {i["name"] for i in old}
            out[key] = kept + [i for i in new if i["name"] not in have]
    return out
