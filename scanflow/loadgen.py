"""The one load generator: open-loop arrivals on schedule (or a fixed number of clients back to back)
against an HTTP endpoint, for the demo, the tests and the benchmarks.

Open loop (`rate` requests/s): arrivals leave on an even schedule whatever the answers do, with at most
`clients` requests in flight. Latency counts from the *scheduled* send time, so a generator or a service
that falls behind shows as latency instead of hiding it (no coordinated omission), and an arrival due
while every client is busy is counted in `unsent`, never sent late or dropped silently. The rate can
change while the load runs (a load step); the schedule restarts at each change.
Closed loop (`concurrency` n): n clients back to back, changeable while it runs. A closed loop measures
what a service can serve (a capacity probe); for a fixed-concurrency benchmark alone, wrk does it better.

Why raw HTTP/1.1 over asyncio streams and not an HTTP client library: httpx costs about 1 ms of CPU
per request under the GIL, which made the generator, not the service, the bottleneck of S2's load step. Each
connection carries one request at a time (keep-alive; a new connection opens when every open one is
busy); Content-Length, chunked and close-delimited answers are read, HTTP/1.0 answers close.

One engine (scanflow.loadgen_engine, on the raw HTTP/1.1 client of scanflow.loadgen_http), two hosts, here:
- `LoadGenerator`: a thread of this process with its own event loop. Each request's body comes from the
  caller's `make(client, n)`; each answer is judged by `judge(request, outcome)` and the verdict kept.
  Used by `scanflow.embedded.traffic.Traffic` (labelled rows, feedback, accuracy per model version: S1,
  tests, benchmarks/s1.py), `scanflow.demo.load.Load` (closed loop with samples: S4, the in-process S2).
- `python -m scanflow.loadgen URL BODIES.npy`: the same engine in a child process with its own GIL, for
  rates a busy test process could not send (S2's step, S3's probes), steered over stdin with JSON lines
  (`{"rate": r}`, `{"closed": n}`, `{"stop": true}`), one report per second on stdout. Used through
  `scanflow.demo.load.OpenLoad`.
Both keep one `Second` per second: sent, ok, failed, unsent, p50/p99 of the answered requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Self, TypeVar

import orjson

from scanflow.loadgen_engine import Engine, Outcome, Second, percentile
from scanflow.loadgen_http import Request

R = TypeVar("R")


class LoadGenerator(Generic[R]):
    """`with LoadGenerator(url, make, judge, clients=4, rate=100) as gen: ...; gen.results()`

    The engine in a thread of this process. With `rate`, an open loop; without, a closed loop of
    `concurrency` clients (default: all `clients`); either knob may change while it runs.
    judge(request, outcome) -> R: what to keep of one answer; it runs on the generator's event loop, so
    it must be quick. A ValueError it raises on an answer counts as no answer (judged again with status 0
    and the error); on a status-0 outcome it must not raise.
    """

    def __init__(self, url: str, make: Callable[[int, int], Request], judge: Callable[[Request, Outcome], R],
                 *, clients: int, timeout_s: float = 10.0, rate: float | None = None,
                 concurrency: int | None = None, error_pause_s: float = 0.0,
                 results: list[R] | None = None, name: str = "loadgen") -> None:
        if clients < 1:
            raise ValueError(f"clients must be >= 1, got {clients}")
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be > 0 (or None for a closed loop), got {rate}")
        if rate is not None and concurrency is not None:
            raise ValueError("concurrency applies to the closed loop only, not with rate")
        if concurrency is not None and not 0 <= concurrency <= clients:
            raise ValueError(f"concurrency must be in [0, clients={clients}], got {concurrency}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.judge = judge
        self.timeout_s = timeout_s
        self.name = name
        self._results: list[R] = [] if results is None else results
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.engine = Engine(url, make, self._keep, clients=clients, timeout_s=timeout_s, rate=rate or 0.0,
                             concurrency=(clients if concurrency is None else concurrency) if rate is None else 0,
                             error_pause_s=error_pause_s)

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started (a generator runs once)")
        self._thread = threading.Thread(target=lambda: asyncio.run(self.engine.run(self._stop.is_set)),
                                        name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sending, let the requests in flight finish (bounded by the timeout) and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- knobs and counters ------------------------------------------------------------------------
    @property
    def rate(self) -> float:
        return self.engine.rate

    @rate.setter
    def rate(self, per_s: float) -> None:
        self.engine.rate = per_s

    @property
    def concurrency(self) -> int:
        return self.engine.concurrency

    @concurrency.setter
    def concurrency(self, n: int) -> None:
        self.engine.concurrency = n

    @property
    def in_flight(self) -> int:
        return self.engine.in_flight

    @property
    def sent(self) -> int:
        return self.engine.sent

    @property
    def unsent(self) -> int:
        return self.engine.unsent

    def seconds(self, since: float = 0.0) -> list[Second]:
        return [s for s in list(self.engine.seconds) if s.t >= since]

    # -- results ---------------------------------------------------------------------------------
    def results(self) -> list[R]:
        """A copy of everything kept so far, in arrival order."""
        with self._lock:
            return list(self._results)

    def _keep(self, req: Request, out: Outcome) -> bool:
        try:
            kept = self.judge(req, out)
        except ValueError as exc:  # the answer's body could not be read: no answer
            out = Outcome(0, out.latency_ms, out.t_monotonic, out.t_wall, None, exc, out.scheduled)
            kept = self.judge(req, out)
        with self._lock:
            self._results.append(kept)
        return out.response is not None


def measure_closed_loop(url: str, content: bytes, clients: int, seconds: float, *,
                        warmup_s: float = 0.5, timeout_s: float = 10.0) -> dict[str, float]:
    """`clients` back to back for `warmup_s + seconds` (a thread of this process); over the measured
    `seconds`: the median of the per-second answered counts (`rps`, robust to a stalled second on a busy
    machine), p50/p99 latency of the answered requests (ms) and `errors` (no answer or not 200).
    For a benchmark without wrk; with wrk installed, wrk measures a fixed concurrency better."""

    def judge(req: Request, out: Outcome) -> tuple[float, float, bool]:
        return out.t_monotonic, out.latency_ms, out.status == 200

    gen = LoadGenerator(url, lambda c, n: Request(content), judge, clients=clients, timeout_s=timeout_s,
                        error_pause_s=0.05, name="closed-loop")
    with gen:
        t_begin = time.monotonic() + warmup_s
        time.sleep(warmup_s + seconds)
    got = [r for r in gen.results() if t_begin <= r[0] < t_begin + seconds]
    windows = [0] * max(1, int(seconds))
    for t, _, ok in got:
        if ok and int(t - t_begin) < len(windows):
            windows[int(t - t_begin)] += 1
    latencies = [ms for _, ms, ok in got if ok]
    return {"rps": float(statistics.median(windows)),
            "p50_ms": percentile(latencies, 0.5) or float("nan"),
            "p99_ms": percentile(latencies, 0.99) or float("nan"),
            "errors": float(sum(1 for _, _, ok in got if not ok))}


class GeneratorOwner:
    """Mixin for wrappers that own a `LoadGenerator` as `_gen`: start / stop / `with` delegate to it,
    so each wrapper keeps only what it sends and what it keeps (scanflow.demo.load.Load,
    scanflow.embedded.traffic.Traffic)."""

    _gen: LoadGenerator[Any]

    def start(self) -> Self:
        self._gen.start()
        return self

    def stop(self) -> None:
        self._gen.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the child-process host ----------------------------------------------------------------------
def _second_line(s: Second) -> str:
    return json.dumps({"t": s.t, "rate": s.rate, "closed": s.closed, "sent": s.sent, "ok": s.ok,
                       "failed": s.failed, "unsent": s.unsent, "p50_ms": s.p50_ms, "p99_ms": s.p99_ms,
                       "in_flight": s.in_flight})


def parse_second(line: str) -> Second:
    """One stdout line of the child host; ValueError when it is not one."""
    try:
        d = json.loads(line)
        return Second(float(d["t"]), float(d["rate"]), int(d["sent"]), int(d["ok"]), int(d["failed"]),
                      int(d["unsent"]), d["p50_ms"], d["p99_ms"], int(d["in_flight"]), int(d.get("closed", 0)))
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a load report: {line[:80]!r}") from exc


def apply_command(engine: Engine, line: str | bytes) -> bool:
    """Apply one stdin command to the engine; False once it says stop (or is not a command at all)."""
    try:
        cmd = json.loads(line)
        if not isinstance(cmd, dict) or cmd.get("stop"):
            return False
        if "rate" in cmd:
            engine.rate = float(cmd["rate"])
        elif "closed" in cmd:
            engine.concurrency = min(int(cmd["closed"]), engine.clients)
        return True
    except (ValueError, TypeError):
        sys.stderr.write(f"loadgen: ignored a command that is not one: {line[:80]!r}\n")
        return True


async def _serve_child(engine: Engine) -> None:
    """Run the engine, apply stdin's commands and print each second's report as one JSON line."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def commands() -> None:
        while not engine.stopping:
            line = await reader.readline()
            if not line or not apply_command(engine, line):  # EOF: the parent is gone
                engine.stopping = True

    command_task = loop.create_task(commands())
    run_task = loop.create_task(engine.run(lambda: False))
    printed = 0.0
    while not run_task.done():
        await asyncio.wait({run_task}, timeout=0.05)
        fresh = [s for s in list(engine.seconds) if s.t > printed]
        if fresh:
            sys.stdout.write("".join(_second_line(s) + "\n" for s in fresh))
            sys.stdout.flush()
            printed = fresh[-1].t
    command_task.cancel()
    run_task.result()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="An open-loop load generator in its own process, steered over stdin.")
    ap.add_argument("url", help="the predict URL, e.g. http://127.0.0.1:8000/predict")
    ap.add_argument("bodies", help="a .npy file of rows (one row per request, sent in turn)")
    ap.add_argument("--max-connections", type=int, default=2048)
    ap.add_argument("--timeout-s", type=float, default=10.0)
    a = ap.parse_args(argv)
    import numpy as np

    rows = np.load(a.bodies).astype(np.float32)
    bodies = [Request(orjson.dumps({"inputs": [r.tolist()]})) for r in rows]
    turn = iter(range(1 << 62))
    engine = Engine(a.url, lambda client, n: bodies[next(turn) % len(bodies)], lambda r, o: o.response is not None,
                    clients=a.max_connections, timeout_s=a.timeout_s)
    try:
        import uvloop
    except ImportError:  # optional: the standard loop sends less per CPU second, same schedule
        asyncio.run(_serve_child(engine))
    else:
        uvloop.run(_serve_child(engine))


if __name__ == "__main__":
    main()
