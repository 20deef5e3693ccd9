"""create_datagram_endpoint() on stock and on our loop in each preset, ours
also with ``datagram=stock``: echo (connected and not; IPv4, IPv6, Unix),
sizes 0 and 65,507, an ICMP port unreachable, a burst read in one event,
close and pause_reading inside a burst, sendto's argument errors (the texts
of this Python's stock), flow control over a full Unix socket, close and
abort with datagrams buffered, extra info, repr and the finaliser.

Behaviour is compared with stock on the same Python; counts come from
``loop.statistics()`` (never timings).
"""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import re
import socket
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import asyncio_relaxed
from asyncio_relaxed import _compat
from benchmarks.harness.loops import missing
from conftest import (
    LOOP_FACTORIES,
    REFCOUNTED,
    RELAXED_SETTINGS,
    LoopErrors,
    _as_fixture,
    collect_garbage,
    compiled,
    run,
)

LOCAL = "127.0.0.1"
HAS_IPV6 = socket.has_ipv6
try:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as _probe:
        _probe.bind(("::1", 0))
except OSError:
    HAS_IPV6 = False
HAS_UNIX = hasattr(socket, "AF_UNIX")
_HEADER = _compat.DATAGRAM_HEADER_SIZE

#: Stock, each of our presets, and our default preset with stock's datagram transport.
DATAGRAM_LOOPS = ["asyncio", *RELAXED_SETTINGS, "relaxed-datagram-stock"]


@pytest.fixture(params=DATAGRAM_LOOPS)
def dloop(request: pytest.FixtureRequest,
          loop_errors: LoopErrors) -> Iterator[asyncio.AbstractEventLoop]:
    name: str = request.param
    if name == "relaxed-datagram-stock":
        loop: asyncio.AbstractEventLoop = asyncio_relaxed.Loop(datagram="stock")
    else:
        factory = LOOP_FACTORIES[name]
        assert factory is not None
        loop = factory()
    yield from _as_fixture(loop, loop_errors)


#: Every loop of the behaviour suite (conftest's, uvloop included) and our
#: default preset with stock's datagram transport.
EVERY_LOOP = [*LOOP_FACTORIES, "relaxed-datagram-stock"]


@pytest.fixture(params=EVERY_LOOP)
def every_loop(request: pytest.FixtureRequest,
               loop_errors: LoopErrors) -> Iterator[asyncio.AbstractEventLoop]:
    """dloop's loops and uvloop (skipped with the reason where it cannot run)."""
    name: str = request.param
    if name == "relaxed-datagram-stock":
        loop: asyncio.AbstractEventLoop = asyncio_relaxed.Loop(datagram="stock")
    else:
        why = missing(name)
        if why:
            pytest.skip(why)
        factory = LOOP_FACTORIES[name]
        assert factory is not None
        loop = factory()
    yield from _as_fixture(loop, loop_errors)


@pytest.fixture(params=list(RELAXED_SETTINGS))
def own_loop(request: pytest.FixtureRequest,
             loop_errors: LoopErrors) -> Iterator[asyncio_relaxed.Loop]:
    """Our loop with its own datagram transport, in each preset."""
    loop = asyncio_relaxed.Loop(**RELAXED_SETTINGS[request.param], datagram="own")
    yield from _as_fixture(loop, loop_errors)  # type: ignore[misc]


def own(loop: asyncio.AbstractEventLoop) -> bool:
    return (isinstance(loop, asyncio_relaxed.PyLoop)
            and loop.config.datagram is asyncio_relaxed.DatagramMode.OWN)


#: How our compiled transport reads its next event: a system call a datagram,
#: or recvmmsg() batches (it chooses by what its last event read).
READS = ["each", "batches"]


def _read_by(transport: Any, read: str) -> None:
    """Our transport's next event read *read*'s way (stock's: nothing to set)."""
    from asyncio_relaxed import _datagram
    if isinstance(transport, _datagram.DatagramTransport):
        transport._last_read = 32 if read == "batches" else 0


