"""A new LocalPlatform adopts the services a SIGKILLed one left running: same processes, no failed
request, supervision and close() as if it had started them (real processes, real load)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from plat_load import Load, wait_for  # type: ignore[import-not-found]

from scanflow.platform import processes as procs
from scanflow.platform.local import LocalPlatform
from scanflow.spec import Resources, Service

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HERE = Path(__file__).parent
TOKEN = "test-token-123"


def _read_ready(owner: subprocess.Popen[str], deadline_s: float = 150.0) -> dict:  # type: ignore[type-arg]
    """The owner's READY line (its service status), or fail with its output."""
    lines: list[str] = []

    def ready() -> bool:
        line = owner.stdout.readline() if owner.stdout else ""  # blocks until a line: the owner prints one
        lines.append(line)
        return line.startswith("READY ") or owner.poll() is not None

    assert procs.wait_until(ready, deadline_s, 0.0) and lines[-1].startswith("READY "), lines
    return json.loads(lines[-1][len("READY "):])


def test_killed_owner_services_are_adopted_without_a_failed_request(mlflow_server, models, tmp_path) -> None:  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    spec = Service(name="adopt", model_uri=models["v1"], replicas=2, max_replicas=3,
                   resources=Resources(cpu=1, memory="1Gi"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    owner = subprocess.Popen(
        [sys.executable, str(HERE / "plat_owner.py"), str(home), mlflow_server, TOKEN, spec.model_dump_json()],
        stdout=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    plat: LocalPlatform | None = None
    try:
        st = _read_ready(owner)
        before = {r["name"]: r["pid"] for r in st["replicas"]}
        assert len(before) == 2 and all(before.values())
        with Load(st["endpoint"], clients=2) as load:
            assert wait_for(lambda: load.snapshot()[0] > 20, 30)
            os.killpg(owner.pid, signal.SIGKILL)  # the owner dies; its services are in their own sessions
            owner.wait(timeout=10)
            n = load.snapshot()[0]
            assert wait_for(lambda: load.snapshot()[0] > n + 20, 30)  # still serving, nobody owns them

            plat = LocalPlatform(home, tracking_uri=mlflow_server, token=TOKEN)
            report = plat.adopt()
            assert report["adopt"]["restarted"] == [], report
            assert plat.services()["adopt"] == spec
            assert plat.deploy(spec).endpoint == st["endpoint"]  # an identical spec: a no-op
            now = plat.status("adopt")
            assert {r.name: r.pid for r in now.replicas} == before and now.ready_replicas == 2

            # the supervisor watches adopted replicas by pid and restores a killed one
            victim = before["adopt-1"]
            os.kill(victim, signal.SIGKILL)

            def restored() -> bool:
                s = plat.status("adopt")  # type: ignore[union-attr]
                return s.ready_replicas == 2 and victim not in {r.pid for r in s.replicas}

            assert wait_for(restored, 90, 0.5)
            n = load.snapshot()[0]
            assert wait_for(lambda: load.snapshot()[0] > n + 20, 30)
        assert load.failed == [], load.failed[:5]
        state = json.loads((home / "state.json").read_text())
        assert {r["pid"] for r in state["services"]["adopt"]["replicas"]} == {r.pid for r in plat.status("adopt").replicas}

        gateway_pid = state["services"]["adopt"]["gateway"]["pid"]
        pids = plat.pids()
        assert gateway_pid in pids and before["adopt-2"] in pids
        plat.close()  # stops adopted processes too, and leaves nothing to adopt
        assert all(procs.start_time(p) is None for p in pids)
        assert not (home / "state.json").exists()
    finally:
        if plat is not None:
            plat.close()
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait(timeout=10)
        procs.kill_groups(procs.find_processes("SCANFLOW_PLATFORM_HOME", str(home.resolve()),
                                               ("scanflow.serving.gateway", "scanflow.serving.replica")))


def test_adopt_drops_dead_and_foreign_entries_and_restarts_them(mlflow_server, models, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A recorded pid that is gone, or alive but another process (pid reuse), is not adopted: the
    gateway comes back on its recorded port and the replica is started anew."""
    home = tmp_path / "home"
    home.mkdir()
    spec = Service(name="ghost", model_uri=models["v1"], replicas=1, resources=Resources(cpu=1, memory="1Gi"))
    me = os.getpid()  # alive, but not a replica: stands for a reused pid
    port = procs.free_port()
    state = {"version": 1, "cgroup_prefix": "scanflow-test-ghost", "services": {"ghost": {
        "spec": spec.model_dump(mode="json"), "backup_url": None, "routed_to": None,
        "gateway": {"pid": 2**22 + 1, "start": 1, "port": port},
        "replicas": [{"rid": 1, "pid": me, "start": procs.start_time(me), "port": procs.free_port(),
                      "restarts": 0, "cpus": [0]}],
    }}}
    (home / "state.json").write_text(json.dumps(state))
    with LocalPlatform(home, tracking_uri=mlflow_server, token=TOKEN) as plat:
        report = plat.adopt()
        assert report["ghost"] == {"adopted": [], "restarted": ["gateway", "replica 1"]}
        assert wait_for(lambda: plat.status("ghost").ready_replicas == 1, 120, 0.5)
        st = plat.status("ghost")
        assert st.endpoint == f"http://127.0.0.1:{port}" and st.replicas[0].pid != me
        r = procs.call("POST", st.endpoint + "/predict", json={"inputs": [[0.1] * 64]}, timeout_s=10)
        assert r["model_version"] == models["v1"].rsplit("/", 1)[1]
    assert procs.start_time(me) is not None  # the foreign process was left alone


def test_adopt_with_no_or_broken_state_adopts_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with LocalPlatform(tmp_path / "a", tracking_uri="http://127.0.0.1:9") as plat:
        assert plat.adopt() == {}
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "state.json").write_text("{not json")
    with LocalPlatform(tmp_path / "b", tracking_uri="http://127.0.0.1:9") as plat:
        assert plat.adopt() == {}
