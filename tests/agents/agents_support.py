"""Helpers of the reference-agent tests (a module of its own name: `from conftest import` is ambiguous
when several test folders are collected in one run): the digits workflow they supervise, and a receiving
agent served by uvicorn on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn

from scanflow.agent import Agent, Store, create_app
from scanflow.settings import Settings
from scanflow.spec import AgentSpec, Workflow

TOKEN = "agents-test-token"
DIGITS_YAML = Path(__file__).resolve().parents[2] / "workflows" / "digits" / "workflow.yaml"


def digits_workflow() -> Workflow:
    """The digits example, the workflow the reference-agent tests supervise unless they say otherwise."""
    return Workflow.from_yaml(DIGITS_YAML.read_text())


def spec_of(wf: Workflow, role: str) -> AgentSpec:
    """The workflow's agent with this role (the one a reference agent of that role binds to)."""
    return next(a for a in wf.agents if a.role == role)


@asynccontextmanager
async def served(agent: Agent, home: Path, port: int) -> AsyncIterator[Store]:
    """Run `agent` as a real HTTP server on 127.0.0.1:port until the block ends; yields its store."""
    store = Store(f"sqlite:///{home / (agent.name + '.db')}")
    app = create_app(agent, Settings(token=TOKEN), store=store, retry_backoff_s=0.01)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started:
                break
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield store
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        store.close()
