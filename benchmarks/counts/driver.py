"""The in-process workloads the count tools run: an echo and an aiohttp hello.

benchmarks.counts.instructions counts what these execute under callgrind,
benchmarks.counts.bytecodes which Python functions they run; both need a
workload that does the same work on every loop and nothing else in the
process, so both drive it in-process:

* ``PAIRS`` socket pairs; one end of each is served by the loop under test
  (``connect_accepted_socket`` + a plain echo Protocol), the other end is the
  client, driven by a callback on the same loop (:class:`Driver`): it sends
  one message on every pair, and once every echo is back in full, the next
  round;
* ``tls``: the same 1 KiB echo over TLS 1.3 (benchmarks.harness.tls): the
  served ends through ``connect_accepted_socket(ssl=)``, the client ends
  non-blocking ``ssl.SSLSocket`` objects whose handshakes are pumped from a
  loop callback before the first round;
* ``starttls``: the same, the served ends plain through
  ``connect_accepted_socket`` and then upgraded by ``loop.start_tls()``
  (asyncpg's and SMTP's way to TLS), so against ``tls`` it is the cost of
  the loop's start_tls path beside its ``ssl=`` path;
* ``streams``: the 1 KiB echo through asyncio's streams: the served ends
  through ``connect_accepted_socket`` with a ``StreamReaderProtocol``
  whose handler task reads, writes and drains (a Task step per message, as
  ``asyncio.start_server`` serves it); its floor is the plain 1 KiB one;
* ``http``: an aiohttp app on the loop under test, ``GET /`` answering 0
  bytes, over ``PAIRS`` keep-alive connections driven the same way (one
  request per connection per round, the next round once the handler has
  run for all of them and every response is back);
* ``udp``: a datagram echo: ``PAIRS`` connected UDP client sockets each
  send a burst of ``UDP_BURST`` 1 KiB datagrams per round to one server
  socket (``create_datagram_endpoint(sock=)`` and a DatagramProtocol that
  sends each datagram back with ``sendto(data, addr)``, udp-burst-1k's
  shape), the next round once every echo is back; counted per datagram;
* ``life``: a connection's life, per connection: ``PAIRS`` blocking client
  sockets connect to a ``create_server`` echo on the loop under test and
  send 1 KiB each; once every echo is written the driver reads them and
  closes the clients, and the next round starts when the server has seen
  ``connection_lost`` for all of them (accept, connection_made, one read,
  one write, EOF, close);
* the floors: the same driver around a minimal echo in pure Python
  (:func:`floor`: ``epoll.poll``, ``recv``, ``send``; :func:`floor_tls`: the
  same around an ``SSLObject`` with memory BIOs and reused buffers, as
  benchmarks.workloads.floors' ``floor-tls-bio``; :func:`floor_udp`:
  ``epoll.poll``, ``recvfrom`` until the socket runs dry, ``sendto``), so
  *above the floor* is what a loop adds to the least any Python echo must
  execute.

*on_round(left)* is called as each round is sent, with the rounds left
after it, and with -1 once the last is back: the bytecode counter turns
itself on and off there.
"""

from __future__ import annotations

import asyncio
import functools
import json
import mmap
import os
import select
import socket
import ssl
from collections.abc import Callable
from typing import Any

from benchmarks.harness import checkout, loops, tls
from benchmarks.workloads.catalog import ITEM

