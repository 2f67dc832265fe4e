"""Sensors around the loop: a sensor's return value read as events, and the task that runs a sensor on
its interval, across restarts.

Separate from scanflow.agent.runtime, whose `run_sensor` runs one tick (watermark, events into the inbox):
this is the reading of what user code returned, and the timing of ticks, which need none of the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from scanflow.agent.store import WATERMARK_PREFIX
from scanflow.agent.types import Event, SensorSpec

if TYPE_CHECKING:
    from scanflow.agent.store import Store


def normalise_events(raw: Any, sensor: str) -> list[tuple[str, dict[str, Any]]]:
    """A sensor's return value -> [(name, payload)]: accepts None, Event, (name, payload), dicts."""
    if raw is None:
        return []
    items = (
        raw
        if isinstance(raw, (list, tuple))
        and not (len(raw) == 2 and isinstance(raw[0], str) and isinstance(raw[1], dict))
        else [raw]
    )
    out: list[tuple[str, dict[str, Any]]] = []
    for it in items:
        if isinstance(it, Event):
            out.append((it.name, dict(it.payload)))
        elif isinstance(it, tuple) and len(it) == 2 and isinstance(it[0], str):
            out.append((it[0], dict(it[1] or {})))
        elif isinstance(it, dict) and isinstance(it.get("name"), str):
            out.append((it["name"], dict(it.get("payload") or {})))
        else:
            raise TypeError(
                f"sensor {sensor!r} returned {type(it).__name__}; return Event, (name, payload) or a list"
            )
    return out


async def sensor_loop(spec: SensorSpec, store: Store, run: Callable[[str], Awaitable[Any]],
                      clock: Callable[[], float], log: logging.Logger) -> None:
    """Run the sensor through `run` (Runtime.run_sensor) every `spec.every` seconds until cancelled. The
    first tick waits out what is left of the interval since the last one (the watermark's `last_run`,
    maybe an earlier process's); a failing tick is logged and the loop goes on."""
    name = spec.name
    wm = await asyncio.to_thread(store.get, WATERMARK_PREFIX + name, {})
    last = wm.get("last_run")
    if last is not None:  # respect the interval across restarts
        await asyncio.sleep(max(0.0, min(spec.every, float(last) + spec.every - clock())))
    while True:
        started = time.monotonic()
        try:
            await run(name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the sensor loop must survive its handler
            log.warning("sensor %s failed: %s: %s", name, type(exc).__name__, exc)
        await asyncio.sleep(max(0.0, spec.every - (time.monotonic() - started)))
