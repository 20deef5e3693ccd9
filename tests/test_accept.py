"""Accept strategies: exact accept() calls per readiness event, no Task per
connection, and socket options read back with getsockopt."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import asyncio_relaxed
from asyncio_relaxed import _accept, _compat
from conftest import LoopErrors, iterate, run


class Counting(asyncio.Protocol):
    made = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        Counting.made += 1
        self.transport = transport

    def connection_lost(self, exc: BaseException | None) -> None:
        pass


@pytest.fixture
def clients() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    yield socks
    for s in socks:
        s.close()


class Served:
    """The servers a test started: started, stopped, and what a test that
    failed before its stop() left open closed at teardown, so that its
    sockets' ResourceWarnings do not fail a later, unrelated test."""

    def __init__(self) -> None:
        self.started: list[tuple[asyncio_relaxed.Loop, Any]] = []

    def start(self, loop: asyncio_relaxed.Loop, backlog: int = 100) -> asyncio.AbstractServer:
        server = run(loop, loop.create_server(Counting, "127.0.0.1", 0, backlog=backlog))
        self.started.append((loop, server))
        iterate(loop, 1)
        return server

    def stop(self, loop: asyncio_relaxed.Loop, server: asyncio.AbstractServer) -> None:
        stop_server(loop, server)
        self.started.remove((loop, server))

    def close_leftovers(self) -> None:
        for loop, server in self.started:
            for transport in list(loop._transports.values()):
                if transport is not None and transport._sock is not None:
                    transport._sock.close()
            for sock in server._sockets or ():
                sock.close()
        self.started.clear()


def stop_server(loop: asyncio_relaxed.Loop, server: asyncio.AbstractServer) -> None:
    server.close()
    for transport in list(loop._transports.values()):
        if transport is not None:
            transport.abort()
    run(loop, server.wait_closed())
    iterate(loop, 2)


@pytest.fixture
def served() -> Iterator[Served]:
    servers = Served()
    yield servers
    servers.close_leftovers()


def connect(server: asyncio.AbstractServer, clients: list[socket.socket], n: int) -> None:
    """n completed TCP handshakes waiting in the accept queue."""
    address = server.sockets[0].getsockname()
    for _ in range(n):
        clients.append(socket.create_connection(address))


@pytest.mark.parametrize(
    ("accept_batch", "accepts"), [(0, 5), (2, 2)], ids=["backlog", "batch-of-2"]
)
@pytest.mark.parametrize("queue_length", ["known", "unknown"])
def test_batch_accepts_up_to_the_batch_per_event(
    clients: list[socket.socket], monkeypatch: pytest.MonkeyPatch, accept_batch: int,
    accepts: int, queue_length: str, served: Served,
) -> None:
    """Up to the batch per event.  Where the accept queue's length is known
    (Linux TCP), no accept finds the queue empty; elsewhere the batch ends at
    one that does, as stock's (5 connections: 6 accepts, one EAGAIN)."""
    if queue_length == "unknown":
        monkeypatch.setattr(_accept, "accept_queue_length", lambda sock: None)
    elif not _accept.QUEUE_LENGTH_KNOWN:
        pytest.skip("Linux only (TCP_INFO)")
    eagain = 1 if queue_length == "unknown" and accepts == 5 else 0
    loop = asyncio_relaxed.new_event_loop(accept="batch", accept_batch=accept_batch)
    try:
        server = served.start(loop)
        connect(server, clients, 5)
        settle(server, 5)
        before = loop.statistics()
        iterate(loop, 1)
        delta = loop.statistics() - before
        assert (delta.accept, delta.accept_eagain) == (accepts + eagain, eagain)
        served.stop(loop, server)
    finally:
        loop.close()


@pytest.mark.skipif(not _accept.QUEUE_LENGTH_KNOWN, reason="Linux only (TCP_INFO)")
def test_batch_one_connection_per_event_costs_one_accept(
    clients: list[socket.socket], served: Served
) -> None:
    """Light load, the common case of a worker: one connection per event,
    one accept (stock makes two, the second finding the queue empty)."""
    loop = asyncio_relaxed.new_event_loop(accept="batch")
    try:
        server = served.start(loop)
        before = loop.statistics()
        for _ in range(3):
            connect(server, clients, 1)
            settle(server, 1)
            iterate(loop, 1)
        delta = loop.statistics() - before
        assert (delta.accept, delta.accept_eagain) == (3, 0)
        served.stop(loop, server)
    finally:
        loop.close()


@pytest.mark.parametrize("strategy", ["single", "relaxed"])
def test_single_and_relaxed_accept_one_per_event_and_never_waste_one(
    clients: list[socket.socket], strategy: str, served: Served
) -> None:
    loop = asyncio_relaxed.new_event_loop(accept=strategy)
    try:
        server = served.start(loop)
        connect(server, clients, 5)
        before = loop.statistics()
        for i in range(1, 6):
            iterate(loop, 1)
            assert (loop.statistics() - before).accept == i
        iterate(loop, 3)
        delta = loop.statistics() - before
        assert (delta.accept, delta.accept_eagain) == (5, 0)
        served.stop(loop, server)
    finally:
        loop.close()


