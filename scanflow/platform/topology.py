"""Machine topology and core placement: which cores each replica of a service gets.

Pure functions (plus one reader of /sys) so the Planner, the local platform and the tests share the
same math. `read_topology()` reads sockets and NUMA nodes from /sys/devices/system; `place_replicas`
implements the policies of the Scanflow-K8s paper (docs/local-platform.md): ANY (affinity "none": every core)
and CPUMEM (affinity "pinned"/"numa": contiguous cores on one socket, filling socket by socket).
`candidate_configs` lists the configurations a Planner may choose between on this machine.

Who calls: scanflow.platform.local (set_resources, deploy), the Planner agent, benchmarks/tuning_sweep.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from scanflow.spec import Service

Policy = Literal["none", "pinned", "numa"]


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' (the kernel's list format) -> (0, 1, 2, 3, 8, 10, 11). Empty text -> ()."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return tuple(sorted(set(cpus)))


def format_cpu_list(cpus: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 5) -> '0-2,5': the inverse of parse_cpu_list (what cpuset files expect)."""
    out: list[str] = []
    s = sorted(set(cpus))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True)
class Topology:
    """Sockets as ordered tuples of logical CPU ids; NUMA nodes likewise (node id -> cpus)."""

    sockets: tuple[tuple[int, ...], ...]
    nodes: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(c for s in self.sockets for c in s)

    @property
    def total(self) -> int:
        return sum(len(s) for s in self.sockets)

    @property
    def cores_per_socket(self) -> int:
        """P of the paper; the smallest socket when they differ (placement must fit every socket)."""
        return min(len(s) for s in self.sockets) if self.sockets else 0

    def node_of(self, cpu: int) -> int | None:
        for node, cpus in self.nodes.items():
            if cpu in cpus:
                return node
        return None

    def restricted(self, allowed: set[int] | frozenset[int] | tuple[int, ...]) -> Topology:
        """Only the cores in `allowed` (e.g. os.sched_getaffinity(0): what this process's cpuset lets it
        use, inside a container or a cgroup with `cpuset.cpus`): placing a replica on a core outside it
        would fail, and pinning must count only cores it can really give. Sockets left empty go; an
        `allowed` sharing no core with the machine leaves the topology as it is (nothing better known)."""
        keep = set(allowed)
        sockets = tuple(s for s in (tuple(c for c in sock if c in keep) for sock in self.sockets) if s)
        if not sockets:
            return self
        nodes = {n: tuple(c for c in cpus if c in keep) for n, cpus in self.nodes.items()}
        return Topology(sockets=sockets, nodes={n: c for n, c in nodes.items() if c})

    @classmethod
    def synthetic(cls, sockets: int, cores_per_socket: int) -> Topology:
        """Regular machine for tests and planning: socket s holds cpus [s*P, (s+1)*P)."""
        socks = tuple(tuple(range(s * cores_per_socket, (s + 1) * cores_per_socket)) for s in range(sockets))
        return cls(sockets=socks, nodes={s: socks[s] for s in range(sockets)})