class Recorder(asyncio.DatagramProtocol):
    """What the transport tells its protocol, with a future per awaited count."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: Any = None
        self.received: list[tuple[bytes, Any]] = []
        self.errors: list[BaseException] = []
        self.calls: list[str] = []
        self.lost: asyncio.Future[BaseException | None] = loop.create_future()
        self._want: tuple[int, asyncio.Future[None]] | None = None
        self.error: asyncio.Future[BaseException] = loop.create_future()
        self.echo = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.calls.append("connection_made")

    def datagram_received(self, data: bytes, addr: Any) -> None:
        assert not self.lost.done(), "a datagram after connection_lost"
        self.received.append((data, addr))
        if self.echo:
            self.transport.sendto(data, addr)
        if self._want is not None and len(self.received) >= self._want[0]:
            fut = self._want[1]
            self._want = None
            fut.set_result(None)

    def error_received(self, exc: BaseException) -> None:
        self.errors.append(exc)
        if not self.error.done():
            self.error.set_result(exc)

    def pause_writing(self) -> None:
        self.calls.append("pause_writing")

    def resume_writing(self) -> None:
        self.calls.append("resume_writing")

    def connection_lost(self, exc: BaseException | None) -> None:
        self.calls.append("connection_lost")
        self.lost.set_result(exc)

    async def count(self, n: int) -> None:
        if len(self.received) < n:
            fut = self.loop.create_future()
            self._want = (n, fut)
            await fut


def _unix_path() -> str:
    folder = tempfile.mkdtemp(prefix="dgram-")
    return os.path.join(folder, "s")


def _family_addr(family: str) -> tuple[int, Any]:
    if family == "ipv4":
        return socket.AF_INET, (LOCAL, 0)
    if family == "ipv6":
        if not HAS_IPV6:
            pytest.skip("no IPv6 loopback here")
        return socket.AF_INET6, ("::1", 0)
    if not HAS_UNIX:
        pytest.skip("no AF_UNIX here")
    return socket.AF_UNIX, _unix_path()


async def _endpoint(loop: asyncio.AbstractEventLoop, **kwargs: Any) -> tuple[Any, Recorder]:
    transport, protocol = await loop.create_datagram_endpoint(lambda: Recorder(loop), **kwargs)
    return transport, protocol


def test_the_loop_makes_its_own_transport_by_the_setting(dloop: asyncio.AbstractEventLoop) -> None:
    """datagram=own makes the loop's transport; stock and datagram=stock make stock's."""
    async def main() -> type:
        transport, _ = await _endpoint(dloop, local_addr=(LOCAL, 0))
        transport.close()
        return type(transport)

    kind = run(dloop, main())
    if own(dloop):
        # The class of the loop's build: the pure one or its compiled subclass.
        assert kind is dloop._DatagramTransport  # type: ignore[attr-defined]
        assert issubclass(kind, asyncio_relaxed._datagram.DatagramTransport)
    else:
        assert kind.__module__ == "asyncio.selector_events"


@pytest.mark.parametrize("family", ["ipv4", "ipv6", "unix"])
@pytest.mark.parametrize("connected", [False, True], ids=["unconnected", "connected"])
def test_echo(dloop: asyncio.AbstractEventLoop, family: str, connected: bool) -> None:
    """A client endpoint sends three datagrams to an echoing server endpoint
    and gets each back, with the addresses recvfrom gives on stock."""
    fam, addr = _family_addr(family)

    async def main() -> None:
        server, sproto = await _endpoint(dloop, local_addr=addr, family=fam)
        sproto.echo = True
        server_addr = server.get_extra_info("sockname")
        # Bound where the server can reply (an unbound Unix client gets none).
        options: dict[str, Any] = {
            "family": fam, "local_addr": _unix_path() if fam == socket.AF_UNIX else addr}
        if connected:
            # (create_datagram_endpoint takes (host, port) for IPv6 too)
            options["remote_addr"] = server_addr if fam == socket.AF_UNIX else server_addr[:2]
        client, cproto = await _endpoint(dloop, **options)
        for data in (b"one", b"two", b"three"):
            if connected:
                client.sendto(data)
            else:
                client.sendto(data, server_addr)
        await cproto.count(3)
        assert [d for d, _ in cproto.received] == [b"one", b"two", b"three"]
        assert {a for _, a in cproto.received} == {server_addr}
        assert {a for _, a in sproto.received} == {client.get_extra_info("sockname")}
        assert client.get_extra_info("peername") == (server_addr if connected else None)
        client.close()
        server.close()
        assert await cproto.lost is None
        assert await sproto.lost is None
        assert cproto.calls == ["connection_made", "connection_lost"]

    run(dloop, main())


@pytest.mark.parametrize("size", [0, 1, 65507])
def test_sizes(dloop: asyncio.AbstractEventLoop, size: int) -> None:
    """A datagram of 0, 1 and 65,507 bytes (the IPv4 maximum) arrives whole,
    from a plain socket; the transport's own sendto(b"") sends one where
    stock's does (3.13.0) and nothing where it drops it (3.11.7, 3.12.1):
    the stock loop's run of this test checks the probe."""
    async def main() -> None:
        server, sproto = await _endpoint(dloop, local_addr=(LOCAL, 0))
        addr = server.get_extra_info("sockname")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind((LOCAL, 0))
            payload = os.urandom(size)
            peer.sendto(payload, addr)
            await sproto.count(1)
            assert sproto.received == [(payload, peer.getsockname())]
            server.sendto(payload, peer.getsockname())
            peer.settimeout(5)
            if size or _compat.DATAGRAM_SENDS_EMPTY:
                assert peer.recv(65536) == payload
            else:
                peer.setblocking(False)
                with pytest.raises(BlockingIOError):
                    peer.recv(65536)
        server.close()
        await sproto.lost

    run(dloop, main())