PAIRS = 10
WARMUP_ROUNDS = 100
#: tlslife's warm-up: a full RSA-2048 handshake per connection costs about
#: 15 million instructions (both sides), 50 ms each under callgrind, so 10
#: rounds warm the same caches as 100 elsewhere in a tenth of the time.
TLSLIFE_WARMUP_ROUNDS = 10
#: The size tokens of the aiohttp workload, of the 1 KiB echo over TLS and
#: of a connection's life.
HTTP = "http"
UVICORN = "uvicorn"
TLS = "tls"
STARTTLS = "starttls"
LIFE = "life"
TLSLIFE = "tlslife"
STREAMS = "streams"
UDP = "udp"
#: The workloads named, not sized in bytes, the echoes over TLS, and every
#: workload that needs the TLS certificates.
NAMED = (HTTP, UVICORN, TLS, STARTTLS, LIFE, TLSLIFE, STREAMS, UDP)
OVER_TLS = (TLS, STARTTLS)
NEEDS_CERTIFICATES = (*OVER_TLS, TLSLIFE)
#: The workloads without a floor: no minimal aiohttp, uvicorn or accept loop.
NO_FLOOR = (HTTP, UVICORN, LIFE, TLSLIFE)
LIFE_SIZE = 1024
TLS_SIZE = 1024
STREAMS_SIZE = 1024
UDP_SIZE = 1024
#: The datagrams each client sends per round: 40 queued at the server
#: (about 100 KiB of the kernel's receive buffer with its per-datagram
#: overhead, under the default 208 KiB), so loopback drops none.
UDP_BURST = 4
HTTP_REQUEST = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"
#: What the uvicorn workload imports.
UVICORN_NEEDS = ("uvicorn", "starlette", "httptools")
#: The uvicorn-json workloads' request.
UVICORN_REQUEST = (b"POST /items/42 HTTP/1.1\r\nHost: localhost\r\n"
                   b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                   % (len(ITEM), ITEM.encode()))
FLOOR = "floor"
#: The loops' functions of the floors (module:qualname), for the counts' groups.
FLOOR_FUNCTIONS = ("driver:floor", "driver:floor_tls")
_PLAIN_SIZE = 256 * 1024


def _no_hook(left: int) -> None:
    """The on_round of a run nobody watches."""


class Echo(asyncio.Protocol):
    """Writes back what it gets; the round's last byte schedules the driver."""

    def __init__(self, round_done: Callable[[int], None]) -> None:
        self.round_done = round_done

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)
        self.round_done(len(data))


def _pairs(size: int, over_tls: bool) -> tuple[list[socket.socket], list[socket.socket]]:
    """(served ends, client ends): non-blocking, the client ends with
    buffers for a few messages (and over TLS, wrapped, not yet shaken)."""
    served, clients = [], []
    context = tls.client_context() if over_tls else None
    for _ in range(PAIRS):
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * size)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * size)
        if context is not None:
            b = context.wrap_socket(b, server_hostname=tls.HOSTNAME,
                                    do_handshake_on_connect=False)
        served.append(a)
        clients.append(b)
    return served, clients


def _shake(clients: list[socket.socket]) -> bool:
    """One non-blocking handshake step on every client end not yet done;
    True once all are."""
    done = True
    for client in clients:
        if isinstance(client, ssl.SSLSocket):
            try:
                client.do_handshake()
            except ssl.SSLWantReadError:
                done = False
    return done


class Driver:
    """The client ends: one message on every pair per round; the next round
    once the server has echoed the whole round (``echoed``) and it is back.

    The same work per round on every loop: the driver reads only after the
    last echo was written, so it rarely finds a socket empty (a short write
    by the server leaves the rest for later; then it tries again)."""

    def __init__(self, clients: list[socket.socket], size: int, rounds: int,
                 on_round: Callable[[int], None] | None = None, burst: int = 1) -> None:
        self.clients = clients
        self.on_round = on_round or _no_hook
        self.message = os.urandom(size)
        self.size = size
        self.burst = burst  # messages per client per round (udp: datagrams)
        self.rounds = rounds
        self.missing = [0] * len(clients)
        self.unechoed = 0  # bytes of this round the server has not written back

    def send_round(self) -> None:
        self.rounds -= 1
        self.on_round(self.rounds)
        self.unechoed = self.size * self.burst * len(self.clients)
        for i, client in enumerate(self.clients):
            for _ in range(self.burst):
                client.sendall(self.message)  # the peer's buffer holds a whole round
            self.missing[i] = self.size * self.burst

    def echoed(self, nbytes: int) -> bool:
        """The server wrote *nbytes* back; True when that completes the round."""
        self.unechoed -= nbytes
        return self.unechoed == 0

    def next_round(self) -> bool:
        """The floors' end of a round (its last echo is written): read it all
        back, then send the next round (True), or end the run (False)."""
        while not self.receive():
            pass
        if not self.rounds:
            self.on_round(-1)
            return False
        self.send_round()
        return True

    def receive(self) -> bool:
        """Read what has come back; True once the whole round has."""
        for i, client in enumerate(self.clients):
            while self.missing[i]:
                try:
                    self.missing[i] -= len(client.recv(self.missing[i]))
                except (BlockingIOError, ssl.SSLWantReadError):
                    return False
        return True


