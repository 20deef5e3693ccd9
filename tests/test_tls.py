"""TLS on every loop, ours with each ``tls`` setting (its own transport, and
stock's SSLProtocol over its socket transport).

What a protocol and its peer see of a TLS connection is held to stock's:
extra info, SNI, ALPN, client certificates, flow control both ways,
close_notify on close() and as EOF, abort, sendfile's fallback; and every
kind of bad input (a plaintext client, a certificate that fails, a
truncated record, a reset or a stalled handshake, a peer that never answers
close_notify, renegotiation and key updates) ends the way it ends on stock,
closing only its own connection and leaving no descriptor or task behind.
Where an outcome is compared with stock's, the same scenario runs on a
fresh stock loop in the same test.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import socket
import ssl
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

import asyncio_relaxed
from conftest import LoopErrors, TlsFiles, run

LOCAL = "127.0.0.1"


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def is_ours(loop: asyncio.AbstractEventLoop) -> bool:
    return isinstance(loop, asyncio_relaxed.PyLoop)


def own_tls(loop: asyncio.AbstractEventLoop) -> bool:
    return is_ours(loop) and loop.config.tls is asyncio_relaxed.TlsMode.OWN  # type: ignore[attr-defined]


class Recording(asyncio.Protocol):
    """Records what a TLS transport tells it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: Any = None
        self.data = bytearray()
        self.calls: list[str] = []
        self.made = loop.create_future()
        self.lost: asyncio.Future[BaseException | None] = loop.create_future()
        self.paused = 0
        self.resumed = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.calls.append("made")
        self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> None:
        self.calls.append("eof")

    def pause_writing(self) -> None:
        self.paused += 1

    def resume_writing(self) -> None:
        self.resumed += 1

    def connection_lost(self, exc: BaseException | None) -> None:
        self.calls.append("lost")
        self.lost.set_result(exc)

    async def until(self, nbytes: int) -> None:
        while len(self.data) < nbytes and not self.lost.done():
            await asyncio.sleep(0.001)


async def serve(loop: asyncio.AbstractEventLoop, context: ssl.SSLContext,
                **kwargs: Any) -> tuple[Any, list[Recording]]:
    """A TLS server recording each connection's protocol."""
    made: list[Recording] = []

    def factory() -> Recording:
        made.append(Recording(loop))
        return made[-1]

    server = await loop.create_server(factory, LOCAL, 0, ssl=context, **kwargs)
    return server, made


def address(server: Any) -> tuple[str, int]:
    return server.sockets[0].getsockname()[:2]  # type: ignore[no-any-return]


# -- the contract -----------------------------------------------------------------


def test_echo_extra_info_and_the_transport_kind(tls_loop: asyncio.AbstractEventLoop,
                                                tls_files: TlsFiles) -> None:
    loop = tls_loop
    server_ctx, client_ctx = tls_files.server_context(), tls_files.client_context()

    async def main() -> None:
        server, made = await serve(loop, server_ctx)
        transport, client = await loop.create_connection(
            lambda: Recording(loop), *address(server), ssl=client_ctx,
            server_hostname="localhost")
        await made[0].made
        for side, ctx in ((transport, client_ctx), (made[0].transport, server_ctx)):
            assert "ssl" in type(side).__name__.lower()
            assert isinstance(side.get_extra_info("ssl_object"), ssl.SSLObject)
            assert side.get_extra_info("sslcontext") is ctx
            assert side.get_extra_info("cipher")[1].startswith("TLSv1")
            assert side.get_extra_info("compression") is None
            assert side.get_extra_info("socket").fileno() >= 0
            assert side.get_extra_info("peername")[0] == LOCAL
            assert side.get_extra_info("sockname")[0] == LOCAL
            assert side.get_extra_info("nothing", "default") == "default"
            assert not side.can_write_eof()
            with pytest.raises(NotImplementedError):
                side.write_eof()
        assert transport.get_extra_info("peercert")["subjectAltName"]
        assert made[0].transport.get_extra_info("peercert") is None  # no client certificate
        with pytest.raises(TypeError, match="data: expecting a bytes-like instance, got str"):
            transport.write("text")
        for size in (1, 1024, 1 << 20):
            payload = os.urandom(size)
            transport.write(payload)
            await made[0].until(size)
            made[0].transport.write(bytes(made[0].data))
            made[0].data.clear()
            await client.until(size)
            assert bytes(client.data) == payload
            client.data.clear()
        transport.close()
        assert transport.is_closing()
        assert await client.lost is None
        assert await made[0].lost is None
        # Both sides' protocols see EOF: the peer's close_notify, and the
        # answer to ours.
        assert client.calls == ["made", "eof", "lost"]
        assert made[0].calls == ["made", "eof", "lost"]
        server.close()
        await server.wait_closed()

    run(loop, main())


