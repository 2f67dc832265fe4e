"""The emulated cluster's pure rules: env resolution, selectors, addresses, DNS names, rollout status."""

from __future__ import annotations

import base64

import pytest

from tests.harness import model

POD = {"metadata": {"name": "executor-abc", "namespace": "scanflow", "labels": {"app": "x"}},
       "spec": {"serviceAccountName": "scanflow-executor"}, "status": {"podIP": "10.244.0.7"}}
SECRETS = {"s": {"data": {"token": base64.b64encode(b"t0k").decode(), "pw": base64.b64encode(b"p@ss").decode()}}}
CMS = {"c": {"data": {"level": "debug"}}}


def test_env_is_the_image_env_then_env_in_order_with_var_expansion() -> None:
    container = {"env": [
        {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
        {"name": "URI", "value": "postgresql://u:$(PW)@db:5432/x"},   # defined before: expanded
        {"name": "EARLY", "value": "$(LATER)-$$(PW)"},                 # undefined kept, $$ escapes
        {"name": "LATER", "value": "v"},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "level"}}},
        {"name": "HOME", "value": "/home/x"},
    ]}
    env = model.resolve_env(container, POD, SECRETS, CMS, base={"HOME": "/tmp", "PATH": "/bin"})
    assert env["URI"] == "postgresql://u:p@ss@db:5432/x"
    assert env["EARLY"] == "$(LATER)-$(PW)"
    assert (env["NS"], env["NAME"], env["IP"], env["LEVEL"]) == ("scanflow", "executor-abc", "10.244.0.7", "debug")
    assert env["HOME"] == "/home/x" and env["PATH"] == "/bin"


def test_a_missing_secret_or_key_fails_unless_optional() -> None:
    missing = {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "token"}}}]}
    with pytest.raises(model.ResolveError, match="nope"):
        model.resolve_env(missing, POD, SECRETS, CMS)
    no_key = {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "other"}}}]}
    with pytest.raises(model.ResolveError, match="other"):
        model.resolve_env(no_key, POD, SECRETS, CMS)
    optional = {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}}}]}
    assert "T" not in model.resolve_env(optional, POD, SECRETS, CMS)


def test_env_from_a_secret_with_prefix() -> None:
    env = model.resolve_env({"envFrom": [{"secretRef": {"name": "s"}, "prefix": "S_"}]}, POD, SECRETS, CMS)
    assert env == {"S_token": "t0k", "S_pw": "p@ss"}


def test_argv_is_command_then_args_expanded_and_a_container_without_command_is_refused() -> None:
    c = {"name": "m", "command": ["mlflow", "server"], "args": ["--port=$(PORT)"]}
    assert model.expand_argv(model.pod_argv(c), {"PORT": "5000"}) == ["mlflow", "server", "--port=5000"]
    with pytest.raises(model.ResolveError):
        model.pod_argv({"name": "x"})