async def _unreachable_endpoint(loop: asyncio.AbstractEventLoop) -> tuple[Any, Recorder]:
    """An endpoint connected to a UDP port nobody has: a port bound and closed
    again, which the endpoint's own ephemeral port may happen to be (the kernel
    may hand the freed port out next; the socket is then connected to itself
    and hears its own datagrams), so such an endpoint is made anew."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as gone:
            gone.bind((LOCAL, 0))
            addr = gone.getsockname()
        transport, proto = await _endpoint(loop, remote_addr=addr)
        if transport.get_extra_info("sockname") != addr:
            return transport, proto
        transport.close()


def test_port_unreachable_is_error_received(dloop: asyncio.AbstractEventLoop) -> None:
    """A connected endpoint whose peer's port is closed: the kernel's ICMP
    port unreachable comes to error_received as ConnectionRefusedError, and
    the transport stays open.  The datagram is sent again while no error has
    come: the kernel's global ICMP rate limit (net.ipv4.icmp_msgs_per_sec,
    loopback included) may drop a port unreachable on a busy machine."""
    async def main() -> None:
        transport, proto = await _unreachable_endpoint(dloop)
        exc: BaseException | None = None
        for _ in range(100):
            transport.sendto(b"anyone?")
            try:
                exc = await asyncio.wait_for(asyncio.shield(proto.error), 0.1)
                break
            except TimeoutError:
                pass
        assert isinstance(exc, ConnectionRefusedError)
        assert not transport.is_closing()
        assert proto.calls == ["connection_made"]
        assert proto.received == []
        transport.close()
        assert await proto.lost is None

    run(dloop, main())


def test_failed_send_is_error_received(dloop: asyncio.AbstractEventLoop) -> None:
    """A send the kernel refuses (no such Unix socket) goes to error_received."""
    if not HAS_UNIX:
        pytest.skip("no AF_UNIX here")

    async def main() -> None:
        transport, proto = await _endpoint(dloop, local_addr=_unix_path(), family=socket.AF_UNIX)
        transport.sendto(b"x", _unix_path())  # a path nobody bound
        assert [type(e) for e in proto.errors] == [FileNotFoundError]
        assert not transport.is_closing()
        transport.close()
        await proto.lost

    run(dloop, main())


#: The largest UDP payload of each family: one byte more is EMSGSIZE.
_UDP_PAYLOAD_MAX: dict[int, int] = {socket.AF_INET: 65507, socket.AF_INET6: 65527}


async def _reply_outcomes(loop: asyncio.AbstractEventLoop, family: str) -> list[Any]:
    """A server endpoint reads a datagram from client A, then one from
    client B, then replies naming an address each way a protocol can: A's
    (not the one read last), B's object, a tuple equal to it, from an
    endpoint of the other family to B's, a datagram too large to send, and
    last B's port as a float (equal, but a TypeError on stock's socket,
    fatal).  What each client got back and what each protocol was told."""
    fam, addr = _family_addr(family)
    other_fam, other_addr = _family_addr("ipv6" if family == "ipv4" else "ipv4")
    server, proto = await _endpoint(loop, local_addr=addr, family=fam)
    other, other_proto = await _endpoint(loop, local_addr=other_addr, family=other_fam)
    clients: list[socket.socket] = []
    for name in (b"a", b"b"):
        client = socket.socket(fam, socket.SOCK_DGRAM)
        client.bind(addr)
        client.settimeout(5)
        client.sendto(name, server.get_extra_info("sockname"))
        await proto.count(len(clients) + 1)
        clients.append(client)
    (_, a), (_, b) = proto.received
    outcomes: list[Any] = []
    for data, to in ((b"1", a), (b"2", b), (b"3", tuple(list(b)))):
        server.sendto(data, to)
    other.sendto(b"5", b)
    server.sendto(b"x" * (_UDP_PAYLOAD_MAX[fam] + 1), b)
    await asyncio.sleep(0)
    outcomes.append(("got", clients[0].recv(100), clients[1].recv(100), clients[1].recv(100)))
    server.sendto(b"4", (b[0], float(b[1])))  # fatal on stock: the transport closes
    outcomes.append(("server told", [type(e).__name__ for e in proto.errors], server.is_closing()))
    outcomes.append(("other told", [type(e).__name__ for e in other_proto.errors],
                     other.is_closing()))
    for transport in (server, other):
        transport.abort()
    for client in clients:
        client.close()
    return outcomes


def _one_port_on_two_hosts() -> list[socket.socket]:
    """Two sockets bound to 127.0.0.1 and 127.0.0.2 on the same port."""
    for _ in range(20):
        first = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        first.bind((LOCAL, 0))
        second = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            second.bind(("127.0.0.2", first.getsockname()[1]))
        except OSError:  # (the port taken on 127.0.0.2: another one)
            first.close()
            second.close()
            continue
        return [first, second]
    pytest.skip("no port free on both 127.0.0.1 and 127.0.0.2")


@pytest.mark.parametrize("read", READS)
def test_senders_of_one_port_on_two_hosts_are_told_apart(
        dloop: asyncio.AbstractEventLoop, read: str) -> None:
    """Datagrams in one burst from the same port of two hosts, alternating:
    each is told with its own host (the compiled read reuses the address
    it made last only for the same sockaddr)."""
    async def main() -> list[Any]:
        server, proto = await _endpoint(dloop, local_addr=(LOCAL, 0))
        _read_by(server, read)
        to = server.get_extra_info("sockname")
        peers = _one_port_on_two_hosts()
        try:
            for i in range(6):
                peers[i % 2].sendto(b"%d" % i, to)
            await proto.count(6)
            return [addr for _, addr in proto.received]
        finally:
            for peer in peers:
                peer.close()
            server.close()
            await proto.lost

    got = run(dloop, main())
    port = got[0][1]
    assert got == [(LOCAL, port), ("127.0.0.2", port)] * 3


@pytest.mark.skipif(not HAS_IPV6, reason="no IPv6 loopback here")
@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_replies_name_their_address_as_on_stock(dloop: asyncio.AbstractEventLoop,
                                                loop_errors: LoopErrors, family: str) -> None:
    """Each reply reaches the client its address names, and an address the
    socket cannot take fails as on stock (the compiled build sends to the
    address it read last without parsing it again: only an equal tuple of
    the same types, on a socket of the same family, may)."""
    loop_errors.expect("Fatal write error on datagram transport")
    stock = asyncio.SelectorEventLoop()
    try:
        expected = run(stock, _reply_outcomes(stock, family))
    finally:
        stock.close()
    asyncio.set_event_loop(dloop)
    got = run(dloop, _reply_outcomes(dloop, family))
    assert got == expected
    assert got[0] == ("got", b"1", b"2", b"3")


def test_a_patched_socket_class_sees_every_datagram(dloop: asyncio.AbstractEventLoop,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A patch of socket.socket's recvfrom and sendto (a test's spy) is
    called for each datagram, as on stock: the compiled build's system
    calls step aside while the class is patched."""
    calls: list[str] = []

    def spy(name: str) -> Any:
        method = getattr(socket.socket, name)

        def patched(self: socket.socket, *args: Any) -> Any:
            calls.append(name)
            return method(self, *args)
        return patched

    async def main() -> None:
        server, proto = await _endpoint(dloop, local_addr=(LOCAL, 0))
        proto.echo = True
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.settimeout(5)
            monkeypatch.setattr(socket.socket, "recvfrom", spy("recvfrom"))
            monkeypatch.setattr(socket.socket, "sendto", spy("sendto"))
            client.sendto(b"ping", server.get_extra_info("sockname"))
            await proto.count(1)
            monkeypatch.undo()
            assert client.recv(100) == b"ping"
        server.close()
        await proto.lost

    run(dloop, main())
    # The client's sendto, the server's reads (the second finds nothing)
    # and its reply.
    assert calls[:2] == ["sendto", "recvfrom"] and calls.count("sendto") == 2, calls


