"""`serve(agent, ...)`: run one agent's app under uvicorn (blocking), and load agents from a file.

Who calls: `scanflow agent run FILE` (scanflow.agent.cli), scripts, the docker/Kubernetes entrypoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from scanflow.agent.agent import Agent, AgentDefinitionError
from scanflow.settings import Settings


def serve(
    agent: Agent,
    settings: Settings | None = None,
    host: str | None = None,
    port: int = 8080,
    peers: Mapping[str, str] | None = None,
    *,
    allow_anonymous: bool = False,
    log_level: str | None = None,
    max_body_bytes: int | None = None,
) -> None:
    """Run the agent on host:port until interrupted (SIGINT/SIGTERM stop it cleanly); on the socket
    handed to this process instead, when its starter reserved the port (scanflow.handoff).
    `max_body_bytes`: see create_app (default: the agent's own limit, else 1 MiB). A request head must
    arrive within `settings.head_timeout_s` and a body within `settings.body_timeout_s` (408 and close)."""
    from scanflow.agent.app import create_app
    from scanflow.handoff import serve_uvicorn
    from scanflow.httpdeadline import HeadDeadlineProtocol, with_head_timeout

    settings = settings or Settings()
    app = create_app(
        agent, settings, peers=peers, allow_anonymous=allow_anonymous, max_body_bytes=max_body_bytes
    )
    serve_uvicorn(
        app,
        host=host or settings.host,
        port=port,
        log_level=(log_level or settings.log_level).lower(),
        access_log=False,
        lifespan="on",
        http=with_head_timeout(HeadDeadlineProtocol, settings.head_timeout_s),  # slow heads cut (408)
    )


def load_agents(path: str | Path) -> dict[str, Agent]:
    """Import a Python file and return its module-level `Agent` objects by agent name."""
    from scanflow.spec import load_python_file

    p = Path(path)
    if not p.exists():
        raise AgentDefinitionError(f"agent file {str(p)!r} does not exist")
    module = load_python_file(p)
    found = {v.name: v for v in vars(module).values() if isinstance(v, Agent)}
    if not found:
        raise AgentDefinitionError(f"{p}: defines no scanflow.agent.Agent at module level")
    return found


def parse_peers(items: list[str]) -> dict[str, str]:
    """['executor=http://127.0.0.1:8002', ...] -> {'executor': 'http://127.0.0.1:8002'}."""
    peers: dict[str, str] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name.strip() or not url.strip().startswith(("http://", "https://")):
            raise ValueError(f"--peer {item!r}: expected NAME=http://HOST:PORT")
        peers[name.strip()] = url.strip().rstrip("/")
    return peers
