"""start_tls() on every loop, ours with each ``tls`` setting: a plain
connection upgraded on both sides (streams, as SMTP's STARTTLS and
PostgreSQL's SSLRequest do it), and TLS over TLS (a tunnel through a TLS
proxy).  Under ``tls=own`` the loop's own TLS layer carries each upgrade;
the bytes, the end of the connection and what the exception handler hears
are held to stock's.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from typing import Any

import pytest

import asyncio_relaxed
from conftest import LoopErrors, run

LOCAL = "127.0.0.1"
#: Bigger than the loop's read buffer and a TLS record, both ways.
BLOB = random.Random(30).randbytes(1024 * 1024 + 17)


def own_tls(loop: asyncio.AbstractEventLoop) -> bool:
    return (isinstance(loop, asyncio_relaxed.PyLoop)
            and loop.config.tls is asyncio_relaxed.TlsMode.OWN)


def kind(loop: asyncio.AbstractEventLoop) -> str | None:
    """The class name start_tls() returns on *loop*, where we know it."""
    if not isinstance(loop, asyncio_relaxed.PyLoop):
        return None
    return "SSLTransport" if own_tls(loop) else "_SSLProtocolTransport"


async def _echo_upgraded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         context: ssl.SSLContext, upgrades: int) -> None:
    """A server that upgrades *upgrades* more times on request, then echoes
    lines' lengths and payloads until EOF."""
    for _ in range(upgrades):
        assert await reader.readline() == b"STARTTLS\n"
        writer.write(b"GO\n")
        await writer.drain()
        await writer.start_tls(context)
    while True:
        header = await reader.readline()
        if not header:
            break
        payload = await reader.readexactly(int(header))
        writer.write(header + payload)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


async def _upgraded_client(loop: asyncio.AbstractEventLoop, port: int,
                           context: ssl.SSLContext, first: ssl.SSLContext | None,
                           upgrades: int) -> list[Any]:
    """Connect (over TLS when *first*), upgrade *upgrades* times, echo
    BLOB, close; the transports start_tls() returned."""
    if first is None:
        reader, writer = await asyncio.open_connection(LOCAL, port)
    else:
        reader, writer = await asyncio.open_connection(LOCAL, port, ssl=first,
                                                       server_hostname="localhost")
    made = []
    for _ in range(upgrades):
        writer.write(b"STARTTLS\n")
        assert await reader.readline() == b"GO\n"
        await writer.start_tls(context, server_hostname="localhost")
        made.append((writer.transport, getattr(writer.transport, "_transport", None)))
    header = b"%d\n" % len(BLOB)
    writer.write(header + BLOB)
    assert await reader.readline() == header
    assert await reader.readexactly(len(BLOB)) == BLOB
    assert ("DNS", "localhost") in writer.get_extra_info("peercert")["subjectAltName"]
    assert writer.get_extra_info("sslcontext") is context
    assert writer.get_extra_info("peername")[0] == LOCAL  # from the socket below
    writer.close()
    await writer.wait_closed()
    assert await reader.read() == b""
    return made


@pytest.mark.parametrize("over_tls", [False, True], ids=["plain", "tls-over-tls"])
def test_start_tls_on_both_sides(tls_loop: asyncio.AbstractEventLoop, tls_loop_name: str,
                                 tls: tuple[ssl.SSLContext, ssl.SSLContext],
                                 over_tls: bool) -> None:
    server_ctx, client_ctx = tls
    if over_tls and tls_loop_name == "uvloop":
        pytest.skip("uvloop 0.23's start_tls() does not take its own TLS transport")
    upgrades = 1

    async def main() -> list[Any]:
        served: list[asyncio.Task[None]] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            served.append(asyncio.current_task())  # type: ignore[arg-type]
            await _echo_upgraded(reader, writer, server_ctx, upgrades)

        server = await asyncio.start_server(handle, LOCAL, 0,
                                            ssl=server_ctx if over_tls else None)
        port = server.sockets[0].getsockname()[1]
        made = await _upgraded_client(tls_loop, port, client_ctx,
                                      client_ctx if over_tls else None, upgrades)
        await asyncio.gather(*served)
        server.close()
        await server.wait_closed()
        return made

    made = run(tls_loop, main())
    expected = kind(tls_loop)
    if expected is not None:
        assert [type(transport).__name__ for transport, _ in made] == [expected]
    if own_tls(tls_loop):
        below = made[0][1]
        assert type(below).__name__ == ("SSLTransport" if over_tls else "SocketTransport")