def child(loop_name: str, size: int | str, rounds: int,
          on_round: Callable[[int], None] | None = None) -> None:
    """One echo run (*size* bytes, TLS or STARTTLS for 1 KiB over TLS,
    STREAMS for 1 KiB through streams) of *rounds* after the warm-up, on
    loop *loop_name* or the floor."""
    over_tls = size in OVER_TLS
    nbytes = TLS_SIZE if over_tls else STREAMS_SIZE if size == STREAMS else int(size)
    served, clients = _pairs(nbytes, over_tls)
    driver = Driver(clients, nbytes, WARMUP_ROUNDS + rounds, on_round)
    if loop_name == FLOOR:
        (floor_tls if over_tls else floor)(served, driver)
        return
    # Which tree asyncio_relaxed comes from, for the parent's check.
    print(json.dumps({"relaxed": checkout.relaxed_package()}), flush=True)
    loop = loops.factory(loop_name)()
    finished = loop.create_future()
    context = tls.server_context() if over_tls else None
    round_done = _round_keeper(loop, driver, finished)

    def pump() -> None:  # the clients' handshakes, while the loop serves theirs
        if not _shake(clients):
            loop.call_soon(pump)

    accept = _connect_accepted_socket(loop_name, loop)

    async def upgrade(transport: Any) -> None:
        assert context is not None  # STARTTLS is over TLS
        echo = Echo(round_done)
        echo.connection_made(await loop.start_tls(transport, echo, context, server_side=True))

    handlers: list[Any] = []  # the streams' handler tasks

    async def echo_streams(reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())
        while data := await reader.read(65536):
            writer.write(data)
            round_done(len(data))
            await writer.drain()
        writer.close()

    def streams_protocol() -> asyncio.StreamReaderProtocol:
        return asyncio.StreamReaderProtocol(asyncio.StreamReader(), echo_streams)

    async def serve_all() -> None:
        if size == STREAMS:
            await asyncio.gather(*(accept(streams_protocol, sock) for sock in served))
            return
        if size == STARTTLS:
            plain = await asyncio.gather(*(accept(asyncio.Protocol, sock) for sock in served))
            upgrades = [asyncio.ensure_future(upgrade(transport)) for transport, _ in plain]
            # The clients' first flight only once every start_tls has taken
            # its transport's reads, or a plain protocol would get it.
            await asyncio.sleep(0)
            loop.call_soon(pump)
            await asyncio.gather(*upgrades)
            return
        await asyncio.gather(*(
            accept(lambda: Echo(round_done), sock, ssl=context) for sock in served))

    if context is not None and size != STARTTLS:
        loop.call_soon(pump)
    loop.run_until_complete(serve_all())
    while not _shake(clients):  # the last client may still wait for its last flight
        loop.run_until_complete(asyncio.sleep(0))
    driver.send_round()
    loop.run_until_complete(finished)
    if size == STREAMS:  # the handlers end at EOF
        for client in clients:
            client.shutdown(socket.SHUT_WR)
        loop.run_until_complete(asyncio.gather(*handlers))
    loop.close()


