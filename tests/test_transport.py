"""The socket transport (asyncio_relaxed._transport, _basetransport, _sockets).

Every write path meets every send fault: the one fast path (write() sending
at once), the send primitive from the queue's flush, from writelines, past
the high-water mark, on EPOLLOUT and on a feed retry, each with the first
send of the path failing as test_faults' plans make sends fail.  Transient
faults (EINTR, EAGAIN, a short send) must lose nothing; fatal ones end the
connection once, with their error, and reach no exception handler.  The
counters tell which path was taken, so a path that stops being taken fails
here rather than passing untested.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import _differential as diff
import pytest

import asyncio_relaxed
from asyncio_relaxed import _sockets
from conftest import LoopErrors, Recorder, run

PAYLOAD = bytes(range(256)) * 64  # 16 KiB

#: path -> (loop settings, which send of the connection fails (0: the
#: first), the counter that shows the path was taken)
PATHS: dict[str, tuple[dict[str, Any], int, str]] = {
    "write-at-once": ({"write": "eager"}, 0, "send"),
    "flush": ({"write": "deferred"}, 0, "writes_deferred"),
    "writelines": ({"write": "eager"}, 0, "sendmsg"),
    "past-high-water": ({"write": "deferred"}, 0, "writes_deferred"),
    "epollout": ({"write": "eager", "partial_write": "poll"}, 1, "partial_writes"),
    "feed-retry": ({"write": "eager", "partial_write": "feed"}, 1, "write_feeds"),
}
FAULTS = ["EINTR", "EAGAIN", "short", "ECONNRESET", "EPIPE", "ENOBUFS"]


def _start(transport: Any, path: str) -> None:
    """What the protocol writes, in one callback, to take *path*."""
    if path in ("write-at-once", "flush"):
        transport.write(PAYLOAD)
    elif path == "writelines":
        transport.writelines([PAYLOAD[:100], PAYLOAD[100:]])
    elif path == "past-high-water":
        transport.set_write_buffer_limits(high=4096)
        transport.write(PAYLOAD[:100])  # queued for the flush
        transport.write(PAYLOAD[100:])  # past the mark: sent now
    else:
        # The first send comes up short (made so below), the rest waits for
        # EPOLLOUT or a feed retry: the second send is the faulty one.
        transport.write(PAYLOAD)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("path", list(PATHS))
def test_every_write_path_through_every_send_fault(path: str, fault: str,
                                                   loop_errors: LoopErrors) -> None:
    settings, faulty, counter = PATHS[path]
    plan = {faulty: fault}
    if faulty:
        plan[0] = "short"
    faults = diff.FaultPlan({"send": plan})
    loop = asyncio_relaxed.new_event_loop(**settings)
    loop.set_exception_handler(loop_errors.handler)
    ours, peer = socket.socketpair()
    ours = diff.FaultySocket.adopt(ours, faults)
    peer.setblocking(False)

    async def main() -> tuple[bytes, Recorder]:
        before = loop.statistics()
        recorder = Recorder(loop)
        transport, _ = await loop.connect_accepted_socket(lambda: recorder, ours)
        _start(transport, path)
        received = bytearray()
        while len(received) < len(PAYLOAD) and not recorder.lost.done():
            await asyncio.sleep(0.001)
            try:
                received += peer.recv(1 << 20)
            except BlockingIOError:
                pass
        assert getattr(loop.statistics() - before, counter) > 0, f"{path} not taken"
        if not recorder.lost.done():
            transport.close()
        await recorder.lost
        return bytes(received), recorder

    try:
        received, recorder = run(loop, main(), timeout=10)
    finally:
        loop.close()
        peer.close()
    assert faults.fired == sorted((("send", n, f) for n, f in plan.items()),
                                  key=lambda fired: fired[1])
    lost = recorder.lost.result()
    if fault in diff.TRANSIENT:
        assert received == PAYLOAD
        assert lost is None
    else:
        assert PAYLOAD.startswith(received)
        assert isinstance(lost, OSError) and lost.errno == diff.FAULT_ERRNOS[fault]
    assert recorder.calls.count("connection_lost") == 1
    loop_errors.check()  # no OSError of a transport reaches the handler


class _Counting:
    """A socket whose recv/recv_into record how much they were asked for."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.asked: list[int] = []

    def recv(self, size: int) -> bytes:
        self.asked.append(size)
        return self.sock.recv(size)

    def recv_into(self, buffer: Any) -> int:
        self.asked.append(len(buffer))
        return self.sock.recv_into(buffer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


@pytest.mark.parametrize("read_size", [1024, 64 * 1024, 256 * 1024])
def test_a_read_asks_for_at_most_read_size(read_size: int) -> None:
    """Small reads, buffer mode and streaming each read read_size at most
    (README, Security notes), whatever it is set to."""
    loop = asyncio_relaxed.new_event_loop(read_size=read_size)
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.setblocking(False)

    async def main() -> None:
        recorder = Recorder(loop)
        transport, _ = await loop.connect_accepted_socket(lambda: recorder, ours)
        counting = _Counting(ours)
        transport._sock = counting
        total = 0
        for size in (10, 300_000, 10, 10, 70_000, 10):
            await loop.sock_sendall(peer, b"x" * size)
            total += size
            await recorder.received(total)
        assert counting.asked and max(counting.asked) <= read_size, counting.asked
        transport._sock = ours
        transport.close()
        await recorder.lost

    try:
        run(loop, main())
    finally:
        loop.close()
        peer.close()


def test_is_tcp_reads_wrapped_listeners() -> None:
    """gunicorn hands the loop wrapper objects that pass attributes on."""

    class Wrapper:
        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    with socket.socket() as tcp, socket.socket(socket.AF_UNIX) as unix, \
            socket.socket(type=socket.SOCK_DGRAM) as udp:
        assert _sockets.is_tcp(tcp) and _sockets.is_tcp(Wrapper(tcp))
        assert not _sockets.is_tcp(unix) and not _sockets.is_tcp(Wrapper(unix))
        assert not _sockets.is_tcp(udp)


def _listening(family: int, address: Any, transparent: bool = False) -> socket.socket:
    sock = socket.socket(family)
    try:
        if transparent:
            level, option = _sockets._TRANSPARENT[family]
            sock.setsockopt(level, option, 1)
        sock.bind(address)
        sock.listen()
    except BaseException:
        sock.close()
        raise
    return sock


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's accept semantics")
def test_accepted_sockname_is_the_listeners_only_where_every_connection_has_it(
        tmp_path: Any) -> None:
    """A listener bound to one address gives its own name to what it
    accepts; a wildcard, a mapped wildcard, a transparent listener and
    anything that is not a stream listener are asked per connection."""
    with _listening(socket.AF_INET, ("127.0.0.1", 0)) as sock:
        assert _sockets.accepted_sockname(sock) == sock.getsockname()
    with _listening(socket.AF_INET, ("0.0.0.0", 0)) as sock:
        assert _sockets.accepted_sockname(sock) is None
    with _listening(socket.AF_UNIX, str(tmp_path / "s")) as sock:
        assert _sockets.accepted_sockname(sock) == str(tmp_path / "s")
    with socket.socket(type=socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        assert _sockets.accepted_sockname(udp) is None
    if socket.has_ipv6:
        for host in ("::", "::ffff:0.0.0.0", "::ffff:127.0.0.1"):
            try:
                sock = _listening(socket.AF_INET6, (host, 0))
            except OSError:  # no IPv6 here
                continue
            with sock:
                assert _sockets.accepted_sockname(sock) is None, host
        try:
            sock = _listening(socket.AF_INET6, ("::1", 0))
        except OSError:
            pass
        else:
            with sock:
                assert _sockets.accepted_sockname(sock) == sock.getsockname()
    try:
        sock = _listening(socket.AF_INET, ("127.0.0.1", 0), transparent=True)
    except PermissionError:  # IP_TRANSPARENT needs CAP_NET_ADMIN
        return
    with sock:
        assert _sockets.accepted_sockname(sock) is None


# What TransportBase.__init__ does in place of FlowControlMixin.__init__ and
# BaseTransport.__init__ (their bodies, as every supported Python has them).
_STOCK_BASE_INITS = {
    "BaseTransport": ["if extra is None:", "extra = {}", "self._extra = extra"],
    "_FlowControlMixin": ["super().__init__(extra)", "assert loop is not None",
                          "self._loop = loop", "self._protocol_paused = False",
                          "self._set_write_buffer_limits()"],
}


def test_the_base_classes_inits_are_the_ones_inlined() -> None:
    """A Python whose transport base classes set more than these lines
    fails here: TransportBase.__init__ must then do that too."""
    import inspect
    from asyncio import transports

    for name, lines in _STOCK_BASE_INITS.items():
        source = inspect.getsource(getattr(transports, name).__init__)
        body = [line.strip() for line in source.splitlines()[1:]]
        body = [line for line in body if line and not line.startswith(("#", '"""'))]
        assert body == lines, (name, body)


def test_a_transport_starts_with_what_the_base_inits_set() -> None:
    from asyncio import transports

    class Stock(transports._FlowControlMixin):
        def get_write_buffer_size(self) -> int:
            return 0

    loop = asyncio_relaxed.Loop()
    a, b = socket.socketpair()
    try:
        async def main() -> None:
            transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
            stock = Stock(None, loop)
            assert transport._loop is stock._loop is loop
            assert transport._protocol_paused is stock._protocol_paused is False
            assert transport.get_write_buffer_limits() == stock.get_write_buffer_limits()
            assert transport.get_extra_info("nothing", 7) == 7
            assert transport._extra["peername"] == a.getpeername()
            transport.close()

        run(loop, main())
    finally:
        b.close()
        loop.close()


def _body(function: Any) -> list[str]:
    """A function's lines past its signature, stripped, without comments
    and docstrings."""
    import inspect

    source = inspect.getsource(function).splitlines()[1:]
    lines = [line.strip() for line in source]
    return [line for line in lines if line and not line.startswith(("#", '"""'))]


def test_socket_socket_does_what_the_inlined_bodies_do() -> None:
    """The accept path makes a socket.socket as its __init__ does and a
    transport closes it as its close() does (asyncio_relaxed._sockets.C_NEW):
    a Python whose socket.socket does more fails here."""
    assert _body(socket.socket.__init__)[-3:] == [
        "_socket.socket.__init__(self, family, type, proto, fileno)",
        "self._io_refs = 0", "self._closed = False"]
    assert _body(socket.socket.close) == [
        "self._closed = True", "if self._io_refs <= 0:", "self._real_close()"]
    assert _body(socket.socket._real_close) == ["_ss.close(self)"]
    assert socket.socket.__slots__ == ["__weakref__", "_io_refs", "_closed"]


def test_an_accepted_socket_is_a_whole_socket_and_closes_as_one() -> None:
    """What the accept path made: family, type, proto, timeout and the
    Python fields as socket.socket's constructor sets them; makefile()
    still holds the descriptor open past the transport's close, and
    closing the file then closes it."""
    loop = asyncio_relaxed.Loop()
    seen: list[Any] = []

    class Keep(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            conn = transport.get_extra_info("socket")._sock
            seen.append((conn, conn.makefile("rb")))
            transport.close()

    async def main() -> None:
        server = await loop.create_server(Keep, "127.0.0.1", 0)
        listener = server.sockets[0]
        with socket.create_connection(listener.getsockname()) as client:
            while not seen:
                await asyncio.sleep(0)
            conn, file = seen[0]
            assert type(conn) is socket.socket
            assert (conn.family, conn.type, conn.proto) == (
                listener.family, listener.type, listener.proto)
            assert conn.gettimeout() == 0.0
            assert conn._io_refs == 1 and not conn._closed
            for _ in range(3):
                await asyncio.sleep(0)  # connection_lost: the transport closed it
            assert conn._closed and conn.fileno() >= 0  # makefile()'s reference
            file.close()
            assert conn.fileno() == -1
            assert client.recv(1) == b""
        server.close()
        await server.wait_closed()

    try:
        run(loop, main())
    finally:
        loop.close()


def test_the_loops_entry_for_a_transport_lasts_as_long_as_its_socket() -> None:
    """loop._transports (stock's _ensure_fd_no_transport reads it) names an
    open transport's fd, so sock_recv() on that socket raises stock's
    error; the entry goes when connection_lost closes the socket, though
    the transport object lives on."""
    loop = asyncio_relaxed.Loop()
    a, b = socket.socketpair()
    try:
        transport, _ = run(loop, loop.connect_accepted_socket(asyncio.Protocol, a))
        fd = a.fileno()
        assert loop._transports[fd] is transport  # type: ignore[attr-defined]
        with pytest.raises(RuntimeError, match="is used by transport"):
            run(loop, loop.sock_recv(a, 1))
        transport.close()
        run(loop, asyncio.sleep(0))
        assert transport.get_extra_info("socket").fileno() == -1
        assert fd not in loop._transports.data  # type: ignore[attr-defined]
        assert len(loop._transports) == 0  # type: ignore[attr-defined]
    finally:
        b.close()
        loop.close()
