"""The built-in load generators: ``python -m benchmarks.workloads.client``.

One process, one loop (benchmarks.harness.loops.client_loop: uvloop when
installed, else stock asyncio; the same client for every server loop,
recorded in the results).  Without ``--port``
it reads the port from its first line of input, so that the runner can start
it while the server starts.  It connects, runs
the load through a warm-up, prints ``{"ready": ...}``, and starts counting
when the runner writes ``go`` on stdin (after marking the server).  After
``--duration`` seconds each connection finishes the request it is in and
stops; the client then prints one JSON line: requests (or MiB for the pipe),
elapsed seconds and the latency samples' p50/p99 in microseconds.

Kinds of load:
- ``echo``: ``--concurrency`` connections, each sends ``--request`` bytes and
  waits for ``--response`` bytes back, then repeats (request-response);
- ``http``: keep-alive ``GET --path`` over HTTP/1.1, one request in flight
  per connection (wrk's model, used when wrk is not installed); with
  ``--method``/``--body`` another method with a JSON body; a response
  whose status is not 2xx is counted (``non_2xx``), as wrk counts them;
- ``churn``: a new connection per request (connect, request, response, close);
- ``pipe``: one connection; writes ``--request``-byte chunks whenever its
  write buffer is empty and counts what comes back (node's tcp-raw-pipe);
- ``idle``: opens ``--concurrency`` connections, makes one round trip on each
  (so the server has built every transport) and holds them until ``go``;
- ``fairness``: the fairness workloads' clients (benchmarks.workloads.fairness,
  whose parent starts this with ``--mode``);
- ``quic``: one aioquic connection sending ``--request``-byte streams one
  at a time (benchmarks.workloads.quic), in MiB;
- ``udp``: ``--concurrency`` datagram endpoints, each on its own connected
  UDP socket (4 MiB buffers, benchmarks.workloads.floors.udp_socket), each
  sending ``--burst`` datagrams of ``--request`` bytes at a time and
  waiting for all their echoes, then the next burst; the count is of
  datagrams echoed, the latency of whole bursts.  A burst whose echoes do
  not all come back within :data:`LOSS_TIMEOUT` counts the missing ones as
  ``lost`` (in the result) and the next burst starts; an echo of an earlier
  burst (each datagram starts with its burst's number) counts as ``late``
  and is not counted;
- ``ws``: ``--concurrency`` WebSocket connections (websockets' Sans-I/O
  client protocol over an asyncio.Protocol each) to the ``ws-broadcast``
  server (benchmarks.workloads.apps), each reading the broadcasts; when
  every connection has received one, the first connection acknowledges it
  and the server sends the next.  The count is of messages delivered, the
  latency a broadcast's, from its send time (in the message) to its last
  delivery.  It holds its connections until the end of its input, so that
  their closing is not in the server's window;
- ``resp``: ``--concurrency`` connections to the ``resp`` server, each
  SETting its ``--pipeline`` keys (``--response`` bytes each) once, then
  sending ``--pipeline`` GETs of them in one write and waiting for all
  their replies (checked byte for byte), again; the count is of commands,
  the latency a pipeline's.

``--tls`` makes every connection of ``echo``, ``http``, ``churn`` and
``idle`` over TLS 1.3 (benchmarks.harness.tls), in the client loop's own TLS
(uvloop's sslproto, in Cython, or stock's): a handshake per connection, so
under ``churn`` one per request.  ``--starttls`` makes each ``echo``
connection plain first, then TLS 1.3 through ``loop.start_tls()`` after the
STARTTLS exchange of benchmarks.workloads.server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from typing import Any

from benchmarks.harness import loops, maths, tls
from benchmarks.workloads import apps, fairness
from benchmarks.workloads.control import finish, raise_fd_limit
from benchmarks.workloads.server import STARTTLS, STARTTLS_OK

KINDS = ("echo", "http", "churn", "pipe", "idle", "fairness", "udp", "quic", "ws", "resp")
TLS_KINDS = ("echo", "http", "churn", "idle", "quic")
STARTTLS_KINDS = ("echo",)
MiB = 1 << 20
#: Seconds a UDP client waits for a burst's echoes before it counts the
#: missing ones as lost (loopback answers in well under a millisecond).
LOSS_TIMEOUT = 0.2


class Meter:
    """What every connection reports to: counts and latency samples."""

    def __init__(self) -> None:
        self.counting = False
        self.stopping = False
        self.requests = 0
        self.units = 0.0  # bytes for the pipe
        self.latencies: list[float] = []
        self.active = 0
        self.idle = asyncio.Event()
        self.non_2xx = 0  # http: responses whose status is not 2xx
        self.errors: list[str] = []  # resp: answers other than the ones due

    def done(self, started: float) -> None:
        if self.counting:
            self.requests += 1
            self.latencies.append(time.perf_counter() - started)

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.idle.set()


class RequestResponse(asyncio.Protocol):
    """One keep-alive connection: send a request, wait for the whole answer."""

    def __init__(self, meter: Meter, request: bytes, response: int, hold: bool = False) -> None:
        self.meter = meter
        self.hold = hold  # after one answer, keep the connection open and quiet
        self.request = request
        self.response = response
        self.connected = asyncio.get_running_loop().create_future()
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.meter.active += 1
        self.connected.set_result(None)
        self.send()

    def send(self) -> None:
        self.pending = self.response
        self.started = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.pending -= len(data)
        if self.pending > 0:
            return
        self.answered()

    def answered(self) -> None:
        """The whole answer is in: counted, then the next request (none
        while holding; the connection closes once the run is stopping)."""
        self.meter.done(self.started)
        if self.hold:
            return
        if self.meter.stopping:
            self.transport.close()
        else:
            self.send()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.meter.leave()
        if not self.closed.done():
            self.closed.set_result(exc)


class HttpConnection(RequestResponse):
    """Keep-alive HTTP/1.1 GET; a response ends after its Content-Length body."""

    def send(self) -> None:
        self.buffer = b""
        self.body_left = -1
        self.started = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.body_left < 0:
            self.buffer += data
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            if self.buffer[9:10] != b"2":  # "HTTP/1.1 200 OK"
                self.meter.non_2xx += 1
            length = 0
            for line in self.buffer[:end].split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            self.body_left = length - (len(self.buffer) - end - 4)
        else:
            self.body_left -= len(data)
        if self.body_left > 0:
            return
        self.answered()


class PipeClient(asyncio.Protocol):
    """Writes a chunk whenever the write buffer is empty; counts the echo."""

    def __init__(self, meter: Meter, chunk: bytes) -> None:
        self.meter = meter
        self.chunk = chunk
        self.sent = 0
        self.received = 0
        self.paused = False
        self.drained = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=0)  # pause as soon as anything is buffered
        self.fill()

    def fill(self) -> None:
        # Write while the kernel takes everything; at most a few chunks per
        # callback so that the echo is read in between.
        for _ in range(4):
            if self.paused or self.meter.stopping:
                return
            self.sent += len(self.chunk)
            self.transport.write(self.chunk)
        asyncio.get_running_loop().call_soon(self.fill)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.fill()

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        if self.meter.counting:
            self.meter.units += len(data)
        if self.meter.stopping and self.received >= self.sent and not self.drained.done():
            self.drained.set_result(None)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.drained.done():
            self.drained.set_result(None)


class UdpClient(asyncio.DatagramProtocol):
    """One connected UDP socket: a burst of datagrams, all their echoes, again."""

    def __init__(self, meter: Meter, size: int, burst: int) -> None:
        if size < 8:
            raise ValueError(f"a UDP request carries its burst's number in 8 bytes, not {size}")
        self.meter = meter
        self.body = b"u" * (size - 8)
        self.burst = burst
        self.round = 0
        self.tag = b""
        self.pending = 0
        self.lost = 0
        self.late = 0
        self.timer: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.meter.active += 1
        self.send()

    def send(self) -> None:
        self.round += 1
        self.tag = self.round.to_bytes(8, "little")
        data = self.tag + self.body
        self.pending = self.burst
        self.started = time.perf_counter()
        sendto = self.transport.sendto
        for _ in range(self.burst):
            sendto(data)
        self.timer = self.loop.call_later(LOSS_TIMEOUT, self.timeout, self.round)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if data[:8] != self.tag or not self.pending:
            self.late += 1
            return
        self.pending -= 1
        if self.meter.counting:
            self.meter.units += 1
        if self.pending:
            return
        assert self.timer is not None
        self.timer.cancel()
        self.meter.done(self.started)
        self.next()

    def timeout(self, round_: int) -> None:
        if round_ != self.round or not self.pending:
            return
        if self.meter.counting:
            self.lost += self.pending
        self.pending = 0
        self.next()

    def next(self) -> None:
        if self.meter.stopping:
            self.transport.close()
            self.meter.leave()
        else:
            self.send()

    def error_received(self, exc: Exception) -> None:
        pass  # the burst's timeout counts what it cost


async def udp_clients(meter: Meter, args: argparse.Namespace) -> list[UdpClient]:
    """The ``udp`` kind's endpoints, each sending its first burst."""
    from benchmarks.workloads.floors import udp_socket

    loop = asyncio.get_running_loop()
    out = []
    for _ in range(args.concurrency):
        sock = udp_socket()
        sock.connect(("127.0.0.1", args.port))
        _, proto = await loop.create_datagram_endpoint(
            lambda: UdpClient(meter, args.request, args.burst), sock=sock)
        out.append(proto)
    return out