def _round_keeper(loop: asyncio.AbstractEventLoop, driver: Driver,
                  finished: asyncio.Future[None]) -> Callable[[int], None]:
    """The server's callback for each echo it writes (its byte count): once
    the round is echoed, the driver reads it back from a loop callback and
    sends the next, or ends the run (*finished*)."""

    def next_round() -> None:
        # A loop callback, from the iteration after the round's last echo.
        if not driver.receive():
            loop.call_soon(next_round)  # a short write: the rest comes later
        elif driver.rounds:
            driver.send_round()
        else:
            driver.on_round(-1)
            finished.set_result(None)

    def round_done(nbytes: int) -> None:
        if driver.echoed(nbytes):
            loop.call_soon(next_round)

    return round_done


class _UdpEcho(asyncio.DatagramProtocol):
    """Sends each datagram back to where it came from."""

    def __init__(self, round_done: Callable[[int], None]) -> None:
        self.round_done = round_done

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.transport.sendto(data, addr)
        self.round_done(len(data))


def udp_child(loop_name: str, rounds: int,
              on_round: Callable[[int], None] | None = None) -> None:
    """The ``udp`` run: PAIRS clients, a burst of UDP_BURST datagrams each
    per round, echoed by one server socket (or the floor)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.setblocking(False)
    clients = []
    for _ in range(PAIRS):
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        client.connect(server.getsockname())
        client.setblocking(False)
        clients.append(client)
    # (Driver.receive reads the echoes back: a UDP recv returns one datagram.)
    driver = Driver(clients, UDP_SIZE, WARMUP_ROUNDS + rounds, on_round, burst=UDP_BURST)
    try:
        if loop_name == FLOOR:
            floor_udp(server, driver)
            return
        print(json.dumps({"relaxed": checkout.relaxed_package()}), flush=True)
        loop = loops.factory(loop_name)()
        finished = loop.create_future()
        round_done = _round_keeper(loop, driver, finished)
        transport, _ = loop.run_until_complete(loop.create_datagram_endpoint(
            lambda: _UdpEcho(round_done), sock=server))
        driver.send_round()
        loop.run_until_complete(finished)
        transport.close()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
    finally:
        for sock in (server, *clients):
            sock.close()


def _connect_accepted_socket(loop_name: str, loop: asyncio.AbstractEventLoop) -> Any:
    """The loop's connect_accepted_socket; for the aiofastnet pairings,
    aiofastnet's own (its patch_loop leaves the loop's method stock's, so
    the loop's would count stock's transports)."""
    if loops.SPECS[loops.preset(loop_name)].kind == "aiofastnet":
        import aiofastnet

        return functools.partial(aiofastnet.connect_accepted_socket, loop)
    return loop.connect_accepted_socket


def http_child(loop_name: str, rounds: int,
               on_round: Callable[[int], None] | None = None, app: str = HTTP) -> None:
    """An HTTP server on the loop and ``PAIRS`` keep-alive clients, one
    request each per round: aiohttp's hello (*app* HTTP) or the uvicorn
    workloads' Starlette JSON endpoint (UVICORN)."""
    on_round = on_round or _no_hook
    print(json.dumps({"relaxed": checkout.relaxed_package()}), flush=True)
    loop = loops.factory(loop_name)()
    finished = loop.create_future()
    clients: list[socket.socket] = []
    missing = [0] * PAIRS  # responses not yet read, per client
    state = {"rounds": WARMUP_ROUNDS + rounds, "served": 0}
    request = HTTP_REQUEST if app == HTTP else UVICORN_REQUEST

    def send_round() -> None:
        state["rounds"] -= 1
        on_round(state["rounds"])
        for i, client in enumerate(clients):
            client.sendall(request)
            missing[i] += 1

    def receive() -> bool:
        # A response's head ends with the one blank line in it.
        for i, client in enumerate(clients):
            while missing[i]:
                try:
                    data = client.recv(65536)
                except BlockingIOError:
                    return False
                if data.count(b"HTTP/1.1 ") != data.count(b"HTTP/1.1 200 "):
                    raise RuntimeError(f"a response other than 200 OK: {data!r}")
                missing[i] -= data.count(b"\r\n\r\n")
        return True

    def next_round() -> None:
        if not receive():
            loop.call_soon(next_round)
        elif state["rounds"]:
            send_round()
        else:
            on_round(-1)
            finished.set_result(None)

    def served() -> None:
        state["served"] += 1
        if state["served"] % PAIRS == 0:
            loop.call_soon(next_round)

    async def main() -> None:
        port, stop = await (_aiohttp_hello if app == HTTP else _uvicorn_json)(served)
        for _ in range(PAIRS):
            client = socket.create_connection(("127.0.0.1", port))
            client.setblocking(False)
            clients.append(client)
        send_round()
        await finished
        for client in clients:
            client.close()
        await stop()

    loop.run_until_complete(main())
    loop.close()