def test_start_tls_argument_errors_as_stock(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """A context that is not an SSLContext, and a transport start_tls()
    cannot take: stock's errors and texts."""

    async def errors(loop: asyncio.AbstractEventLoop) -> list[str]:
        server = await loop.create_server(asyncio.Protocol, LOCAL, 0)
        transport, protocol = await loop.create_connection(
            asyncio.Protocol, *server.sockets[0].getsockname()[:2])
        seen = []
        class NotAContext:
            def __repr__(self) -> str:
                return "<NotAContext>"

        for context in (None, NotAContext()):
            with pytest.raises(TypeError) as raised:
                await loop.start_tls(transport, protocol, context)  # type: ignore[arg-type]
            seen.append(str(raised.value))

        class Unsupported(asyncio.Transport):
            def __repr__(self) -> str:
                return "<Unsupported>"

        with pytest.raises(TypeError) as raised:
            await loop.start_tls(Unsupported(), protocol, tls[1])
        seen.append(str(raised.value).replace(repr(loop), "LOOP"))
        transport.close()
        server.close()
        await server.wait_closed()
        return seen

    stock = asyncio.new_event_loop()
    ours = asyncio_relaxed.Loop(tls="own")
    try:
        assert run(ours, errors(ours)) == run(stock, errors(stock))
    finally:
        ours.close()
        stock.close()


def test_a_failed_start_tls_closes_the_connection(tls_loop: asyncio.AbstractEventLoop,
                                                  tls: tuple[ssl.SSLContext, ssl.SSLContext],
                                                  loop_errors: LoopErrors) -> None:
    """A certificate the client does not trust: start_tls() raises the
    verification error and the plain connection below is closed."""
    server_ctx, _ = tls

    async def main() -> None:
        lost = tls_loop.create_future()

        class Server(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                self.upgrade = asyncio.ensure_future(
                    tls_loop.start_tls(transport, self, server_ctx, server_side=True))
                self.upgrade.add_done_callback(lambda f: f.exception())

            def connection_lost(self, exc: BaseException | None) -> None:
                if not lost.done():
                    lost.set_result(None)

        server = await tls_loop.create_server(Server, LOCAL, 0)
        transport, protocol = await tls_loop.create_connection(
            asyncio.Protocol, *server.sockets[0].getsockname()[:2])
        with pytest.raises(ssl.SSLCertVerificationError):
            await tls_loop.start_tls(transport, protocol, ssl.create_default_context(),
                                     server_hostname="localhost")
        assert transport.is_closing()
        await asyncio.wait_for(lost, 10)
        server.close()
        await server.wait_closed()

    run(tls_loop, main())


def test_tls_over_tls_shutdown_timeout_ends_both_layers(
        tls: tuple[ssl.SSLContext, ssl.SSLContext], loop_errors: LoopErrors) -> None:
    """The inner TLS connection's peer never answers close_notify: after
    ssl_shutdown_timeout the inner layer aborts the outer TLS transport
    below it (``_force_close``), and both end, the protocol told once.  On
    3.11.7 stock's outer transport fails that call (gh-113214); the loop's
    own layer ends as later versions' stock does."""
    server_ctx, client_ctx = tls
    loop = asyncio_relaxed.Loop(tls="own")
    loop.set_exception_handler(loop_errors.handler)

    async def main() -> None:
        upgraded = loop.create_future()

        class Server(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                self.transport = transport

            def data_received(self, data: bytes) -> None:
                assert data == b"UPGRADE"
                self.transport.write(b"GO")
                task = asyncio.ensure_future(loop.start_tls(self.transport, self, server_ctx,
                                                            server_side=True))
                task.add_done_callback(lambda f: upgraded.set_result(f.result()))

        class Client(asyncio.Protocol):
            def __init__(self) -> None:
                self.go = loop.create_future()
                self.lost = loop.create_future()

            def data_received(self, data: bytes) -> None:
                self.go.set_result(data)

            def connection_lost(self, exc: BaseException | None) -> None:
                self.lost.set_result(exc)

        server = await loop.create_server(Server, LOCAL, 0, ssl=server_ctx)
        outer, client = await loop.create_connection(
            Client, LOCAL, server.sockets[0].getsockname()[1], ssl=client_ctx,
            server_hostname="localhost")
        outer.write(b"UPGRADE")
        assert await client.go == b"GO"
        inner = await loop.start_tls(outer, client, client_ctx, server_hostname="localhost",
                                     ssl_shutdown_timeout=0.2)
        inner_server = await upgraded
        inner_server.pause_reading()  # it never reads the close_notify
        inner.close()
        await asyncio.wait_for(client.lost, 10)
        assert outer.is_closing()
        assert inner.is_closing()
        inner_server.close()
        server.close()
        await server.wait_closed()

    try:
        run(loop, main())
    finally:
        loop.close()
    loop_errors.check()
