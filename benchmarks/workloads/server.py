"""The server process of every workload: ``python -m benchmarks.workloads.server``.

It serves one kind of server on one loop, prints ``{"listening": PORT, ...}``
and then answers the runner's marks (benchmarks.workloads.control) until
the end of its input.

Kinds of server (the protocol API and the work per request are the
workload's, nothing else differs between loops):

- ``echo-protocol``, ``echo-buffered``, ``echo-streams``: echo every byte,
  through ``asyncio.Protocol``, ``asyncio.BufferedProtocol``, and
  ``asyncio.start_server`` streams (vmbench's three servers);
- ``pipe``: echo with flow control (``pause_reading`` while the transport's
  buffer is above its high-water mark), node's tcp-raw-pipe server;
- ``pieces``: answer each request of ``--request`` bytes with ``--pieces``
  writes of ``--piece`` bytes made in one callback (what deferred writes
  coalesce);
- ``split``: HTTP/1.1 keep-alive, one response of 13 bytes of text, written
  in one write for ``GET /one`` and in two, head then body, for
  ``GET /two`` (what uvicorn does for every response);
- ``http``: an aiohttp app, ``GET /`` returns 0 bytes, ``GET /4k`` 4 KiB;
- ``uvicorn``: uvicorn with httptools serving an ASGI app, on the loop
  uvicorn's own ``--loop`` option makes (benchmarks.workloads.asgi);
- ``uvicorn-json``, ``aiohttp-pg``, ``ws-broadcast``, ``resp``: the
  application workloads' servers (benchmarks.workloads.apps): uvicorn +
  Starlette's JSON endpoint (``--http httptools`` or ``h11``), aiohttp with
  a PostgreSQL query per request, a websockets broadcast, a Redis-protocol
  server;
- ``quic``: aioquic's QUIC server on the loop's datagram endpoint,
  counting the client's streams (benchmarks.workloads.quic);
- ``udp-echo``: a datagram endpoint (``create_datagram_endpoint``, on the
  socket of :func:`benchmarks.workloads.floors.udp_socket`, buffers of
  4 MiB each way) that sends every datagram back to its sender.  A loop
  whose ``create_datagram_endpoint`` raises NotImplementedError says so
  (control.unsupported).

``--tls`` serves ``echo-protocol``, ``http``, ``uvicorn-json`` and
``aiohttp-pg`` over TLS 1.3 (``create_server(ssl=)``, aiohttp's
``ssl_context``, uvicorn's ``ssl_certfile``; benchmarks.harness.tls has the
certificates).  A loop whose ``create_server(ssl=)`` refuses
(NotImplementedError, or a TypeError for the keyword) says so instead of
listening (control.unsupported), and the runner notes it.

``--starttls`` serves ``echo-protocol`` over TLS 1.3 reached as SMTP and
PostgreSQL reach it: each connection starts plain, the client sends
``STARTTLS`` and its line, the server answers ``OK`` and its line, and both
sides call ``loop.start_tls()``; then the echo.  Before listening, the
server makes one such upgrade over a socket pair of its own, so that a loop
without ``start_tls`` says so (control.unsupported) instead of failing its
clients.

A floor (``--loop floor``, ``floor-tls-bio``, ``floor-tls-socket``) runs no
event loop: benchmarks.workloads.floors serves it, the least a Python echo
server executes, so the CPU time per request of each loop can be read
against what Python, the kernel and OpenSSL cost here.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import socket
import ssl
from typing import Any

from benchmarks.harness import checkout, loops, tls
from benchmarks.workloads import apps, asgi, floors
from benchmarks.workloads.control import (
    control,
    finish,
    listening,
    raise_fd_limit,
    unsupported,
)
from benchmarks.workloads.floors import READ_SIZE, aligned_buffer, udp_socket

KINDS = ("echo-protocol", "echo-buffered", "echo-streams", "pipe", "pieces", "split", "http",
         "uvicorn", "udp-echo", "quic", "uvicorn-json", *apps.SERVERS)
#: The kinds that serve over TLS with --tls (quic: always, TLS 1.3 in QUIC).
TLS_KINDS = ("echo-protocol", "http", "quic", "uvicorn-json", "aiohttp-pg")
#: The kinds uvicorn serves, on the loop it makes.
UVICORN_KINDS = {"uvicorn": "plaintext", "uvicorn-json": "json"}
#: The kinds that serve over TLS with --starttls.
STARTTLS_KINDS = ("echo-protocol",)
#: The plain exchange before start_tls: the client's line, the server's answer.
STARTTLS = b"STARTTLS\n"
STARTTLS_OK = b"OK\n"


class EchoProtocol(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class UpgradedEcho(EchoProtocol):
    """EchoProtocol for a transport start_tls returns: the data that comes
    in the handshake's last read reaches the protocol before start_tls has
    returned its transport (TLS 1.3 clients send their first request with
    their Finished), so it waits for connection_made."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.early: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        for data in self.early:
            transport.write(data)
        self.early.clear()

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            self.early.append(data)
        else:
            self.transport.write(data)


