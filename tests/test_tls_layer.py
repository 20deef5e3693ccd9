"""The TLS layer's states and flow control (asyncio_relaxed/_tls.py), each
held to stock's SSLProtocol where both observe the same thing.

Every scenario runs on ``Loop(tls="own")`` and on stock's SelectorEventLoop
(test_tls.outcome: a fresh loop, no descriptor or task left behind, the
exception handler's messages), and the two outcomes must be equal.  What
is observed is counts and orders (the protocol's pause_writing and
resume_writing, whether the byte stream below reads, the protocol's calls,
what asyncio's logger says), never timings.  Each test pins lines a
line-deletion mutation run over the layer found no test for (issue 30,
item 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import ssl
import struct
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from test_tls import Recording, Scenario, _bio_peer, _connect, _listener, address, outcome, serve

import asyncio_relaxed
from conftest import TlsFiles

pytestmark = pytest.mark.timeout(30)


def own() -> asyncio.AbstractEventLoop:
    return asyncio_relaxed.Loop(tls="own")


def same_as_stock(scenario: Scenario, files: TlsFiles) -> Any:
    """The scenario's outcome on our own TLS layer, which must be stock's."""
    ours = outcome(own, scenario, files)
    assert ours == outcome(asyncio.SelectorEventLoop, scenario, files)
    return ours


def _tls_state(layer: Any) -> str:
    """The TLS state's name: the engine's on ours, the SSLProtocol's own on stock."""
    engine = getattr(layer, "_engine", None)
    return (engine.state if engine is not None else layer._state).name  # type: ignore[no-any-return]


async def until(predicate: Any, what: str, timeout: float = 15) -> None:
    """Poll *predicate* once per iteration (the layer's state offers no
    event), for up to *timeout* seconds: a peer thread that a loaded
    machine leaves without a CPU takes longer than any count of iterations."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0)


async def pair(loop: asyncio.AbstractEventLoop, files: TlsFiles,
               protocol: Any = None) -> tuple[Any, Any, Recording, Recording]:
    """A TLS server and a client connected to it on *loop*: (server,
    client transport, client's Recording, server side's Recording)."""
    server, made = await serve(loop, files.server_context())
    transport, client = await loop.create_connection(
        protocol or (lambda: Recording(loop)), *address(server), ssl=files.client_context(),
        server_hostname="localhost")
    await made[0].made
    return server, transport, client, made[0]


async def close_pair(server: Any, transport: Any, peer: Recording) -> None:
    transport.close()
    await peer.lost
    server.close()
    await server.wait_closed()


def test_a_layer_starts_with_what_the_base_inits_set(tls_files: TlsFiles) -> None:
    """SSLTransport.__init__ sets what FlowControlMixin.__init__ and
    BaseTransport.__init__ would (tests/test_transport.py holds their bodies
    to the lines it inlines), and set_protocol's two fields."""
    from asyncio import transports

    from asyncio_relaxed._tls import SSLTransport

    class Stock(transports._FlowControlMixin):
        def get_write_buffer_size(self) -> int:
            return 0

    loop = own()
    try:
        layer = SSLTransport(loop, asyncio.Protocol(), tls_files.server_context(),
                             server_side=True)
        stock = Stock(None, loop)
        for name in ("_extra", "_loop", "_protocol_paused", "_high_water", "_low_water"):
            assert getattr(layer, name) == getattr(stock, name), name
        assert layer._app_buffered is False
        layer.set_protocol(asyncio.BufferedProtocol())
        assert layer._app_buffered is True
        layer._closed = True  # never connected: no unclosed-transport warning
    finally:
        loop.close()


# -- flow control -----------------------------------------------------------------


class FailingFlow(Recording):
    """pause_writing and resume_writing raise (after counting)."""

    def pause_writing(self) -> None:
        super().pause_writing()
        raise RuntimeError("pause failed")

    def resume_writing(self) -> None:
        super().resume_writing()
        raise RuntimeError("resume failed")


