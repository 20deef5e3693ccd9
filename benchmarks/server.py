"""The server process of every workload: ``python -m benchmarks.server``.

It serves one kind of server on one loop, prints ``{"listening": PORT, ...}``
and then answers the runner over stdin/stdout: each ``mark`` line is answered
with one JSON line holding the process's CPU seconds (user + system, from
``getrusage``), its resident memory and, on asyncio_relaxed's loop,
``loop.statistics()``; end of input stops the server.  The runner subtracts
two marks around the measured window, so start-up and warm-up cost nothing.

The marks are read by a thread blocked on stdin and handed to the loop with
``call_soon_threadsafe``, which every loop supports, so the snapshot is taken
on the loop's thread; the thread costs nothing while it waits.

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
  uvicorn's own ``--loop`` option makes (benchmarks.asgi).

``--loop floor`` (echo-protocol only) runs no event loop: :func:`serve_floor`
is the least a Python echo server executes, so the CPU time per request of
each loop can be read against what Python and the kernel cost here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import resource
import select
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from benchmarks import checkout, loops

KINDS = ("echo-protocol", "echo-buffered", "echo-streams", "pipe", "pieces", "split", "http",
         "uvicorn")
READ_SIZE = 256 * 1024  # what each server asks for per read (stock's max_size)
_PRIVATE_ANONYMOUS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS


class EchoProtocol(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class EchoBufferedProtocol(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        # Page-aligned (an anonymous mmap), not bytearray(256 KiB), which
        # glibc places 16 bytes past a page boundary: on the machine of the
        # README the kernel's copy into such a buffer costs about twice the
        # system time of an aligned one (asyncio_relaxed._transport.read_buffer),
        # and every loop's figure would measure that instead of the loop.
        self.view = memoryview(mmap.mmap(-1, READ_SIZE, flags=_PRIVATE_ANONYMOUS))

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


def snapshot(loop: asyncio.AbstractEventLoop | None) -> dict[str, Any]:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # µs resolution; os.times() has ticks
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    mark: dict[str, Any] = {"cpu": usage.ru_utime + usage.ru_stime, "rss": rss}
    statistics = getattr(loop, "statistics", None) if loop is not None else None
    if callable(statistics):
        mark["statistics"] = statistics().as_dict()
    return mark


def _finish(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def raise_fd_limit() -> None:
    """Allow as many sockets as the hard limit (the idle workload holds 10,000)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def control(loop: asyncio.AbstractEventLoop, stop: Callable[[], object]) -> None:
    """Answer the runner from a thread blocked on stdin: each ``mark`` with a
    snapshot taken on *loop*'s thread, the end of input with *stop* there."""

    def report() -> None:
        print(json.dumps(snapshot(loop)), flush=True)

    def read() -> None:
        for line in sys.stdin:
            if line.strip() == "mark":
                loop.call_soon_threadsafe(report)
        loop.call_soon_threadsafe(stop)

    threading.Thread(target=read, daemon=True).start()


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    runner = None
    server: Any
    if args.kind == "http":
        from aiohttp import web

        runner = web.AppRunner(http_app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
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
        server = await loop.create_server(factory, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"listening": port, "pid": os.getpid(),
                      "loop": f"{type(loop).__module__}.{type(loop).__qualname__}",
                      "relaxed": checkout.relaxed_package()}), flush=True)
    control(loop, lambda: _finish(stop))
    await stop
    if runner is not None:
        await runner.cleanup()
    else:
        server.close()


def serve_floor() -> None:
    """The echo-protocol server without an event loop: the floor.

    One epoll, accept until EAGAIN, ``recv_into`` one page-aligned buffer
    (the placement matters here: see EchoBufferedProtocol) and ``send`` from
    it, no copy; a short send keeps the rest and waits for EPOLLOUT with
    input off, so it is a correct echo, not only a fast one.  No protocol,
    transport, handle, flow control or statistics: what every loop adds to
    a request is its CPU time above this one.  (benchmarks.instructions has
    the same floor in instructions, driven in-process.)  The runner's marks
    arrive over a socket pair from the stdin thread, as everything else here.
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    listener.setblocking(False)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    epoll = select.epoll()
    epoll.register(listener.fileno(), select.EPOLLIN)
    epoll.register(wake_r.fileno(), select.EPOLLIN)
    view = memoryview(mmap.mmap(-1, READ_SIZE, flags=_PRIVATE_ANONYMOUS))
    conns: dict[int, socket.socket] = {}
    pending: dict[int, bytes] = {}

    def control() -> None:
        for line in sys.stdin:
            if line.strip() == "mark":
                wake_w.send(b"m")
        wake_w.send(b"q")

    def close(fd: int) -> None:
        epoll.unregister(fd)
        conns.pop(fd).close()
        pending.pop(fd, None)

    print(json.dumps({"listening": listener.getsockname()[1], "pid": os.getpid(),
                      "loop": "floor", "relaxed": None}), flush=True)
    threading.Thread(target=control, daemon=True).start()
    lfd, wfd = listener.fileno(), wake_r.fileno()
    running = True
    while running:
        for fd, mask in epoll.poll(-1, 1024):
            sock = conns.get(fd)
            if sock is not None:
                try:
                    if mask & select.EPOLLOUT:
                        rest = pending[fd]
                        sent = sock.send(rest)
                        if sent < len(rest):
                            pending[fd] = rest[sent:]
                        else:
                            del pending[fd]
                            epoll.modify(fd, select.EPOLLIN)
                        continue
                    n = sock.recv_into(view)
                    if not n:
                        close(fd)
                        continue
                    sent = sock.send(view[:n])
                    if sent < n:
                        pending[fd] = bytes(view[sent:n])
                        epoll.modify(fd, select.EPOLLOUT)
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:  # a reset peer: its connection only
                    close(fd)
            elif fd == lfd:
                while True:
                    try:
                        conn, _ = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    conn.setblocking(False)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conns[conn.fileno()] = conn
                    epoll.register(conn.fileno(), select.EPOLLIN)
            elif fd == wfd:
                for byte in wake_r.recv(64):
                    if byte == ord("m"):
                        print(json.dumps(snapshot(None)), flush=True)
                    else:
                        running = False
    for fd in list(conns):
        close(fd)
    listener.close()
    epoll.close()
    wake_r.close()
    wake_w.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="one benchmark server (driven by the runner)")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--loop", choices=tuple(loops.SPECS), required=True)
    parser.add_argument("--request", type=int, default=64, help="pieces: request size, bytes")
    parser.add_argument("--pieces", type=int, default=16, help="pieces: writes per request")
    parser.add_argument("--piece", type=int, default=64, help="pieces: bytes per write")
    args = parser.parse_args()
    raise_fd_limit()
    if args.kind == "uvicorn":  # uvicorn makes the loop itself, from its --loop option
        from benchmarks import asgi

        asgi.serve(args.loop)
        return
    if args.loop == "floor":
        if args.kind != "echo-protocol":
            parser.error("--loop floor serves --kind echo-protocol only")
        serve_floor()
        return
    loop = loops.factory(args.loop)()
    try:
        loop.run_until_complete(serve(args))
    finally:
        loop.close()


if __name__ == "__main__":
    main()
