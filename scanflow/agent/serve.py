"""`serve(agent, ...)`: run one agent's app under uvicorn (blocking), and load agents from a file or module.

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


def load_agents(source: str | Path) -> dict[str, Agent]:
    """Import the agents' code and return its module-level `Agent` objects by agent name.

    `source`: a Python file, or a module reference ('package.module:attr' or 'package.module',
    scanflow.agent.sources); with ':attr', only the Agent at that attribute.
    """
    from scanflow.agent.sources import is_module_ref, module_file, split_module_ref
    from scanflow.spec import load_python_file

    attr = None
    if is_module_ref(source) and not Path(source).exists():
        attr = split_module_ref(str(source))[1]
        p = module_file(str(source))
    else:
        p = Path(source)
        if not p.exists():
            raise AgentDefinitionError(f"agent file {str(p)!r} does not exist")
    module = load_python_file(p)
    if attr is not None:
        chosen = getattr(module, attr, None)
        if not isinstance(chosen, Agent):
            raise AgentDefinitionError(f"{source}: {attr!r} is not a scanflow.agent.Agent in {p}")
        return {chosen.name: chosen}
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