def http_request(method: str, path: str, body: str) -> bytes:
    """An HTTP/1.1 request: a GET without body, or *method* with a JSON *body*."""
    if method == "GET" and not body:
        return f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
    data = body.encode()
    return (f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def resp_command(*args: bytes) -> bytes:
    """A command of the Redis protocol: an array of bulk strings."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args)


class RespClient(RequestResponse):
    """One ``resp`` connection: its keys SET once, then pipelines of GETs,
    every reply checked against what the SETs stored."""

    def __init__(self, meter: Meter, index: int, pipeline: int, size: int) -> None:
        keys = [b"key:%d:%d" % (index, i) for i in range(pipeline)]
        value = bytes([97 + index % 26]) * size
        self.setup: bytes | None = b"".join(resp_command(b"SET", k, value) for k in keys)
        self.setup_reply = b"+OK\r\n" * pipeline
        self.expected = b"$%d\r\n%b\r\n" % (size, value) * pipeline
        self.buffer = b""
        super().__init__(meter, b"".join(resp_command(b"GET", k) for k in keys),
                         len(self.expected))

    def send(self) -> None:
        self.buffer = b""
        if self.setup is not None:
            self.transport.write(self.setup)
            return
        super().send()

    def data_received(self, data: bytes) -> None:
        self.buffer = self.buffer + data if self.buffer else data
        want = self.setup_reply if self.setup is not None else self.expected
        if len(self.buffer) < len(want):
            return
        if self.buffer != want:
            self.meter.errors.append(f"the server answered {self.buffer[:80]!r}..., "
                                     f"not {want[:80]!r}...")
            self.transport.close()
            return
        if self.setup is not None:  # the keys are set: the pipelines start
            self.setup = None
            self.send()
            return
        self.answered()


class WsClient(asyncio.Protocol):
    """One ``ws`` connection: websockets' own client protocol (its Sans-I/O
    layer: the opening handshake, framing and masking) over a plain
    asyncio.Protocol, so one process holds 1,000 of them without a Task or
    a queue each; every broadcast is reported to *deliveries*, and
    *complete(seq, sent_ns)* is called when this connection was the last
    to receive broadcast *seq*."""

    def __init__(self, index: int, port: int, deliveries: apps.Deliveries,
                 complete: Any) -> None:
        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        self.index = index
        self.deliveries = deliveries
        self.complete = complete
        self.ws = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/"))
        self.upgraded = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.ws.send_request(self.ws.connect())
        self.flush()

    def flush(self) -> None:
        """What the protocol has to send (the handshake, an ack, a pong)."""
        data = self.ws.data_to_send()
        if data:
            self.transport.write(b"".join(data))

    def data_received(self, data: bytes) -> None:
        from websockets.frames import Opcode

        ws = self.ws
        ws.receive_data(data)
        for event in ws.events_received():
            if not self.upgraded.done():  # the first event: the handshake's response
                if ws.handshake_exc is not None:
                    self.upgraded.set_exception(ws.handshake_exc)
                    return
                self.upgraded.set_result(None)
                continue
            if event.opcode is not Opcode.BINARY:  # (nothing else comes unasked)
                continue
            payload = event.data
            seq = int.from_bytes(payload[:8], "little")
            if self.deliveries.deliver(self.index, seq):
                self.complete(seq, int.from_bytes(payload[8:16], "little"))
        self.flush()

    def ack(self, seq: int) -> None:
        """Acknowledge broadcast *seq* (0: start the broadcasts)."""
        self.ws.send_binary(seq.to_bytes(8, "little"))
        self.flush()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.upgraded.done():
            self.upgraded.set_exception(ConnectionError("closed before the upgrade"))


async def ws_clients(meter: Meter, args: argparse.Namespace,
                     done: asyncio.Future[None]) -> list[WsClient]:
    """The ``ws`` kind's connections, upgraded, the broadcasts started."""
    loop = asyncio.get_running_loop()
    deliveries = apps.Deliveries(args.concurrency)
    conns: list[WsClient] = []

    def complete(seq: int, sent_ns: int) -> None:
        if meter.counting:
            meter.requests += 1
            meter.units += args.concurrency
            meter.latencies.append((time.monotonic_ns() - sent_ns) / 1e9)
        if meter.stopping:
            finish(done)
        else:
            conns[0].ack(seq)

    async def connect(index: int) -> WsClient:
        _, proto = await loop.create_connection(
            lambda: WsClient(index, args.port, deliveries, complete), "127.0.0.1", args.port)
        await proto.upgraded
        return proto

    for first in range(0, args.concurrency, 100):  # within the server's backlog
        conns += await asyncio.gather(*(connect(i) for i in range(
            first, min(first + 100, args.concurrency))))
    conns[0].ack(0)
    return conns


