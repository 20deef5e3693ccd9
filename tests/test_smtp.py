"""aiosmtplib against aiosmtpd, both on the loop under test: STARTTLS and
implicit TLS on every loop, ours with each ``tls`` setting (#30).

The server is aiosmtpd's ``SMTP`` protocol served by ``loop.create_server``
on the loop under test (not its ``Controller``, which runs a loop of its own
in a thread); the client is aiosmtplib on the same loop, over loopback, with
the certificates of ``tls_files`` (trustme's, or the openssl command's where
trustme has no build: PyPy).  Each test asserts the message the server's
handler received, byte for byte, and the class of the transport that carried
TLS at each end.  (aiohttp and websockets over TLS: tests/test_tls_libraries.py;
asyncpg's start_tls: tests/test_clients.py.)

What carries TLS where:

- the client's STARTTLS is ``loop.start_tls()`` (aiosmtplib's
  ``SMTPProtocol.start_tls``) and its implicit TLS ``create_connection(ssl=)``:
  the loop's TLS transport, ours under ``tls=own``;
- the server's implicit TLS is ``create_server(ssl=)``: the loop's too;
- the server's STARTTLS is not the loop's on any loop: aiosmtpd 1.4's
  ``smtp_STARTTLS`` builds ``asyncio.sslproto.SSLProtocol`` itself and sets it
  as the protocol of the plain transport, so there stock's TLS runs over the
  loop's own plain transport, which the test asserts as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

import asyncio_relaxed
from conftest import TlsFiles, run

pytestmark = pytest.mark.timeout(30)

aiosmtplib = pytest.importorskip(
    "aiosmtplib", reason="aiosmtplib is not installed (pyproject.toml's test extra has it)")
aiosmtpd_smtp = pytest.importorskip(
    "aiosmtpd.smtp", reason="aiosmtpd is not installed (pyproject.toml's test extra has it)")

LOCAL = "127.0.0.1"
SENDER = "sender@example.com"
RECIPIENTS = ["one@example.com", "two@example.org"]
#: What aiosmtpd's handler sees of a message is exactly what the client sent
#: when it ends in CRLF and has no bare CR or LF (aiosmtplib's data() makes
#: every line end CRLF and stuffs the dots, aiosmtpd unstuffs them).  8-bit
#: bytes (BODY=8BITMIME), lines that start with a dot or are one dot, and
#: 367 KiB in all: many TLS records, more than the loop's one read (256 KiB).
_rng = random.Random(30)
MESSAGE = b"".join([
    b"From: sender@example.com\r\nTo: one@example.com, two@example.org\r\n",
    b"Subject: issue 30\r\nMIME-Version: 1.0\r\n",
    b"Content-Type: application/octet-stream\r\nContent-Transfer-Encoding: 8bit\r\n\r\n",
    b".\r\n..\r\n.leading dot\r\n",
    *(bytes(_rng.choice(range(0x20, 0x100)) for _ in range(_rng.randrange(1, 990))) + b"\r\n"
      for _ in range(740)),
    b"the end.\r\n",
])  # fmt: skip

STOCK_TLS = "asyncio.sslproto._SSLProtocolTransport"


def name(transport: Any) -> str:
    kind = type(transport)
    return f"{kind.__module__}.{kind.__qualname__}"


def uvloop_loop(loop: asyncio.AbstractEventLoop) -> bool:
    return type(loop).__module__.startswith("uvloop")


def plain_kind(loop: asyncio.AbstractEventLoop) -> str:
    """The class of the loop's TCP transport."""
    if isinstance(loop, asyncio_relaxed.PyLoop):
        return f"{loop._SocketTransport.__module__}.{loop._SocketTransport.__qualname__}"
    if uvloop_loop(loop):
        return "uvloop.loop.TCPTransport"
    return "asyncio.selector_events._SelectorSocketTransport"