async def _aiohttp_hello(served: Callable[[], None]) -> tuple[int, Any]:
    """aiohttp's ``GET /`` answering 0 bytes: its port, and the coroutine
    function that stops it."""
    from aiohttp import web

    async def hello(request: web.Request) -> web.Response:
        served()
        return web.Response(body=b"")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return site._server.sockets[0].getsockname()[1], runner.cleanup  # type: ignore[union-attr]


async def _uvicorn_json(served: Callable[[], None]) -> tuple[int, Any]:
    """uvicorn (httptools) serving the uvicorn-json workload's Starlette app
    (benchmarks.workloads.apps.json_app), each request counted once its
    response is sent: its port, and the coroutine function that stops it."""
    import uvicorn

    from benchmarks.workloads import apps

    async def started(loop: asyncio.AbstractEventLoop) -> None:
        """(the lifespan's hook: lifespan is off here)"""

    app = apps.json_app(started)

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        await app(scope, receive, send)
        served()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(PAIRS)
    server = uvicorn.Server(uvicorn.Config(counted, http="httptools", lifespan="off",
                                           access_log=False, log_level="warning"))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.001)

    async def stop() -> None:
        server.should_exit = True
        await task

    return sock.getsockname()[1], stop


class _LifeEcho(asyncio.Protocol):
    """The server side of a connection's life: echo, then close on EOF."""

    def __init__(self, life: _Life) -> None:
        self.life = life
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)
        self.life.echoed(len(data))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.life.lost()


class _Life:
    """The client side of ``life``: a round is PAIRS connections."""

    def __init__(self, loop: Any, rounds: int, on_round: Callable[[int], None]) -> None:
        self.loop = loop
        self.rounds = rounds
        self.on_round = on_round
        self.address: Any = None
        self.message = os.urandom(LIFE_SIZE)
        self.clients: list[socket.socket] = []
        self.unechoed = self.open = 0
        self.finished = loop.create_future()

    def counted_off(self) -> bool:
        """A round is counted off and the hook told, or, once none is
        left, the run ends (False)."""
        if not self.rounds:
            self.on_round(-1)
            self.finished.set_result(None)
            return False
        self.rounds -= 1
        self.on_round(self.rounds)
        return True

    def next_round(self) -> None:
        if not self.counted_off():
            return
        self.unechoed = LIFE_SIZE * PAIRS
        self.open = PAIRS
        self.clients = []
        for _ in range(PAIRS):
            client = socket.socket()
            client.connect(self.address)  # loopback: done once the listener queues it
            client.sendall(self.message)
            self.clients.append(client)

    def echoed(self, nbytes: int) -> None:
        self.unechoed -= nbytes
        if not self.unechoed:
            self.loop.call_soon(self.close_clients)

    def close_clients(self) -> None:
        for client in self.clients:
            got = 0
            while got < LIFE_SIZE:
                got += len(client.recv(LIFE_SIZE))
            client.close()

    def lost(self) -> None:
        self.open -= 1
        if not self.open:
            self.loop.call_soon(self.next_round)


def life_child(loop_name: str, rounds: int,
               on_round: Callable[[int], None] | None = None) -> None:
    """The ``life`` run: PAIRS connections per round, each connect, 1 KiB
    echo, close."""
    print(json.dumps({"relaxed": checkout.relaxed_package()}), flush=True)
    loop = loops.factory(loop_name)()
    life = _Life(loop, WARMUP_ROUNDS + rounds, on_round or _no_hook)

    async def main() -> None:
        server = await loop.create_server(lambda: _LifeEcho(life), "127.0.0.1", 0,
                                          backlog=4 * PAIRS)
        life.address = server.sockets[0].getsockname()
        life.next_round()
        await life.finished
        server.close()
        await server.wait_closed()

    loop.run_until_complete(main())
    loop.close()