@pytest.mark.parametrize("host", [LOCAL, "0.0.0.0"])
def test_an_accepted_connections_sockname_is_its_sockets(
        tls_loop: asyncio.AbstractEventLoop, tls_files: TlsFiles, host: str) -> None:
    """A TLS server's connection says what its socket says, for a listener
    bound to one address and to the wildcard (whose connections have
    another address than the listener)."""
    loop = tls_loop
    server_ctx, client_ctx = tls_files.server_context(), tls_files.client_context()

    async def main() -> None:
        made: list[Recording] = []

        def factory() -> Recording:
            made.append(Recording(loop))
            return made[-1]

        server = await loop.create_server(factory, host, 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(
            lambda: Recording(loop), LOCAL, port, ssl=client_ctx, server_hostname="localhost")
        await made[0].made
        theirs = made[0].transport
        assert theirs.get_extra_info("sockname") == (LOCAL, port)
        assert theirs.get_extra_info("sockname") == theirs.get_extra_info("socket").getsockname()
        assert theirs.get_extra_info("sockname") == transport.get_extra_info("peername")
        transport.close()
        await made[0].lost
        server.close()
        await server.wait_closed()

    run(loop, main())


def test_sni_alpn_and_a_client_certificate(tls_loop: asyncio.AbstractEventLoop,
                                           tls_files: TlsFiles) -> None:
    loop = tls_loop
    server_ctx = tls_files.server_context()
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server_ctx.load_verify_locations(tls_files.ca)
    server_ctx.set_alpn_protocols(["h2", "http/1.1"])
    names: list[str | None] = []
    server_ctx.sni_callback = lambda sslobj, name, ctx: names.append(name)  # type: ignore[assignment,misc]
    client_ctx = tls_files.client_context()
    client_ctx.load_cert_chain(tls_files.client)
    client_ctx.set_alpn_protocols(["http/1.1"])

    async def main() -> None:
        server, made = await serve(loop, server_ctx)
        transport, _ = await loop.create_connection(
            lambda: Recording(loop), *address(server), ssl=client_ctx,
            server_hostname="localhost")
        await made[0].made
        assert names == ["localhost"]
        for side in (transport, made[0].transport):
            assert side.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
        assert made[0].transport.get_extra_info("peercert") is not None
        transport.close()
        await made[0].lost
        server.close()
        await server.wait_closed()

    run(loop, main())


def test_flow_control_with_16_mib_to_a_stalled_reader(tls_loop: asyncio.AbstractEventLoop,
                                                       tls_loop_name: str,
                                                       tls_files: TlsFiles) -> None:
    """The writer is paused above the high-water mark and resumed once the
    reader drains; nothing is lost; the buffer size is the application's
    (stock's: what waits above the socket's own buffer).  The paused
    reading shows where stock keeps it, which CPython's own tests read."""
    if tls_loop_name == "uvloop":
        pytest.skip("uvloop 0.23's TLS transport delivers nothing after resume_reading() "
                    "of what arrived while paused: the reader hangs")
    loop = tls_loop
    payload = os.urandom(16 << 20)

    async def main() -> None:
        server, made = await serve(loop, tls_files.server_context())
        transport, client = await loop.create_connection(
            lambda: Recording(loop), *address(server), ssl=tls_files.client_context(),
            server_hostname="localhost")
        transport.pause_reading()
        assert not transport.is_reading()
        assert transport._ssl_protocol._app_reading_paused
        await made[0].made
        sender = made[0]
        for offset in range(0, len(payload), 1 << 16):
            sender.transport.write(payload[offset:offset + (1 << 16)])
        # The first writes fill the socket's buffer, which pauses the TLS
        # layer; the records of the next wait in the outgoing BIO, which
        # counts towards the application's marks.
        assert sender.paused == 1
        low, high = sender.transport.get_write_buffer_limits()
        assert sender.transport.get_write_buffer_size() >= high > low
        await asyncio.sleep(0.05)
        assert not client.data  # paused: nothing delivered
        transport.resume_reading()
        assert not transport._ssl_protocol._app_reading_paused
        await client.until(len(payload))
        assert bytes(client.data) == payload
        assert sender.resumed == 1
        assert sender.transport.get_write_buffer_size() <= low
        transport.close()
        await sender.lost
        server.close()
        await server.wait_closed()

    run(loop, main(), timeout=60)


def test_abort_and_the_peers_close_notify(tls_loop: asyncio.AbstractEventLoop,
                                          tls_files: TlsFiles) -> None:
    """abort() loses the connection at once (the peer sees it end without a
    close_notify); a peer's close_notify is EOF, then connection_lost."""
    loop = tls_loop

    async def main() -> None:
        server, made = await serve(loop, tls_files.server_context())
        for how in ("abort", "peer closes"):
            transport, client = await loop.create_connection(
                lambda: Recording(loop), *address(server), ssl=tls_files.client_context(),
                server_hostname="localhost")
            await made[-1].made
            transport.write(b"last words")
            await made[-1].until(10)
            if how == "abort":
                transport.abort()
                assert await client.lost is None
                assert client.calls == ["made", "lost"]
            else:
                made[-1].transport.close()
                assert await client.lost is None
                assert client.calls == ["made", "eof", "lost"]
            await made[-1].lost
        server.close()
        await server.wait_closed()

    run(loop, main())


def test_sendfile_over_tls(tls_loop: asyncio.AbstractEventLoop, tls_loop_name: str,
                           tls_files: TlsFiles, tmp_path: Any) -> None:
    if tls_loop_name == "uvloop":
        pytest.skip("uvloop does not implement loop.sendfile")
    loop = tls_loop
    blob = os.urandom(3 << 20)
    path = tmp_path / "blob"
    path.write_bytes(blob)

    async def main() -> None:
        server, made = await serve(loop, tls_files.server_context())
        transport, _ = await loop.create_connection(
            lambda: Recording(loop), *address(server), ssl=tls_files.client_context(),
            server_hostname="localhost")
        with open(path, "rb") as file:
            assert await loop.sendfile(transport, file) == len(blob)
        await made[0].until(len(blob))
        assert bytes(made[0].data) == blob
        transport.close()
        await made[0].lost
        server.close()
        await server.wait_closed()

    run(loop, main(), timeout=60)


# -- bad input, compared with stock's outcome -------------------------------------


Scenario = Callable[[asyncio.AbstractEventLoop, TlsFiles], Coroutine[Any, Any, Any]]


def outcome(make_loop: Callable[[], asyncio.AbstractEventLoop], scenario: Scenario,
            files: TlsFiles) -> tuple[Any, list[str]]:
    """Run *scenario* on a new loop: (what it returned, the exception-handler
    calls), after checking it left no descriptor or task behind."""
    before = fds()
    loop = make_loop()
    handled: list[str] = []
    loop.set_exception_handler(lambda _, ctx: handled.append(str(ctx.get("message"))))
    try:
        result = loop.run_until_complete(asyncio.wait_for(scenario(loop, files), 20))
        loop.run_until_complete(asyncio.sleep(0.05))
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        assert not tasks, tasks
    finally:
        loop.close()
    gc.collect()
    assert fds() <= before, f"{fds() - before} descriptors left"
    return result, handled


def compare(tls_loop: asyncio.AbstractEventLoop, scenario: Scenario,
            files: TlsFiles) -> tuple[Any, list[str]]:
    """The scenario on a loop like *tls_loop* and on stock: the same outcome."""
    base = type(tls_loop)
    if is_ours(tls_loop):
        settings = {"write": tls_loop.config.write, "tls": tls_loop.config.tls}  # type: ignore[attr-defined]

        def make() -> asyncio.AbstractEventLoop:
            return asyncio_relaxed.Loop(**settings)
    else:
        def make() -> asyncio.AbstractEventLoop:
            return base()  # type: ignore[no-any-return]
    ours = outcome(make, scenario, files)
    if scenario not in _STOCK_OUTCOMES:  # stock's is the same for every loop compared
        _STOCK_OUTCOMES[scenario] = outcome(asyncio.SelectorEventLoop, scenario, files)
    assert ours == _STOCK_OUTCOMES[scenario]
    return ours


_STOCK_OUTCOMES: dict[Scenario, tuple[Any, list[str]]] = {}


async def _then_a_good_client(loop: asyncio.AbstractEventLoop, files: TlsFiles,
                              server: Any, made: list[Recording]) -> str:
    """The server still serves: a proper client's round trip."""
    transport, client = await loop.create_connection(
        lambda: Recording(loop), *address(server), ssl=files.client_context(),
        server_hostname="localhost")
    transport.write(b"ping")
    await made[-1].until(4)
    transport.close()
    await client.lost
    await made[-1].lost
    server.close()
    await server.wait_closed()
    return bytes(made[-1].data).decode()


async def plaintext_client(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    server, made = await serve(loop, files.server_context())
    reader, writer = await asyncio.open_connection(*address(server))
    writer.write(b"GET / HTTP/1.0\r\n\r\n")
    try:
        answer = await reader.read()
        ended = "eof" if not answer.startswith(b"HTTP") else "http"
    except ConnectionResetError:
        ended = "reset"
    writer.close()
    await writer.wait_closed()
    return ended, len(made), await _then_a_good_client(loop, files, server, made)


async def untrusted_certificate(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    server, made = await serve(loop, files.server_context())
    results = []
    for context, hostname in ((ssl.create_default_context(), "localhost"),
                              (files.client_context(), "example.com")):
        try:
            await loop.create_connection(asyncio.Protocol, *address(server), ssl=context,
                                         server_hostname=hostname)
        except ssl.SSLCertVerificationError as exc:
            results.append((type(exc).__name__, exc.reason, exc.verify_code))
    return results, await _then_a_good_client(loop, files, server, made)


async def expired_certificate(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.expired)
    server, _ = await serve(loop, context)
    try:
        await loop.create_connection(asyncio.Protocol, *address(server),
                                     ssl=files.client_context(), server_hostname="localhost")
    except ssl.SSLCertVerificationError as exc:
        result = (type(exc).__name__, exc.reason, exc.verify_message)
    server.close()
    await server.wait_closed()
    return result


async def reset_mid_handshake(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    server, made = await serve(loop, files.server_context())
    hello = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = files.client_context().wrap_bio(*hello, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    client_hello = hello[1].read()
    sock = socket.create_connection(address(server))
    sock.sendall(client_hello[: len(client_hello) // 2])
    await asyncio.sleep(0.02)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
    await asyncio.sleep(0.05)
    return len(made), await _then_a_good_client(loop, files, server, made)


async def handshake_timeouts(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """A client that never says hello to a server, and a server that never
    answers a client: each side's ssl_handshake_timeout ends it."""
    server, made = await serve(loop, files.server_context(), ssl_handshake_timeout=0.1)
    silent = socket.create_connection(address(server))
    silent.setblocking(False)
    ended = await asyncio.wait_for(loop.sock_recv(silent, 10), 5)  # the server gave up: EOF
    silent.close()
    listener = _listener()
    try:
        await loop.create_connection(asyncio.Protocol, *listener.getsockname(),
                                     ssl=files.client_context(), server_hostname="localhost",
                                     ssl_handshake_timeout=0.1)
    except ConnectionAbortedError as exc:
        client_side = (type(exc).__name__, str(exc))
    finally:
        listener.close()
    return ended, len(made), client_side, await _then_a_good_client(loop, files, server, made)


def _tls_peer(context: ssl.SSLContext, sock: socket.socket, script: Callable[[Any], Any]) -> Any:
    """Run *script* on a blocking TLS server socket over *sock* in a thread;
    its result, or the exception it raised."""
    result: list[Any] = []

    def target() -> None:
        try:
            conn, _ = sock.accept()
            conn.settimeout(10)
            with context.wrap_socket(conn, server_side=True) as tls_conn:
                result.append(script(tls_conn))
        except Exception as exc:
            result.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def _listener() -> socket.socket:
    """A listening socket on loopback, for a peer thread to accept from."""
    listener = socket.socket()
    listener.bind((LOCAL, 0))
    listener.listen()
    return listener


async def _connect(loop: asyncio.AbstractEventLoop, listener: socket.socket, files: TlsFiles,
                   **kwargs: Any) -> tuple[Any, Recording]:
    """A TLS client connection to *listener*, recorded."""
    return await loop.create_connection(  # type: ignore[return-value]
        lambda: Recording(loop), *listener.getsockname(), ssl=files.client_context(),
        server_hostname="localhost", **kwargs)


def _bio_peer(files: TlsFiles, sock: socket.socket, after: Callable[[Any, Any, Any], Any]) -> Any:
    """A TLS server in a thread that drives an SSLObject over *sock* by hand
    (memory BIOs), then runs ``after(conn, sslobj, outgoing)``."""
    result: list[Any] = []

    def target() -> None:
        try:
            conn, _ = sock.accept()
            conn.settimeout(10)
            incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            obj = files.server_context().wrap_bio(incoming, outgoing, server_side=True)
            while True:
                try:
                    obj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    if outgoing.pending:
                        conn.sendall(outgoing.read())
                    incoming.write(conn.recv(65536))
            if outgoing.pending:
                conn.sendall(outgoing.read())
            result.append(after(conn, obj, outgoing))
        except Exception as exc:
            result.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


async def truncated_record(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """After the handshake the peer sends one whole record and half of the
    next, then closes TCP."""
    listener = _listener()

    def after(conn: Any, obj: Any, outgoing: Any) -> str:
        obj.write(b"whole")
        conn.sendall(outgoing.read())
        obj.write(b"truncated")
        record = outgoing.read()
        conn.sendall(record[: len(record) // 2])
        conn.close()
        return "sent"

    thread, result = _bio_peer(files, listener, after)
    _, client = await _connect(loop, listener, files)
    exc = await client.lost
    await loop.run_in_executor(None, thread.join)
    listener.close()
    return bytes(client.data), client.calls, type(exc).__name__ if exc else None, result


async def unanswered_close_notify(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """close() sends close_notify; the peer reads but never answers or
    closes: ssl_shutdown_timeout ends the connection."""
    listener = _listener()
    stop = threading.Event()

    def script(conn: Any) -> bytes:
        data = conn.recv(100)
        stop.wait(10)
        return data

    thread, result = _tls_peer(files.server_context(), listener, script)
    transport, client = await _connect(loop, listener, files, ssl_shutdown_timeout=0.2)
    transport.write(b"bye")
    transport.close()
    exc = await client.lost
    stop.set()
    await loop.run_in_executor(None, thread.join)
    listener.close()
    return client.calls, type(exc).__name__ if exc else None, str(exc) if exc else None, result


async def rst_after_close_notify(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """The peer sends close_notify, then resets the connection."""
    listener = _listener()

    def script(conn: Any) -> str:
        conn.sendall(b"data")
        raw = conn.unwrap()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        raw.close()
        return "reset"

    thread, result = _tls_peer(files.server_context(), listener, script)
    _, client = await _connect(loop, listener, files)
    exc = await client.lost
    await loop.run_in_executor(None, thread.join)
    listener.close()
    return bytes(client.data), client.calls, type(exc).__name__ if exc else None, result


async def key_update_and_renegotiation(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """openssl s_client asks for a TLS 1.3 key update between two lines,
    then (TLS 1.2) a renegotiation after one.  OpenSSL 3 refuses a client's
    renegotiation by default: s_client, answered with a no_renegotiation
    alert, sends a handshake_failure alert and exits.  Each round waits for
    its own connection (the previous one's protocol has a transport too)."""
    server, made = await serve(loop, files.server_context())
    outcomes = []
    for count, (version, command) in enumerate((("-tls1_3", "K"), ("-tls1_2", "R")), 1):
        proc = await asyncio.create_subprocess_exec(
            shutil.which("openssl") or "openssl", "s_client", version, "-connect",
            "{}:{}".format(*address(server)), "-CAfile", str(files.ca), "-servername",
            "localhost",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        assert proc.stdin is not None
        while len(made) < count or made[-1].transport is None:
            await asyncio.sleep(0.01)
        proto = made[-1]
        proc.stdin.write(b"one\n")
        await proto.until(4)
        proc.stdin.write(f"{command}\n".encode())
        if command == "K":
            await asyncio.sleep(0.1)
            proc.stdin.write(b"two\n")
            await proto.until(8)
            proc.stdin.close()
        await proc.wait()
        await proto.lost
        lost = proto.lost.result()
        outcomes.append((version, bytes(proto.data), proto.calls, type(lost).__name__,
                         getattr(lost, "reason", None)))
    server.close()
    await server.wait_closed()
    return outcomes


SCENARIOS: dict[str, Scenario] = {
    "plaintext_client": plaintext_client,
    "untrusted_certificate": untrusted_certificate,
    "expired_certificate": expired_certificate,
    "reset_mid_handshake": reset_mid_handshake,
    "handshake_timeouts": handshake_timeouts,
    "truncated_record": truncated_record,
    "unanswered_close_notify": unanswered_close_notify,
    "rst_after_close_notify": rst_after_close_notify,
    "key_update_and_renegotiation": key_update_and_renegotiation,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_bad_input_ends_as_on_stock(tls_loop: asyncio.AbstractEventLoop, tls_loop_name: str,
                                    name: str, tls_files: TlsFiles) -> None:
    if tls_loop_name == "uvloop":
        pytest.skip("uvloop's TLS errors and timings are its own")
    if name == "expired_certificate" and tls_files.expired is None:
        pytest.skip("needs trustme for an expired certificate")
    if name == "key_update_and_renegotiation" and shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    _, handled = compare(tls_loop, SCENARIOS[name], tls_files)
    if not tls_loop.get_debug():
        # TLS errors are OSErrors, logged only in debug mode, where stock also
        # reports a failed accept's transport to the handler (compared above).
        assert handled == []


# -- ours only ----------------------------------------------------------------------


def _failed_handshake_leftovers(tls: str, files: TlsFiles) -> int:
    """How many transports of a connection whose certificate failed are
    still alive, with the collector off, after the loop has moved on."""
    from asyncio import sslproto

    loop = asyncio_relaxed.Loop(tls=tls)
    refs: list[Any] = []
    # The socket's transports, as stock's own test of gh-159049 finds them:
    # each TLS layer's connection_made is given its connection's.
    cls: Any = asyncio_relaxed._tls.SSLTransport if tls == "own" else sslproto.SSLProtocol
    name, original = "connection_made", cls.connection_made

    def remember(protocol: Any, transport: Any) -> None:
        refs.append(weakref.ref(transport))
        original(protocol, transport)

    async def main() -> None:
        server, _ = await serve(loop, files.server_context())
        try:
            await loop.create_connection(asyncio.Protocol, *address(server),
                                         ssl=ssl.create_default_context(),
                                         server_hostname="localhost")
        except ssl.SSLCertVerificationError:
            pass
        await asyncio.sleep(0.05)
        server.close()
        await server.wait_closed()

    gc.collect()
    gc.disable()
    setattr(cls, name, remember)
    try:
        loop.run_until_complete(main())
        for _ in range(3):
            loop.call_soon(loop.stop)
            loop.run_forever()
        assert len(refs) == 2  # the client's and the server's
        return sum(ref() is not None for ref in refs)
    finally:
        setattr(cls, name, original)
        gc.enable()
        loop.close()


def test_a_failed_handshake_leaves_no_more_cycles_than_stock(tls_files: TlsFiles) -> None:
    """The transports of a connection whose certificate failed are freed by
    reference counting alone wherever stock's are (3.14+, gh-159049: before,
    stock's _accept_connection2 and _create_connection_transport keep the
    error, and with it the frames that hold the transports, in a cycle)."""
    if sys.implementation.name != "cpython":
        pytest.skip("PyPy frees objects only when its collector runs")
    stock = _failed_handshake_leftovers("stock", tls_files)
    assert _failed_handshake_leftovers("own", tls_files) <= stock
    # In asyncio debug mode stock reports the failed accept to the exception
    # handler, whose log record keeps the error and its frames.
    debug = sys.flags.dev_mode or (not sys.flags.ignore_environment
                                   and bool(os.environ.get("PYTHONASYNCIODEBUG")))
    if sys.version_info >= (3, 14) and not debug:
        assert stock == 0


@pytest.mark.parametrize("write", ["eager", "deferred"])
def test_a_callbacks_writes_leave_as_one_batch_of_records(write: str,
                                                           tls_files: TlsFiles) -> None:
    """Deferred mode: the records of a callback's writes leave in one
    sendmsg; eager: each write's records in one send."""
    loop = asyncio_relaxed.Loop(tls="own", write=write)

    async def main() -> Any:
        server, made = await serve(loop, tls_files.server_context())
        transport, client = await loop.create_connection(
            lambda: Recording(loop), *address(server), ssl=tls_files.client_context(),
            server_hostname="localhost")
        await made[0].made
        before = loop.statistics()
        for part in (b"a" * 100, b"b" * 100, b"c" * 100):
            made[0].transport.write(part)
        await client.until(300)
        delta = loop.statistics() - before
        transport.close()
        await made[0].lost
        server.close()
        await server.wait_closed()
        return delta

    try:
        delta = run(loop, main())
    finally:
        loop.close()
    if write == "deferred":
        assert (delta.sendmsg, delta.writes_coalesced) == (1, 3)
    else:
        assert delta.send >= 3 and delta.sendmsg == 0


def test_the_loops_read_buffer_serves_tls_without_a_buffer_per_connection(
        tls_files: TlsFiles) -> None:
    """Ours keeps no receive buffer per TLS connection (stock's SSLProtocol
    holds 256 KiB each)."""
    if not hasattr(sys, "getsizeof") or sys.implementation.name != "cpython":
        pytest.skip("sys.getsizeof() tells nothing on PyPy")
    loop = asyncio_relaxed.Loop(tls="own")

    async def main() -> None:
        server, made = await serve(loop, tls_files.server_context())
        transport, _ = await loop.create_connection(
            lambda: Recording(loop), *address(server), ssl=tls_files.client_context(),
            server_hostname="localhost")
        await made[0].made
        for obj in (transport, made[0].transport):
            # Every class's slots (the compiled build's layer adds none).
            slots = [name for cls in type(obj).__mro__ for name in vars(cls).get("__slots__", ())]
            sizes = [sys.getsizeof(getattr(obj, name, None)) for name in slots]
            assert max(sizes) < 4096, sizes
        transport.close()
        await made[0].lost
        server.close()
        await server.wait_closed()

    try:
        run(loop, main())
    finally:
        loop.close()


def test_tls_setting_picks_the_transport(tls: tuple[ssl.SSLContext, ssl.SSLContext],
                                         loop_errors: LoopErrors) -> None:
    server_ctx, client_ctx = tls

    async def kind_of(loop: asyncio.AbstractEventLoop) -> str:
        server, made = await serve(loop, server_ctx)
        transport, _ = await loop.create_connection(
            asyncio.Protocol, *address(server), ssl=client_ctx, server_hostname="localhost")
        name = type(transport).__name__
        transport.close()
        await made[0].lost
        server.close()
        await server.wait_closed()
        return name

    for mode, kind in (("own", "SSLTransport"), ("stock", "_SSLProtocolTransport")):
        loop = asyncio_relaxed.Loop(tls=mode)
        loop.set_exception_handler(loop_errors.handler)
        try:
            assert run(loop, kind_of(loop)) == kind
        finally:
            loop.close()
    loop_errors.check()


@pytest.mark.parametrize("tls", ["own", "stock"])
def test_an_accepted_tls_connection_needs_no_task(tls: str, tls_files: TlsFiles,
                                                 loop_errors: LoopErrors) -> None:
    """tls=own serves an accepted TLS connection without a Task, as it serves
    a plain one; tls=stock keeps stock's _accept_connection2 task."""
    loop = asyncio_relaxed.Loop(tls=tls)
    loop.set_exception_handler(loop_errors.handler)
    tasks: list[asyncio.Task[Any]] = []

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        tasks.append(asyncio.Task(coro, loop=loop, **kwargs))
        return tasks[-1]

    async def main() -> bytes:
        server, made = await serve(loop, tls_files.server_context())
        loop.set_task_factory(counting)
        transport, client = await loop.create_connection(
            lambda: Recording(loop), *address(server), ssl=tls_files.client_context(),
            server_hostname="localhost")
        await made[0].made
        made[0].transport.write(b"hello")
        await client.until(5)
        loop.set_task_factory(None)
        transport.close()
        await made[0].lost
        server.close()
        await server.wait_closed()
        return bytes(client.data)

    try:
        assert run(loop, main()) == b"hello"
        assert len(tasks) == (0 if tls == "own" else 1), tasks
    finally:
        loop.close()
    loop_errors.check()


@pytest.mark.parametrize("runner", ["stock", "own", "tls-stock"])
def test_a_handshake_under_way_ends_with_the_run(runner: str, tls_files: TlsFiles) -> None:
    """asyncio.run() ends while a client has not finished its handshake: the
    server's side of it is closed, as stock's cancelled accept task closes
    it, and nothing of it is left for the collector to warn about (under
    tls=own there is no task: the loop's close ends the handshake)."""
    client: socket.socket | None = None

    async def main() -> None:
        nonlocal client
        loop = asyncio.get_running_loop()
        made: list[int] = []

        def factory() -> asyncio.Protocol:
            made.append(1)
            return asyncio.Protocol()

        server = await loop.create_server(factory, LOCAL, 0, ssl=tls_files.server_context())
        client = socket.create_connection(address(server))
        while not made:
            await asyncio.sleep(0.001)
        server.close()  # the listener, not the connection: as a server that stops

    gc.collect()  # what earlier tests left (PyPy frees it when its collector runs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        if runner == "stock":
            asyncio.run(main())
        else:
            asyncio_relaxed.run(main(), tls="stock" if runner == "tls-stock" else "own")
        gc.collect()
        gc.collect()  # PyPy: an object with __del__ goes one collection later
    assert client is not None
    try:
        client.settimeout(5)
        assert client.recv(1) == b""  # the server closed its end
    finally:
        client.close()
    left = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert left == []


# -- faults at chosen calls of the TLS connection's socket ------------------------


@pytest.mark.parametrize("tls", ["own", "stock"])
@pytest.mark.parametrize("where", ["recv", "send"])
@pytest.mark.parametrize("fault", ["EINTR", "EAGAIN", "short", "ECONNRESET"])
def test_socket_faults_under_tls(tls: str, where: str, fault: str, tls_files: TlsFiles,
                                 loop_errors: LoopErrors) -> None:
    """The server's socket fails at its 3rd and 5th recv or send (records in
    the middle of the stream; a short send leaves part of a record): a
    transient fault loses nothing, a fatal one ends the connection once with
    its error, and neither reaches the exception handler."""
    import _differential as diff

    plan = diff.FaultPlan({where: {2: fault, 4: fault}})
    loop = asyncio_relaxed.Loop(tls=tls)
    loop.set_exception_handler(loop_errors.handler)
    ours, theirs = socket.socketpair()
    ours = diff.FaultySocket.adopt(ours, plan)
    payload = os.urandom(200_000)

    async def main() -> tuple[bytes, Any, list[str]]:
        server_side: list[Recording] = []

        def factory() -> Recording:
            server_side.append(Recording(loop))
            return server_side[-1]

        connect = loop.create_connection(lambda: Recording(loop), sock=theirs,
                                         ssl=tls_files.client_context(),
                                         server_hostname="localhost")
        accept = loop.connect_accepted_socket(factory, ours, ssl=tls_files.server_context())
        (transport, client), _ = await asyncio.gather(connect, accept)
        server = server_side[0]
        for offset in range(0, len(payload), 20_000):
            transport.write(payload[offset:offset + 20_000])  # several records, several recvs
        await server.until(len(payload))
        server.transport.write(bytes(server.data))  # and back: several sends
        await client.until(len(payload))
        transport.close()
        lost = await server.lost
        await client.lost
        return bytes(client.data), lost, server.calls

    try:
        echoed, lost, calls = run(loop, main())
    finally:
        loop.close()
    assert [f for f in plan.fired if f[2] == fault], plan.fired
    if fault in diff.TRANSIENT:
        assert echoed == payload and lost is None
    else:
        assert payload.startswith(echoed)
        assert isinstance(lost, ConnectionResetError)
    assert calls.count("lost") == 1
    loop_errors.check()