def tls_kind(loop: asyncio.AbstractEventLoop) -> str:
    """The class of the TLS transport the loop makes (``ssl=``, ``start_tls()``)."""
    if isinstance(loop, asyncio_relaxed.PyLoop):
        own = loop.config.tls is asyncio_relaxed.TlsMode.OWN
        cls = loop._SSLTransport  # the build's own (_tls, or _speedups' subclass)
        return f"{cls.__module__}.{cls.__qualname__}" if own else STOCK_TLS
    if uvloop_loop(loop):
        return "uvloop.loop._SSLProtocolTransport"
    return STOCK_TLS


@dataclass
class Received:
    """One message as aiosmtpd's handler saw it, and what carried it."""

    mail_from: str
    rcpt_tos: list[str]
    content: bytes
    transport: str  # the server protocol's transport when the message came
    below: str | None  # the plain transport under aiosmtpd's STARTTLS, if any
    tls_version: str | None


class Inbox:
    """aiosmtpd's handler: keeps each message."""

    def __init__(self) -> None:
        self.messages: list[Received] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        ssl_object = server.transport.get_extra_info("ssl_object")
        below = server._original_transport
        self.messages.append(Received(
            envelope.mail_from, list(envelope.rcpt_tos), envelope.content,
            name(server.transport), None if below is None else name(below),
            None if ssl_object is None else ssl_object.version()))  # fmt: skip
        return "250 Message accepted for delivery"


