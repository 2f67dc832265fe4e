"""What each MLflow login may do: every MLflow route sorted into a group, each role allowed a set of
groups, and the few rules that need the request's body. Pure functions; the proxy
(scanflow.tracking.mlflow_proxy) gathers the facts and applies the verdict.

Why default-deny by route: MLflow's server has ~400 routes (tracking, registry, artifacts, traces, AI
gateway secrets, webhooks, datasets, ...) and grows with every release. A rule that lists what is
forbidden lets every new route through; here a route no group names is the operator's only
(`OTHER`), so a new MLflow release can only take rights away until a group names the route.

Why the body decides: MLflow reads a POST's or DELETE's arguments from its JSON body, not from the
query string, so the alias or tag a call touches is read from where MLflow will read it; a query that
names another alias than the body is refused outright (the two readers would disagree).

Roles (who holds them: docs/security.md):
- admin: everything (the operator, the bootstrap).
- executor: the one component that changes what serves: every alias, the model digest tag.
- writer: the other agents: runs, metrics, artifacts, versions' descriptions; no alias, no delete.
- job: a training Job: runs, artifacts, registering versions, aliases other than `champion`.
- reader: reads only (replicas load models).
Nobody but admin deletes (experiments, runs, registered models, versions, logged models, artifacts) or
writes into a logged model once it is finalized (the files a registered version loads).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

Role = Literal["admin", "executor", "writer", "job", "reader"]
ROLES: tuple[Role, ...] = ("admin", "executor", "writer", "job", "reader")

Group = Literal["read", "experiment-write", "run-write", "artifact-write", "model-register", "model-describe",
                "alias", "stage", "delete", "other"]
GROUPS: tuple[Group, ...] = ("read", "experiment-write", "run-write", "artifact-write", "model-register",
                             "model-describe", "alias", "stage", "delete", "other")

ROLE_GROUPS: dict[Role, frozenset[Group]] = {
    "admin": frozenset(GROUPS),
    "executor": frozenset({"read", "experiment-write", "run-write", "artifact-write", "model-register",
                           "model-describe", "alias"}),
    "writer": frozenset({"read", "experiment-write", "run-write", "artifact-write", "model-register",
                         "model-describe"}),
    "job": frozenset({"read", "experiment-write", "run-write", "artifact-write", "model-register",
                      "model-describe", "alias"}),
    "reader": frozenset({"read"}),
}

PROTECTED_ALIASES = frozenset({"champion"})  # the alias every replica loads: moving it is code execution there
# Version tags only the Executor (and admin) may set or delete: the digest replicas check at load.
PROTECTED_TAG_PREFIXES = ("scanflow.model_digest",)

# (method, path below the API prefix) -> group, first match wins. Paths are MLflow's own route names.
_TRACKING: tuple[tuple[str, str, Group], ...] = (
    ("GET", r"experiments/(get|get-by-name|search)", "read"),
    ("POST", r"experiments/(search|search-datasets)", "read"),
    ("POST", r"experiments/(create|update|set-experiment-tag|delete-experiment-tag)", "experiment-write"),
    ("POST", r"experiments/(delete|restore)", "delete"),
    ("GET", r"runs/get", "read"),
    ("POST", r"runs/search", "read"),
    ("POST", (r"runs/(create|update|log-batch|log-metric|log-parameter|set-tag|delete-tag|log-inputs|log-model"
             r"|outputs)"), "run-write"),
    ("POST", r"runs/(delete|restore)", "delete"),
    ("GET", r"metrics/(get-history|get-history-bulk|get-history-bulk-interval)", "read"),
    ("GET", r"artifacts/list", "read"),
    ("GET", r"registered-models/(get|search|alias|get-latest-versions)", "read"),
    ("POST", r"registered-models/get-latest-versions", "read"),
    ("POST", r"registered-models/create", "model-register"),
    ("POST|PATCH|DELETE", r"registered-models/(update|set-tag|delete-tag)", "model-describe"),
    ("POST|DELETE", r"registered-models/alias", "alias"),
    ("POST", r"registered-models/rename", "stage"),
    ("DELETE", r"registered-models/delete", "delete"),
    ("GET", r"model-versions/(get|search|get-download-uri)", "read"),
    ("POST", r"model-versions/create", "model-register"),
    ("POST|PATCH|DELETE", r"model-versions/(update|set-tag|delete-tag)", "model-describe"),
    ("POST", r"model-versions/transition-stage", "stage"),
    ("DELETE", r"model-versions/delete", "delete"),
    ("POST", r"logged-models/search", "read"),
    ("POST", r"logged-models", "model-register"),
    ("GET", r"logged-models/[^/]+(/artifacts/(directories|files))?", "read"),
    ("PATCH", r"logged-models/[^/]+(/tags)?", "model-register"),
    ("POST", r"logged-models/[^/]+/params", "model-register"),
    ("DELETE", r"logged-models/[^/]+/tags/[^/]+", "model-register"),
    ("DELETE", r"logged-models/[^/]+", "delete"),
    ("GET", r"server-info", "read"),
)
_ARTIFACTS: tuple[tuple[str, str, Group], ...] = (
    ("GET", r"artifacts(/.*)?", "read"),
    ("PUT", r"artifacts/.+", "artifact-write"),
    ("POST", r"mpu/(create|complete|abort)/.+", "artifact-write"),
    ("DELETE", r"artifacts/.+", "delete"),
)
# The web UI's own pages and downloads (reads).
_UI = re.compile(r"^/(|static-files/.*|build/.*|version|get-artifact|model-versions/get-artifact)$")
# MLflow's API prefixes: /api and /ajax-api, versions 2.0 and 3.0 (one 2.0 route is registered without
# the slash after the version), tracking and mlflow-artifacts.
_PREFIX = re.compile(r"^/(ajax-)?api/[23]\.0/?mlflow(?P<artifacts>-artifacts)?/(?P<rest>.*)$")
_COMPILED = {kind: [(frozenset(m.split("|")), re.compile(f"^{p}$"), g) for m, p, g in table]
             for kind, table in (("tracking", _TRACKING), ("artifacts", _ARTIFACTS))}
_READ_METHODS = frozenset({"GET", "HEAD"})
# An artifact path inside a logged model's folder: <experiment id>/models/<model id>/...
# The routes that change a logged model's files or status: an artifact write inside its folder
# (<experiment id>/models/<model id>/...) and its finalization (PATCH logged-models/<model id>).
LOGGED_MODEL_WRITE = (re.compile(r"^/(ajax-)?api/2\.0/mlflow-artifacts/(artifacts|mpu/[a-z]+)/"
                                 r"[^/]+/models/(?P<model_id>m-[0-9a-f]+)(/|$)"),
                      re.compile(r"^/(ajax-)?api/2\.0/mlflow/logged-models/(?P<model_id>m-[0-9a-f]+)$"))


def route_group(method: str, path: str) -> Group:
    """Pure: the group of `method path` (`other`, the operator's only, when no rule names it)."""
    method = "GET" if method in ("HEAD", "OPTIONS") else method
    if method == "GET" and _UI.match(path):
        return "read"
    m = _PREFIX.match(path)
    if m is None:
        return "other"
    for methods, rx, group in _COMPILED["artifacts" if m["artifacts"] else "tracking"]:
        if method in methods and rx.match(m["rest"]):
            return group
    return "other"


def logged_model_of(method: str, path: str) -> str | None:
    """The logged model (`m-...`) whose files or status a write would change, or None."""
    if method in _READ_METHODS or method == "DELETE":
        return None
    for rx in LOGGED_MODEL_WRITE:
        if m := rx.match(path):
            return m["model_id"]
    return None


@dataclass(frozen=True)
class Facts:
    """What the proxy read from the request besides its method and path.

    `aliases`: every alias the call names (the body's and, if any, the query's); `tag_keys`: every tag
    key it names; `frozen`: the call writes the files or the status of a finalized logged model
    (scanflow.tracking.mlflow_proxy looks it up); `body_ok`: the body
    was readable JSON where the rule needs it."""

    aliases: frozenset[str] = field(default_factory=frozenset)
    tag_keys: frozenset[str] = field(default_factory=frozenset)
    frozen: bool = False
    body_ok: bool = True


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    group: Group
    reason: str = ""


def decide(role: Role, method: str, path: str, facts: Facts = Facts()) -> Verdict:
    """Pure: whether `role` may send `method path` with these facts, and why not."""
    group = route_group(method, path)
    if role == "admin":
        return Verdict(True, group)
    if group not in ROLE_GROUPS[role]:
        return Verdict(False, group, f"role {role} may not call {group} routes")
    if group == "alias" and role != "executor":
        if not facts.body_ok or not facts.aliases:
            return Verdict(False, group, "the alias this call moves cannot be read")
        if facts.aliases & PROTECTED_ALIASES:
            return Verdict(False, group, f"only the Executor moves {', '.join(sorted(PROTECTED_ALIASES))}")
    if group == "alias" and len(facts.aliases) > 1:
        return Verdict(False, group, "the query and the body name different aliases")
    if group in ("model-describe", "model-register") and role != "executor":
        if not facts.body_ok:
            return Verdict(False, group, "the tags this call sets cannot be read")
        if any(k.startswith(PROTECTED_TAG_PREFIXES) for k in facts.tag_keys):
            return Verdict(False, group, "only the Executor sets the model digest")
    if group in ("artifact-write", "model-register") and facts.frozen:
        return Verdict(False, group, "a finalized logged model's files are immutable")
    return Verdict(True, group)


def needs_body(group: Group) -> bool:
    """Whether the verdict for a non-admin depends on the body (aliases, tag keys)."""
    return group in ("alias", "model-describe", "model-register")


def body_facts(method: str, body: bytes, query: Mapping[str, str]) -> Facts:
    """Pure: the aliases and tag keys in a JSON body (as MLflow reads it: from the body for any method
    but GET) and in the query (a second reader's view, so a disagreement is visible)."""
    aliases: set[str] = set()
    keys: set[str] = set()
    if "alias" in query:
        aliases.add(query["alias"])
    if "key" in query:
        keys.add(query["key"])
    if method in _READ_METHODS:
        return Facts(frozenset(aliases), frozenset(keys))
    try:
        doc = json.loads(body) if body else {}
    except (ValueError, RecursionError, UnicodeDecodeError):
        return Facts(frozenset(aliases), frozenset(keys), body_ok=False)
    if not isinstance(doc, dict):
        return Facts(frozenset(aliases), frozenset(keys), body_ok=False)
    if isinstance(doc.get("alias"), str):
        aliases.add(doc["alias"])
    elif "alias" in doc:
        return Facts(frozenset(aliases), frozenset(keys), body_ok=False)
    if isinstance(doc.get("key"), str):
        keys.add(doc["key"])
    keys.update(_tag_keys(doc.get("tags")))
    return Facts(frozenset(aliases), frozenset(keys))


def _tag_keys(tags: object) -> Iterable[str]:
    """Keys of MLflow's `tags` field: a list of {"key", "value"} (or a mapping, to be safe)."""
    if isinstance(tags, dict):
        return [str(k) for k in tags]
    if isinstance(tags, list):
        return [str(t["key"]) for t in tags if isinstance(t, dict) and "key" in t]
    return []