def _returns(protocol: asyncio.Protocol) -> Any:
    return lambda: protocol


class StartTls(asyncio.Protocol):
    """The plain part of a --starttls connection: STARTTLS out, OK back."""

    def __init__(self) -> None:
        self.line = b""
        self.ok = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        transport.write(STARTTLS)

    def data_received(self, data: bytes) -> None:
        self.line += data
        if len(self.line) >= len(STARTTLS_OK) and not self.ok.done():
            if self.line == STARTTLS_OK:
                self.ok.set_result(None)
            else:
                self.ok.set_exception(RuntimeError(f"the server answered {self.line!r}"))

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.ok.done():
            self.ok.set_exception(ConnectionError("closed before the STARTTLS answer"))


async def starttls_connection(make: Any, port: int) -> Any:
    """A plain connection upgraded by start_tls; the protocol *make* builds
    gets connection_made with the TLS transport."""
    loop = asyncio.get_running_loop()
    plain, exchange = await loop.create_connection(StartTls, "127.0.0.1", port)
    await exchange.ok
    proto = make()
    transport = await loop.start_tls(plain, proto, tls.client_context(),
                                     server_hostname=tls.HOSTNAME)
    proto.connection_made(transport)
    return proto


def _tls_options(on: bool) -> dict[str, Any]:
    """create_connection's keywords for a TLS connection, or none."""
    return {"ssl": tls.client_context(), "server_hostname": tls.HOSTNAME} if on else {}