async def write_limits_now(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """set_write_buffer_limits() looks at the buffer at once: a high mark
    under what waits pauses the writer, a low mark at it resumes it, both
    when the protocol's pause_writing/resume_writing raise (the exception
    handler hears it).  What waits is put in the backlog by stock's test
    hook, which looks at no mark."""
    seen = []
    for factory in (Recording, FailingFlow):
        server, transport, client, peer = await pair(loop, files, lambda f=factory: f(loop))
        transport._test__append_write_backlog(b"z" * 100)
        seen.append((client.paused, client.resumed, transport.get_write_buffer_size()))
        transport.set_write_buffer_limits(high=50)
        seen.append((client.paused, client.resumed, transport.get_write_buffer_limits()))
        transport.set_write_buffer_limits(high=200)  # over the low mark: still paused
        seen.append((client.paused, client.resumed, transport.get_write_buffer_limits()))
        transport.set_write_buffer_limits(high=400, low=100)
        seen.append((client.paused, client.resumed, transport.get_write_buffer_limits()))
        transport.write(b"after")
        await peer.until(105)
        seen.append((client.paused, client.resumed, bytes(peer.data)))
        await close_pair(server, transport, peer)
    return seen


def test_write_buffer_limits_pause_and_resume_at_once(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(write_limits_now, tls_files)
    assert seen[:5] == [(0, 0, 100), (1, 0, (12, 50)), (1, 0, (50, 200)), (1, 1, (100, 400)),
                        (1, 1, b"z" * 100 + b"after")]
    assert seen[5:] == seen[:5]
    assert handled == ["protocol.pause_writing() failed", "protocol.resume_writing() failed"]


def lower(transport: Any) -> Any:
    """The byte stream under a TLS transport (stock's and ours)."""
    return transport._ssl_protocol._transport


async def read_limits(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """A paused reader: ciphertext waits in the incoming BIO until its high
    mark pauses the socket's reading; set_read_buffer_limits() looks at once;
    resume_reading() drains the BIO and resumes the socket."""
    server, transport, client, peer = await pair(loop, files)
    seen = [transport.is_reading()]
    transport.pause_reading()
    seen.append((transport.is_reading(), transport.get_read_buffer_limits()))
    peer.transport.write(b"x" * (48 << 10))
    await until(lambda: transport.get_read_buffer_size() >= 48 << 10, "48 KiB in the BIO")
    seen.append(("under the default mark", lower(transport).is_reading()))
    transport.set_read_buffer_limits(high=16 << 10)
    seen.append(("over a new mark", lower(transport).is_reading(),
                 transport.get_read_buffer_limits()))
    transport.set_read_buffer_limits(high=128 << 10)  # not under the low mark (32 KiB)
    seen.append(("over the low mark", lower(transport).is_reading()))
    transport.set_read_buffer_limits(high=256 << 10)
    seen.append(("under it again", lower(transport).is_reading()))
    transport.set_read_buffer_limits(high=16 << 10)
    seen.append(("over", lower(transport).is_reading(), bytes(client.data)))
    transport.resume_reading()
    await client.until(48 << 10)
    seen.append(("drained", lower(transport).is_reading(), transport.get_read_buffer_size(),
                 len(client.data)))
    await close_pair(server, transport, peer)
    return seen


def test_read_buffer_limits_pause_the_socket_below(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(read_limits, tls_files)
    assert seen[0] is True and seen[1][0] is False
    assert seen[2:] == [("under the default mark", True),
                        ("over a new mark", False, (4096, 16384)),
                        ("over the low mark", False),
                        ("under it again", True),
                        ("over", False, b""),
                        ("drained", True, 0, 48 << 10)]
    assert handled == []


async def default_read_mark(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """The default high mark (256 KiB of ciphertext) pauses the socket's
    reading under a paused reader, whose resume_reading() resumes it."""
    server, transport, client, peer = await pair(loop, files)
    transport.pause_reading()
    peer.transport.write(b"y" * (1 << 20))
    await until(lambda: not lower(transport).is_reading(), "the socket paused")
    seen = [("paused", transport.get_read_buffer_size() >= 256 << 10, bytes(client.data))]
    transport.resume_reading()
    await client.until(1 << 20)
    seen.append(("drained", lower(transport).is_reading(), len(client.data)))
    await close_pair(server, transport, peer)
    return seen


def test_the_default_read_mark_pauses_the_socket(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(default_read_mark, tls_files)
    assert seen == [("paused", True, b""), ("drained", True, 1 << 20)]
    assert handled == []


# -- states -----------------------------------------------------------------------


async def eof_while_paused(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """The peer sends data and half-closes TCP without close_notify while
    the reader is paused: the connection stays open (FLUSHING) until
    resume_reading(), which delivers the data, EOF, then the loss; a close()
    in between closes the transport at once."""
    seen = []
    for close_first in (False, True):
        listener = _listener()

        def after(conn: Any, obj: Any, outgoing: Any) -> str:
            obj.write(b"last data")
            conn.sendall(outgoing.read())
            conn.shutdown(socket.SHUT_WR)
            conn.recv(65536)  # until the client closes
            conn.close()
            return "sent"

        thread, result = _bio_peer(files, listener, after)
        transport, client = await _connect(loop, listener, files)
        transport.pause_reading()
        layer = transport._ssl_protocol
        await until(lambda layer=layer: _tls_state(layer) == "FLUSHING", "the peer's EOF")
        seen.append((transport.is_closing(), bytes(client.data), list(client.calls)))
        if close_first:
            transport.close()
            seen.append(("closed", transport.is_closing()))
        transport.resume_reading()
        exc = await client.lost
        await loop.run_in_executor(None, thread.join)
        listener.close()
        seen.append((bytes(client.data), client.calls, type(exc).__name__ if exc else None,
                     result))
    return seen


def test_eof_while_paused_waits_for_resume_reading(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(eof_while_paused, tls_files)
    assert seen[0] == (False, b"", ["made"])
    assert seen[1] == (b"last data", ["made", "eof", "lost"], None, ["sent"])
    assert seen[3] == ("closed", True)
    assert handled == []


class KeepOpen(Recording):
    def eof_received(self) -> bool:
        super().eof_received()
        return True


async def logged(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """What asyncio's logger says of a protocol whose eof_received() returns
    true at the peer's close_notify, and of writes after close(), after
    abort() and after the connection is lost (past the threshold: one
    warning per write)."""
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("asyncio")
    log.addHandler(handler)
    try:
        server, _, client, peer = await pair(loop, files, lambda: KeepOpen(loop))
        peer.transport.close()
        await client.lost
        seen = [(client.calls, list(records))]
        records.clear()
        server2, transport2, _, peer2 = await pair(loop, files)
        transport2.close()
        for _ in range(8):
            transport2.write(b"after close")
        size = transport2.get_write_buffer_size()  # nothing kept
        await peer2.lost
        seen.append((size, list(records)))
        records.clear()
        server3, transport3, _, peer3 = await pair(loop, files)
        transport3.abort()  # UNWRAPPED at once: the writes are dropped by this layer
        for _ in range(8):
            transport3.write(b"after abort")
        size = transport3.get_write_buffer_size()  # nothing kept
        await peer3.lost
        seen.append((size, list(records)))
        records.clear()
        server4, transport4, client4, peer4 = await pair(loop, files)
        # The peer resets the connection (SO_LINGER 0): it is lost while
        # WRAPPED, and the writes after it are counted from one.
        peer4.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer4.transport.abort()
        await client4.lost
        for _ in range(8):
            transport4.write(b"after the end")
        seen.append((transport4.get_write_buffer_size(), list(records)))
        for srv in (server, server2, server3, server4):
            srv.close()
            await srv.wait_closed()
    finally:
        log.removeHandler(handler)
    return seen


def test_what_the_logger_says(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(logged, tls_files)
    assert seen[0] == (["made", "eof", "lost"],
                       ["returning true from eof_received() has no effect when using ssl"])
    assert seen[1] == (0, ["SSL connection is closed"] * 3)
    assert seen[2] == (0, ["SSL connection is closed"] * 3)
    assert seen[3] == (0, ["SSL connection is closed"] * 4)
    assert handled == []


#: What sslproto logs in debug mode, as format strings (the %r is each side's own).
DEBUG_FORMATS = {"%r starts SSL handshake", "%r: SSL handshake took %.1f ms",
                 "%r received EOF", "%r: %s"}


@contextlib.contextmanager
def asyncio_debug_formats() -> Iterator[list[str]]:
    """The format strings asyncio's logger gets meanwhile, at DEBUG level."""
    formats: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: formats.append(str(record.msg))  # type: ignore[method-assign]
    log = logging.getLogger("asyncio")
    level = log.level
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    try:
        yield formats
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


async def debug_log(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """In debug mode each side logs its handshake's start and its length,
    and the byte stream's EOF."""
    loop.set_debug(True)
    try:
        with asyncio_debug_formats() as formats:
            listener = _listener()

            def after(conn: Any, obj: Any, outgoing: Any) -> str:
                conn.shutdown(socket.SHUT_WR)  # EOF without close_notify
                conn.recv(65536)
                conn.close()
                return "eof"

            thread, result = _bio_peer(files, listener, after)
            _, client = await _connect(loop, listener, files)
            exc = await client.lost
            await loop.run_in_executor(None, thread.join)
            listener.close()
    finally:
        loop.set_debug(False)
    return (sorted(f for f in formats if f in DEBUG_FORMATS), client.calls,
            type(exc).__name__ if exc else None, result)


def test_the_debug_log(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(debug_log, tls_files)
    # One EOF from the socket's transport, one from the TLS layer.
    assert seen == (["%r received EOF", "%r received EOF", "%r starts SSL handshake",
                     "%r: SSL handshake took %.1f ms"], ["made", "eof", "lost"], None, ["eof"])
    assert handled == []


async def closed_twice(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """close() twice lets the SSL object go with the connection (stock's app
    transport drops its SSLProtocol), before the loss or after it, while
    the application keeps its transport."""
    seen = []
    for second_close_after_loss in (False, True):
        server, transport, client, peer = await pair(loop, files)
        ref = weakref.ref(transport.get_extra_info("ssl_object"))
        transport.close()
        if not second_close_after_loss:
            transport.close()
        await client.lost
        await peer.lost
        await asyncio.sleep(0)
        if second_close_after_loss:
            gc.collect()
            seen.append(("after the loss, closed once", ref() is None))
            transport.close()
        gc.collect()
        seen.append((second_close_after_loss, ref() is None, client.calls))
        server.close()
        await server.wait_closed()
    return seen


def test_closed_twice_lets_the_ssl_object_go(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(closed_twice, tls_files)
    assert seen == [(False, True, ["made", "eof", "lost"]),
                    ("after the loss, closed once", False),
                    (True, True, ["made", "eof", "lost"])]
    assert handled == []


async def backlog(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """Data in the write backlog (stock's test hook puts it there) goes
    before a later write's and counts in the buffer size; what waits there
    when the connection is lost goes with it.  abort() closes at once."""
    server, transport, client, peer = await pair(loop, files)
    transport._test__append_write_backlog(b"first ")
    seen: list[Any] = [transport.get_write_buffer_size()]
    transport.write(b"second")
    await peer.until(12)
    seen.append((bytes(peer.data), transport.get_write_buffer_size()))
    transport._test__append_write_backlog(b"never sent")
    seen.append(transport.get_write_buffer_size())
    transport.pause_reading()
    transport.abort()
    seen.append(transport.is_closing())
    await client.lost
    await peer.lost
    transport.resume_reading()  # after the loss: nothing to read or shut down
    await asyncio.sleep(0)
    seen.append(bytes(peer.data))
    server.close()
    await server.wait_closed()
    return seen, transport.get_write_buffer_size()


def test_the_write_backlog(tls_files: TlsFiles) -> None:
    (seen, _), handled = outcome(asyncio.SelectorEventLoop, backlog, tls_files)
    (ours, size_after), ours_handled = outcome(own, backlog, tls_files)
    assert ours == seen == [6, (b"first second", 0), 10, True, b"first second"]
    assert ours_handled == handled == []
    # Stock (3.11-3.14) clears its backlog at the loss but not its size,
    # which get_write_buffer_size() then still counts; ours counts nothing.
    assert size_after == 0




async def quiet_log(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """Outside debug mode nothing of the handshake is logged, even with
    asyncio's logger at DEBUG (and PYTHONASYNCIODEBUG set)."""
    debug = loop.get_debug()
    loop.set_debug(False)
    try:
        with asyncio_debug_formats() as formats:
            server, transport, client, peer = await pair(loop, files)
            await close_pair(server, transport, peer)
    finally:
        loop.set_debug(debug)
    return sorted(f for f in formats if f in DEBUG_FORMATS), client.calls


def test_no_debug_log_outside_debug_mode(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(quiet_log, tls_files)
    assert seen == ([], ["made", "eof", "lost"])
    assert handled == []


async def timers_left(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """Once the handshake is done neither side keeps its handshake timer
    scheduled (stock cancels it: a cancelled timer is no longer live)."""
    server, transport, _, peer = await pair(loop, files)
    live = [handle for handle in loop._scheduled  # type: ignore[attr-defined]
            if not handle.cancelled()
            and getattr(handle._callback, "__name__", "") == "_check_handshake_timeout"]
    await close_pair(server, transport, peer)
    return len(live)


def test_the_handshake_timer_goes_with_the_handshake(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(timers_left, tls_files)
    assert seen == 0
    assert handled == []


async def cancelled_handshake(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """A connect cancelled while the handshake waits for a server that never
    answers: create_connection closes the transport mid-handshake, which
    aborts the connection at once (no close_notify before a handshake), so
    the server sees the end long before any handshake timeout."""
    listener = _listener()
    with listener:
        try:
            await asyncio.wait_for(_connect(loop, listener, files), 0.2)
        except TimeoutError:
            pass
        else:
            raise AssertionError("the handshake finished without a server")
        await asyncio.sleep(0)  # the abort's connection_lost
        await asyncio.sleep(0)
        timers = len([handle for handle in loop._scheduled  # type: ignore[attr-defined]
                      if not handle.cancelled() and "_check_handshake_timeout" in repr(handle)])
        conn, _ = listener.accept()  # the connection is in the backlog
        with conn:
            conn.setblocking(False)
            hello = b""
            try:
                # Read on the loop: the abort's close runs in a later iteration.
                while chunk := await asyncio.wait_for(loop.sock_recv(conn, 65536), 5):
                    hello += chunk
                end = "eof"
            except ConnectionResetError:
                end = "reset"
            except TimeoutError:
                end = "still open"
    return (hello[:1], end, timers)


def test_a_close_during_the_handshake_aborts(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(cancelled_handshake, tls_files)
    assert seen[0] == b"\x16"  # a ClientHello went out (a TLS handshake record)
    assert seen[1] in ("eof", "reset")
    assert seen[2] == 0  # the handshake timer went with the connection
    assert handled == []


def _send_close_notify(conn: Any, obj: Any, outgoing: Any) -> None:
    """A _bio_peer's close_notify, sent (its unwrap then waits for ours)."""
    try:
        obj.unwrap()
    except ssl.SSLWantReadError:
        pass
    conn.sendall(outgoing.read())


async def _connect_as(loop: asyncio.AbstractEventLoop, listener: socket.socket,
                      files: TlsFiles, protocol: Any) -> tuple[Any, Any]:
    """A TLS client connection to *listener* with ``protocol(loop)``."""
    return await loop.create_connection(  # type: ignore[return-value]
        lambda: protocol(loop), *listener.getsockname(), ssl=files.client_context(),
        server_hostname="localhost")


async def _client_closes(loop: asyncio.AbstractEventLoop, files: TlsFiles,
                         listener: socket.socket, after: Any) -> tuple[Recording, Any, Any]:
    """A client of a _bio_peer running *after* closes once it has 2 bytes:
    (the client, what connection_lost got, the peer's result)."""
    thread, result = _bio_peer(files, listener, after)
    with listener:
        transport, client = await _connect(loop, listener, files, ssl_shutdown_timeout=15)
        await client.until(2)
        transport.close()
        exc = await asyncio.wait_for(client.lost, 10)
        await loop.run_in_executor(None, thread.join)
    return client, exc, result


class ClosingOnEof(Recording):
    """Records whether its transport says it is closing when EOF arrives."""

    def eof_received(self) -> None:
        self.calls.append(f"eof, closing={self.transport.is_closing()}")
        # The layer starts its shutdown after eof_received returns.
        self.loop.call_soon(lambda: self.calls.append(
            f"then closing={self.transport.is_closing()}"))


async def peer_close_notify(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """The peer sends close_notify first: once eof_received has returned the
    transport is closing (stock's _start_shutdown marks it), and the
    connection ends cleanly."""
    listener = _listener()

    def after(conn: Any, obj: Any, outgoing: Any) -> str:
        _send_close_notify(conn, obj, outgoing)
        conn.recv(65536)  # the client's close_notify, or its close
        conn.close()
        return "sent"

    thread, result = _bio_peer(files, listener, after)
    with listener:
        _, client = await _connect_as(loop, listener, files, ClosingOnEof)
        exc = await client.lost
        await loop.run_in_executor(None, thread.join)
    return client.calls, exc, result


def test_the_peers_close_notify_closes_the_transport(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(peer_close_notify, tls_files)
    assert seen == (["made", "eof, closing=False", "then closing=True", "lost"], None, ["sent"])
    assert handled == []


async def corrupt_after_close_notify(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """close() sends close_notify; the peer answers with a record that does
    not decrypt: the shutdown fails at once with the SSL error (the
    connection does not wait for ssl_shutdown_timeout)."""
    listener = _listener()

    def after(conn: Any, obj: Any, outgoing: Any) -> str:
        obj.write(b"hi")  # the client closes once it has this: after the handshake's reads
        conn.sendall(outgoing.read())
        conn.recv(65536)  # the client's close_notify
        conn.sendall(b"\x17\x03\x03\x00\x20" + b"\x00" * 32)  # application data, bad MAC
        try:
            conn.recv(65536)
        except OSError:
            pass
        conn.close()
        return "sent"

    client, exc, result = await _client_closes(loop, files, listener, after)
    return client.calls, type(exc).__name__, result


def test_a_corrupt_record_during_shutdown_ends_it(tls_files: TlsFiles) -> None:
    seen, _ = same_as_stock(corrupt_after_close_notify, tls_files)
    assert seen[0] == ["made", "lost"]
    assert seen[1] == "SSLError"
    assert seen[2] == ["sent"]


class TimersOnEof(Recording):
    """Counts the live shutdown timers just after eof_received returns
    (stock's is a lambda around _check_shutdown_timeout, ours the method)."""

    def eof_received(self) -> None:
        self.calls.append("eof")
        self.loop.call_soon(self.count_timers)

    def count_timers(self) -> None:
        live = [handle for handle in self.loop._scheduled  # type: ignore[attr-defined]
                if not handle.cancelled() and getattr(handle._callback, "__name__", "") in (
                    "_check_shutdown_timeout", "<lambda>")]
        self.calls.append(f"shutdown timers {len(live)}")


async def answered_close_notify(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """close() sends close_notify and the peer answers with its own: the
    shutdown is complete (eof_received), and its timer is cancelled then
    (3.11-3.13) or kept until the socket has closed (3.14+), as on stock."""
    listener = _listener()

    def after(conn: Any, obj: Any, outgoing: Any) -> str:
        obj.write(b"hi")
        conn.sendall(outgoing.read())
        conn.recv(65536)  # the client's close_notify
        _send_close_notify(conn, obj, outgoing)
        conn.recv(65536)  # the client's close
        conn.close()
        return "sent"

    thread, result = _bio_peer(files, listener, after)
    with listener:
        transport, client = await _connect_as(loop, listener, files, TimersOnEof)
        await client.until(2)
        transport.close()
        exc = await client.lost
        client.count_timers()  # none once the connection is lost
        await loop.run_in_executor(None, thread.join)
    return client.calls, exc, result


def test_the_shutdown_timer_after_a_clean_shutdown(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(answered_close_notify, tls_files)
    assert seen[0][:2] == ["made", "eof"] and seen[0][3:] == ["lost", "shutdown timers 0"]
    assert seen[1:] == (None, ["sent"])
    assert handled == []


async def eof_after_close_notify(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """close() sends close_notify; the peer reads it and closes TCP without
    answering: the EOF ends the shutdown, and the protocol hears eof_received
    before connection_lost, as on stock."""
    listener = _listener()

    def after(conn: Any, obj: Any, outgoing: Any) -> str:
        obj.write(b"hi")
        conn.sendall(outgoing.read())
        conn.recv(65536)  # the client's close_notify
        conn.close()
        return "closed"

    client, exc, result = await _client_closes(loop, files, listener, after)
    return client.calls, exc, result


def test_the_peers_eof_ends_a_shutdown(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(eof_after_close_notify, tls_files)
    assert seen == (["made", "eof", "lost"], None, ["closed"])
    assert handled == []


class SmallBuffers(asyncio.BufferedProtocol):
    """A BufferedProtocol that lends 100-byte buffers and records its calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.buffer = bytearray(100)
        self.data = bytearray()
        self.calls: list[str] = []
        self.got_all = loop.create_future()
        self.lost: asyncio.Future[BaseException | None] = loop.create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.calls.append("made")

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data += self.buffer[:nbytes]
        if len(self.data) >= 1000 and not self.got_all.done():
            self.calls.append("all data")
            self.got_all.set_result(None)

    def eof_received(self) -> None:
        # Before this layer's own close_notify: not closing yet, as on stock.
        self.calls.append(f"eof, closing={self.transport.is_closing()}")

    def connection_lost(self, exc: BaseException | None) -> None:
        self.calls.append("lost")
        self.lost.set_result(exc)


async def buffered_reads(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """A BufferedProtocol whose buffers are smaller than a record: the rest
    of what was decrypted comes in later iterations without more ciphertext;
    then the peer's close_notify is eof_received, and the connection ends."""
    listener = _listener()
    go_on = threading.Event()

    def after(conn: Any, obj: Any, outgoing: Any) -> str:
        obj.write(bytes(range(250)) * 4)  # 1000 bytes in one record
        conn.sendall(outgoing.read())
        go_on.wait(10)  # until the client has it all
        _send_close_notify(conn, obj, outgoing)
        conn.recv(65536)  # the client's close_notify, or its close
        conn.close()
        return "sent"

    thread, result = _bio_peer(files, listener, after)
    with listener:
        _, client = await _connect_as(loop, listener, files, SmallBuffers)
        await asyncio.wait_for(client.got_all, 10)
        go_on.set()
        exc = await asyncio.wait_for(client.lost, 10)
        await loop.run_in_executor(None, thread.join)
    return client.calls, bytes(client.data) == bytes(range(250)) * 4, exc, result


def test_a_buffered_protocol_over_tls(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(buffered_reads, tls_files)
    assert seen == (["made", "all data", "eof, closing=False", "lost"], True, None, ["sent"])
    assert handled == []


class RaisingOnEof(Recording):
    def eof_received(self) -> None:
        self.calls.append("eof")
        raise ZeroDivisionError("from eof_received")


async def eof_received_raises(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
    """The peer's close_notify reaches an eof_received that raises: the
    error goes to the exception handler in stock's words, and the
    connection ends with it."""
    listener = _listener()

    def after(conn: Any, obj: Any, outgoing: Any) -> str:
        _send_close_notify(conn, obj, outgoing)
        try:
            conn.recv(65536)
        except OSError:
            pass
        conn.close()
        return "sent"

    thread, result = _bio_peer(files, listener, after)
    with listener:
        _, client = await _connect_as(loop, listener, files, RaisingOnEof)
        exc = await asyncio.wait_for(client.lost, 10)
        await loop.run_in_executor(None, thread.join)
    return client.calls, type(exc).__name__, result


def test_an_eof_received_that_raises(tls_files: TlsFiles) -> None:
    seen, handled = same_as_stock(eof_received_raises, tls_files)
    assert seen == (["made", "eof", "lost"], "ZeroDivisionError", ["sent"])
    assert handled == ["Error calling eof_received()"]


class _ShortWrites:
    """An SSL core whose write() takes the first *take* bytes of the next
    call only (an SSLObject's write that stopped short), then every byte."""

    def __init__(self, core: Any, take: int) -> None:
        self.core = core
        self.take = take

    def write(self, data: Any) -> int:
        take, self.take = self.take, -1
        return self.core.write(data[:take] if take >= 0 else data)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)


@pytest.mark.parametrize("build", ["compiled", "pure"])
def test_a_short_ssl_write_keeps_the_rest_for_the_next(tls_files: TlsFiles, build: str) -> None:
    """What SSLObject.write() did not take waits in the backlog, counted in
    the write buffer, and leaves before the next write's data, on either
    build's write() (the compiled one's fast path included)."""
    cls = asyncio_relaxed.CLoop if build == "compiled" else asyncio_relaxed.PyLoop
    if cls is None:
        pytest.skip(f"no compiled build here: {asyncio_relaxed._builds.WHY}")

    async def scenario(loop: asyncio.AbstractEventLoop, files: TlsFiles) -> Any:
        server, transport, _, peer = await pair(loop, files)
        transport._ssl = _ShortWrites(transport._ssl, 5)
        transport.write(b"hello world")
        size = transport.get_write_buffer_size()
        transport.write(b", more")
        await until(lambda: len(peer.data) >= 17, "the peer has every byte")
        await close_pair(server, transport, peer)
        return size, bytes(peer.data)

    (size, data), handled = outcome(lambda: cls(tls="own"), scenario, tls_files)
    assert size == 6 and data == b"hello world, more"
    assert handled == []
