"""DNS discovery of replicas (scanflow.serving.discovery): the pure expansion and merge, then a real
gateway process resolving a name through its own /etc/hosts (a private mount namespace, as the
emulated cluster gives a pod) while the test changes the addresses the name has, as cluster DNS does
for a headless Service when pods turn ready or go."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from serving_helpers import Proc, free_port

from scanflow.serving import discovery


def test_expand_gives_one_url_per_address_sorted_with_the_port_and_path() -> None:
    got = discovery.expand("http://digits-own:8080", ["10.0.0.2", "10.0.0.1", "10.0.0.2", "fd00::1"])
    assert got == ["http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://[fd00::1]:8080"]
    assert discovery.expand("http://svc/base/", ["10.0.0.1"]) == ["http://10.0.0.1:80/base"]
    assert discovery.expand("http://svc:1", []) == []


def test_discover_keeps_addresses_resolves_names_and_survives_a_resolver_failure() -> None:
    answers: dict[str, list[str] | Exception] = {"a": ["10.0.0.1", "10.0.0.2"], "gone": []}

    async def resolver(host: str, port: int) -> list[str]:
        got = answers[host]
        if isinstance(got, Exception):
            raise got
        return got

    sources = ["http://127.0.0.1:9", "http://a:8080", "http://gone:8080"]
    found = asyncio.run(discovery.discover(sources, {}, resolver))
    assert found == {"http://127.0.0.1:9": ["http://127.0.0.1:9"],
                     "http://a:8080": ["http://10.0.0.1:8080", "http://10.0.0.2:8080"],
                     "http://gone:8080": []}  # no ready pod: no replica (the gateway fails over)
    answers["a"] = discovery.DiscoveryError("SERVFAIL")
    again = asyncio.run(discovery.discover(sources, found, resolver))
    assert again["http://a:8080"] == found["http://a:8080"]  # a DNS hiccup keeps what was known


def test_resolve_host_answers_an_unknown_name_with_no_address() -> None:
    try:  # NXDOMAIN is "no address"; where no DNS server answers at all, a resolver failure instead
        assert asyncio.run(discovery.resolve_host("no-such-name.invalid", 80)) == []
    except discovery.DiscoveryError as exc:
        assert "no-such-name.invalid" in str(exc)
    assert "127.0.0.1" in asyncio.run(discovery.resolve_host("localhost", 80))


def _namespaces_usable() -> str | None:
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("unshare") is None:
        return "needs root and unshare (a private /etc/hosts for the gateway)"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    return None if probe.returncode == 0 else f"unshare -m failed: {probe.stderr.decode().strip()}"


def _state(url: str) -> dict:
    return httpx.get(url + "/admin/state", timeout=5).json()


def _wait(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.1)


def _write_hosts(path: Path, addresses: list[str]) -> None:
    """In place (the gateway's bind mount holds this inode), as the cluster's DNS changes its answer."""
    lines = ["127.0.0.1\tlocalhost"] + [f"{a}\treplicas.test" for a in addresses]
    with open(path, "r+") as f:
        f.write("\n".join(lines) + "\n")
        f.truncate()


@pytest.mark.integration
@pytest.mark.slow
def test_a_gateway_with_dns_discovery_follows_the_addresses_a_name_has(digits_models, launch, digits_rows,
                                                                       tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reason = _namespaces_usable()
    if reason:
        pytest.skip(reason)
    port = free_port()
    # two replicas on the same port at two loopback addresses: two pods of a headless Service
    launch("replica", "--model-uri", digits_models["v1"], "--allow-anonymous", "--host", "127.0.0.1", port=port)
    r2 = launch("replica", "--model-uri", digits_models["v1"], "--allow-anonymous", "--host", "127.0.0.2",
                port=port, wait=False)
    Proc(r2.popen, f"http://127.0.0.2:{port}", r2.log).wait_ready()
    hosts = tmp_path / "hosts"
    hosts.write_text("")
    _write_hosts(hosts, ["127.0.0.1"])
    gw_port = free_port()
    log = open(tmp_path / "gateway.log", "wb")  # noqa: SIM115 - closed with the process below
    gw = subprocess.Popen(
        ["unshare", "-m", "sh", "-c", f'mount --bind "{hosts}" /etc/hosts && exec "$0" "$@"', sys.executable, "-m",
         "scanflow.serving.gateway", "--port", str(gw_port), "--service", "digits", "--allow-anonymous",
         "--replica", f"http://replicas.test:{port}", "--upstream-discovery", "dns", "--health-interval-s", "0.3"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{gw_port}"
    one, two = f"http://127.0.0.1:{port}", f"http://127.0.0.2:{port}"
    try:
        Proc(gw, url, tmp_path / "gateway.log").wait_ready("/health")

        def replicas() -> dict[str, dict]:
            return {r["url"]: r for r in _state(url)["replicas"]}

        _wait(lambda: set(replicas()) == {one} and replicas()[one]["healthy"], 30, "the name's one address")
        assert _state(url)["discovery"] == {"mode": "dns", "sources": [f"http://replicas.test:{port}"]}
        assert httpx.post(url + "/predict", json={"inputs": digits_rows[:1]}, timeout=10).status_code == 200

        _write_hosts(hosts, ["127.0.0.1", "127.0.0.2"])  # a second pod turned ready
        _wait(lambda: set(replicas()) == {one, two} and all(r["healthy"] for r in replicas().values()), 30,
              "both addresses as replicas")

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=10) as http:
                got = await asyncio.gather(*(http.post(url + "/predict", json={"inputs": [row]})
                                             for row in digits_rows * 3))
            return [g.status_code for g in got]

        assert set(asyncio.run(burst())) == {200}
        assert all(r["requests"] > 0 for r in replicas().values()), replicas()  # balanced over both pods

        _write_hosts(hosts, ["127.0.0.2"])  # the first pod went away
        _wait(lambda: set(replicas()) == {two}, 30, "the first address gone")
        assert httpx.post(url + "/predict", json={"inputs": digits_rows[:1]}, timeout=10).status_code == 200

        _write_hosts(hosts, [])  # no ready pod: the name has no address
        _wait(lambda: replicas() == {}, 30, "no replica left")
        empty = httpx.post(url + "/predict", json={"inputs": digits_rows[:1]}, timeout=10)
        assert empty.status_code == 503 and "no healthy replica" in empty.json()["detail"]
    finally:
        Proc(gw, url, tmp_path / "gateway.log").stop()
        log.close()
