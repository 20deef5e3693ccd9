"""Accept strategies: exact accept() calls per readiness event, no Task per
connection, and socket options read back with getsockopt."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import asyncio_relaxed
from conftest import iterate, run


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


def start(loop: asyncio_relaxed.Loop, backlog: int = 100) -> asyncio.AbstractServer:
    server = run(loop, loop.create_server(Counting, "127.0.0.1", 0, backlog=backlog))
    iterate(loop, 1)
    return server


def connect(server: asyncio.AbstractServer, clients: list[socket.socket], n: int) -> None:
    """n completed TCP handshakes waiting in the accept queue."""
    address = server.sockets[0].getsockname()
    for _ in range(n):
        clients.append(socket.create_connection(address))


def stop(loop: asyncio_relaxed.Loop, server: asyncio.AbstractServer) -> None:
    server.close()
    for transport in list(loop._transports.values()):
        if transport is not None:
            transport.abort()
    run(loop, server.wait_closed())
    iterate(loop, 2)


@pytest.mark.parametrize(
    ("accept_batch", "accepts", "eagain"),
    [(0, 6, 1), (2, 2, 0)],
    ids=["backlog", "batch-of-2"],
)
def test_batch_accepts_up_to_the_batch_per_event(
    clients: list[socket.socket], accept_batch: int, accepts: int, eagain: int
) -> None:
    loop = asyncio_relaxed.new_event_loop(accept="batch", accept_batch=accept_batch)
    try:
        server = start(loop)
        connect(server, clients, 5)
        before = loop.statistics()
        iterate(loop, 1)
        delta = loop.statistics() - before
        # With the backlog as the batch: 5 connections and one wasted EAGAIN.
        assert (delta.accept, delta.accept_eagain) == (accepts, eagain)
        stop(loop, server)
    finally:
        loop.close()


@pytest.mark.parametrize("strategy", ["single", "relaxed"])
def test_single_and_relaxed_accept_one_per_event_and_never_waste_one(
    clients: list[socket.socket], strategy: str
) -> None:
    loop = asyncio_relaxed.new_event_loop(accept=strategy)
    try:
        server = start(loop)
        connect(server, clients, 5)
        before = loop.statistics()
        for i in range(1, 6):
            iterate(loop, 1)
            assert (loop.statistics() - before).accept == i
        iterate(loop, 3)
        delta = loop.statistics() - before
        assert (delta.accept, delta.accept_eagain) == (5, 0)
        stop(loop, server)
    finally:
        loop.close()


def test_plain_accept_creates_no_task(clients: list[socket.socket]) -> None:
    loop = asyncio_relaxed.new_event_loop()
    try:
        server = start(loop)
        Counting.made = 0
        connect(server, clients, 3)
        tasks_before = len(asyncio.all_tasks(loop))
        iterate(loop, 1)
        assert len(asyncio.all_tasks(loop)) == tasks_before
        iterate(loop, 1)
        assert Counting.made == 3
        stop(loop, server)
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
def test_exclusive_accept_registers_listeners_with_epollexclusive(exclusive: bool) -> None:
    import select

    if not hasattr(select, "EPOLLEXCLUSIVE"):
        pytest.skip("no EPOLLEXCLUSIVE on this platform")
    loop = asyncio_relaxed.new_event_loop(exclusive_accept=exclusive)
    try:
        server = start(loop)
        listener = server.sockets[0].fileno()
        flags = _epoll_flags(loop._selector.fileno(), listener)
        assert bool(flags & select.EPOLLEXCLUSIVE) is exclusive
        assert flags & select.EPOLLIN
        stop(loop, server)
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
