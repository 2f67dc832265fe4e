"""An agent starting beside its database server (the prod overlay: the agents and PostgreSQL start
together) waits for the server instead of exiting into a restart back-off (store_schema.wait_for_server)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa

from scanflow.agent import Store
from scanflow.agent.store_schema import wait_for_server
from scanflow.platform.processes import free_port

pytestmark = pytest.mark.integration


class _Seen(logging.Handler):
    """Sets `event` on the first record that says the agent is waiting (the test's cue)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.event = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if "not reachable yet" in record.getMessage():
            self.event.set()


def _forward(listen_port: int, target_port: int, stop: threading.Event, ready: threading.Event) -> None:
    """A TCP forwarder to the real server: the 'server' appears on `listen_port` when it starts."""
    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        server.close()

    asyncio.run(main())


def test_the_store_waits_for_a_server_that_comes_up_later_and_never_logs_the_password(
        pg_database: str) -> None:
    real = urlsplit(pg_database)
    port = free_port()
    url = f"postgresql+psycopg2://scanflow:s3cret-pw@127.0.0.1:{port}{real.path}"  # trust auth: any password
    seen = _Seen()
    logging.getLogger("scanflow.agent.store_schema").addHandler(seen)
    stop, ready = threading.Event(), threading.Event()

    def server_later() -> None:
        if seen.event.wait(60):  # the agent has failed once and says it waits: now the server comes up
            _forward(port, real.port or 5432, stop, ready)

    threading.Thread(target=server_later, daemon=True).start()
    try:
        store = Store(url)
        assert ready.is_set()  # it got in through the server that came up after it started
        store.close()
    finally:
        stop.set()
        logging.getLogger("scanflow.agent.store_schema").removeHandler(seen)
    assert any(f"127.0.0.1:{port}" in m for m in seen.messages), seen.messages
    assert not any("s3cret-pw" in m for m in seen.messages), seen.messages


def test_a_server_that_never_comes_is_an_error_after_the_wait() -> None:
    engine = sa.create_engine(f"postgresql+psycopg2://scanflow:pw@127.0.0.1:{free_port()}/none")
    t0 = time.monotonic()
    with pytest.raises(sa.exc.OperationalError):
        wait_for_server(engine, wait_s=1.5)
    assert 1.5 <= time.monotonic() - t0 < 30  # it waited, then gave up (bounded by one backoff step)


def test_a_refusal_waiting_cannot_cure_is_an_error_at_once(pg_server: str) -> None:
    from scanflow.agent.store_schema import make_engine

    engine = make_engine(f"{pg_server}/no_such_database")
    t0 = time.monotonic()
    with pytest.raises(sa.exc.OperationalError, match="does not exist"):
        wait_for_server(engine, wait_s=60)
    assert time.monotonic() - t0 < 30  # not the 60 s wait: a missing database does not appear by waiting