def test_plain_accept_creates_no_task(clients: list[socket.socket], served: Served) -> None:
    loop = asyncio_relaxed.new_event_loop()
    try:
        server = served.start(loop)
        Counting.made = 0
        connect(server, clients, 3)
        tasks_before = len(asyncio.all_tasks(loop))
        iterate(loop, 1)
        assert len(asyncio.all_tasks(loop)) == tasks_before
        iterate(loop, 1)
        assert Counting.made == 3
        served.stop(loop, server)
    finally:
        loop.close()


def test_protocol_factory_error_closes_the_connection(clients: list[socket.socket]) -> None:
    """As stock: the connection is dropped (closed here, not left to the GC)."""
    loop = asyncio_relaxed.new_event_loop()

    def broken() -> asyncio.Protocol:
        raise RuntimeError("no protocol for you")

    try:
        server = run(loop, loop.create_server(broken, "127.0.0.1", 0))
        connect(server, clients, 1)
        iterate(loop, 3)
        clients[0].settimeout(5)
        assert clients[0].recv(1) == b""  # closed by the server
        server.close()
        run(loop, server.wait_closed())
    finally:
        loop.close()


def check_three_sockets(
    loop: asyncio_relaxed.Loop, check: Callable[[socket.socket, Any, Any], None]
) -> None:
    """Run *check(listener, accepted, client)* on a real loopback connection."""
    accepted: list[asyncio.BaseTransport] = []

    class Keep(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.append(transport)

    async def main() -> None:
        server = await loop.create_server(Keep, "127.0.0.1", 0)
        listener = server.sockets[0]
        port = listener.getsockname()[1]
        client, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        while not accepted:
            await asyncio.sleep(0)
        check(listener, accepted[0].get_extra_info("socket"), client.get_extra_info("socket"))
        client.close()
        accepted[0].close()
        server.close()
        await server.wait_closed()

    run(loop, main())


#: Client addresses in 127/8 (all loopback on Linux) with one-, two- and
#: three-digit octets, 0 and 255 among them.
PEERS = ["127.0.0.1", "127.9.10.99", "127.100.255.0", "127.255.254.253"]


def test_accepted_connection_is_what_socket_accept_makes(loop: asyncio.AbstractEventLoop) -> None:
    """An accepted connection's peername is the client's address and port,
    and its socket is what ``socket.accept()`` then ``setblocking(False)``
    leave: timeout 0, O_NONBLOCK, close-on-exec, not inheritable, its kind
    without flags (the compiled accept makes all of it in one accept4() and
    writes the address itself)."""
    seen: list[tuple[Any, ...]] = []

    class Peer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            sock = getattr(sock, "_sock", sock)  # stock's TransportSocket
            flags = fcntl.fcntl(sock.fileno(), fcntl.F_GETFL)
            seen.append((transport.get_extra_info("peername"), sock.gettimeout(),
                         bool(flags & os.O_NONBLOCK), os.get_inheritable(sock.fileno()),
                         bool(fcntl.fcntl(sock.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC),
                         sock.type, sock.family))
            transport.close()

    async def main() -> list[tuple[str, int]]:
        server = await loop.create_server(Peer, "127.0.0.1", 0)
        expected = []
        for peer in PEERS:
            with socket.socket() as client:
                client.bind((peer, 0))
                client.connect(server.sockets[0].getsockname())
                expected.append(client.getsockname())
                while len(seen) < len(expected):
                    await asyncio.sleep(0.001)
        server.close()
        await server.wait_closed()
        return expected

    expected = run(loop, main())
    assert [s[0] for s in seen] == expected
    assert {s[1:] for s in seen} == {(0.0, True, False, True, socket.SOCK_STREAM,
                                      socket.AF_INET)}


@pytest.mark.parametrize("write", ["eager", "deferred"])
def test_nodelay_on_listener_accepted_and_client_sockets(write: str) -> None:
    loop = asyncio_relaxed.new_event_loop(write=write)
    nodelay = (socket.IPPROTO_TCP, socket.TCP_NODELAY)
    reuse = (socket.SOL_SOCKET, socket.SO_REUSEADDR)

    def check(listener: socket.socket, server_side: Any, client_side: Any) -> None:
        assert listener.getsockopt(*nodelay) == 1  # set once, on the listener
        assert server_side.getsockopt(*nodelay) == 1  # inherited from it
        assert client_side.getsockopt(*nodelay) == 1  # set by the transport
        assert listener.getsockopt(*reuse) == 1
        assert client_side.getsockopt(*reuse) == 0

    try:
        check_three_sockets(loop, check)
    finally:
        loop.close()


@pytest.mark.parametrize("factory", ["asyncio", "eager", "deferred"])
def test_nodelay_on_a_listener_made_without_a_protocol(factory: str) -> None:
    """``socket.socket(AF_INET)`` has proto 0 (uvicorn --fd/--workers and
    gunicorn make their listeners so): stock sets TCP_NODELAY only where
    proto is IPPROTO_TCP, so its accepted sockets keep Nagle's algorithm;
    ours sets it on the listener whatever its proto, and Linux copies it to
    each accepted socket (README, Migrating from uvloop)."""
    if factory == "asyncio":
        loop: Any = asyncio.SelectorEventLoop()
    else:
        loop = asyncio_relaxed.new_event_loop(write=factory)
    nodelay = (socket.IPPROTO_TCP, socket.TCP_NODELAY)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    assert listener.proto == 0
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[Any] = []

    class Keep(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            accepted.append(transport)

    async def main() -> None:
        server = await loop.create_server(Keep, sock=listener)
        client, _ = await loop.create_connection(asyncio.Protocol,
                                                 *listener.getsockname())
        while not accepted:
            await asyncio.sleep(0)
        expected = 0 if factory == "asyncio" else 1
        assert listener.getsockopt(*nodelay) == expected
        assert accepted[0].get_extra_info("socket").getsockopt(*nodelay) == expected
        client.close()
        accepted[0].close()
        server.close()
        await server.wait_closed()

    try:
        run(loop, main())
    finally:
        loop.close()


def test_keepalive_knobs_on_listener_accepted_and_client_sockets() -> None:
    loop = asyncio_relaxed.new_event_loop(
        keepalive=True, keepalive_idle=30, keepalive_interval=5, keepalive_count=3
    )
    expected = {
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE): 1,
        (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE): 30,
        (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL): 5,
        (socket.IPPROTO_TCP, socket.TCP_KEEPCNT): 3,
    }

    def check(listener: socket.socket, server_side: Any, client_side: Any) -> None:
        for sock in (listener, server_side, client_side):
            got = {key: sock.getsockopt(*key) for key in expected}
            assert got == expected, sock

    try:
        check_three_sockets(loop, check)
    finally:
        loop.close()


def _epoll_flags(epoll_fd: int, fd: int) -> int:
    """The event mask the kernel holds for *fd* in the epoll set *epoll_fd*."""
    with open(f"/proc/self/fdinfo/{epoll_fd}") as f:
        for line in f:
            if line.startswith("tfd:"):
                fields = line.split()
                if int(fields[1]) == fd:
                    return int(fields[3], 16)
    raise AssertionError(f"fd {fd} is not in epoll set {epoll_fd}")


@pytest.mark.parametrize("exclusive", [False, True])
def test_exclusive_accept_registers_listeners_with_epollexclusive(
    exclusive: bool, served: Served
) -> None:
    import select

    if not hasattr(select, "EPOLLEXCLUSIVE"):
        pytest.skip("no EPOLLEXCLUSIVE on this platform")
    loop = asyncio_relaxed.new_event_loop(exclusive_accept=exclusive)
    try:
        server = served.start(loop)
        listener = server.sockets[0].fileno()
        flags = _epoll_flags(loop._selector.fileno(), listener)
        assert bool(flags & select.EPOLLEXCLUSIVE) is exclusive
        assert flags & select.EPOLLIN
        served.stop(loop, server)
    finally:
        loop.close()


def test_pending_connect_leaves_the_loop_blocking() -> None:
    """A connect stuck in EINPROGRESS (the listener's accept queue is full) must
    not make the loop spin (libuv "fix EINPROGRESS busy loop")."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # never accepted from: the queue fills at once
    address = listener.getsockname()
    fillers: list[socket.socket] = []
    loop = asyncio_relaxed.new_event_loop()
    try:
        # Fill the accept queue until a handshake no longer completes.
        for _ in range(64):
            try:
                fillers.append(socket.create_connection(address, timeout=0.2))
            except TimeoutError:
                break
        else:
            pytest.skip("the accept queue never filled")
        pending = socket.socket()
        pending.setblocking(False)
        fillers.append(pending)

        async def attempt() -> None:
            await asyncio.wait_for(loop.sock_connect(pending, address), 0.5)

        before = loop.statistics()
        with pytest.raises(asyncio.TimeoutError):  # still pending: not refused, not done
            run(loop, attempt())
        delta = loop.statistics() - before
        # Blocking waits: a handful of iterations in 0.5 s, not thousands.
        assert delta.iterations < 20, delta
    finally:
        loop.close()
        for s in fillers:
            s.close()
        listener.close()


# -- accept=balanced ----------------------------------------------------------------


def accepts(loop: asyncio_relaxed.Loop, before: Any) -> tuple[int, int]:
    delta = loop.statistics() - before
    return delta.accept, delta.accept_eagain


def ctl(loop: asyncio_relaxed.Loop, before: Any) -> tuple[int, int, int]:
    """(ADD, MOD, DEL) sent to the kernel since *before*."""
    delta = loop.statistics() - before
    return delta.epoll_ctl_add, delta.epoll_ctl_mod, delta.epoll_ctl_del


def listening(loop: asyncio_relaxed.Loop, server: asyncio.AbstractServer) -> bool:
    try:
        loop._selector.get_key(server.sockets[0].fileno())
    except KeyError:
        return False
    return True


#: The real one, for settle(): some tests replace _loop's.
_queue_length = _accept.accept_queue_length


def settle(listener: Any, n: int) -> None:
    """Wait until the kernel has *n* connections in *listener*'s accept queue
    (a listening socket, or a Server's): a completed connect() returns
    before the server side has queued the connection.  Where the length
    cannot be read, trust the connect."""
    if not isinstance(listener, socket.socket):
        listener = listener.sockets[0]._sock
    for _ in range(1000):
        queued = _queue_length(listener)
        if queued is None or queued == n:
            return
        time.sleep(0.001)
    raise AssertionError(f"the accept queue never held {n}")


@pytest.mark.skipif(not _accept.QUEUE_LENGTH_KNOWN, reason="Linux only (TCP_INFO)")
def test_accept_queue_length_counts_waiting_connections(clients: list[socket.socket]) -> None:
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(10)
        assert _accept.accept_queue_length(listener) == 0
        for _ in range(3):
            clients.append(socket.create_connection(listener.getsockname()))
        settle(listener, 3)
        assert _accept.accept_queue_length(listener) == 3
        listener.accept()[0].close()
        assert _accept.accept_queue_length(listener) == 2
    finally:
        listener.close()
    a, b = socket.socketpair()
    with a, b:
        assert _accept.accept_queue_length(a) is None  # not TCP: unknown


def test_balanced_gate_without_sockets() -> None:
    """The rest grows with open connections and is capped; cooldown starts at
    its cap, halves when connections waited for a rest, grows back when none
    did, and stays within its bounds."""
    gate = _accept.BalancedGate()
    cap = _accept.BALANCED_MAX_COOLDOWN
    assert gate.cooldown == cap
    assert gate.rest(2) == 2 * cap
    assert gate.rest(10**6) == _accept.BALANCED_MAX_REST
    gate.rested(waited=False)
    assert gate.cooldown == cap  # idle rests never take it past the cap
    gate.rested(waited=True)
    assert gate.cooldown == cap * _accept.BALANCED_SHRINK
    gate.rested(waited=False)
    assert gate.cooldown == cap * _accept.BALANCED_SHRINK * _accept.BALANCED_GROW
    for _ in range(100):
        gate.rested(waited=True)
    assert gate.cooldown == _accept.BALANCED_MIN_COOLDOWN
    for _ in range(1000):
        gate.rested(waited=False)
    assert gate.cooldown == cap
    assert (gate.rests_waited, gate.rests_idle) == (101, 1002)


class FakeSocket:
    """A listening socket without a kernel: accept() gives what *script*
    says, in order ("conn", or an exception class), then EAGAIN."""

    family = socket.AF_INET

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.accepts = 0
        self.fd = 7

    def fileno(self) -> int:
        return self.fd

    def accept(self) -> tuple[Any, Any]:
        self.accepts += 1
        step = self.script.pop(0) if self.script else BlockingIOError
        if step == "conn":
            return FakeConn(), ("192.0.2.1", self.accepts)
        if isinstance(step, type) and issubclass(step, OSError):
            raise step(errno.EMFILE, "Too many open files") if step is OSError else step()
        raise AssertionError(step)


class FakeConn:
    def setblocking(self, flag: bool) -> None:
        pass


class FakeHost:
    """What a Listener asks of its loop, recorded."""

    def __init__(self, accept_batch: int = 0, open_count: int = 0) -> None:
        from asyncio_relaxed._stats import Counters

        self.stats = Counters()
        self.accept_batch = accept_batch
        self.held = open_count
        self.calls: list[tuple[Any, ...]] = []
        self.accepted_conns: list[Any] = []

    def accepted(self, listener: Any, conn: Any, addr: Any) -> None:
        self.accepted_conns.append(addr)
        self.held += 1

    def poll(self, listener: Any) -> None:
        self.calls.append(("poll",))

    def unpoll(self, listener: Any) -> None:
        self.calls.append(("unpoll",))

    def reregister(self, listener: Any) -> None:
        self.calls.append(("reregister",))

    def rest(self, listener: Any, seconds: float) -> Any:
        self.calls.append(("rest", seconds))
        return FakeTimer()

    def starved(self, listener: Any, exc: OSError, report: bool) -> Any:
        self.calls.append(("starved", exc.errno, report))
        return FakeTimer()

    def open_count(self, listener: Any) -> int:
        return self.held


class FakeTimer:
    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def listener(strategy: str, host: FakeHost, sock: FakeSocket) -> Any:
    cls = _accept.listener_class(asyncio_relaxed.AcceptStrategy(strategy))
    return cls(host, Counting, sock, None, None, 100, (60.0, 30.0), None)


def test_listener_batch_takes_what_is_queued_and_no_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """batch: one accept, then the queue's length (3), never one into an
    empty queue; with the length unknown, until EAGAIN."""
    monkeypatch.setattr(_accept, "accept_queue_length", lambda sock: 3)
    host, sock = FakeHost(), FakeSocket(["conn"] * 4)
    listener("batch", host, sock).ready()
    assert (sock.accepts, len(host.accepted_conns), host.stats.accept_eagain) == (4, 4, 0)
    monkeypatch.setattr(_accept, "accept_queue_length", lambda sock: None)
    host, sock = FakeHost(), FakeSocket(["conn"] * 4)
    listener("batch", host, sock).ready()
    assert (sock.accepts, len(host.accepted_conns), host.stats.accept_eagain) == (5, 4, 1)


def test_listener_skips_an_aborted_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection reset before accept() is dropped and the burst goes on
    (stock from 3.14, gh-127529), first or later in the event."""
    monkeypatch.setattr(_accept, "accept_queue_length", lambda sock: 2)
    for script in (["conn", ConnectionAbortedError, "conn"],
                   [ConnectionAbortedError, "conn", "conn"]):
        host, sock = FakeHost(), FakeSocket(script)
        listener("batch", host, sock).ready()
        assert (sock.accepts, len(host.accepted_conns)) == (3, 2), script


@pytest.mark.parametrize("strategy", ["single", "relaxed"])
def test_listener_single_and_relaxed_accept_one(strategy: str) -> None:
    host, sock = FakeHost(), FakeSocket(["conn"] * 3)
    listener(strategy, host, sock).ready()
    assert (sock.accepts, len(host.accepted_conns)) == (1, 1)


def test_listener_backs_off_and_reports_once_per_episode() -> None:
    """EMFILE: out of the poller, stock's retry scheduled, reported; a second
    failure before any success is not reported again; a success ends the
    episode."""
    host, sock = FakeHost(), FakeSocket([OSError])
    made = listener("single", host, sock)
    made.ready()
    assert made.state is _accept.ListenerState.BACKING_OFF
    assert host.calls == [("unpoll",), ("starved", errno.EMFILE, True)]
    made.resume()
    sock.script = [OSError]
    made.ready()
    assert host.calls[-1] == ("starved", errno.EMFILE, False)
    made.resume()
    sock.script = ["conn", OSError]
    made.ready()
    made.ready()
    assert host.calls[-1] == ("starved", errno.EMFILE, True)


def test_listener_stop_cancels_its_timer() -> None:
    host, sock = FakeHost(), FakeSocket([OSError])
    made = listener("batch", host, sock)
    made.ready()
    timer = made.timer
    made.stop()
    assert timer.cancelled and made.timer is None
    assert made.state is _accept.ListenerState.STOPPED


def test_listener_balanced_rests_by_what_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """balanced: holding one connection, a re-registration; holding three,
    a rest of 3 x cooldown, then the queue (2 waited) taken, cooldown
    halved, polled again; a rest nobody waited for grows it back."""
    monkeypatch.setattr(_accept, "accept_queue_length", lambda sock: 0)
    host, sock = FakeHost(), FakeSocket(["conn"])
    made = listener("balanced", host, sock)
    made.ready()
    assert host.calls == [("reregister",)] and made.state is _accept.ListenerState.POLLED
    host.held = 2
    sock.script = ["conn"]
    made.ready()
    assert host.calls[-2:] == [("unpoll",), ("rest", 3 * _accept.BALANCED_MAX_COOLDOWN)]
    assert made.state is _accept.ListenerState.RESTING
    monkeypatch.setattr(_accept, "accept_queue_length", lambda sock: 2)
    sock.script = ["conn", "conn"]
    made.rested()
    assert len(host.accepted_conns) == 4 and host.calls[-1] == ("poll",)
    assert made.gate.cooldown == _accept.BALANCED_MAX_COOLDOWN * _accept.BALANCED_SHRINK
    monkeypatch.setattr(_accept, "accept_queue_length", lambda sock: 0)
    made.state = _accept.ListenerState.RESTING
    made.rested()
    assert made.gate.rests_idle == 1


def test_listener_lost_race_changes_nothing() -> None:
    host, sock = FakeHost(), FakeSocket([])
    listener("balanced", host, sock).ready()
    assert host.calls == [] and host.stats.accept_eagain == 1


def test_balanced_gates_converge_after_48_idle_rests() -> None:
    """Workers' cooldowns cannot drift apart: whatever happened before, 48
    idle rests (ln(MAX/MIN)/ln(GROW) = 47.2) bring every gate to the cap."""
    at_floor, halved, fresh = _accept.BalancedGate(), _accept.BalancedGate(), _accept.BalancedGate()
    for _ in range(100):
        at_floor.rested(waited=True)
    halved.rested(waited=True)
    for _ in range(47):
        for gate in (at_floor, halved, fresh):
            gate.rested(waited=False)
    assert at_floor.cooldown < _accept.BALANCED_MAX_COOLDOWN  # one rest short
    for gate in (at_floor, halved, fresh):
        gate.rested(waited=False)
    assert at_floor.cooldown == halved.cooldown == fresh.cooldown == _accept.BALANCED_MAX_COOLDOWN


def gate(loop: asyncio_relaxed.Loop, server: asyncio.AbstractServer) -> _accept.BalancedGate:
    """The balanced listener's cooldown state."""
    listener = loop._serving.listeners[server.sockets[0].fileno()]
    assert isinstance(listener, _accept.BalancedListener)
    return listener.gate


def rest_end(loop: asyncio_relaxed.Loop, server: asyncio.AbstractServer) -> float | None:
    """The loop time at which the listener's rest ends, None when it is not
    resting.  (Compared with times read around the iteration that scheduled
    it, not with now: a slow machine may be past a 0.3 ms rest already.)"""
    listener = loop._serving.listeners[server.sockets[0].fileno()]
    if listener.state is not _accept.ListenerState.RESTING:
        return None
    return float(listener.timer.when())


def end_rest(loop: asyncio_relaxed.Loop, server: asyncio.AbstractServer) -> None:
    """End the listener's rest now: its timer's callback, run once."""
    handle = loop._serving.listeners[server.sockets[0].fileno()].timer
    callback, args = handle._callback, handle._args
    handle.cancel()
    callback(*args)


@pytest.mark.skipif(not _accept.QUEUE_LENGTH_KNOWN, reason="Linux only (TCP_INFO)")
def test_balanced_takes_what_is_queued_then_rests_by_its_load(
    clients: list[socket.socket], served: Served,
) -> None:
    """One event: the accept, then as many as the queue holds (no EAGAIN);
    holding 3 connections, the worker rests 3 x 0.1 ms out of the poller
    (DEL now, ADD when the rest ends, which finds nothing waiting)."""
    loop = asyncio_relaxed.new_event_loop(accept="balanced")
    try:
        server = served.start(loop)
        connect(server, clients, 3)
        settle(server, 3)
        before = loop.statistics()
        started = loop.time()
        iterate(loop, 1)
        ended = loop.time()
        assert accepts(loop, before) == (3, 0)
        # The listener's DEL (the accepted sockets register for reading in
        # the next iteration, from the transports' call_soon).
        assert ctl(loop, before) == (0, 0, 1)
        assert not listening(loop, server)
        end = rest_end(loop, server)
        assert end is not None and started < end <= ended + 3 * _accept.BALANCED_MAX_COOLDOWN
        before = loop.statistics()
        end_rest(loop, server)
        assert listening(loop, server)
        assert accepts(loop, before) == (0, 0)  # the queue's length said none
        assert ctl(loop, before)[0] >= 1  # the listener's ADD
        assert (gate(loop, server).rests_idle, gate(loop, server).rests_waited) == (1, 0)
        served.stop(loop, server)
    finally:
        loop.close()


def test_balanced_stop_serving_cancels_the_rest(
    clients: list[socket.socket], served: Served
) -> None:
    loop = asyncio_relaxed.new_event_loop(accept="balanced")
    try:
        server = served.start(loop)
        connect(server, clients, 2)
        settle(server, 2)
        for _ in range(3):
            iterate(loop, 1)
            if rest_end(loop, server) is not None:
                break
        assert rest_end(loop, server) is not None
        fd = server.sockets[0].fileno()
        listener = loop._serving.listeners[fd]
        handle = listener.timer
        served.stop(loop, server)
        assert handle.cancelled() and listener.timer is None
        assert listener.state is _accept.ListenerState.STOPPED
        assert fd not in loop._serving.listeners
    finally:
        loop.close()


def test_balanced_light_load_one_accept_and_one_reregister_per_connection(
    clients: list[socket.socket], served: Served,
) -> None:
    """A worker holding one connection or none re-registers the listener at
    once (DEL + ADD), without a rest or a timer."""
    loop = asyncio_relaxed.new_event_loop(accept="balanced")
    try:
        server = served.start(loop)
        for _ in range(3):
            connect(server, clients, 1)
            settle(server, 1)
            before = loop.statistics()
            iterate(loop, 1)
            expected_eagain = 0 if _accept.QUEUE_LENGTH_KNOWN else 1  # batch's EAGAIN otherwise
            assert accepts(loop, before) == (1, expected_eagain)
            # The listener's DEL + ADD; the accepted socket's own ADD comes
            # one iteration later.
            assert ctl(loop, before) == (1, 0, 1)
            assert listening(loop, server) and rest_end(loop, server) is None
            clients.pop().close()  # the connection ends before the next comes
            for _ in range(100):
                if _compat.server_active_count(server) == 0:
                    break
                iterate(loop, 1)
                time.sleep(0.001)
        assert gate(loop, server).rests_idle + gate(loop, server).rests_waited == 0
        served.stop(loop, server)
    finally:
        loop.close()


@pytest.mark.skipif(not _accept.QUEUE_LENGTH_KNOWN, reason="Linux only (TCP_INFO)")
def test_balanced_burst_is_capped_by_accept_batch(
    clients: list[socket.socket], served: Served
) -> None:
    """The burst of an event, and the one at the end of a rest that found
    connections waiting (which halves cooldown), take at most accept_batch."""
    loop = asyncio_relaxed.new_event_loop(accept="balanced", accept_batch=2)
    try:
        server = served.start(loop)
        connect(server, clients, 5)
        settle(server, 5)
        before = loop.statistics()
        iterate(loop, 1)
        assert accepts(loop, before) == (2, 0)
        assert not listening(loop, server)  # holding 2: a rest
        end_rest(loop, server)
        assert accepts(loop, before) == (4, 0)  # 3 waited, 2 taken
        cooldown = gate(loop, server)
        assert (cooldown.rests_idle, cooldown.rests_waited) == (0, 1)
        assert cooldown.cooldown == _accept.BALANCED_MAX_COOLDOWN * _accept.BALANCED_SHRINK
        assert listening(loop, server)
        iterate(loop, 1)
        assert accepts(loop, before) == (5, 0)
        served.stop(loop, server)
    finally:
        loop.close()


def test_balanced_burst_ends_at_eagain_when_a_sibling_took_the_counted(
    clients: list[socket.socket], monkeypatch: pytest.MonkeyPatch, served: Served
) -> None:
    """The queue's length is read before the burst; connections a sibling
    takes meanwhile end it with one EAGAIN.  Also what happens where the
    length is unknown: the burst runs until EAGAIN, as batch's does."""
    monkeypatch.setattr(_accept, "accept_queue_length", lambda sock: 5)
    loop = asyncio_relaxed.new_event_loop(accept="balanced")
    try:
        server = served.start(loop)
        connect(server, clients, 2)
        settle(server, 2)
        before = loop.statistics()
        iterate(loop, 1)
        assert accepts(loop, before) == (3, 1)
        assert ctl(loop, before) == (0, 0, 1)  # holding 2: out for a rest
        assert rest_end(loop, server) is not None
        served.stop(loop, server)
    finally:
        loop.close()


class EmptyListener:
    """A listener whose accept() finds nothing, as when a sibling won."""

    def __init__(self, real: socket.socket) -> None:
        self.real = real
        self.calls = 0

    def fileno(self) -> int:
        return self.real.fileno()

    def accept(self) -> Any:
        self.calls += 1
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")


def test_balanced_lost_race_costs_one_accept_and_no_reregister() -> None:
    loop = asyncio_relaxed.new_event_loop(accept="balanced")
    real = socket.socket()
    try:
        real.bind(("127.0.0.1", 0))
        real.listen(10)
        loop._add_reader(real.fileno(), lambda: None)
        before = loop.statistics()
        fake = EmptyListener(real)
        loop._accept_connection(Counting, fake, None, None, 100)
        assert fake.calls == 1 and accepts(loop, before) == (1, 1)
        assert ctl(loop, before) == (0, 0, 0)
        loop._remove_reader(real.fileno())
    finally:
        loop.close()
        real.close()


class SharedListener:
    """Two balanced loops serving one listening socket, as pre-forked workers
    do (the same open file, polled by two epoll sets), in one thread."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(100)
        self.address = self.listener.getsockname()
        self.loops = [asyncio_relaxed.new_event_loop(accept="balanced") for _ in range(2)]
        self.servers = [
            run(loop, loop.create_server(Counting, sock=self.listener.dup()))
            for loop in self.loops
        ]
        for loop in self.loops:
            iterate(loop, 1)
        self.clients: list[socket.socket] = []

    def connect(self) -> socket.socket:
        client = socket.create_connection(self.address)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for loop, server in zip(self.loops, self.servers, strict=True):
            stop_server(loop, server)
            loop.close()
        self.listener.close()


def test_balanced_workers_reregister_only_after_winning() -> None:
    """Both workers poll the listener throughout (no rest); each reregisters its
    own registration once per event it won, and the loser of a race sees
    no event at all (epoll re-checks readiness before reporting)."""
    shared = SharedListener()
    (a, b), (server_a, server_b) = shared.loops, shared.servers
    try:
        before_a, before_b = a.statistics(), b.statistics()
        shared.connect()
        settle(server_a, 1)
        iterate(a, 1)
        assert accepts(a, before_a) == (1, 0) and ctl(a, before_a) == (1, 0, 1)
        shared.connect()
        settle(server_b, 1)
        iterate(b, 1)
        assert accepts(b, before_b) == (1, 0) and ctl(b, before_b) == (1, 0, 1)
        iterate(a, 1)
        assert accepts(a, before_a) == (1, 0)  # nothing left for a
        assert listening(a, server_a) and listening(b, server_b)
    finally:
        shared.close()


@pytest.mark.parametrize("exclusive", [False, True])
def test_balanced_reregister_keeps_epollexclusive(
    clients: list[socket.socket], exclusive: bool, served: Served
) -> None:
    import select

    if not hasattr(select, "EPOLLEXCLUSIVE"):
        pytest.skip("no EPOLLEXCLUSIVE on this platform")
    loop = asyncio_relaxed.new_event_loop(accept="balanced", exclusive_accept=exclusive)
    try:
        server = served.start(loop)
        connect(server, clients, 1)
        settle(server, 1)
        before = loop.statistics()
        iterate(loop, 1)
        assert ctl(loop, before)[2] == 1  # reregisterd
        flags = _epoll_flags(loop._selector.fileno(), server.sockets[0].fileno())
        assert bool(flags & select.EPOLLEXCLUSIVE) is exclusive
        served.stop(loop, server)
    finally:
        loop.close()


class StarvedListener:
    """A listener whose accept() fails with EMFILE after *ok* real accepts."""

    def __init__(self, real: socket.socket, ok: int = 0) -> None:
        self.real = real
        self.family = real.family
        self.ok = ok
        self.calls = 0

    def fileno(self) -> int:
        return self.real.fileno()

    def getsockopt(self, *args: Any) -> Any:
        return self.real.getsockopt(*args)

    def accept(self) -> Any:
        self.calls += 1
        if self.calls <= self.ok:
            return self.real.accept()
        raise OSError(errno.EMFILE, "Too many open files")


@pytest.mark.parametrize("ok", [0, 1], ids=["first-accept", "in-the-burst"])
def test_balanced_emfile_backs_off_once(
    clients: list[socket.socket], ok: int, loop_errors: LoopErrors
) -> None:
    """EMFILE on the first accept of an event or within its burst: reported
    once, the listener out of the poller (no reregister), one back-off retry."""
    loop = asyncio_relaxed.new_event_loop(accept="balanced")
    loop.set_exception_handler(loop_errors.handler)
    loop_errors.expect("socket.accept() out of system resource")
    real = socket.socket()
    real.bind(("127.0.0.1", 0))
    real.listen(10)
    for _ in range(2):
        clients.append(socket.create_connection(real.getsockname()))
    settle(real, 2)
    real.setblocking(False)
    fake = StarvedListener(real, ok)
    try:
        loop._add_reader(real.fileno(), lambda: None)
        before = loop.statistics()
        loop._accept_connection(Counting, fake, None, None, 100)
        assert fake.calls == ok + 1
        assert len(loop_errors.contexts) == 1
        assert loop_errors.contexts[0]["exception"].errno == errno.EMFILE
        with pytest.raises(KeyError):
            loop._selector.get_key(real.fileno())
        assert ctl(loop, before) == (0, 0, 1)  # the back-off's DEL, no reregister
        assert len(loop._transports) == ok  # what was accepted is served
        resumes = [
            h for h in loop._scheduled
            if not h.cancelled() and h._callback == loop._serving.resume
        ]
        assert len(resumes) == 1
        resumes[0].cancel()
        for transport in list(loop._transports.values()):
            if transport is not None:
                transport.abort()
        iterate(loop, 1)
    finally:
        loop.close()
        real.close()
    loop_errors.check()


@pytest.mark.slow
def test_balanced_accept_under_real_emfile() -> None:
    """The subprocess EMFILE server of test_reliability, under accept=balanced:
    one report, serving throughout, every connection accepted once fds free."""
    from test_reliability import EmfileServer, greeted_and_served

    server = EmfileServer({"accept": "balanced"})
    try:
        first = server.connect()
        greeted_and_served(first, b"before", greeting=True)
        flood = [server.connect() for _ in range(50)]
        error = server.wait("accept error", lambda: server.of_kind("error"))[0]
        assert error[2] == str(errno.EMFILE), error
        greeted_and_served(first, b"during the back-off")
        for sock in flood:
            sock.close()
        late = server.connect()
        server.wait("accept after fds were freed", lambda: server.accepted(late), timeout=15)
        greeted_and_served(late, b"served again", greeting=True)
        assert len(server.of_kind("error")) == 1, server.of_kind("error")
        for sock in (first, late):
            sock.close()
        server.wait(
            "every connection accepted and closed",
            lambda: len(server.of_kind("lost")) == len(server.of_kind("accepted")) == 52,
            timeout=15,
        )
        server.stop()
    finally:
        server.cleanup()
