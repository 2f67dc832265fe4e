"""The gateway's `POST /predict` without an ASGI cycle: parsed, queued and answered from the protocol.

Why: the gateway did all of an empty endpoint's HTTP work plus the forwarding, 58-70 us of CPU per
request against 36-39 us for an empty uvicorn endpoint (docs/serving.md), and most of the difference
was uvicorn's per-request machinery rather than the forwarding: a RequestResponseCycle, an asyncio
task, an Event, the scope dict, the `receive`/`send` coroutines and their message dicts. Here the
common request (POST /predict, a Content-Length body of at most the coalescing item size, JSON or no
Content-Type) is taken straight from httptools' callbacks: its body joins the coalescing queue
(`Gateway.enqueue`), and the coalesced call's future answers it with one socket write from a done
callback: no task, no coroutine, no ASGI messages. Anything else (other paths and methods, chunked
or large bodies, `Expect: 100-continue`, other content types, HTTP/1.0) goes through uvicorn and the
ASGI app exactly as before, and so does a request whose coalesced call needs a retry (dead replica,
502/503: `Gateway.forward_with_retries` in a task). The answers (status, body, `content-type`,
`x-scanflow-upstream`) are the same bytes as the ASGI path's.

Open Inference Protocol v2 infer (`POST /v2/models/{name}[/versions/{v}]/infer`, plain names only:
scanflow.serving.oip_path) is taken the same way: its body joins the same queue marked with its model,
and the coalesced call (POST /predict_batch, framed with the models) has the replica check and answer it as its v2 route would
(scanflow.serving.oip_items), so the answer is the protocol's, and a retry goes to the v2 path upstream.

Per-request work of uvicorn's protocol that a fast request never needs is left out: the ASGI scope
(a dict and a copy of the app state, built by uvicorn at every message begin) is built only when a
request turns out to need the ASGI path; the header callback does uvicorn's and ours in one call; the
keep-alive timeout is one lazy timer per connection (uvicorn arms a timer after every answer and
cancels it at the next read); the answer is written at once rather than at the end of the loop turn,
and the coalesced call hands it over by a plain callback (`Gateway.enqueue_cb`), not a Future, so it
leaves in the turn the replica's answer arrives. Measured: see docs/benchmarks/serving.md.

Ordering and pipelining: the fast request takes the protocol's `cycle` slot with a `FastCycle`, so
a pipelined request behind it is queued by uvicorn's own pipeline logic and started after the fast
answer is written (`on_response_complete`), as it would be behind an ASGI cycle.
Slow bodies: a fast request whose body is not complete at the end of a read arms a timer of the
gateway's body timeout; when it fires, 408 and close (as `read_body`'s deadline does). Slow heads: the
head deadline of scanflow.httpdeadline, which this protocol inherits.

Who uses it: scanflow.serving.gateway.main (the default front; `--front asgi` is the plain uvicorn
path). It extends scanflow.serving.corked's protocol, so it relies on the same uvicorn
internals (httptools_impl: `cycle`, `pipeline`, `on_response_complete`, `server_state`), pinned by the
project's uvicorn version and exercised by tests/serving/test_serving_fastfront.py.
"""

from __future__ import annotations

import asyncio
import http
import time
from typing import TYPE_CHECKING, Any

from scanflow.serving.asgi import is_json_media_type
from scanflow.serving.batchwire import ItemModel
from scanflow.serving.corked import CorkedHttpToolsProtocol
from scanflow.serving.oip_path import infer_path, infer_target, v2_shaped
from scanflow.serving.outcomes import final

if TYPE_CHECKING:
    from scanflow.serving.gateway_server import Gateway
    from scanflow.serving.outcomes import Outcome

_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in http.HTTPStatus}


_defaults: tuple[object, bytes] = (None, b"")


def _default_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """uvicorn's default headers (date, server) as bytes; uvicorn replaces the list when the date
    changes, so the joined form is kept until the list object changes."""
    global _defaults
    if _defaults[0] is not headers:
        _defaults = (headers, b"".join(n + b": " + v + b"\r\n" for n, v in headers))
    return _defaults[1]


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else f"HTTP/1.1 {status} \r\n".encode()


class _NoEvent:
    """uvicorn sets `cycle.message_event` on disconnect; a fast request has nobody waiting on it."""

    __slots__ = ()

    def set(self) -> None:
        pass


