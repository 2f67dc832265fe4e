"""Hello, agents: a checker that notices drift and a planner that it asks to act, in one process.

    .venv/bin/python examples/hello_agents.py

Both agents are served by uvicorn on loopback ports in this process; the checker's strategy calls
the planner's actuator over REST with the shared token. Run either agent alone with
`scanflow agent run examples/hello_agents.py --name planner --port 8002` (token in SCANFLOW_TOKEN).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import tempfile
from pathlib import Path
from typing import Any

from scanflow.agent import Action, Agent, AgentClient, Context

planner = Agent("planner", role="planner")


@planner.actuator("plan_retrain")
def plan_retrain(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Count plans in the agent's persisted state; the key makes a retried call harmless."""
    ctx.state["plans"] = ctx.state.get("plans", 0) + 1
    ctx.log.warning("planning a retrain: %s (key %s)", args, ctx.key)
    return {"planned": True, "plans": ctx.state["plans"]}


checker = Agent("checker", role="checker")
checker.strategy(
    "retrain-on-drift",
    event="drift.checked",
    constraint="event.drift_rate > 0.1 and since('planner.plan_retrain') > 600",
    actions=[Action("plan_retrain", agent="planner", args={"reason": "drift"})],
    cooldown_s=60,
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def main() -> None:
    import uvicorn

    from scanflow.agent import create_app
    from scanflow.settings import Settings

    token = os.environ.get("SCANFLOW_TOKEN") or secrets.token_urlsafe(16)
    home = Path(tempfile.mkdtemp(prefix="scanflow-hello-"))
    settings = Settings(token=token, home=home)
    ports = {"planner": _port(), "checker": _port()}
    urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    servers = [
        uvicorn.Server(uvicorn.Config(create_app(planner, settings), port=ports["planner"], log_level="warning")),
        uvicorn.Server(
            uvicorn.Config(
                create_app(checker, settings, peers={"planner": urls["planner"]}),
                port=ports["checker"],
                log_level="warning",
            )
        ),
    ]
    tasks = [asyncio.create_task(s.serve()) for s in servers]
    try:
        async with AgentClient(urls["checker"], token) as c, AgentClient(urls["planner"], token) as p:
            await c.wait_ready(30)
            await p.wait_ready(30)
            for rate in (0.05, 0.3, 0.4):  # the third: since() < 600 s, so it does not fire
                print("event", await c.post_event("drift.checked", {"drift_rate": rate}))
            for _ in range(200):
                if not await c.events(status="pending"):
                    break
                await asyncio.sleep(0.05)
            for d in reversed(await c.decisions()):
                print(f"decision: event {d['event_id']} {d['strategy']}: {d['reason']}  outcomes={d['outcomes']}")
            print("planner state:", (await p.status())["state"])
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main())
