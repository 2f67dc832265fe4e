"""Ports handed from the process that picks them to the server that listens on them.

Why: a port picked free and bound later by another process can be taken in between. An embedded
stack picks its agents' and gateways' ports before MLflow and the bootstrap start (tens of seconds on a
busy machine), and CI saw another stack's server take the Checker's port and keep it through every
restart. So the picker binds the port and listens on it itself (a *reservation*: no one else can bind
a listening port; scanflow.platform.processes.reserve_port) and hands that socket to the child, which
serves on it and never binds.

Two hand-offs, both as inherited file descriptors named in the environment:

- `LISTEN_FD_ENV`: the socket this process serves on (`serve_uvicorn` takes it).
- `RESERVED_PORTS_ENV`: reservations this process is to hand on to what it starts (the stack's gateway
  ports, passed through the Executor to its gateways; `take_reserved_ports`).

Both variables are removed from the environment when read, so a grandchild never sees a descriptor
number that is not open in it. Who calls: scanflow.platform.processes (spawn), scanflow.agent.serve,
scanflow.serving.server, scanflow.platform.local.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from typing import Any

LISTEN_FD_ENV = "SCANFLOW_LISTEN_FD"
RESERVED_PORTS_ENV = "SCANFLOW_RESERVED_PORT_FDS"  # "PORT:FD,PORT:FD"


class HandoffError(RuntimeError):
    """A handed descriptor is not what the environment says (a wrong number, not a TCP socket, another port)."""


def _socket(fd_text: str, what: str) -> socket.socket:
    try:
        sock = socket.socket(fileno=int(fd_text))
    except (ValueError, OSError) as exc:
        raise HandoffError(f"{what}: {fd_text!r} is not an open socket ({exc})") from None
    if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        sock.detach()
        raise HandoffError(f"{what}: descriptor {fd_text} is not a TCP socket")
    sock.set_inheritable(False)  # it stays ours; what we start gets its own hand-off
    return sock


def listen_host(env: Mapping[str, str]) -> str:
    """The address a scanflow server started with `env` listens on (SCANFLOW_HOST, else loopback), so a
    reservation for it is bound where the server would have bound itself."""
    return env.get("SCANFLOW_HOST", "").strip() or "127.0.0.1"


def take_listen_socket(host: str | None = None, port: int | None = None) -> socket.socket | None:
    """The socket handed to this process to serve on, or None when none was (then bind as usual).
    `host`, `port`: what this process was told to serve on; a handed socket bound elsewhere is an
    error, not a silent move to another address."""
    raw = os.environ.pop(LISTEN_FD_ENV, None)
    if raw is None:
        return None
    sock = _socket(raw, LISTEN_FD_ENV)
    bound_host, bound_port = sock.getsockname()[:2]
    other_host = host is not None and _is_ip(host) and ipaddress.ip_address(host) != ipaddress.ip_address(bound_host)
    if (port and bound_port != port) or other_host:
        sock.close()
        raise HandoffError(f"{LISTEN_FD_ENV}: the handed socket is bound to {bound_host}:{bound_port}, "
                           f"not {host}:{port}")
    return sock


def _is_ip(host: str | None) -> bool:
    try:
        ipaddress.ip_address(host or "")
    except ValueError:
        return False
    return True


def take_reserved_ports() -> dict[int, socket.socket]:
    """The port reservations handed to this process to pass on, by port (empty when none were)."""
    raw = os.environ.pop(RESERVED_PORTS_ENV, None)
    found: dict[int, socket.socket] = {}
    for item in filter(None, (raw or "").split(",")):
        _, _, fd = item.partition(":")
        sock = _socket(fd, RESERVED_PORTS_ENV)
        found[int(sock.getsockname()[1])] = sock
    return found


def reserved_ports_value(sockets: list[socket.socket]) -> str:
    """The RESERVED_PORTS_ENV value naming `sockets` (pure apart from reading each one's port)."""
    return ",".join(f"{s.getsockname()[1]}:{s.fileno()}" for s in sockets)


def serve_uvicorn(app: Any, host: str, port: int, **config: Any) -> None:
    """`uvicorn.run(app, host=, port=, **config)` for one process, on the handed socket when there is
    one (host and port then only name it in uvicorn's log)."""
    import uvicorn

    sock = take_listen_socket(host, port)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **config))
    try:
        server.run(sockets=[sock] if sock is not None else None)
    except KeyboardInterrupt:  # as uvicorn.run: a Ctrl-C is a normal stop
        pass