_NO_EVENT = _NoEvent()


class FastCycle:
    """Stands in the protocol's `cycle` slot while a fast request is read and answered: the attributes
    uvicorn's protocol reads or writes on a cycle (connection_lost, shutdown, the pipeline check)."""

    __slots__ = ("disconnected", "keep_alive", "message_event", "response_complete", "t0", "timer")

    def __init__(self, keep_alive: bool, t0: float) -> None:
        self.response_complete = False
        self.disconnected = False
        self.keep_alive = keep_alive
        self.message_event = _NO_EVENT
        self.t0 = t0
        self.timer: asyncio.TimerHandle | None = None


class FastFrontProtocol(CorkedHttpToolsProtocol):
    """uvicorn's httptools protocol with the gateway's common `POST /predict` and v2 infer answered in place.
    Bound to one gateway by `protocol_for`."""

    gateway: Gateway

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fast: FastCycle | None = None  # the fast request whose body is being read
        self._fast_model: ItemModel = None  # its OIP v2 (name, version), None for POST /predict
        self._fast_chunks: list[bytes] = []
        self._ctype_ok = True
        self._length: int | None = None
        self._plain = True  # no header that needs the ASGI path (Expect, Transfer-Encoding)
        self._keep_alive_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # loop time of the last answer while nothing is in hand

    # ---- parser callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        # uvicorn's on_message_begin, less the ASGI scope (built in `_asgi_scope` for the ASGI path only),
        # plus the head deadline's mark (scanflow.httpdeadline.HeadDeadlineProtocol.on_message_begin)
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._head_pending = True
        self._ctype_ok, self._length, self._plain = True, None, True

    def _asgi_scope(self) -> None:
        """The scope uvicorn's on_message_begin builds (uvicorn 0.54, httptools_impl), for a request that
        takes the ASGI path: it is made only now, once the head shows the request is not a fast one."""
        self.scope = {  # type: ignore[typeddict-item]
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,  # type: ignore[typeddict-item]
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }

    def on_header(self, name: bytes, value: bytes) -> None:
        # uvicorn's on_header (lower-case the name, note Expect: 100-continue, keep the header) and ours
        name = name.lower()
        if name == b"content-length":
            try:
                self._length = int(value)
            except ValueError:
                self._plain = False
        elif name == b"content-type":
            self._ctype_ok = is_json_media_type(value)
        elif name == b"expect":
            self._plain = False
            if value.lower() == b"100-continue":
                self.expect_100_continue = True
        elif name == b"transfer-encoding":
            self._plain = False
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        gw = self.gateway
        url = self.url
        if (
            self._plain
            and self._ctype_ok
            and self._length is not None
            and self._length <= gw.fast_body_limit
            and (url == b"/predict" or url.startswith(b"/v2/models/"))
            and (self.cycle is None or self.cycle.response_complete)
            and self.parser.get_method() == b"POST"
            and self.parser.get_http_version() == "1.1"
            and gw.fast_path_open()
            and (url == b"/predict" or self._v2_target(url))
        ):
            if url == b"/predict":
                self._fast_model = None
            self.head_complete()  # the head deadline (scanflow.httpdeadline) ends here, as on the ASGI path
            self._fast = self.cycle = FastCycle(self.parser.should_keep_alive(), time.perf_counter())  # type: ignore[assignment]
            self._fast_chunks = []
            return
        self._asgi_scope()
        super().on_headers_complete()

    def _v2_target(self, url: bytes) -> bool:
        """An OIP v2 infer URL the fast front takes (`oip_path.infer_target`): noted for the body."""
        self._fast_model = infer_target(url)
        return self._fast_model is not None

    def on_body(self, body: bytes) -> None:
        if self._fast is not None:
            self._fast_chunks.append(body)
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        cycle = self._fast
        if cycle is None:
            super().on_message_complete()
            return
        self._fast = None
        if cycle.timer is not None:
            cycle.timer.cancel()
            cycle.timer = None
        chunks = self._fast_chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._fast_chunks = []
        gw, model = self.gateway, self._fast_model
        if gw.fast_path_open():
            gw.enqueue_cb(body, lambda outcome: self._coalesced_done(cycle, body, outcome, model), model)
        else:  # the route changed between headers and body: the full path
            self._retry(cycle, body, None, model)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        cycle = self._fast
        if cycle is not None and cycle.timer is None:  # a body split over reads: bound its wait
            cycle.timer = self.loop.call_later(self.gateway.config.body_timeout_s, self._body_timeout, cycle)

    # ---- answers ----------------------------------------------------------------------------
    def _coalesced_done(self, cycle: FastCycle, body: bytes, outcome: Outcome, model: ItemModel) -> None:
        if final(outcome):
            assert outcome is not None
            status, payload, ctype, up = outcome
            if model is not None and status >= 500:  # the gateway's own 504 (upstream timeout): v2's shape
                status, payload = v2_shaped(status, payload)
            self._answer(cycle, status, payload, b"content-type: " + ctype + b"\r\nx-scanflow-upstream: "
                         + up.url.encode() + b"\r\n", self.gateway.route_label(up))
        else:
            self._retry(cycle, body, outcome, model)

    def _retry(self, cycle: FastCycle, body: bytes, outcome: Outcome, model: ItemModel) -> None:
        """The request alone, with the gateway's retries and failover; a v2 request to its own path
        upstream, and a refusal the gateway makes itself in the protocol's error shape."""
        async def run() -> None:
            if model is None:
                status, payload, headers, route = await self.gateway.forward_with_retries(body, outcome)
            else:
                status, payload, headers, route = await self.gateway.forward_with_retries(
                    body, outcome, infer_path(model))
                status, payload = v2_shaped(status, payload)
            self._answer(cycle, status, payload, b"".join(n + b": " + v + b"\r\n" for n, v in headers), route)

        task = self.loop.create_task(run())
        self.tasks.add(task)  # uvicorn's graceful shutdown waits for these
        task.add_done_callback(self.tasks.discard)

    def _answer(self, cycle: FastCycle, status: int, payload: bytes, headers: bytes, route: str,
                close: bool = False) -> None:
        gw = self.gateway
        gw.metrics.requests.inc(str(status), route)
        gw.metrics.latency.observe(time.perf_counter() - cycle.t0)
        if cycle.disconnected or self.transport.is_closing():
            return
        keep_alive = cycle.keep_alive and not close
        default = _default_headers(self.server_state.default_headers)
        self.transport.write_now(  # type: ignore[attr-defined]  # the CorkedTransport (scanflow.serving.corked)
            status_line(status) + default + headers + b"content-length: " + str(len(payload)).encode()
            + (b"\r\n\r\n" if keep_alive else b"\r\nconnection: close\r\n\r\n") + payload
        )
        cycle.response_complete = True
        if keep_alive:
            self.on_response_complete()
        else:
            self.server_state.total_requests += 1
            self.transport.close()

    # ---- keep-alive: one lazy timer per connection ---------------------------------------------
    def on_response_complete(self) -> None:
        # uvicorn's on_response_complete, with the keep-alive deadline kept as "idle since" instead of a
        # timer armed after every answer (and cancelled by the next read): the timer, armed when none is,
        # checks the idle time when it fires and re-arms for what is left
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self._keep_alive_timer is None:
            self._keep_alive_timer = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_check)

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this on every read and when the connection goes: the connection is busy again
        self._idle_since = None

    def _keep_alive_check(self) -> None:
        self._keep_alive_timer = None
        if self.transport.is_closing() or self._idle_since is None:
            return  # closed, or busy: the next answer re-arms
        left = self._idle_since + self.timeout_keep_alive - self.loop.time()
        if left <= 0:
            self.timeout_keep_alive_handler()
        else:
            self._keep_alive_timer = self.loop.call_later(left, self._keep_alive_check)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._keep_alive_timer is not None:
            self._keep_alive_timer.cancel()
            self._keep_alive_timer = None
        super().connection_lost(exc)

    def _body_timeout(self, cycle: FastCycle) -> None:
        if self._fast is not cycle:
            return
        self._fast = None
        self._fast_chunks = []
        timeout = self.gateway.config.body_timeout_s
        detail = f'{{"detail":"request body not received within {timeout:g} s"}}'.encode()
        self._answer(cycle, 408, detail, b"content-type: application/json\r\n", "none", close=True)


def protocol_for(gateway: Gateway) -> type[FastFrontProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to `gateway`."""
    return type("GatewayFastFrontProtocol", (FastFrontProtocol,), {"gateway": gateway})