class StartTlsEcho(asyncio.Protocol):
    """Plain until the client's STARTTLS line; then the OK line, start_tls
    on the server side, and UpgradedEcho over the TLS transport it returns.
    The client sends nothing more before the OK, so no TLS record reaches
    this plain protocol."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.line = b""
        self.upgrade: asyncio.Task[None] | None = None  # held: tasks are weakly referenced

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.line += data
        if len(self.line) < len(STARTTLS):
            return
        if self.line != STARTTLS or self.upgrade is not None:
            self.transport.abort()  # not the benchmark's client
            return
        self.transport.write(STARTTLS_OK)
        self.upgrade = asyncio.ensure_future(self._upgrade())

    async def _upgrade(self) -> None:
        echo = UpgradedEcho()
        try:
            transport = await asyncio.get_running_loop().start_tls(
                self.transport, echo, self.context, server_side=True)
        except (TimeoutError, OSError, ssl.SSLError):
            self.transport.abort()  # the client went away during the handshake
            return
        echo.connection_made(transport)


async def probe_start_tls(context: ssl.SSLContext) -> None:
    """One upgrade over a socket pair, both ends on this loop; raises what
    the loop's start_tls raises."""
    loop = asyncio.get_running_loop()
    pair = socket.socketpair()
    made: list[Any] = []
    try:
        for sock in pair:
            made.append((await loop.create_connection(asyncio.Protocol, sock=sock))[0])
        made += await asyncio.wait_for(asyncio.gather(
            loop.start_tls(made[0], asyncio.Protocol(), context, server_side=True),
            loop.start_tls(made[1], asyncio.Protocol(), tls.client_context(),
                           server_hostname=tls.HOSTNAME)), 30)
    finally:
        for transport in made:
            transport.abort()
        await asyncio.sleep(0)  # the aborts' connection_lost closes the sockets
        for sock in pair[len(made):]:  # the ones no transport took
            sock.close()


class EchoDatagram(asyncio.DatagramProtocol):
    """Sends every datagram back to its sender."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.transport.sendto(data, addr)


async def serve_udp(loop: asyncio.AbstractEventLoop) -> None:
    """The ``udp-echo`` server until the end of input."""
    stop = loop.create_future()
    sock = udp_socket()
    port = sock.getsockname()[1]
    try:
        transport, _ = await loop.create_datagram_endpoint(EchoDatagram, sock=sock)
    except NotImplementedError as exc:
        sock.close()
        unsupported(f"{type(loop).__module__}.{type(loop).__qualname__}: "
                    f"create_datagram_endpoint() raised NotImplementedError: {exc}")
        return
    listening(port, f"{type(loop).__module__}.{type(loop).__qualname__}",
              checkout.relaxed_package())
    control(loop, lambda: finish(stop))
    await stop
    transport.close()


class EchoBufferedProtocol(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        # Page-aligned (floors.aligned_buffer says why), as the loops' own.
        self.view = aligned_buffer()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        # bytes(): the buffer is reused by the next read; a loop may keep
        # what write() could not send, so hand it an immutable copy.
        self.transport.write(bytes(self.view[:nbytes]))


async def echo_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(READ_SIZE):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


class PipeProtocol(asyncio.Protocol):
    """Echo that stops reading while its peer does not read (socket.pipe(socket))."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def pause_writing(self) -> None:
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.transport.resume_reading()


class PiecesProtocol(asyncio.Protocol):
    """Answers every complete request with many small writes in one callback."""

    def __init__(self, request: int, pieces: int, piece: int) -> None:
        self.request = request
        self.pieces = pieces
        self.chunk = b"p" * piece
        self.pending = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.pending += len(data)
        while self.pending >= self.request:
            self.pending -= self.request
            write = self.transport.write
            for _ in range(self.pieces):
                write(self.chunk)


class SplitProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive, every request answered with the same response:
    in one write for ``GET /one``, in two (head, body) for ``GET /two``.

    The requests are wrk's (or the built-in client's) GETs without a body;
    a request is complete at its blank line.
    """

    HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 13\r\n\r\n")
    BODY = b"Hello, world!"
    WHOLE = HEAD + BODY

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        write = self.transport.write
        while (end := buffer.find(b"\r\n\r\n")) >= 0:
            if buffer.startswith(b"GET /two "):
                write(self.HEAD)
                write(self.BODY)
            else:
                write(self.WHOLE)
            buffer = buffer[end + 4:]
        self.buffer = buffer


def http_app() -> Any:
    from aiohttp import web

    four_kib = b"x" * 4096

    async def hello(request: web.Request) -> web.Response:
        return web.Response(body=b"")

    async def four_k(request: web.Request) -> web.Response:
        return web.Response(body=four_kib)

    app = web.Application()
    app.router.add_get("/", hello)
    app.router.add_get("/4k", four_k)
    return app


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    runner = None
    server: Any
    context: ssl.SSLContext | None = (tls.server_context() if args.tls or args.starttls
                                      else None)
    try:
        if args.starttls:
            assert context is not None
            await probe_start_tls(context)
            server = await loop.create_server(functools.partial(StartTlsEcho, context),
                                              "127.0.0.1", 0, backlog=1024)
        elif args.kind == "http":
            from aiohttp import web

            runner = web.AppRunner(http_app(), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024, ssl_context=context)
            await site.start()
            server = site._server  # aiohttp exposes no public accessor for the port
            assert server is not None
        elif args.kind == "echo-streams":
            server = await asyncio.start_server(echo_stream, "127.0.0.1", 0, backlog=1024)
        else:
            factory: Any = {
                "echo-protocol": EchoProtocol,
                "echo-buffered": EchoBufferedProtocol,
                "pipe": PipeProtocol,
                "pieces": lambda: PiecesProtocol(args.request, args.pieces, args.piece),
                "split": SplitProtocol,
            }[args.kind]
            server = await loop.create_server(factory, "127.0.0.1", 0, backlog=1024,
                                              ssl=context)
    except (NotImplementedError, TypeError) as exc:
        if context is None:
            raise
        # A peer without TLS servers or start_tls: noted by the runner, never faked.
        what = "start_tls()" if args.starttls else "create_server(ssl=)"
        unsupported(f"{type(loop).__module__}.{type(loop).__qualname__}: {what} "
                    f"raised {type(exc).__name__}: {exc}")
        return
    listening(server.sockets[0].getsockname()[1],
              f"{type(loop).__module__}.{type(loop).__qualname__}", checkout.relaxed_package())
    control(loop, lambda: finish(stop))
    await stop
    if runner is not None:
        await runner.cleanup()
    else:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="one benchmark server (driven by the runner)")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--loop", choices=tuple(loops.SPECS), required=True)
    parser.add_argument("--request", type=int, default=64, help="pieces: request size, bytes")
    parser.add_argument("--pieces", type=int, default=16, help="pieces: writes per request")
    parser.add_argument("--piece", type=int, default=64, help="pieces: bytes per write")
    parser.add_argument("--tls", action="store_true",
                        help=f"over TLS 1.3 ({', '.join(TLS_KINDS)})")
    parser.add_argument("--starttls", action="store_true",
                        help=f"plain, then TLS 1.3 by start_tls ({', '.join(STARTTLS_KINDS)})")
    parser.add_argument("--http", choices=("httptools", "h11"), default="httptools",
                        help="uvicorn kinds: uvicorn's HTTP protocol (httptools)")
    parser.add_argument("--value", type=int, default=0,
                        help="resp: the store holds a value of this many bytes at 'key' from "
                             "the start, for the open-loop client's GET key (0: empty)")
    args = parser.parse_args()
    if args.tls and args.kind not in TLS_KINDS:
        parser.error(f"--tls serves --kind {' or '.join(TLS_KINDS)} only")
    if args.starttls and (args.kind not in STARTTLS_KINDS or args.tls):
        parser.error(f"--starttls serves --kind {' or '.join(STARTTLS_KINDS)} only, "
                     "without --tls")
    raise_fd_limit()
    if args.kind in UVICORN_KINDS:  # uvicorn makes the loop itself, from its --loop option
        asgi.serve(args.loop, UVICORN_KINDS[args.kind], args.http, args.tls)
        return
    spec = loops.SPECS[args.loop]
    if spec.kind == "floor":
        kind = args.kind + ("+tls" if args.tls else "+starttls" if args.starttls else "")
        if kind not in spec.serves:
            parser.error(f"--loop {args.loop} serves {', '.join(spec.serves)} only")
        floors.serve(args.loop)
        return
    loop = loops.factory(args.loop)()
    try:
        if args.kind == "quic":
            from benchmarks.workloads import quic

            loop.run_until_complete(quic.serve(loop))
            return
        if args.kind in apps.SERVERS:
            loop.run_until_complete(apps.SERVERS[args.kind](args))
            return
        loop.run_until_complete(serve_udp(loop) if args.kind == "udp-echo" else serve(args))
    finally:
        loop.close()


if __name__ == "__main__":
    main()