class _TlsLife(_Life):
    """The client side of ``tlslife``: a round is PAIRS TLS connections,
    each stepped by :meth:`ready` when its socket is readable."""

    HANDSHAKE, READ, CLOSING = range(3)

    def __init__(self, loop: Any, rounds: int, on_round: Callable[[int], None]) -> None:
        super().__init__(loop, rounds, on_round)
        self.context = tls.client_context()
        self.epoll = select.epoll()
        # fd -> [client, state, bytes of the echo read]
        self.steps: dict[int, list[Any]] = {}
        self.shut = 0  # clients of this round closed

    def next_round(self) -> None:
        if not self.counted_off():
            return
        self.open = self.shut = PAIRS
        for _ in range(PAIRS):
            raw = socket.socket()
            raw.connect(self.address)  # loopback: done once the listener queues it
            raw.setblocking(False)
            client = self.context.wrap_socket(raw, server_hostname=tls.HOSTNAME,
                                              do_handshake_on_connect=False)
            try:
                client.do_handshake()  # the ClientHello
            except ssl.SSLWantReadError:
                pass
            fd = client.fileno()
            self.steps[fd] = [client, self.HANDSHAKE, 0]
            self.epoll.register(fd, select.EPOLLIN)

    def ready(self) -> None:
        """The loop's reader of the driver's epoll: step each readable client."""
        for fd, _ in self.epoll.poll(0):
            step = self.steps[fd]
            client = step[0]
            try:
                if step[1] == self.HANDSHAKE:
                    client.do_handshake()
                    client.sendall(self.message)  # one record; the socket's buffer holds it
                    step[1] = self.READ
                    continue
                if step[1] == self.READ:
                    while step[2] < LIFE_SIZE:
                        data = client.recv(LIFE_SIZE - step[2])
                        if not data:
                            raise ConnectionError(f"tlslife: the server closed {client!r} "
                                                  "before its echo")
                        step[2] += len(data)
                    step[1] = self.CLOSING
                client.unwrap()  # close_notify, then the server's
            except ssl.SSLWantReadError:
                continue
            self.epoll.unregister(fd)
            del self.steps[fd]
            client.close()
            self.shut -= 1
            self.lost_or_shut()

    def echoed(self, nbytes: int) -> None:
        """The client reads the echo when its socket is readable."""

    def lost(self) -> None:
        self.open -= 1
        self.lost_or_shut()

    def lost_or_shut(self) -> None:
        if not self.open and not self.shut:
            self.loop.call_soon(self.next_round)


def tlslife_child(loop_name: str, rounds: int,
                  on_round: Callable[[int], None] | None = None) -> None:
    """The ``tlslife`` run: PAIRS TLS connections per round, each connect,
    handshake, 1 KiB echo, close_notify both ways, close."""
    print(json.dumps({"relaxed": checkout.relaxed_package()}), flush=True)
    loop = loops.factory(loop_name)()
    life = _TlsLife(loop, TLSLIFE_WARMUP_ROUNDS + rounds, on_round or _no_hook)

    async def main() -> None:
        server = await loop.create_server(lambda: _LifeEcho(life), "127.0.0.1", 0,
                                          backlog=4 * PAIRS, ssl=tls.server_context())
        life.address = server.sockets[0].getsockname()
        loop.add_reader(life.epoll.fileno(), life.ready)
        life.next_round()
        await life.finished
        loop.remove_reader(life.epoll.fileno())
        server.close()
        await server.wait_closed()

    loop.run_until_complete(main())
    loop.close()
    life.epoll.close()