def test_selectors_plain_and_label_selector() -> None:
    labels = {"scanflow.io/service": "digits", "tier": "web"}
    assert model.selector_matches({"scanflow.io/service": "digits"}, labels)
    assert not model.selector_matches({"scanflow.io/service": "digits-backup"}, labels)
    assert not model.selector_matches({}, labels)  # no selector: no endpoints
    assert not model.selector_matches(None, labels)
    assert model.selector_matches({"matchLabels": {"tier": "web"},
                                   "matchExpressions": [{"key": "scanflow.io/service", "operator": "In",
                                                         "values": ["digits", "x"]}]}, labels)
    assert not model.selector_matches({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, labels)


def test_a_list_calls_label_selector_filters_as_the_api_server_does() -> None:
    labels = {"scanflow.io/service": "digits", "tier": "web"}
    assert model.list_selects(None, labels) and model.list_selects(" ", labels)  # no selector: everything
    assert model.list_selects("scanflow.io/service=digits", labels)
    assert model.list_selects("scanflow.io/service==digits,tier", labels)
    assert not model.list_selects("scanflow.io/service=digits-backup", labels)
    assert not model.list_selects("scanflow.io/service", {"app": "x"})
    assert model.list_selects("tier!=db", labels) and model.list_selects("missing!=x", labels)
    assert model.list_selects("tier in (web, api),!missing", labels)
    assert not model.list_selects("tier notin (web)", labels)
    assert not model.list_selects("!tier", labels)
    with pytest.raises(ValueError, match="unable to parse"):
        model.parse_label_selector("tier in web")


def test_the_node_takes_a_pod_or_says_why_not() -> None:
    small = [{"resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}}},
             {"resources": {"limits": {"cpu": "1", "memory": "64Mi"}}}]  # a limit stands for its request
    assert model.pod_requests(small) == {"cpu": 1.5, "memory": 576 * 2**20}
    assert model.unschedulable(small) is None and model.resize_infeasible(small) is None
    big = [{"resources": {"requests": {"cpu": "6", "memory": "512Mi"}}}]
    assert model.unschedulable(big) == "0/1 nodes are available: 1 Insufficient cpu."
    assert model.resize_infeasible(big) == "Node didn't have enough capacity: cpu, requested: 6000, capacity: 4000"
    assert model.unschedulable(big, {"cpu": "8", "memory": "1Gi"}) is None


def test_service_endpoints_are_the_ready_pods_the_selector_matches_now() -> None:
    def pod(name: str, svc: str, ready: bool, ip: str) -> dict:
        return {"metadata": {"name": name, "labels": {"scanflow.io/service": svc}},
                "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]}}
    pods = [pod("a", "digits", True, "10.0.0.1"), pod("b", "digits", False, "10.0.0.2"),
            pod("c", "digits-backup", True, "10.0.0.3")]
    service = {"spec": {"selector": {"scanflow.io/service": "digits"}}}
    assert [ip for ip, _ in model.pick_target(service, pods)] == ["10.0.0.1"]
    service["spec"]["selector"] = {"scanflow.io/service": "digits-backup"}  # the Executor's route
    assert [ip for ip, _ in model.pick_target(service, pods)] == ["10.0.0.3"]


def test_addresses_are_stable_per_name_and_skip_the_gateway() -> None:
    pool = model.AddressPool("10.96.0.0/30", skip=1)
    assert pool.get("a") == "10.96.0.2" and pool.get("a") == "10.96.0.2"
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.get("b")


def test_hosts_file_names_every_service_form() -> None:
    text = model.hosts_file([("10.96.0.2", model.service_names("mlflow", "scanflow"))])
    assert "10.96.0.2\tmlflow mlflow.scanflow mlflow.scanflow.svc mlflow.scanflow.svc.cluster.local" in text
    assert text.startswith("127.0.0.1\tlocalhost")


def test_named_ports_and_rollout_status() -> None:
    c = {"name": "r", "ports": [{"name": "http", "containerPort": 8080}]}
    assert model.container_port(c, "http") == 8080 and model.container_port(c, 9000) == 9000
    with pytest.raises(model.ResolveError):
        model.container_port(c, "metrics")
    st = model.rollout_status(3, 2, [("new", True), ("new", False), ("old", True)], "new")
    assert st == {"observedGeneration": 3, "replicas": 3, "updatedReplicas": 2, "readyReplicas": 2,
                  "availableReplicas": 2, "unavailableReplicas": 1}
    assert model.template_hash({"a": 1}) != model.template_hash({"a": 2})


COMPOSE = {
    "services": {
        "postgres": {"image": "postgres:16-alpine", "environment": {"POSTGRES_PASSWORD": "p"},
                     "volumes": ["pgdata:/var/lib/postgresql/data:rw", "./init.sql:/docker-entrypoint-initdb.d/a.sql:ro"],
                     "healthcheck": {"test": ["CMD", "pg_isready"], "interval": "5s", "timeout": "3s", "retries": 10}},
        "bootstrap": {"image": "scanflow", "command": ["python", "-m", "b"], "restart": "on-failure",
                      "healthcheck": {"test": ["NONE"]}, "depends_on": {"postgres": {"condition": "service_healthy"}}},
        "tracker": {"image": "scanflow", "command": ["scanflow", "agent"], "tmpfs": ["/tmp"],
                    "environment": {"SCANFLOW_PEERS": "a=http://a:8080", "EMPTY": None},
                    "depends_on": ["bootstrap"], "restart": "unless-stopped"},
    },
    "volumes": {"pgdata": {}},
}


def test_compose_services_become_pods_with_their_command_env_volumes_and_healthcheck() -> None:
    objs = model.compose_objects(COMPOSE, "compose", "/proj")
    assert objs["bootstrap"]["kind"] == "Job" and objs["tracker"]["kind"] == "Deployment"
    pg = objs["postgres"]["spec"]["template"]["spec"]
    assert pg["volumes"] == [{"name": "v0", "persistentVolumeClaim": {"claimName": "pgdata"}},
                             {"name": "v1", "hostPath": {"path": "/proj/./init.sql"}}]
    probe = pg["containers"][0]["readinessProbe"]
    assert probe == {"exec": {"command": ["pg_isready"]}, "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 10}
    tracker = objs["tracker"]["spec"]["template"]["spec"]["containers"][0]
    assert tracker["command"] == ["scanflow", "agent"] and "readinessProbe" not in tracker
    assert {"name": "EMPTY", "value": ""} in tracker["env"]
    assert tracker["volumeMounts"] == [{"name": "t0", "mountPath": "/tmp"}]
    assert "readinessProbe" not in objs["bootstrap"]["spec"]["template"]["spec"]["containers"][0]  # test: NONE


def test_compose_order_and_durations() -> None:
    assert model.compose_order(COMPOSE) == {"postgres": {}, "bootstrap": {"postgres": "service_healthy"},
                                            "tracker": {"bootstrap": "service_started"}}
    assert model.duration_s("1m30s", 0) == 90 and model.duration_s("500ms", 0) == 0.5
    assert model.duration_s(None, 7) == 7


def test_named_lists_merge_by_name_as_strategic_merge_does() -> None:
    from kmock._internal import dicts

    def merge(a: dict, b: dict) -> dict:
        return dict(dicts.merge_patch_dict(a, model.merge_named_lists(a, b, merge)))

    stored = {"containers": [{"name": "replica", "image": "scanflow", "env": [{"name": "A", "value": "1"}],
                              "command": ["old"]}, {"name": "sidecar", "image": "x"}]}
    patch = {"containers": [{"name": "replica", "command": ["new"], "env": [{"name": "B", "value": "2"}]}]}
    got = merge(stored, patch)
    assert got["containers"][0] == {"name": "replica", "image": "scanflow", "command": ["new"],
                                    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
    assert got["containers"][1] == {"name": "sidecar", "image": "x"}
    assert model.merge_named_lists({"args": ["a"]}, {"args": ["b"]}, merge) == {"args": ["b"]}  # plain lists: replaced


def test_a_service_port_named_by_a_sidecar_resolves_on_the_pod() -> None:
    mlflow = {"name": "mlflow", "ports": []}
    proxy = {"name": "proxy", "ports": [{"name": "http", "containerPort": 5000}]}
    assert model.pod_port([mlflow, proxy], "http") == 5000
    assert model.pod_port([mlflow, proxy], 5001) == 5001
    with pytest.raises(model.ResolveError):
        model.pod_port([mlflow, proxy], "grpc")


def test_rolling_step_keeps_every_old_pod_while_the_new_one_is_not_ready() -> None:
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    # a rollout starts: one pod more, nothing goes
    assert model.rolling_step(2, strategy, [], [("a", True), ("b", True)]) == (1, [])
    # the new pod never becomes ready (unschedulable): an old pod still starting is kept too
    assert model.rolling_step(2, strategy, [("n", False)], [("a", True), ("b", False)]) == (0, [])
    # ready: one old pod goes, the unready one first
    assert model.rolling_step(2, strategy, [("n", True)], [("a", True), ("b", False)]) == (0, ["b"])
    assert model.rolling_step(2, strategy, [("n", True)], [("a", True), ("b", True)]) == (0, ["a"])
    # put back (the old template current again): the unplaceable pod goes once the others are ready
    assert model.rolling_step(2, strategy, [("a", True), ("b", False)], [("n", False)]) == (0, [])
    assert model.rolling_step(2, strategy, [("a", True), ("b", True)], [("n", False)]) == (0, ["n"])
    # no rollout: scale up and down
    assert model.rolling_step(3, strategy, [("a", True)], []) == (2, [])
    assert model.rolling_step(1, strategy, [("a", True), ("b", False)], []) == (0, ["b"])


def test_rolling_step_defaults_and_percentages() -> None:
    # the defaults (25 % each): 4 replicas surge by 1 and may lose 1 ready pod
    assert model.rolling_step(4, None, [], [(c, True) for c in "abcd"]) == (1, ["a"])
    assert model.rolling_step(4, {"rollingUpdate": {"maxSurge": "50%", "maxUnavailable": 0}}, [],
                              [(c, True) for c in "abcd"]) == (2, [])