def allowed_topology(sys_root: Path = Path("/sys")) -> Topology:
    """The machine's topology (`read_topology`) restricted to the cores this process may run on (its
    affinity mask, which a cgroup cpuset bounds): what the local platform places replicas on."""
    import os

    t = read_topology(sys_root)
    return t.restricted(frozenset(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else t


def read_topology(sys_root: Path = Path("/sys")) -> Topology:
    """Read online CPUs, their sockets (physical_package_id) and NUMA nodes from sysfs.

    Falls back to one socket holding os.sched_getaffinity(0) when sysfs is missing (containers
    without /sys, other OSes).
    """
    import os

    cpu_dir = sys_root / "devices/system/cpu"
    try:
        online = parse_cpu_list((cpu_dir / "online").read_text())
    except OSError:
        return Topology(sockets=(tuple(sorted(os.sched_getaffinity(0))),))
    by_socket: dict[int, list[int]] = {}
    for cpu in online:
        try:
            pkg = int((cpu_dir / f"cpu{cpu}/topology/physical_package_id").read_text())
        except (OSError, ValueError):
            pkg = 0
        by_socket.setdefault(max(pkg, 0), []).append(cpu)
    nodes: dict[int, tuple[int, ...]] = {}
    node_dir = sys_root / "devices/system/node"
    if node_dir.is_dir():
        for d in sorted(node_dir.glob("node[0-9]*")):
            try:
                nodes[int(d.name[4:])] = tuple(c for c in parse_cpu_list((d / "cpulist").read_text()) if c in online)
            except (OSError, ValueError):
                continue
    sockets = tuple(tuple(sorted(by_socket[k])) for k in sorted(by_socket))
    return Topology(sockets=sockets, nodes=nodes)


def cpumem_range(i: int, n_cpu: int, n_cps: int, p: int) -> tuple[int, int, int]:
    """The paper's CPUMEM placement for replica i (1-based): (socket, first core, last core).

    s_i = ceil(i / N_cps) - 1; cores [s_i*P + N_cpu*((i-1) - s_i*N_cps), s_i*P + N_cpu*(i - s_i*N_cps) - 1],
    as global indices on a machine whose socket s holds indices [s*P, (s+1)*P).
    """
    if i < 1 or n_cpu < 1 or n_cps < 1 or p < 1:
        raise ValueError(f"cpumem_range needs i, n_cpu, n_cps, p >= 1; got {i}, {n_cpu}, {n_cps}, {p}")
    if n_cpu * n_cps > p:
        raise ValueError(f"{n_cps} replicas x {n_cpu} cores do not fit a socket of {p} cores")
    s = math.ceil(i / n_cps) - 1
    first = s * p + n_cpu * ((i - 1) - s * n_cps)
    last = s * p + n_cpu * (i - s * n_cps) - 1
    return s, first, last


@dataclass(frozen=True)
class Placement:
    """Cores (and memory node, for 'numa') one replica gets; `shared` when cores had to be reused."""

    cpus: tuple[int, ...]
    node: int | None = None
    shared: bool = False


def place_replicas(topology: Topology, replicas: int, cores_each: int, policy: Policy) -> list[Placement]:
    """Cores for replicas 1..n under a policy.

    none: every replica may use every core (ANY). pinned / numa: CPUMEM; N_cps = P // cores_each
    replicas per socket. A replica wider than a socket takes contiguous cores across sockets. When the
    machine has fewer cores than replicas x cores_each, placement wraps around and marks the
    replica `shared` (oversubscribed: the caller reports it).
    """
    if replicas < 0:
        raise ValueError(f"replicas must be >= 0, got {replicas}")
    all_cpus = topology.cpus
    if policy == "none" or not all_cpus:
        return [Placement(cpus=all_cpus) for _ in range(replicas)]
    cores_each = max(1, min(cores_each, len(all_cpus)))
    p = topology.cores_per_socket
    n_cps = p // cores_each
    out: list[Placement] = []
    if n_cps >= 1:
        capacity = n_cps * len(topology.sockets)
        for i in range(1, replicas + 1):
            slot = (i - 1) % capacity + 1
            s, first, last = cpumem_range(slot, cores_each, n_cps, p)
            local = range(first - s * p, last - s * p + 1)
            cpus = tuple(topology.sockets[s][k] for k in local)
            node = topology.node_of(cpus[0]) if policy == "numa" else None
            out.append(Placement(cpus=cpus, node=node, shared=i > capacity))
        return out
    # wider than a socket: contiguous runs over the flattened core list
    capacity = len(all_cpus) // cores_each
    for i in range(replicas):
        slot = i % max(capacity, 1)
        cpus = all_cpus[slot * cores_each : (slot + 1) * cores_each]
        out.append(Placement(cpus=cpus, node=None, shared=i >= capacity))
    return out


@dataclass(frozen=True)
class Config:
    """One configuration the Planner can choose: replicas x threads x cores each x affinity."""

    replicas: int
    threads: int
    cpus_per_replica: int
    affinity: Policy

    @property
    def label(self) -> str:
        return f"{self.replicas}x{self.threads}t-{self.affinity}"


def default_config(topology: Topology) -> Config:
    """What a user gets without tuning: one replica, torch's default threads (all cores), unpinned."""
    return Config(replicas=1, threads=topology.total, cpus_per_replica=topology.total, affinity="none")


def candidate_configs(topology: Topology, service: Service | None = None) -> list[Config]:
    """Configurations worth trying on this machine, the default first.

    Splits the machine's cores evenly into n replicas (n divides the core count, within the
    service's [min_replicas, max_replicas]); each replica gets threads = its cores (thread pools
    follow CPU) and is either unpinned or pinned (CPUMEM); 'numa' is offered only with > 1 NUMA node.
    """
    total = topology.total
    lo = max(1, service.min_replicas) if service is not None else 1
    hi = service.max_replicas if service is not None else total
    policies: list[Policy] = ["none", "pinned"]
    if len(topology.nodes) > 1:
        policies.append("numa")
    base = default_config(topology)
    out = [base]
    for n in range(lo, min(hi, total) + 1):
        if total % n:
            continue
        each = total // n
        for pol in policies:
            cfg = Config(replicas=n, threads=each, cpus_per_replica=each, affinity=pol)
            if cfg not in out:
                out.append(cfg)
        if each > 1:  # one thread per replica: less intra-op overhead for tiny models
            cfg = Config(replicas=n, threads=1, cpus_per_replica=each, affinity="none")
            if cfg not in out:
                out.append(cfg)
    return out