def _burst(addr: Any, n: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        for i in range(n):
            peer.sendto(b"%d" % i, addr)


@pytest.mark.parametrize("n, events", [(32, 1), (33, 2), (5, 1)])
def test_a_burst_is_read_in_one_event(own_loop: asyncio_relaxed.Loop, n: int,
                                      events: int) -> None:
    """Datagrams waiting when the poll reports the socket: up to
    datagram_batch (32) read in one readiness event, each counted; 33 take
    two events.  Each is read by a system call of its own, the second event
    ending at EAGAIN; the compiled build reads an event that follows one
    that read 3 or more by recvmmsg(), one call an event, and one that
    returns fewer than it asked for ends the batch without an EAGAIN read."""
    loop = own_loop

    async def burst(server: Any, sproto: Recorder, first: int) -> Any:
        before = loop.statistics()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            for i in range(first, first + n):
                peer.sendto(b"%d" % i, server.get_extra_info("sockname"))
        await sproto.count(first + n)
        await asyncio.sleep(0)
        diff = loop.statistics() - before
        assert [d for d, _ in sproto.received[first:]] == [b"%d" % i for i in
                                                           range(first, first + n)]
        assert diff.datagram_read_events == events
        assert diff.datagrams_received == n
        assert diff.datagram_bytes_received == sum(len(b"%d" % i)
                                                   for i in range(first, first + n))
        return diff

    async def main() -> None:
        server, sproto = await _endpoint(loop, local_addr=(LOCAL, 0))
        diff = await burst(server, sproto, 0)
        if compiled(loop) and n == 33:  # the second event by recvmmsg, the first read 32
            assert (diff.datagram_recv, diff.datagram_recv_eagain) == (33, 0)
        else:
            assert diff.datagram_recv == n + diff.datagram_recv_eagain
            assert diff.datagram_recv_eagain == (0 if n == 32 else 1)
        diff = await burst(server, sproto, n)
        if compiled(loop):
            # After 32 or 5 read: one recvmmsg.  33 ended on an event that
            # read 1, so a call a datagram until that event's 32.
            assert (diff.datagram_recv, diff.datagram_recv_eagain) == (
                (33, 0) if n == 33 else (1, 0))
        else:
            assert diff.datagram_recv == n + diff.datagram_recv_eagain
        server.close()
        await sproto.lost

    run(loop, main())


def test_one_datagram_an_event_is_read_by_recvfrom(own_loop: asyncio_relaxed.Loop) -> None:
    """After an event that read 3 or more, one that reads a single datagram
    puts the compiled transport back to a system call a datagram (recvmmsg
    costs more than recvfrom for one): the event after it reads its
    datagram and then meets EAGAIN."""
    loop = own_loop

    async def main() -> None:
        server, sproto = await _endpoint(loop, local_addr=(LOCAL, 0))
        _read_by(server, "batches")
        to = server.get_extra_info("sockname")
        counts = []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            for i in range(3):
                before = loop.statistics()
                peer.sendto(b"%d" % i, to)
                await sproto.count(i + 1)
                diff = loop.statistics() - before
                counts.append((diff.datagram_recv, diff.datagram_recv_eagain))
        server.close()
        await sproto.lost
        if compiled(loop):
            assert counts == [(1, 0), (2, 1), (2, 1)]
        else:
            assert counts == [(2, 1)] * 3

    run(loop, main())


def test_batch_setting(loop_errors: LoopErrors) -> None:
    """datagram_batch=1 reads one datagram per readiness event, as stock does."""
    for loop in _as_fixture(asyncio_relaxed.Loop(datagram_batch=1), loop_errors):
        async def main(loop: asyncio_relaxed.Loop = loop) -> None:
            server, sproto = await _endpoint(loop, local_addr=(LOCAL, 0))
            before = loop.statistics()
            _burst(server.get_extra_info("sockname"), 5)
            await sproto.count(5)
            diff = loop.statistics() - before
            assert diff.datagram_read_events == 5
            assert diff.datagrams_received == 5
            server.close()
            await sproto.lost

        run(loop, main())


class _CloseAt(Recorder):
    def __init__(self, loop: asyncio.AbstractEventLoop, at: int, how: str) -> None:
        super().__init__(loop)
        self.at, self.how = at, how

    def datagram_received(self, data: bytes, addr: Any) -> None:
        super().datagram_received(data, addr)
        if len(self.received) == self.at:
            getattr(self.transport, self.how)()


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("how", ["close", "abort", "pause_reading"])
def test_a_callback_ends_the_batch(dloop: asyncio.AbstractEventLoop, how: str,
                                   read: str) -> None:
    """close(), abort() or pause_reading() from datagram_received, at the
    3rd of 10 waiting datagrams: nothing more is delivered (after close, not
    even after connection_lost); after pause_reading, resume_reading()
    delivers the other 7 in order."""
    async def main() -> None:
        server, proto = await dloop.create_datagram_endpoint(
            lambda: _CloseAt(dloop, 3, how), local_addr=(LOCAL, 0))
        _read_by(server, read)
        before = dloop.statistics() if own(dloop) else None
        _burst(server.get_extra_info("sockname"), 10)
        await proto.count(3)
        for _ in range(5):
            await asyncio.sleep(0)
        assert [d for d, _ in proto.received] == [b"0", b"1", b"2"]
        if before is not None:
            diff = dloop.statistics() - before  # type: ignore[attr-defined]
            assert (diff.datagram_read_events, diff.datagrams_received) == (1, 3)
        if how == "pause_reading":
            assert not server.is_reading()
            server.resume_reading()
            await proto.count(10)
            assert [d for d, _ in proto.received] == [b"%d" % i for i in range(10)]
            server.close()
        assert await proto.lost is None
        assert len(proto.received) == (10 if how == "pause_reading" else 3)

    run(dloop, main())


class _PauseAt(Recorder):
    """Pauses reading at each count of *at*."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *at: int) -> None:
        super().__init__(loop)
        self.at = at
        self.paused = loop.create_future()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        super().datagram_received(data, addr)
        if len(self.received) in self.at:
            self.transport.pause_reading()
            if not self.paused.done():
                self.paused.set_result(None)


@pytest.mark.parametrize("read", READS)
def test_pauses_inside_a_burst_keep_its_order(dloop: asyncio.AbstractEventLoop,
                                              read: str) -> None:
    """Reading paused at the 3rd and the 6th of 10 waiting datagrams, and
    two more sent during each pause: each resume_reading() delivers what
    waited before what came after, as stock (whose datagrams wait in the
    kernel) does; paused, nothing is delivered, not even after a
    resume_reading() that a pause_reading() follows at once."""
    async def main() -> None:
        server, proto = await dloop.create_datagram_endpoint(
            lambda: _PauseAt(dloop, 3, 6), local_addr=(LOCAL, 0))
        _read_by(server, read)
        addr = server.get_extra_info("sockname")
        _burst(addr, 10)
        sent = 10
        for at in (3, 6):
            await proto.count(at)
            for _ in range(3):
                await asyncio.sleep(0)
            assert len(proto.received) == at and not server.is_reading()
            server.resume_reading()
            server.pause_reading()
            for _ in range(3):
                await asyncio.sleep(0)
            assert len(proto.received) == at
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
                for i in range(sent, sent + 2):
                    peer.sendto(b"%d" % i, addr)
            sent += 2
            server.resume_reading()
        await proto.count(sent)
        assert [d for d, _ in proto.received] == [b"%d" % i for i in range(sent)]
        server.close()
        await proto.lost

    run(dloop, main())


@pytest.mark.parametrize("read", READS)
def test_a_close_while_paused_delivers_nothing_more(dloop: asyncio.AbstractEventLoop,
                                                    read: str) -> None:
    """Paused at the 3rd of 10 waiting datagrams, then closed: connection_lost
    and none of the other 7, as on stock (whose 7 the socket's close drops)."""
    async def main() -> None:
        server, proto = await dloop.create_datagram_endpoint(
            lambda: _PauseAt(dloop, 3), local_addr=(LOCAL, 0))
        _read_by(server, read)
        _burst(server.get_extra_info("sockname"), 10)
        await proto.paused
        server.close()
        assert await proto.lost is None
        for _ in range(3):
            await asyncio.sleep(0)
        assert [d for d, _ in proto.received] == [b"0", b"1", b"2"]
        if own(dloop):
            assert not server._held

    run(dloop, main())


def _sendto_outcomes(loop: asyncio.AbstractEventLoop) -> list[str]:
    """What each sendto() misuse does on *loop*: the exception's type and
    text, or "ok"."""
    async def main() -> list[str]:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind((LOCAL, 0))
            addr = peer.getsockname()
            connected, cproto = await _endpoint(loop, remote_addr=addr)
            unconnected, uproto = await _endpoint(loop, local_addr=(LOCAL, 0))
            outcomes = []
            calls = [
                (connected, ("text",)),
                (connected, (1234,)),
                (connected, (None,)),
                (connected, (b"x", ("127.0.0.2", 9))),
                (connected, (b"x", "nowhere")),
                (connected, (b"x", addr)),
                (connected, (bytearray(b"x"),)),
                (connected, (memoryview(b"x"),)),
                (unconnected, ("text", addr)),
                (unconnected, (b"x", (LOCAL, 0))),
                (unconnected, (b"",  addr)),
            ]
            for transport, args in calls:
                try:
                    transport.sendto(*args)
                    outcomes.append("ok")
                except Exception as exc:
                    # (the ports of this run's sockets out of the text)
                    text = str(exc).replace(str(addr), "ADDR")
                    outcomes.append(f"{type(exc).__name__}: {text}")
            outcomes.append(f"errors: {[type(e).__name__ for e in uproto.errors]}")
            connected.close()
            unconnected.close()
            await cproto.lost
            await uproto.lost
            outcomes.append(f"after close: {connected.sendto(b'x')!r}")
            return outcomes

    return run(loop, main())  # type: ignore[no-any-return]


def test_sendto_argument_errors_are_stocks(dloop: asyncio.AbstractEventLoop,
                                           loop_errors: LoopErrors) -> None:
    """sendto()'s TypeError and ValueError texts and what a misuse does,
    call for call the same as on stock's loop on this Python."""
    stock = asyncio.SelectorEventLoop()
    try:
        expected = _sendto_outcomes(stock)
    finally:
        stock.close()
    asyncio.set_event_loop(dloop)
    got = _sendto_outcomes(dloop)
    assert got == expected
    assert any("bytes-like object" in outcome for outcome in got)
    assert any("Invalid address: must be None or" in outcome for outcome in got)


@pytest.mark.skipif(not HAS_UNIX, reason="no AF_UNIX here")
def test_flow_control_over_a_full_unix_socket(dloop: asyncio.AbstractEventLoop) -> None:
    """A Unix datagram socket whose peer does not read refuses sends once its
    queue is full: the transport buffers, pauses the protocol past the high
    mark, and once the peer reads, sends the rest in order and resumes it."""
    async def main() -> None:
        path = _unix_path()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as peer:
            peer.bind(path)
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            transport, proto = await _endpoint(dloop, remote_addr=path, family=socket.AF_UNIX)
            transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            transport.set_write_buffer_limits(high=4096, low=1024)
            sent = 0
            while "pause_writing" not in proto.calls:
                assert sent < 10_000, "the peer's queue never filled"
                transport.sendto(b"%06d" % sent + b"." * 500)
                sent += 1
            buffered = transport.get_write_buffer_size()
            assert buffered > 4096
            peer.setblocking(False)
            got: list[bytes] = []
            while len(got) < sent:
                try:
                    got.append(peer.recv(1024))
                except BlockingIOError:
                    await asyncio.sleep(0.001)
            assert [g[:6] for g in got] == [b"%06d" % i for i in range(sent)]
            assert proto.calls == ["connection_made", "pause_writing", "resume_writing"]
            if own(dloop) or hasattr(transport, "_header_size") or not _HEADER:
                # (3.13's stock counts 8 bytes per datagram ever buffered)
                assert transport.get_write_buffer_size() == 0
            transport.close()
            assert await proto.lost is None

    run(dloop, main())


@pytest.mark.skipif(not HAS_UNIX, reason="no AF_UNIX here")
@pytest.mark.parametrize("how", ["close", "abort"])
def test_close_waits_for_the_buffer_abort_drops_it(dloop: asyncio.AbstractEventLoop,
                                                   how: str) -> None:
    """close() with datagrams buffered: connection_lost once they have gone
    out, all delivered; abort(): connection_lost on the next iteration,
    nothing more sent."""
    async def main() -> None:
        path = _unix_path()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as peer:
            peer.bind(path)
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            transport, proto = await _endpoint(dloop, remote_addr=path, family=socket.AF_UNIX)
            sent = 0
            while not transport.get_write_buffer_size():
                assert sent < 10_000, "the peer's queue never filled"
                transport.sendto(b"%06d" % sent)
                sent += 1
            transport.sendto(b"%06d" % sent)
            sent += 1
            delivered_before = sent - 2  # the first refused one and the last are buffered
            getattr(transport, how)()
            assert transport.is_closing()
            peer.setblocking(False)
            got: list[bytes] = []
            while not proto.lost.done():
                try:
                    got.append(peer.recv(1024))
                except BlockingIOError:
                    await asyncio.sleep(0.001)
            assert await proto.lost is None
            while True:
                try:
                    got.append(peer.recv(1024))
                except BlockingIOError:
                    break
            expect = sent if how == "close" else delivered_before
            assert got == [b"%06d" % i for i in range(expect)]

    run(dloop, main())


def test_extra_info_and_repr(dloop: asyncio.AbstractEventLoop) -> None:
    """get_extra_info's keys and the repr, in stock's form."""
    async def main() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind((LOCAL, 0))
            transport, proto = await _endpoint(dloop, remote_addr=peer.getsockname())
            sock = transport.get_extra_info("socket")
            assert sock.fileno() == transport._sock.fileno()
            assert type(sock).__name__ == "TransportSocket"
            assert transport.get_extra_info("sockname") == sock.getsockname()
            assert transport.get_extra_info("peername") == peer.getsockname()
            assert transport.get_extra_info("nothing", "dflt") == "dflt"
            assert isinstance(transport, asyncio.BaseTransport)
            assert transport.get_protocol() is proto
            assert re.fullmatch(r"<\w+ fd=\d+ read=polling write=<idle, bufsize=0>>",
                                repr(transport)), repr(transport)
            transport.pause_reading()
            assert " read=idle " in repr(transport)
            transport.close()
            assert re.fullmatch(r"<\w+ closing fd=\d+ read=idle write=<idle, bufsize=0>>",
                                repr(transport)), repr(transport)
            await proto.lost
            assert re.fullmatch(r"<\w+ closed fd=\d+>", repr(transport)), repr(transport)

    run(dloop, main())


def test_an_unclosed_transport_warns(dloop: asyncio.AbstractEventLoop) -> None:
    """A transport collected unclosed: ResourceWarning "unclosed transport",
    and its socket is closed."""
    async def main() -> int:
        transport, proto = await _endpoint(dloop, local_addr=(LOCAL, 0))
        fd: int = transport._sock.fileno()
        proto.transport = None
        dloop._transports.pop(fd, None)  # type: ignore[attr-defined]
        dloop._remove_reader(fd)  # type: ignore[attr-defined]
        del transport
        return fd

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fd = run(dloop, main())
        collect_garbage()
        if not REFCOUNTED:
            gc.collect()
    messages = [str(w.message) for w in caught if w.category is ResourceWarning]
    assert any(m.startswith("unclosed transport <") and f"fd={fd}" in m
               for m in messages), messages


def test_sendto_counts(own_loop: asyncio_relaxed.Loop) -> None:
    """Each datagram sent at once: one send, one datagram and its bytes out."""
    loop = own_loop

    async def main() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind((LOCAL, 0))
            transport, proto = await _endpoint(loop, local_addr=(LOCAL, 0))
            before = loop.statistics()
            for size in (3, 5, 7):
                transport.sendto(b"x" * size, peer.getsockname())
            diff = loop.statistics() - before
            assert (diff.datagram_send, diff.datagrams_sent, diff.datagram_bytes_sent) == (3, 3, 15)
            assert diff.datagram_send_eagain == diff.datagram_errors == 0
            transport.close()
            await proto.lost

    run(loop, main())


def test_iterations_are_not_blocked_by_an_idle_endpoint(own_loop: asyncio_relaxed.Loop) -> None:
    """An endpoint with nothing to read costs no read: the reader runs only
    on readiness."""
    loop = own_loop

    async def main() -> None:
        transport, proto = await _endpoint(loop, local_addr=(LOCAL, 0))
        before = loop.statistics()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        diff = loop.statistics() - before
        assert diff.datagram_read_events == diff.datagram_recv == 0
        transport.close()
        await proto.lost

    run(loop, main())


class _RaiseAt(Recorder):
    def datagram_received(self, data: bytes, addr: Any) -> None:
        super().datagram_received(data, addr)
        if data == b"1":
            raise ZeroDivisionError("from datagram_received")


@pytest.mark.parametrize("read", READS)
def test_a_failing_callback_is_the_readers_error(dloop: asyncio.AbstractEventLoop,
                                                 loop_errors: LoopErrors, read: str) -> None:
    """datagram_received raising: reported as the reader's exception (stock's
    "Exception in callback ..._read_ready()"), the transport stays open and
    the datagrams after it are delivered."""
    loop_errors.expect("Exception in callback")

    async def main() -> None:
        server, proto = await dloop.create_datagram_endpoint(
            lambda: _RaiseAt(dloop), local_addr=(LOCAL, 0))
        _read_by(server, read)
        _burst(server.get_extra_info("sockname"), 3)
        await proto.count(3)
        assert [d for d, _ in proto.received] == [b"0", b"1", b"2"]
        assert not server.is_closing()
        server.close()
        await proto.lost

    run(dloop, main())
    assert len(loop_errors.contexts) == 1
    context = loop_errors.contexts[0]
    assert isinstance(context["exception"], ZeroDivisionError)
    assert context["message"].startswith("Exception in callback ")
    assert context["message"].endswith("._read_ready()")


async def _fatal_send(loop: asyncio.AbstractEventLoop) -> list[Any]:
    """A send whose socket call raises what is not an OSError (an address
    whose port is not a number): fatal, reported and the endpoint lost."""
    contexts: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: contexts.append(context))
    transport, protocol = await _endpoint(loop, local_addr=(LOCAL, 0))
    transport.sendto(b"x", (LOCAL, "no port"))
    exc = await protocol.lost
    return [type(exc).__name__, transport.is_closing(),
            [(c["message"], type(c["exception"]).__name__, c["transport"] is transport)
             for c in contexts]]


def test_a_send_that_fails_otherwise_is_fatal_as_on_stock(
        dloop: asyncio.AbstractEventLoop) -> None:
    stock = asyncio.SelectorEventLoop()
    try:
        expected = stock.run_until_complete(asyncio.wait_for(_fatal_send(stock), 10))
    finally:
        stock.close()
    asyncio.set_event_loop(dloop)
    got = run(dloop, _fatal_send(dloop))
    assert got == expected
    assert got == ["TypeError", True,
                   [("Fatal write error on datagram transport", "TypeError", True)]]


# -- reuse_port and allow_broadcast ----------------------------------------------------

#: Senders of the reuse_port test, each its own socket (its own source port):
#: the kernel spreads a reuse_port group's datagrams by a hash of the source,
#: so each endpoint gets at least one unless 64 hashes all fall on one side.
_REUSE_SENDERS = 64


def _can_reuse_port() -> str | None:
    """Why SO_REUSEPORT cannot be tested here, or None."""
    if not hasattr(socket, "SO_REUSEPORT"):
        return "no SO_REUSEPORT on this platform"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a, \
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b:
            for s in (a, b):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            a.bind((LOCAL, 0))
            b.bind(a.getsockname())
    except OSError as exc:
        return f"two sockets cannot share a port with SO_REUSEPORT here: {exc!r}"
    return None


@pytest.mark.skipif(_can_reuse_port() is not None, reason=str(_can_reuse_port()))
def test_reuse_port_two_endpoints_share_a_port(every_loop: asyncio.AbstractEventLoop) -> None:
    """create_datagram_endpoint(reuse_port=True) twice on one port: both
    sockets have SO_REUSEPORT set, the port is the same, every datagram of
    64 senders arrives exactly once and each endpoint gets some (stock's
    behaviour); a third endpoint on that port without reuse_port fails with
    stock's EADDRINUSE (not asked of uvloop: see below)."""
    loop = every_loop

    async def main() -> None:
        first, fproto = await _endpoint(loop, local_addr=(LOCAL, 0), reuse_port=True)
        addr = first.get_extra_info("sockname")
        second, sproto = await _endpoint(loop, local_addr=addr, reuse_port=True)
        senders: list[socket.socket] = []
        try:
            assert second.get_extra_info("sockname") == addr
            for transport in (first, second):
                sock = transport.get_extra_info("socket")
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) != 0
            if not type(loop).__module__.startswith("uvloop"):
                # (uvloop 0.23 leaves the transport of its failed bind unclosed:
                # ResourceWarning "unclosed resource <UDPTransport closed=False>")
                with pytest.raises(OSError) as refused:
                    await _endpoint(loop, local_addr=addr)
                assert refused.value.errno == errno.EADDRINUSE
            for i in range(_REUSE_SENDERS):
                peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                senders.append(peer)
                peer.bind((LOCAL, 0))
                peer.sendto(b"%d" % i, addr)
            while len(fproto.received) + len(sproto.received) < _REUSE_SENDERS:
                waiter = asyncio.ensure_future(fproto.count(len(fproto.received) + 1))
                other = asyncio.ensure_future(sproto.count(len(sproto.received) + 1))
                await asyncio.wait([waiter, other], return_when=asyncio.FIRST_COMPLETED)
                for fut in (waiter, other):
                    fut.cancel()
                fproto._want = sproto._want = None
            got = sorted(d for d, _ in fproto.received + sproto.received)
            assert got == sorted(b"%d" % i for i in range(_REUSE_SENDERS))
            assert fproto.received and sproto.received
            sources = {peer.getsockname() for peer in senders}
            assert {a for _, a in fproto.received + sproto.received} == sources
        finally:
            for peer in senders:
                peer.close()
            first.close()
            second.close()
        assert await fproto.lost is None
        assert await sproto.lost is None

    run(loop, main())


