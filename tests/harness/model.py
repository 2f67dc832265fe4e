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


def hosts_file(services: Iterable[tuple[str, str, str]]) -> str:
    """/etc/hosts for the pods: localhost, then one line per (name, namespace, address)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    for name, ns, addr in sorted(services, key=lambda s: (s[2], s[0])):
        lines.append(f"{addr}\t" + " ".join(service_names(name, ns)))
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


def rollout_status(generation: int, want: int, pods: Iterable[tuple[str, bool]], current: str) -> Obj:
    """A Deployment's status from its pods ((template hash, ready) each) and the current template's hash."""
    pods = list(pods)
    updated = [r for h, r in pods if h == current]
    return {"observedGeneration": generation, "replicas": len(pods), "updatedReplicas": len(updated),
            "readyReplicas": sum(r for _, r in pods), "availableReplicas": sum(r for _, r in pods),
            "unavailableReplicas": max(0, want - sum(updated))}