class Serving:
    """aiosmtpd's SMTP on *loop*.create_server(), each connection's protocol
    kept, to wait until it has ended and its handler task has finished."""

    def __init__(self, loop: asyncio.AbstractEventLoop, inbox: Inbox,
                 tls_context: ssl.SSLContext | None) -> None:
        self.sessions: list[Any] = []
        base = aiosmtpd_smtp.SMTP

        class Server(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                # loop= given: else aiosmtpd asks asyncio.get_event_loop().
                super().__init__(inbox, hostname="smtp.test", tls_context=tls_context,
                                 loop=loop, timeout=20)
                self.ended: asyncio.Future[None] = loop.create_future()

            def connection_lost(self, error: Exception | None) -> None:
                # aiosmtpd calls it itself after a failed STARTTLS handshake,
                # and the transport calls it again.
                if self.ended.done():
                    return
                super().connection_lost(error)
                self.ended.set_result(None)

        def factory() -> Any:
            self.sessions.append(Server())
            return self.sessions[-1]

        self.factory: Callable[[], Any] = factory

    async def ended(self) -> None:
        """Until every connection so far has ended, its handler task with it."""
        for session in self.sessions:
            await asyncio.wait_for(session.ended, 10)
            await asyncio.wait([session._handler_coroutine], timeout=10)
            assert session._handler_coroutine.done()

    def abort(self) -> None:
        """End every connection still open (after a failed assertion)."""
        for session in self.sessions:
            below = session._original_transport or session.transport
            if not session.ended.done() and below is not None:
                below.abort()


@contextlib.asynccontextmanager
async def smtp_server(loop: asyncio.AbstractEventLoop, inbox: Inbox, *,
                      starttls: ssl.SSLContext | None = None,
                      implicit: ssl.SSLContext | None = None) -> AsyncIterator[tuple[Serving, int]]:
    """aiosmtpd with STARTTLS (*starttls*) or over TLS (*implicit*): the
    sessions and the port.  On the way out every connection is ended, so a
    test that fails half-way leaves none open for the loop's close(): with
    one open, uvloop 0.23's close() blocked past the test's timeout."""
    serving = Serving(loop, inbox, starttls)
    server = await loop.create_server(serving.factory, LOCAL, 0, ssl=implicit)
    try:
        yield serving, server.sockets[0].getsockname()[1]
        await serving.ended()
    finally:
        server.close()
        serving.abort()
        if serving.sessions:
            await asyncio.wait([s.ended for s in serving.sessions], timeout=5)
        await server.wait_closed()


@contextlib.asynccontextmanager
async def smtp_client(port: int, **options: Any) -> AsyncIterator[Any]:
    """An aiosmtplib client, connected; closed on the way out."""
    # local_hostname and tls_context given: else aiosmtplib runs
    # socket.getfqdn() and builds its context in a thread.
    smtp = aiosmtplib.SMTP(hostname=LOCAL, port=port, local_hostname="client.test",
                           timeout=10, **options)
    await smtp.connect()
    try:
        yield smtp
    finally:
        smtp.close()


async def send(smtp: Any) -> None:
    errors, reply = await smtp.sendmail(SENDER, RECIPIENTS, MESSAGE, mail_options=["BODY=8BITMIME"])
    assert (errors, reply) == ({}, "Message accepted for delivery")


def test_smtp_starttls(tls_loop: asyncio.AbstractEventLoop, tls_files: TlsFiles) -> None:
    """Connect in the clear, STARTTLS, send a message, quit."""
    loop = tls_loop
    inbox = Inbox()
    seen: list[str] = []

    async def main() -> None:
        async with smtp_server(loop, inbox, starttls=tls_files.server_context()) as (_, port), \
                smtp_client(port, start_tls=False,
                            tls_context=tls_files.client_context()) as smtp:
            seen.append(name(smtp.transport))
            assert smtp.get_transport_info("sslcontext") is None
            await smtp.starttls()
            seen.append(name(smtp.transport))
            assert smtp.get_transport_info("ssl_object").version() == "TLSv1.3"
            await send(smtp)
            await smtp.quit()

    run(loop, main())
    assert seen == [plain_kind(loop), tls_kind(loop)]
    assert inbox.messages == [Received(SENDER, RECIPIENTS, MESSAGE, STOCK_TLS, plain_kind(loop),
                                       "TLSv1.3")]


def test_smtp_implicit_tls(tls_loop: asyncio.AbstractEventLoop, tls_files: TlsFiles) -> None:
    """A server with ssl=, a client with use_tls=True: TLS from the first byte."""
    loop = tls_loop
    inbox = Inbox()
    seen: list[str] = []

    async def main() -> None:
        async with smtp_server(loop, inbox, implicit=tls_files.server_context()) as (_, port), \
                smtp_client(port, use_tls=True, tls_context=tls_files.client_context()) as smtp:
            seen.append(name(smtp.transport))
            assert smtp.get_transport_info("ssl_object").version() == "TLSv1.3"
            await send(smtp)
            await smtp.quit()

    run(loop, main())
    assert seen == [tls_kind(loop)]
    assert inbox.messages == [Received(SENDER, RECIPIENTS, MESSAGE, tls_kind(loop), None,
                                       "TLSv1.3")]


def test_smtp_starttls_untrusted_then_the_next_client(tls_loop: asyncio.AbstractEventLoop,
                                                      tls_files: TlsFiles) -> None:
    """A client that does not trust the server's certificate: starttls()
    raises the verification error (the type stock's start_tls raises: the
    run on the stock loop checks it), the server ends that connection and
    serves the next client, whose STARTTLS and message go through."""
    loop = tls_loop
    inbox = Inbox()
    seen: list[str] = []

    async def main() -> None:
        async with smtp_server(loop, inbox, starttls=tls_files.server_context()) as (serving,
                                                                                     port):
            async with smtp_client(port, start_tls=False,
                                   tls_context=ssl.create_default_context()) as untrusting:
                with pytest.raises(BaseException) as raised:
                    await untrusting.starttls()
                assert type(raised.value) is ssl.SSLCertVerificationError
                assert untrusting.transport.is_closing()
            await serving.ended()
            assert (len(serving.sessions), inbox.messages) == (1, [])

            async with smtp_client(port, start_tls=False,
                                   tls_context=tls_files.client_context()) as trusting:
                await trusting.starttls()
                seen.append(name(trusting.transport))
                await send(trusting)
                await trusting.quit()
            await serving.ended()
            assert len(serving.sessions) == 2

    run(loop, main())
    assert seen == [tls_kind(loop)]
    assert inbox.messages == [Received(SENDER, RECIPIENTS, MESSAGE, STOCK_TLS, plain_kind(loop),
                                       "TLSv1.3")]