#: The loopback range's broadcast address: routed to lo only (the local
#: table's "broadcast 127.255.255.255 dev lo"), so nothing leaves the host.
_LOOPBACK_BROADCAST = "127.255.255.255"


def _can_broadcast_on_loopback() -> str | None:
    """Why a broadcast on loopback cannot be tested here, or None: a plain
    socket with SO_BROADCAST sends to 127.255.255.255 and a socket bound
    there receives it."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver, \
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            receiver.bind((_LOOPBACK_BROADCAST, 0))
            sender.bind((LOCAL, 0))
            sender.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            sender.sendto(b"probe", receiver.getsockname())
            receiver.settimeout(5)
            if receiver.recv(16) != b"probe":
                return "the loopback broadcast probe got something else"
    except OSError as exc:
        return f"no broadcast on loopback here: {exc!r}"
    return None


def test_allow_broadcast_sets_so_broadcast(every_loop: asyncio.AbstractEventLoop) -> None:
    """allow_broadcast=True: the endpoint's socket has SO_BROADCAST set, as
    stock sets it; without it the option is off."""
    async def main() -> None:
        on, on_proto = await _endpoint(every_loop, local_addr=(LOCAL, 0), allow_broadcast=True)
        off, off_proto = await _endpoint(every_loop, local_addr=(LOCAL, 0))
        assert on.get_extra_info("socket").getsockopt(
            socket.SOL_SOCKET, socket.SO_BROADCAST) != 0
        assert off.get_extra_info("socket").getsockopt(
            socket.SOL_SOCKET, socket.SO_BROADCAST) == 0
        on.close()
        off.close()
        await on_proto.lost
        await off_proto.lost

    run(every_loop, main())


@pytest.mark.skipif(_can_broadcast_on_loopback() is not None,
                    reason=str(_can_broadcast_on_loopback()))
def test_a_broadcast_on_loopback(every_loop: asyncio.AbstractEventLoop) -> None:
    """A send to the loopback broadcast address: from an endpoint with
    allow_broadcast=True it reaches an endpoint bound there, with the
    sender's address; from one without it the kernel refuses it (EACCES),
    which comes to error_received as PermissionError and leaves the
    transport open (stock's outcome, checked by the stock loop's run)."""
    async def main() -> None:
        receiver, rproto = await _endpoint(every_loop, local_addr=(_LOOPBACK_BROADCAST, 0))
        target = receiver.get_extra_info("sockname")
        allowed, aproto = await _endpoint(every_loop, local_addr=(LOCAL, 0), allow_broadcast=True)
        plain, pproto = await _endpoint(every_loop, local_addr=(LOCAL, 0))
        plain.sendto(b"refused", target)
        assert [type(e) for e in pproto.errors] == [PermissionError]
        assert not plain.is_closing()
        allowed.sendto(b"broadcast", target)
        await rproto.count(1)
        assert rproto.received == [(b"broadcast", allowed.get_extra_info("sockname"))]
        assert aproto.errors == []
        for transport in (receiver, allowed, plain):
            transport.close()
        for proto in (rproto, aproto, pproto):
            assert await proto.lost is None
        assert rproto.received == [(b"broadcast", allowed.get_extra_info("sockname"))]

    run(every_loop, main())