async def churn_worker(meter: Meter, port: int, request: bytes, response: int,
                       over_tls: bool = False) -> None:
    loop = asyncio.get_running_loop()
    meter.active += 1
    options = _tls_options(over_tls)
    try:
        while not meter.stopping:
            started = time.perf_counter()
            proto = RequestResponse(Meter(), request, response)  # its own meter: one shot
            proto.meter.stopping = True  # close after the first answer
            await loop.create_connection(_returns(proto), "127.0.0.1", port, **options)
            await proto.closed
            meter.done(started)
    finally:
        meter.leave()


async def wait_for_go() -> None:
    loop = asyncio.get_running_loop()
    go = loop.create_future()

    def read() -> None:
        sys.stdin.readline()
        loop.call_soon_threadsafe(finish, go)

    threading.Thread(target=read, daemon=True).start()
    await go


async def run(args: argparse.Namespace) -> dict[str, Any] | None:
    loop = asyncio.get_running_loop()
    if args.kind == "quic":
        from benchmarks.workloads import quic

        def ready() -> None:
            print(json.dumps({"ready": True, "client": f"builtin ({loops.client_loop()[0]}), "
                              "aioquic"}), flush=True)

        return await quic.client(args, ready, wait_for_go)
    meter = Meter()
    request = b"r" * args.request
    tasks: list[Any] = []
    conns: list[Any] = []
    options = _tls_options(args.tls)
    broadcasts: asyncio.Future[None] = loop.create_future()  # ws: the last one is complete
    if args.kind in ("echo", "http", "idle", "resp"):
        if args.kind == "http":
            request = http_request(args.method, args.path, args.body)
            make: Any = lambda: HttpConnection(meter, request, 0)  # noqa: E731
        elif args.kind == "resp":
            make = lambda: RespClient(meter, len(conns), args.pipeline,  # noqa: E731
                                      args.response)
        elif args.kind == "idle":
            request = b"i"
            make = lambda: RequestResponse(meter, request, 1, hold=True)  # noqa: E731
        else:
            make = lambda: RequestResponse(meter, request, args.response)  # noqa: E731
        for _ in range(args.concurrency):
            if args.starttls:
                proto = await starttls_connection(make, args.port)
            else:
                _, proto = await loop.create_connection(make, "127.0.0.1", args.port,
                                                        **options)
            conns.append(proto)
    elif args.kind == "udp":
        conns = await udp_clients(meter, args)
    elif args.kind == "ws":
        conns = await ws_clients(meter, args, broadcasts)
    elif args.kind == "churn":
        tasks = [asyncio.ensure_future(churn_worker(meter, args.port, request, args.response,
                                                    args.tls))
                 for _ in range(args.concurrency)]
    else:  # pipe
        _, pipe = await loop.create_connection(
            lambda: PipeClient(meter, b"c" * args.request), "127.0.0.1", args.port)
    if args.kind == "idle":
        # Hold until every connection made its round trip (the server built
        # every transport); closing is what ends them.
        while sum(1 for c in conns if c.pending > 0):
            await asyncio.sleep(0.01)
    else:
        await asyncio.sleep(args.warmup)
    print(json.dumps({"ready": True, "client": f"builtin ({loops.client_loop()[0]})"
                      + (", TLS 1.3" if args.tls else "")
                      + (", TLS 1.3 by start_tls" if args.starttls else "")}), flush=True)
    await wait_for_go()
    meter.counting = True
    started = time.perf_counter()
    if args.kind == "idle":
        for c in conns:
            c.transport.close()
        return {"requests": len(conns), "elapsed": time.perf_counter() - started}
    await asyncio.sleep(args.duration)
    meter.stopping = True
    if args.kind == "ws":
        await asyncio.wait_for(broadcasts, 30)
        elapsed = time.perf_counter() - started
        p50, p99 = maths.percentiles(meter.latencies, 50, 99)
        print(json.dumps({"requests": meter.units, "elapsed": elapsed, "p50_us": p50 * 1e6,
                          "p99_us": p99 * 1e6, "broadcasts": meter.requests}), flush=True)
        await wait_for_go()  # the end of input: the server's last mark is taken
        for c in conns:
            c.transport.abort()
        return None
    if args.kind == "pipe":
        await asyncio.wait_for(pipe.drained, 30)
        elapsed = time.perf_counter() - started
        pipe.transport.close()
        mib = meter.units / MiB
        return {"requests": mib, "elapsed": elapsed, "gbit_s": meter.units * 8 / elapsed / 1e9}
    await asyncio.wait_for(meter.idle.wait(), 30)
    elapsed = time.perf_counter() - started
    for task in tasks:
        await task
    if meter.errors:
        raise RuntimeError(f"{len(meter.errors)} connection(s) failed: {meter.errors[0]}")
    if not meter.latencies:
        raise RuntimeError("no request completed in the measured window")
    p50, p99 = maths.percentiles(meter.latencies, 50, 99)
    out = {"requests": meter.requests, "elapsed": elapsed, "p50_us": p50 * 1e6,
           "p99_us": p99 * 1e6}
    if args.kind == "http" and meter.non_2xx:
        out["non_2xx"] = meter.non_2xx
    if args.kind == "resp":  # per command; a pipeline's latency
        out.update(requests=meter.requests * args.pipeline, pipelines=meter.requests)
    if args.kind == "udp":  # per datagram echoed; a burst's latency
        out.update(requests=meter.units, bursts=meter.requests,
                   lost=sum(c.lost for c in conns), late=sum(c.late for c in conns))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="the built-in load generator")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--port", type=int, help="the server's (default: a line of input)")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--request", type=int, default=1024, help="bytes per request/chunk")
    parser.add_argument("--response", type=int, default=1024, help="bytes per response")
    parser.add_argument("--path", default="/", help="http: the path to GET")
    parser.add_argument("--method", default="GET", help="http: the request's method")
    parser.add_argument("--body", default="", help="http: the request's JSON body")
    parser.add_argument("--pipeline", type=int, default=16,
                        help="resp: commands per write, each connection")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=1.0)
    parser.add_argument("--tls", action="store_true",
                        help=f"over TLS 1.3 ({', '.join(TLS_KINDS)})")
    parser.add_argument("--starttls", action="store_true",
                        help=f"plain, then TLS 1.3 by start_tls ({', '.join(STARTTLS_KINDS)})")
    parser.add_argument("--mode", choices=fairness.MODES, default="close",
                        help="fairness: connection lifetimes")
    parser.add_argument("--burst", type=int, default=1,
                        help="udp: datagrams sent at a time before waiting for their echoes")
    args = parser.parse_args()
    if args.tls and args.kind not in TLS_KINDS:
        parser.error(f"--tls: kinds {', '.join(TLS_KINDS)} only")
    if args.starttls and (args.kind not in STARTTLS_KINDS or args.tls):
        parser.error(f"--starttls: kinds {', '.join(STARTTLS_KINDS)} only, without --tls")
    raise_fd_limit()
    if args.port is None:
        args.port = int(sys.stdin.readline())
    if args.kind == "fairness":
        fairness.client(args.port, args.concurrency, args.mode, args.warmup, args.duration)
        return
    loop = loops.client_loop()[1]()
    try:
        result = loop.run_until_complete(run(args))
    finally:
        loop.close()
    if result is not None:  # ws prints its own before it lets go of its connections
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
