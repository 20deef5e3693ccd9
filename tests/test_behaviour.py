"""Transport behaviour, written once and run on every loop (see conftest.py)."""

from __future__ import annotations

import asyncio
import contextvars
import re
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest

from conftest import Echo, Recorder, run, stalled_pair


class BufferedRecorder(asyncio.BufferedProtocol):
    """Collects what a BufferedProtocol is given (a small buffer: many reads)."""

    def __init__(self) -> None:
        self.buf = bytearray(100)
        self.received = bytearray()
        self.got_data = asyncio.Event()
        self.done: asyncio.Future[bytes] = asyncio.get_event_loop().create_future()

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.received += self.buf[:nbytes]
        self.got_data.set()

    def eof_received(self) -> None:
        self.done.set_result(bytes(self.received))

    def connection_lost(self, exc: BaseException | None) -> None:
        pass


async def drain_socket(sock: socket.socket, nbytes: int) -> bytes:
    loop = asyncio.get_running_loop()
    sock.setblocking(False)  # loop.sock_* insist in debug mode
    out = bytearray()
    while len(out) < nbytes:
        chunk = await loop.sock_recv(sock, 1 << 20)
        if not chunk:
            break
        out += chunk
    return bytes(out)


async def read_to_eof(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    out = bytearray()
    while chunk := await loop.sock_recv(sock, 1 << 20):
        out += chunk
    return bytes(out)


async def attach(sock: socket.socket, protocol: asyncio.BaseProtocol) -> Any:
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock)
    return transport


