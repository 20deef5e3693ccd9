"""Server connections the collector frees: the scenarios of tests/test_collected.py.

Each scenario serves one connection whose server side keeps no reference to
its transport (a stream handler that drops its writer, a protocol held only
by its transport), lets the peer go away or stall, runs ``gc.collect()`` and
reports the server's count of open connections at each step, whether
``Server.wait_closed()`` returned, the exception-handler calls and the
ResourceWarnings.  The counts must never go below zero and end at 0: a
transport detaches from its Server exactly once, whatever the order in which
the collector runs the finalisers of the transport and of its StreamWriter.

Run as a script (``python -O tests/_collected.py LOOP``), every scenario runs
and the reports are printed as one JSON object: the test runs it under ``-O``
too, where the assertion in 3.11-3.12's ``Server._detach`` is gone and a
second detach takes the count below zero instead of failing.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import socket
import sys
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

#: How long a scenario may wait for the server to close.
WAIT_CLOSED = 2.0


def active(server: asyncio.AbstractServer) -> int:
    """The server's open connections: a count on 3.11-3.12, a WeakSet from
    3.13 (stock's and ours); uvloop's Server keeps ``_active_count``."""
    count = getattr(server, "_active_count", None)
    if count is not None:
        return int(count)
    return len(server._clients)  # type: ignore[attr-defined]


class Report:
    """What a scenario observed."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.closed = False
        self.errors: list[str] = []
        self.resource_warnings = 0
        self.received = 0

    def as_dict(self) -> dict[str, Any]:
        return {"counts": self.counts, "closed": self.closed, "errors": self.errors,
                "resource_warnings": self.resource_warnings, "received": self.received}


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0.002)


def _scenario(body: Callable[[str, Report], Awaitable[None]]) -> Callable[[str], Any]:
    """A scenario: *body* runs with a Report, recording the exception-handler
    calls and counting the ResourceWarnings of finalisers (a StreamWriter
    dropped by its handler warns on 3.13+, on every loop)."""
    @functools.wraps(body)
    async def scenario(kind: str) -> Report:
        report = Report()
        _record_errors(report)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            await body(kind, report)
        report.resource_warnings = sum(issubclass(w.category, ResourceWarning)
                                       for w in caught)
        return report

    return scenario


async def _finish(server: asyncio.AbstractServer, report: Report) -> None:
    gc.collect()
    report.counts["after_gc"] = active(server)
    await _settle()
    gc.collect()
    report.counts["later"] = active(server)
    server.close()
    try:
        await asyncio.wait_for(server.wait_closed(), WAIT_CLOSED)
        report.closed = True
    except TimeoutError:
        report.closed = False


def _record_errors(report: Report) -> None:
    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        report.errors.append(f"{context.get('message')}: {exc!r}")

    asyncio.get_running_loop().set_exception_handler(handler)


@_scenario
async def abort_after_write(kind: str, report: Report) -> None:
    """The issue's reproducer: the peer writes, then resets the connection."""
    server = await _server(kind)
    reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
    writer.write(b"hello")
    await _settle()
    writer.transport.abort()
    await _settle()
    report.counts["before_gc"] = active(server)
    del reader, writer
    await _finish(server, report)


@_scenario
async def close_then_drop(kind: str, report: Report) -> None:
    """The server side calls close() and keeps nothing: connection_lost is
    scheduled when the collector finds the transport."""
    server = await _server(kind, close_at_once=True)
    client = await _client(server)
    await _settle()
    report.counts["before_gc"] = active(server)
    await _finish(server, report)
    report.received = len(_drain(client))
    client.close()


@_scenario
async def paused_mid_read(kind: str, report: Report) -> None:
    """The server side pauses reading in the middle of the peer's data and
    keeps nothing; the peer then half-closes: nothing is scheduled for the
    transport, which is found only by the collector."""
    server = await _server(kind, pause=True)
    client = await _client(server)
    client.sendall(b"x" * 100_000)
    await _settle()
    try:
        client.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # 3.13+: the handler's writer, dropped, closed the connection already
    await _settle()
    report.counts["before_gc"] = active(server)
    await _finish(server, report)
    client.close()


@_scenario
async def buffered_then_drop(kind: str, report: Report) -> None:
    """The server side writes more than the peer's buffers hold, calls
    close() and keeps nothing: the transport is still the loop's (it waits
    to send), so nothing is collected and everything written arrives."""
    server = await _server(kind, write=1 << 20, close_at_once=True)
    client = await _client(server)
    await _settle()
    report.counts["before_gc"] = active(server)
    gc.collect()
    report.counts["after_gc"] = active(server)
    received = 0
    loop = asyncio.get_running_loop()
    while True:
        chunk = await loop.sock_recv(client, 1 << 16)
        if not chunk:
            break
        received += len(chunk)
    report.received = received
    await _settle()
    gc.collect()
    report.counts["later"] = active(server)
    server.close()
    try:
        await asyncio.wait_for(server.wait_closed(), WAIT_CLOSED)
        report.closed = True
    except TimeoutError:
        pass
    client.close()


SCENARIOS: dict[str, Callable[[str], Any]] = {
    "abort_after_write": abort_after_write,
    "close_then_drop": close_then_drop,
    "paused_mid_read": paused_mid_read,
    "buffered_then_drop": buffered_then_drop,
}

#: How the server is made: asyncio.start_server (a handler that drops its
#: writer) or loop.create_server (a protocol only its transport holds).
KINDS = ("start_server", "create_server")


class _Dropper(asyncio.Protocol):
    """A server protocol that keeps its transport only in a cycle with itself."""

    def __init__(self, *, pause: bool, write: int, close_at_once: bool) -> None:
        self.pause = pause
        self.write = write
        self.close_at_once = close_at_once
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport  # the cycle: transport -> protocol -> transport
        if self.write:
            transport.write(b"y" * self.write)
        if self.close_at_once:
            transport.close()

    def data_received(self, data: bytes) -> None:
        if self.pause:
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        return True


async def _server(kind: str, *, pause: bool = False, write: int = 0,
                  close_at_once: bool = False) -> asyncio.AbstractServer:
    if kind == "start_server":
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if write:
                writer.write(b"y" * write)
            if close_at_once:
                writer.close()
            if pause:
                await reader.read(1)
                writer.transport.pause_reading()

        return await asyncio.start_server(handler, "127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: _Dropper(pause=pause, write=write, close_at_once=close_at_once),
        "127.0.0.1", 0)


async def _client(server: asyncio.AbstractServer) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, server.sockets[0].getsockname()[:2])
    return sock


def _drain(sock: socket.socket) -> bytes:
    data = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


def run(loop_factory: Callable[[], asyncio.AbstractEventLoop], scenario: str,
        kind: str) -> Report:
    """Run one scenario on a new loop from *loop_factory*; the loop is closed
    and collected with everything else before the report returns."""
    loop = loop_factory()
    try:
        report: Report = loop.run_until_complete(SCENARIOS[scenario](kind))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
    return report


if __name__ == "__main__":
    sys.path.insert(0, ".")
    from benchmarks.harness.loops import factory

    name = sys.argv[1]
    print(json.dumps({f"{scenario} {kind}": run(factory(name), scenario, kind).as_dict()
                      for scenario in SCENARIOS for kind in KINDS}))