def floor(served: list[socket.socket], driver: Driver) -> None:
    """The least a Python echo executes: poll, recv, send; same driver."""
    epoll = select.epoll()
    by_fd = {sock.fileno(): sock for sock in served}
    for fd in by_fd:
        epoll.register(fd, select.EPOLLIN)
    driver.send_round()
    while True:
        done = False
        for fd, _ in epoll.poll(-1, PAIRS):
            sock = by_fd[fd]
            data = sock.recv(65536)
            sock.send(data)  # a short send never happens at these sizes
            done = driver.echoed(len(data)) or done
        if done and not driver.next_round():
            return


def floor_tls(served: list[socket.socket], driver: Driver) -> None:
    """The least a Python TLS echo executes: poll, recv_into one buffer, an
    SSLObject over memory BIOs read into a second, its records sent in one
    send; same driver (floors.BioFloor, without its bookkeeping)."""
    context = tls.server_context()
    epoll = select.epoll()
    cipher = memoryview(mmap.mmap(-1, _PLAIN_SIZE))
    plain = memoryview(mmap.mmap(-1, _PLAIN_SIZE))
    by_fd: dict[int, tuple[socket.socket, ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]] = {}
    for sock in served:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        by_fd[sock.fileno()] = (sock, context.wrap_bio(incoming, outgoing, server_side=True),
                                incoming, outgoing)
        epoll.register(sock.fileno(), select.EPOLLIN)
    shaken: set[int] = set()
    while len(shaken) < len(by_fd) or not _shake(driver.clients):  # the handshakes
        _shake(driver.clients)
        for fd, _ in epoll.poll(0.01, PAIRS):
            sock, obj, incoming, outgoing = by_fd[fd]
            incoming.write(sock.recv(65536))
            try:
                obj.do_handshake()
                shaken.add(fd)
            except ssl.SSLWantReadError:
                pass
            if outgoing.pending:
                sock.send(outgoing.read())
    driver.send_round()
    while True:
        done = False
        for fd, _ in epoll.poll(-1, PAIRS):
            sock, obj, incoming, outgoing = by_fd[fd]
            incoming.write(cipher[:sock.recv_into(cipher)])
            try:
                # Until neither the BIO nor OpenSSL holds more: the read
                # that would raise SSLWantReadError costs more than the rest.
                while n := obj.read(_PLAIN_SIZE, plain):
                    obj.write(plain[:n])
                    done = driver.echoed(n) or done
                    if not incoming.pending and not obj.pending():
                        break
            except ssl.SSLWantReadError:
                pass
            sock.send(outgoing.read())  # a short send never happens at this size
        if done and not driver.next_round():
            return


def floor_udp(server: socket.socket, driver: Driver) -> None:
    """The least a Python datagram echo executes: poll, recvfrom until the
    socket runs dry, sendto each back; same driver."""
    with select.epoll() as epoll:
        epoll.register(server.fileno(), select.EPOLLIN)
        driver.send_round()
        while True:
            done = False
            for _ in epoll.poll(-1, 1):
                while True:
                    try:
                        data, addr = server.recvfrom(65536)
                    except BlockingIOError:
                        break
                    server.sendto(data, addr)
                    done = driver.echoed(len(data)) or done
            if done and not driver.next_round():
                return


def warmup_rounds(size: int | str) -> int:
    """The rounds before the measured ones of workload *size*."""
    return TLSLIFE_WARMUP_ROUNDS if size == TLSLIFE else WARMUP_ROUNDS


def run(loop_name: str, size: int | str, rounds: int,
        on_round: Callable[[int], None] | None = None) -> None:
    """The workload of *size* (bytes, TLS, STARTTLS, HTTP, UVICORN, LIFE,
    TLSLIFE or UDP) on *loop_name*."""
    if size in (HTTP, UVICORN):
        http_child(loop_name, rounds, on_round, size)
    elif size == LIFE:
        life_child(loop_name, rounds, on_round)
    elif size == TLSLIFE:
        tlslife_child(loop_name, rounds, on_round)
    elif size == UDP:
        udp_child(loop_name, rounds, on_round)
    else:
        child(loop_name, size, rounds, on_round)