@pytest.mark.parametrize("size", [1024, 10 * 1024, 100 * 1024])
def test_tcp_echo_protocol(loop: asyncio.AbstractEventLoop, size: int) -> None:
    async def main() -> None:
        server = await loop.create_server(Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        payload = bytes(range(256)) * (size // 256)
        for _ in range(20):
            writer.write(payload)
            await writer.drain()
            assert await reader.readexactly(len(payload)) == payload
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()

    run(loop, main())


def test_buffered_protocol_gets_recv_into(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        proto = BufferedRecorder()
        transport = await attach(a, proto)
        payload = b"0123456789" * 1000
        b.sendall(payload)
        b.shutdown(socket.SHUT_WR)
        assert await proto.done == payload
        transport.close()
        b.close()

    run(loop, main())


def test_set_protocol_switches_the_kind_of_read(loop: asyncio.AbstractEventLoop) -> None:
    """Protocol -> BufferedProtocol -> Protocol on a reading transport (as
    start_tls does): each protocol gets what arrives while it is set, by its
    own kind of callback."""

    async def main() -> None:
        a, b = socket.socketpair()
        first = Recorder()
        transport = await attach(a, first)
        b.sendall(b"one")
        await asyncio.wait_for(first.got_data.wait(), 5)
        second = BufferedRecorder()
        transport.set_protocol(second)
        b.sendall(b"two")
        await asyncio.wait_for(second.got_data.wait(), 5)
        third = Recorder()
        transport.set_protocol(third)
        b.sendall(b"three")
        await asyncio.wait_for(third.got_data.wait(), 5)
        assert (bytes(first.data), bytes(second.received), bytes(third.data)) == (
            b"one", b"two", b"three")
        assert transport.get_protocol() is third
        transport.close()
        await third.lost
        b.close()

    run(loop, main())


def test_streams_echo_unix(loop: asyncio.AbstractEventLoop, tmp_path: Any) -> None:
    path = str(tmp_path / "echo.sock")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def main() -> None:
        server = await asyncio.start_unix_server(handle, path)
        reader, writer = await asyncio.open_unix_connection(path)
        for i in range(50):
            writer.write(b"line %d\n" % i)
            assert await reader.readline() == b"line %d\n" % i
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()

    run(loop, main())


def test_close_delivers_everything_buffered(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = stalled_pair()
        proto = Recorder()
        transport = await attach(a, proto)
        payload = b"x" * (3 * 1024 * 1024 + 17)
        transport.write(payload)
        transport.close()
        assert transport.is_closing()
        received = await read_to_eof(b)
        assert len(received) == len(payload)
        assert await proto.lost is None
        b.close()

    run(loop, main())


def test_abort_drops_buffer(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = stalled_pair()
        proto = Recorder()
        transport = await attach(a, proto)
        transport.write(b"x" * (4 * 1024 * 1024))
        transport.abort()
        assert await proto.lost is None
        assert proto.calls.count("connection_lost") == 1
        received = await read_to_eof(b)
        assert len(received) < 4 * 1024 * 1024
        b.close()

    run(loop, main())


def test_flow_control_pause_and_resume(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = stalled_pair()
        proto = Recorder()
        transport = await attach(a, proto)
        transport.set_write_buffer_limits(high=64 * 1024, low=16 * 1024)
        chunk = b"y" * 8192
        written = 0
        while "pause_writing" not in proto.calls:
            transport.write(chunk)
            written += len(chunk)
            assert written < 16 * 1024 * 1024, "pause_writing never came"
            await asyncio.sleep(0)
        assert transport.get_write_buffer_size() > 0
        received = await drain_socket(b, written)
        assert len(received) == written
        while "resume_writing" not in proto.calls:
            await asyncio.sleep(0)
        assert proto.calls.count("pause_writing") == 1
        transport.close()
        await proto.lost
        b.close()

    run(loop, main())


def test_writelines_applies_flow_control(loop: asyncio.AbstractEventLoop, loop_name: str) -> None:
    version = sys.version_info[:3]
    if loop_name == "asyncio" and (
        (3, 12, 0) <= version <= (3, 12, 8) or (3, 13, 0) <= version <= (3, 13, 1)
    ):
        pytest.xfail("stock 3.12.0-3.12.8 and 3.13.0-3.13.1 writelines skip flow control "
                     "(gh-127655)")

    async def main() -> None:
        a, b = stalled_pair()
        proto = Recorder()
        transport = await attach(a, proto)
        transport.set_write_buffer_limits(high=64 * 1024)
        chunks = [b"z" * 4096] * 256  # 1 MiB, far past the high-water mark
        transport.writelines(chunks)
        assert "pause_writing" in proto.calls
        received = await drain_socket(b, 1024 * 1024)
        assert received == b"".join(chunks)
        transport.close()
        await proto.lost
        b.close()

    run(loop, main())


def test_write_eof_half_close(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        b.setblocking(False)
        proto = Recorder()
        transport = await attach(a, proto)
        assert transport.can_write_eof()
        transport.write(b"request")
        transport.write_eof()
        with pytest.raises(RuntimeError, match=r"write\(\) after write_eof"):
            transport.write(b"more")
        assert await read_to_eof(b) == b"request"
        # The other direction still works after our EOF.
        await asyncio.get_running_loop().sock_sendall(b, b"reply")
        await asyncio.wait_for(proto.got_data.wait(), 5)
        assert bytes(proto.data) == b"reply"
        transport.close()
        await proto.lost
        b.close()

    run(loop, main())


@pytest.mark.parametrize("flushed", [True, False], ids=["flushed", "same-callback"])
def test_write_after_close_is_dropped(loop: asyncio.AbstractEventLoop, flushed: bool) -> None:
    """Once close() has scheduled connection_lost (nothing left to send),
    stock drops later writes: the peer gets what came before, then EOF.
    So too right after the write, in the same callback: stock's write() has
    sent it, and under write=deferred close() sends it first."""

    async def main() -> None:
        a, b = socket.socketpair()
        proto = Recorder()
        transport = await attach(a, proto)
        transport.write(b"before")
        for _ in range(3 if flushed else 0):  # a deferred write's flush has run
            await asyncio.sleep(0)
        transport.close()
        transport.write(b"after")
        assert await read_to_eof(b) == b"before"
        assert await proto.lost is None
        b.close()

    run(loop, main())


def test_peer_reset_reports_once(loop: asyncio.AbstractEventLoop, loop_name: str) -> None:
    async def main() -> None:
        a, b = stalled_pair()
        proto = Recorder()
        transport = await attach(a, proto)
        transport.write(b"x" * (1024 * 1024))
        b.close()  # unread data pending: the kernel answers with a reset
        exc = await proto.lost
        assert isinstance(exc, OSError)
        assert proto.calls.count("connection_lost") == 1
        if loop_name != "uvloop":  # uvloop raises RuntimeError here instead
            transport.write(b"after")  # dropped silently, as stock does
        transport.close()

    run(loop, main())


#: Stock's write() TypeError, in each version's words (checked on stock too).
WRITE_TYPE_ERROR = (
    "data argument must be a bytes, bytearray, or memoryview object, not 'str'"
    if sys.version_info >= (3, 14)
    else "data argument must be a bytes-like object, not 'str'"
)


def type_error_text(call: Callable[..., object], *args: object) -> str:
    """The TypeError text of ``call(*args)`` in this interpreter's words."""
    try:
        call(*args)
    except TypeError as exc:
        return str(exc)
    raise AssertionError(f"{call!r}{args!r} raised no TypeError")


#: Stock's writelines() TypeError: 3.12+ takes a memoryview of each chunk,
#: 3.11 joins them first (WriteTransport.writelines).  Builtins' texts differ
#: between CPython and PyPy (its join says "expected bytes, str found").
WRITELINES_TYPE_ERROR = (
    type_error_text(memoryview, "text")
    if sys.version_info >= (3, 12)
    else type_error_text(b"".join, [b"bytes", "text"])
)


def test_write_type_errors_match_stock(loop: asyncio.AbstractEventLoop, loop_name: str) -> None:
    # uvloop raises TypeError with its own texts.
    text = None if loop_name == "uvloop" else re.escape(WRITE_TYPE_ERROR)
    lines_text = None if loop_name == "uvloop" else re.escape(WRITELINES_TYPE_ERROR)

    async def main() -> None:
        a, b = socket.socketpair()
        proto = Recorder()
        transport = await attach(a, proto)
        try:
            with pytest.raises(TypeError, match=text):
                transport.write("text")
            with pytest.raises(TypeError, match=lines_text):
                transport.writelines([b"bytes", "text"])
        finally:
            transport.abort()  # 3.15's stock buffers b"bytes" and never sends it
            await proto.lost
            b.close()

    run(loop, main())


def test_writes_before_the_loop_runs_go_out(loop: asyncio.AbstractEventLoop) -> None:
    a, b = socket.socketpair()
    proto = Recorder()
    transport = run(loop, attach(a, proto))
    # The loop is not running now.
    transport.write(b"hello ")
    transport.write(b"world")
    assert run(loop, drain_socket(b, 11)) == b"hello world"
    transport.close()
    run(loop, proto.lost)
    b.close()


def test_write_then_stop_then_blocking_recv(loop: asyncio.AbstractEventLoop) -> None:
    """uvloop #631: a write made just before the loop stops must not wait."""
    a, b = socket.socketpair()
    proto = Recorder()
    transport = run(loop, attach(a, proto))

    async def write_and_return() -> None:
        transport.write(b"ping")

    run(loop, write_and_return())
    b.settimeout(5)
    assert b.recv(100) == b"ping"
    transport.close()
    run(loop, proto.lost)
    b.close()


def test_call_soon_threadsafe_write_goes_out(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        b.setblocking(False)
        proto = Recorder()
        transport = await attach(a, proto)
        thread = threading.Thread(
            target=lambda: loop.call_soon_threadsafe(transport.write, b"from thread")
        )
        thread.start()
        assert await drain_socket(b, 11) == b"from thread"
        thread.join()
        transport.close()
        await proto.lost
        b.close()

    run(loop, main())


def test_pause_resume_reading_flags(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        proto = Recorder()
        transport = await attach(a, proto)
        assert transport.is_reading()
        transport.pause_reading()
        assert not transport.is_reading()
        b.send(b"queued while paused")
        await asyncio.sleep(0.05)
        assert proto.data == b""
        transport.resume_reading()
        assert transport.is_reading()
        await asyncio.wait_for(proto.got_data.wait(), 5)
        assert bytes(proto.data) == b"queued while paused"
        transport.close()
        assert not transport.is_reading()
        await proto.lost
        b.close()

    run(loop, main())


def test_write_after_close_is_delivered_while_buffered(loop: asyncio.AbstractEventLoop) -> None:
    """As stock and uvloop: close() keeps the connection until the buffer is out,
    and a write() made before that is delivered before the FIN."""

    async def main() -> None:
        a, b = stalled_pair()
        proto = Recorder()
        transport = await attach(a, proto)
        transport.write(b"x" * (1024 * 1024))
        transport.close()
        transport.write(b"LATE")
        received = await read_to_eof(b)
        assert len(received) == 1024 * 1024 + 4
        assert received.endswith(b"LATE")
        await proto.lost
        b.close()

    run(loop, main())


def test_extra_info_matches_the_socket(loop: asyncio.AbstractEventLoop, loop_name: str) -> None:
    """peername, sockname and socket on both ends, before and after close
    (ours keeps them in slots and wraps the socket on first request)."""

    async def main() -> None:
        accepted: asyncio.Future[Any] = loop.create_future()

        class Keep(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                accepted.set_result(transport)

        server = await loop.create_server(Keep, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        theirs = await accepted
        for transport, other in ((theirs, client), (client, theirs)):
            sock = transport.get_extra_info("socket")
            assert sock is transport.get_extra_info("socket")  # one wrapper
            assert sock.fileno() >= 0
            assert transport.get_extra_info("sockname") == sock.getsockname()
            assert transport.get_extra_info("peername") == sock.getpeername()
            assert transport.get_extra_info("peername") == other.get_extra_info("sockname")
            assert transport.get_extra_info("no-such-key") is None
            assert transport.get_extra_info("no-such-key", 7) == 7
        # Answered after close too, from what was known while open.
        names = (client.get_extra_info("sockname"), client.get_extra_info("peername"))
        client.close()
        theirs.close()
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.05)
        assert (client.get_extra_info("sockname"), client.get_extra_info("peername")) == names
        if loop_name != "uvloop":  # uvloop returns None for a closed socket
            assert client.get_extra_info("socket").fileno() == -1

    run(loop, main())


def test_an_accepted_connections_sockname_is_its_sockets(
        loop: asyncio.AbstractEventLoop, tmp_path: Any) -> None:
    """What an accepted transport says its local address is, for listeners
    bound to one address, to a wildcard (where connections have other
    addresses than the listener) and to a Unix path."""
    listeners: list[tuple[int, Any, Any]] = [
        (socket.AF_INET, ("127.0.0.1", 0), "127.0.0.1"),
        (socket.AF_INET, ("0.0.0.0", 0), "127.0.0.1"),
        (socket.AF_UNIX, str(tmp_path / "s"), None),
    ]
    if socket.has_ipv6:
        listeners += [(socket.AF_INET6, ("::1", 0), "::1"),
                      (socket.AF_INET6, ("::", 0), "::1")]

    async def one(family: int, address: Any, connect_to: Any) -> None:
        accepted: asyncio.Future[Any] = loop.create_future()

        class Keep(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                accepted.set_result(transport)

        try:
            sock = socket.socket(family)
            sock.bind(address)
        except OSError:  # no IPv6 here
            sock.close()
            return
        server = await loop.create_server(Keep, sock=sock)
        if family == socket.AF_UNIX:
            client, _ = await loop.create_unix_connection(asyncio.Protocol, address)
        else:
            client, _ = await loop.create_connection(asyncio.Protocol, connect_to,
                                                     sock.getsockname()[1])
        theirs = await accepted
        sockname = theirs.get_extra_info("sockname")
        assert sockname == theirs.get_extra_info("socket").getsockname()
        if family != socket.AF_UNIX:
            assert sockname == client.get_extra_info("peername")
        client.close()
        theirs.close()
        server.close()
        await server.wait_closed()

    async def main() -> None:
        for family, address, connect_to in listeners:
            await one(family, address, connect_to)

    run(loop, main())


def test_private_extra_dict_reads_and_writes_as_in_stock(
    loop: asyncio.AbstractEventLoop, loop_name: str
) -> None:
    """Code in the wild reads and writes ``transport._extra`` (asyncio's
    private dict): it holds socket, sockname and peername, and what is
    written there is what get_extra_info answers."""
    if loop_name == "uvloop":
        pytest.skip("uvloop's transports have no _extra")

    async def main() -> None:
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        extra = transport._extra
        assert extra["peername"] == transport.get_extra_info("peername") == ("127.0.0.1", port)
        assert extra["sockname"] == transport.get_extra_info("sockname")
        assert extra["socket"] is transport.get_extra_info("socket")
        extra["peername"] = ("192.0.2.1", 7)
        extra["mine"] = 1
        assert transport.get_extra_info("peername") == ("192.0.2.1", 7)
        assert transport.get_extra_info("mine") == 1
        transport.close()
        server.close()
        await server.wait_closed()

    run(loop, main())


#: 3.15 runs a server's connections in a copy of the server's context, each
#: connection's callbacks in one context of its own (gh-140947); before, each
#: callback runs in a copy of the context that scheduled it.
CONNECTION_CONTEXTS = sys.version_info >= (3, 15)


def test_server_context_reaches_its_connections(
    loop: asyncio.AbstractEventLoop, loop_name: str
) -> None:
    """What the protocol factory and each callback of a server's connection
    see of the context variables, and that a connection's changes stay its
    own: 3.15's semantics on 3.15, the earlier ones before."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="default")
    seen: list[tuple[str, str]] = []
    done: list[asyncio.Future[None]] = []

    class Seeing(asyncio.Protocol):
        def __init__(self) -> None:
            seen.append(("factory", var.get()))
            self.done = loop.create_future()
            done.append(self.done)

        def connection_made(self, transport: Any) -> None:
            seen.append(("made", var.get()))
            var.set("set by connection_made")
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            seen.append(("data", var.get()))
            self.transport.write(data)

        def connection_lost(self, exc: BaseException | None) -> None:
            seen.append(("lost", var.get()))
            self.done.set_result(None)

    async def main() -> None:
        var.set("when the server was made")
        server = await loop.create_server(Seeing, "127.0.0.1", 0)
        var.set("after")
        address = server.sockets[0].getsockname()
        for _ in range(2):
            reader, writer = await asyncio.open_connection(*address)
            writer.write(b"x")
            assert await reader.readexactly(1) == b"x"
            writer.close()
            await writer.wait_closed()
            await done[-1]
        server.close()
        await server.wait_closed()
        assert var.get() == "after"

    run(loop, main())
    if loop_name == "uvloop":
        pytest.skip("uvloop runs connection callbacks in contexts of its own")
    later = "set by connection_made" if CONNECTION_CONTEXTS else "when the server was made"
    per_connection = [("factory", "when the server was made"),
                      ("made", "when the server was made"), ("data", later), ("lost", later)]
    assert seen == per_connection * 2


def test_client_connection_callbacks_share_one_context(
    loop: asyncio.AbstractEventLoop, loop_name: str
) -> None:
    """create_connection on 3.15: the transport's callbacks run in a copy of
    the caller's context, the same one for all of them."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="default")
    seen: list[tuple[str, str]] = []

    class Seeing(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            seen.append(("made", var.get()))
            var.set("set by connection_made")

        def data_received(self, data: bytes) -> None:
            seen.append(("data", var.get()))

        def connection_lost(self, exc: BaseException | None) -> None:
            seen.append(("lost", var.get()))

    async def main() -> None:
        a, b = socket.socketpair()
        var.set("caller")
        transport, _ = await loop.create_connection(Seeing, sock=a)
        b.send(b"x")
        for _ in range(200):
            if len(seen) > 1:
                break
            await asyncio.sleep(0.005)
        transport.close()
        await asyncio.sleep(0.01)
        b.close()
        assert var.get() == "caller"

    run(loop, main())
    if loop_name == "uvloop":
        pytest.skip("uvloop runs connection callbacks in contexts of its own")
    later = "set by connection_made" if CONNECTION_CONTEXTS else "caller"
    assert seen == [("made", "caller"), ("data", later), ("lost", later)]


def test_a_transports_method_can_be_patched(
    loop: asyncio.AbstractEventLoop, loop_name: str
) -> None:
    """Tests in the wild patch a transport's methods and set attributes on it
    (stock's transports have a __dict__); the patch is what callers reach."""
    if loop_name == "uvloop":
        pytest.skip("uvloop's transports cannot be patched")

    async def main() -> None:
        a, b = socket.socketpair()
        transport, _ = await loop.create_connection(asyncio.Protocol, sock=a)
        with mock.patch.object(transport, "write", wraps=transport.write) as write:
            transport.write(b"through the patch")
        write.assert_called_once_with(b"through the patch")
        assert "write" not in vars(transport)  # the patch is gone again
        transport.write(b" and without")
        transport.heartbeat = 30  # an attribute of the caller's own
        assert transport.heartbeat == 30
        transport.close()
        assert await read_to_eof(b) == b"through the patch and without"
        b.close()

    run(loop, main())


def test_a_class_level_patch_of_get_extra_info_reaches_the_transport(
    loop: asyncio.AbstractEventLoop, loop_name: str
) -> None:
    if loop_name == "uvloop":
        pytest.skip("uvloop's transports do not derive from asyncio.Transport")

    async def main() -> None:
        a, b = socket.socketpair()
        transport, _ = await loop.create_connection(asyncio.Protocol, sock=a)
        with mock.patch.object(asyncio.Transport, "get_extra_info",
                               return_value=("192.0.2.1", 80)) as patched:
            assert transport.get_extra_info("peername") == ("192.0.2.1", 80)
        patched.assert_called_once_with("peername")
        assert transport.get_extra_info("peername") == ""  # a socketpair's
        transport.close()
        await asyncio.sleep(0)
        b.close()

    run(loop, main())


def test_a_raising_connection_lost_is_reported_and_the_loop_goes_on(
    loop: asyncio.AbstractEventLoop, loop_name: str, loop_errors: Any
) -> None:
    """write() then close() in one callback, and the protocol's
    connection_lost raises: the handler hears of it once (stock runs it from
    a handle; ours in deferred mode from the flush) and the loop keeps
    serving.  It must not escape run_until_complete."""
    if loop_name == "uvloop":
        pytest.skip("uvloop leaves the socket object unclosed when connection_lost raises")
    loop_errors.expect("Exception in callback")

    class Raising(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            transport.write(b"bye")
            transport.close()

        def connection_lost(self, exc: BaseException | None) -> None:
            raise ZeroDivisionError("from connection_lost")

    async def main() -> None:
        a, b = socket.socketpair()
        await loop.create_connection(Raising, sock=a)
        assert await read_to_eof(b) == b"bye"
        b.close()
        for _ in range(100):
            if loop_errors.contexts:
                break
            await asyncio.sleep(0.001)
        c, d = socket.socketpair()  # the loop still serves
        transport = await attach(c, Echo())
        d.sendall(b"ping")
        assert await drain_socket(d, 4) == b"ping"
        transport.close()
        await asyncio.sleep(0)
        d.close()

    run(loop, main())
    [context] = loop_errors.contexts
    assert isinstance(context["exception"], ZeroDivisionError)
