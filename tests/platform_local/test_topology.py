"""CPUMEM placement math (docs/local-platform.md) and candidate configurations, on synthetic topologies."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanflow.platform.topology import (
    Topology,
    allowed_topology,
    candidate_configs,
    cpumem_range,
    default_config,
    format_cpu_list,
    parse_cpu_list,
    place_replicas,
    read_topology,
)
from scanflow.spec import Service


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8,10-11", (0, 1, 2, 3, 8, 10, 11)), ("5", (5,)), ("", ()), ("1,0", (0, 1))],
)
def test_cpu_list_round_trip(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


def test_cpumem_two_sockets_of_eight_two_cores_each() -> None:
    # N_cpu=2, P=8 -> N_cps=4: replicas 1-4 on socket 0, 5-8 on socket 1
    got = [cpumem_range(i, 2, 4, 8) for i in range(1, 9)]
    assert got == [
        (0, 0, 1), (0, 2, 3), (0, 4, 5), (0, 6, 7),
        (1, 8, 9), (1, 10, 11), (1, 12, 13), (1, 14, 15),
    ]


def test_cpumem_four_cores_each_and_bad_input() -> None:
    assert cpumem_range(3, 4, 2, 8) == (1, 8, 11)
    with pytest.raises(ValueError, match="do not fit"):
        cpumem_range(1, 4, 3, 8)
    with pytest.raises(ValueError, match=">= 1"):
        cpumem_range(0, 1, 1, 8)


def test_place_replicas_maps_through_real_cpu_ids() -> None:
    # socket 1 numbered 1,3,5,7 (interleaved numbering, as on many dual-socket machines)
    topo = Topology(sockets=((0, 2, 4, 6), (1, 3, 5, 7)), nodes={0: (0, 2, 4, 6), 1: (1, 3, 5, 7)})
    places = place_replicas(topo, 4, 2, "numa")
    assert [p.cpus for p in places] == [(0, 2), (4, 6), (1, 3), (5, 7)]
    assert [p.node for p in places] == [0, 0, 1, 1]
    assert not any(p.shared for p in places)


def test_place_replicas_none_gives_all_cores_and_oversubscription_is_flagged() -> None:
    topo = Topology.synthetic(2, 8)
    assert all(p.cpus == tuple(range(16)) for p in place_replicas(topo, 3, 4, "none"))
    over = place_replicas(topo, 5, 4, "pinned")  # capacity 4 replicas of 4 cores
    assert [p.shared for p in over] == [False] * 4 + [True]
    assert over[4].cpus == over[0].cpus


def test_place_replica_wider_than_a_socket() -> None:
    topo = Topology.synthetic(2, 4)
    places = place_replicas(topo, 2, 6, "pinned")
    assert places[0].cpus == (0, 1, 2, 3, 4, 5)
    assert places[1].shared


def test_candidate_configs_default_first_and_bounded_by_service() -> None:
    topo = Topology.synthetic(2, 8)
    svc = Service(name="s", model_uri="models:/m@champion", min_replicas=1, max_replicas=4)
    configs = candidate_configs(topo, svc)
    assert configs[0] == default_config(topo)
    assert {c.replicas for c in configs} == {1, 2, 4}
    assert {c.affinity for c in configs} == {"none", "pinned", "numa"}
    for c in configs[1:]:
        assert c.cpus_per_replica * c.replicas == 16
        assert c.threads in (1, c.cpus_per_replica)
    assert len(set(configs)) == len(configs)


def test_candidate_configs_one_socket_offers_no_numa() -> None:
    configs = candidate_configs(Topology.synthetic(1, 2))
    assert "numa" not in {c.affinity for c in configs}
    assert {(c.replicas, c.threads, c.affinity) for c in configs} >= {(2, 1, "pinned"), (1, 2, "none")}


def test_read_topology_from_fake_sysfs(tmp_path: Path) -> None:
    cpu = tmp_path / "devices/system/cpu"
    for c, pkg in enumerate([0, 0, 1, 1]):
        d = cpu / f"cpu{c}/topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{pkg}\n")
    (cpu / "online").write_text("0-3\n")
    for n, cpus in enumerate(["0-1", "2-3"]):
        d = tmp_path / f"devices/system/node/node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    topo = read_topology(tmp_path)
    assert topo.sockets == ((0, 1), (2, 3))
    assert topo.nodes == {0: (0, 1), 1: (2, 3)}
    assert topo.node_of(3) == 1


def test_read_topology_on_this_machine() -> None:
    import os

    topo = read_topology()
    assert set(topo.cpus) >= set(os.sched_getaffinity(0))
    assert topo.total >= 1


def test_a_cpuset_restricts_what_placement_may_use() -> None:
    import os

    machine = Topology.synthetic(2, 4)  # cpus 0-3 on socket 0, 4-7 on socket 1
    # a cpuset of 2-5 (a container's --cpuset-cpus): two cores on each socket, CPUMEM within them
    topo = machine.restricted({2, 3, 4, 5})
    assert topo.sockets == ((2, 3), (4, 5)) and topo.nodes == {0: (2, 3), 1: (4, 5)}
    assert [p.cpus for p in place_replicas(topo, 2, 2, "numa")] == [(2, 3), (4, 5)]
    assert [p.node for p in place_replicas(topo, 2, 2, "numa")] == [0, 1]
    assert place_replicas(topo, 3, 2, "pinned")[2].shared  # a third 2-core replica does not fit: says so
    assert machine.restricted({6, 7}).sockets == ((6, 7),)  # an empty socket goes
    assert machine.restricted({42}) == machine  # nothing in common: nothing better known
    assert set(allowed_topology().cpus) == set(os.sched_getaffinity(0))  # this process's own cpuset
