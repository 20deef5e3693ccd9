"""The application workloads' servers (issue #43): what an app spends beside the loop.

Each serves one application on the loop of its process and answers the
runner as every server does (benchmarks.workloads.control); the app's own
work (routing, JSON, a database driver, a protocol parser) is the same on
every loop, so what differs between loops is what the loop adds to it.

- ``uvicorn-json``: uvicorn + Starlette, ``POST /items/{item_id}`` with a
  small JSON body checked by hand (:func:`check_item`), answered with JSON;
  httptools or h11 (``--http``), over TLS with ``--tls`` (uvicorn's own
  ``ssl_certfile``/``ssl_keyfile``).  uvicorn makes the loop from its
  ``--loop`` option, as for ``uvicorn`` (benchmarks.workloads.asgi);
- ``aiohttp-pg``: an aiohttp app of a few routes answering JSON,
  ``GET /users/{user_id}`` making one PostgreSQL query through an asyncpg
  pool of :data:`PG_POOL` connections (the server of ``.ci/services``,
  benchmarks.harness.services); over TLS (client to app) with ``--tls``;
- ``ws-broadcast``: a websockets server broadcasting (``broadcast()``) a
  :data:`MESSAGE`-byte message to every connection, the next one when the
  client acknowledges that every connection received the last
  (:class:`Broadcaster`); the client is ``ws`` of
  benchmarks.workloads.client;
- ``resp``: a Redis-protocol server on ``asyncio.Protocol`` answering GET,
  SET and PING from a dict, every command of a read parsed
  (:class:`RespParser`) and every answer written in one write; the client
  is ``resp``, pipelining, which SETs its keys first, or the open-loop
  client's ``redis`` protocol, which GETs ``key``: ``--value SIZE`` puts
  SIZE bytes there before the first client comes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from typing import Any

from benchmarks.harness import checkout, services, tls
from benchmarks.workloads.control import control, finish, listening, unsupported

#: Connections of the aiohttp-pg app's asyncpg pool (min and max).
PG_POOL = 10
#: The aiohttp-pg app's query: one round trip to PostgreSQL, no table
#: (nothing to create or clean up on a shared server).
PG_QUERY = ("SELECT $1::int4 AS id, 'user ' || $1::int4 AS name, "
            "md5($1::int4::text) AS digest")
#: Bytes of a broadcast message: its sequence number, its send time
#: (``time.monotonic_ns()``, CLOCK_MONOTONIC: one clock for every process
#: of the machine), 8 bytes each, little-endian, then padding.
MESSAGE = 64


def _loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return f"{type(loop).__module__}.{type(loop).__qualname__}"


# -- uvicorn-json ----------------------------------------------------------------------


def check_item(data: Any) -> dict[str, Any] | str:
    """The item of a ``POST /items/{item_id}`` body, or what is wrong with
    it: an object with ``name`` (1-100 characters), ``price`` (a number,
    0 or more), ``quantity`` (an integer, 1 or more) and, optionally,
    ``tags`` (at most 10 strings)."""
    if not isinstance(data, dict):
        return "the body is not a JSON object"
    name, price, quantity = data.get("name"), data.get("price"), data.get("quantity")
    tags = data.get("tags", [])
    if not isinstance(name, str) or not 1 <= len(name) <= 100:
        return "name: a string of 1 to 100 characters"
    if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
        return "price: a number, 0 or more"
    if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity < 1:
        return "quantity: an integer, 1 or more"
    if (not isinstance(tags, list) or len(tags) > 10
            or not all(isinstance(t, str) for t in tags)):
        return "tags: a list of at most 10 strings"
    return {"name": name, "price": price, "quantity": quantity, "tags": tags}


def json_app(started: Any) -> Any:
    """The Starlette app: ``await started(loop)`` at lifespan startup, then
    ``POST /items/{item_id}`` (and ``GET /health``)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def create_item(request: Request) -> JSONResponse:
        try:
            data = await request.json()
        except ValueError:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        item = check_item(data)
        if isinstance(item, str):
            return JSONResponse({"error": item}, status_code=422)
        return JSONResponse({"id": request.path_params["item_id"], **item,
                             "total": item["price"] * item["quantity"]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        await started(asyncio.get_running_loop())
        yield

    return Starlette(routes=[Route("/items/{item_id:int}", create_item, methods=["POST"]),
                             Route("/health", health)], lifespan=lifespan)


async def tls_refused(loop: asyncio.AbstractEventLoop) -> str | None:
    """Why *loop* cannot serve TLS (its ``create_server(ssl=)`` raises
    NotImplementedError, or a TypeError for the keyword), or None."""
    try:
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0,
                                          ssl=tls.server_context())
    except (NotImplementedError, TypeError) as exc:
        return (f"{_loop_name(loop)}: create_server(ssl=) raised "
                f"{type(exc).__name__}: {exc}")
    server.close()
    return None


# -- aiohttp-pg ------------------------------------------------------------------------


def pg_app(pool: Any) -> Any:
    """The aiohttp app: ``GET /users/{user_id}`` (one query), ``GET /health``
    and ``GET /`` (none)."""
    from aiohttp import web

    async def user(request: web.Request) -> web.Response:
        try:
            user_id = int(request.match_info["user_id"])
        except ValueError:
            raise web.HTTPNotFound() from None
        row = await pool.fetchrow(PG_QUERY, user_id)
        return web.json_response(dict(row))

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "pool": pool.get_size()})

    async def index(request: web.Request) -> web.Response:
        return web.json_response({"routes": ["/users/{user_id}", "/health"]})

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/health", health)
    app.router.add_get("/users/{user_id}", user)
    return app


async def serve_pg(args: argparse.Namespace) -> None:
    """The ``aiohttp-pg`` server until the end of input."""
    import asyncpg
    from aiohttp import web

    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    pg = services.read("postgres")
    context = tls.server_context() if args.tls else None
    # Plain TCP to PostgreSQL (asyncpg's default, sslmode "prefer", would
    # take the server's TLS): the TLS of aiohttp-pg-tls is the client's.
    pool = await asyncpg.create_pool(host=pg["host"], port=pg["port"], user=pg["user"],
                                     database=pg["database"], ssl=False,
                                     min_size=PG_POOL, max_size=PG_POOL)
    runner = web.AppRunner(pg_app(pool), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024, ssl_context=context)
    try:
        await site.start()
    except (NotImplementedError, TypeError) as exc:
        if context is None:
            raise
        unsupported(f"{_loop_name(loop)}: create_server(ssl=) raised "
                    f"{type(exc).__name__}: {exc}")
        await runner.cleanup()
        await pool.close()
        return
    server = site._server  # aiohttp exposes no public accessor for the port
    assert server is not None
    listening(server.sockets[0].getsockname()[1], _loop_name(loop), checkout.relaxed_package(),
              asyncpg=asyncpg.__version__, pool=PG_POOL)
    control(loop, lambda: finish(stop))
    await stop
    await runner.cleanup()
    await pool.close()


# -- ws-broadcast ----------------------------------------------------------------------


class Broadcaster:
    """The server's side of the broadcasts: one under way at a time, the
    next when the client acknowledges the last (its sequence number)."""

    def __init__(self) -> None:
        self.seq = 0  # the last broadcast sent; 0: none, the client's "0" starts them
        self.padding = bytes(MESSAGE - 16)

    def ack(self, data: bytes) -> bytes | None:
        """The next message when *data* acknowledges the last broadcast,
        else None (a stale or unknown acknowledgement)."""
        if len(data) != 8 or int.from_bytes(data, "little") != self.seq:
            return None
        self.seq += 1
        return (self.seq.to_bytes(8, "little") + time.monotonic_ns().to_bytes(8, "little")
                + self.padding)


async def serve_ws(args: argparse.Namespace) -> None:
    """The ``ws-broadcast`` server until the end of input."""
    import websockets
    from websockets.asyncio.server import ServerConnection, broadcast, serve
    from websockets.exceptions import ConnectionClosed

    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    clients: set[ServerConnection] = set()
    broadcaster = Broadcaster()

    async def handler(ws: ServerConnection) -> None:
        clients.add(ws)
        try:
            async for data in ws:
                message = broadcaster.ack(data if isinstance(data, bytes) else data.encode())
                if message is not None:
                    broadcast(clients, message)
        except ConnectionClosed:
            pass
        finally:
            clients.discard(ws)

    # No keep-alive pings and no compression: the broadcasts are the only
    # frames the server writes.
    server = await serve(handler, "127.0.0.1", 0, backlog=1024, ping_interval=None,
                         compression=None)
    listening(server.sockets[0].getsockname()[1], _loop_name(loop), checkout.relaxed_package(),
              websockets=websockets.__version__)
    control(loop, lambda: finish(stop))
    await stop
    # Abort, without closing handshakes: the client stops reading at the
    # end of its input, which may come first.
    for ws in list(clients):
        ws.transport.abort()
    server.close()
    await server.wait_closed()


# -- resp ------------------------------------------------------------------------------


class RespError(ValueError):
    """Bytes that are not a RESP array of bulk strings."""


class RespParser:
    """Commands of the Redis protocol (RESP2: an array of bulk strings,
    ``*2\\r\\n$3\\r\\nGET\\r\\n$1\\r\\nk\\r\\n``) from a stream cut anywhere:
    :meth:`feed` returns every whole command so far and keeps the rest.
    Inline commands (``PING\\r\\n`` typed into telnet) are not read."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> list[list[bytes]]:
        buf = self.buffer + data if self.buffer else data
        out: list[list[bytes]] = []
        pos, n = 0, len(buf)
        while pos < n:
            command = self._command(buf, pos, n)
            if command is None:
                break
            args, pos = command
            out.append(args)
        self.buffer = buf[pos:]
        return out

    @staticmethod
    def _command(buf: bytes, pos: int, n: int) -> tuple[list[bytes], int] | None:
        """The command at *pos* and the position after it, or None while
        it is incomplete."""
        if buf[pos] != 0x2A:  # "*"
            raise RespError(f"expected an array ('*'), got {buf[pos:pos + 16]!r}")
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        count = _number(buf, pos + 1, end)
        p = end + 2
        args = []
        for _ in range(count):
            if p >= n:
                return None
            if buf[p] != 0x24:  # "$"
                raise RespError(f"expected a bulk string ('$'), got {buf[p:p + 16]!r}")
            end = buf.find(b"\r\n", p)
            if end < 0:
                return None
            start = end + 2
            stop = start + _number(buf, p + 1, end)
            if stop + 2 > n:
                return None
            if buf[stop:stop + 2] != b"\r\n":
                raise RespError("a bulk string longer than its length")
            args.append(buf[start:stop])
            p = stop + 2
        return args, p


def _number(buf: bytes, start: int, end: int) -> int:
    """The decimal length or count between *start* and *end*."""
    text = buf[start:end]
    if not text.isdigit() or len(text) > 10:
        raise RespError(f"not a length: {text!r}")
    return int(text)


def answer(store: dict[bytes, bytes], command: list[bytes]) -> bytes:
    """The reply to one command: GET, SET and PING; an error for the rest."""
    name = command[0].upper() if command else b""
    if name == b"GET" and len(command) == 2:
        value = store.get(command[1])
        if value is None:
            return b"$-1\r\n"
        return b"$%d\r\n%b\r\n" % (len(value), value)
    if name == b"SET" and len(command) == 3:
        store[command[1]] = command[2]
        return b"+OK\r\n"
    if name == b"PING" and len(command) == 1:
        return b"+PONG\r\n"
    return b"-ERR unknown command or wrong number of arguments\r\n"


class RespProtocol(asyncio.Protocol):
    """One client of the ``resp`` server: every command of a read answered
    in order, the answers in one write."""

    def __init__(self, store: dict[bytes, bytes]) -> None:
        self.store = store
        self.parser = RespParser()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            commands = self.parser.feed(data)
        except RespError as exc:
            self.transport.write(b"-ERR protocol error: %b\r\n" % str(exc).encode())
            self.transport.close()
            return
        if commands:
            store = self.store
            self.transport.write(b"".join([answer(store, c) for c in commands]))


async def serve_resp(args: argparse.Namespace) -> None:
    """The ``resp`` server until the end of input: one dict for every client,
    holding ``args.value`` bytes at ``key`` where that is above 0."""
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    store: dict[bytes, bytes] = {b"key": b"v" * args.value} if args.value > 0 else {}
    server = await loop.create_server(lambda: RespProtocol(store), "127.0.0.1", 0,
                                      backlog=1024)
    listening(server.sockets[0].getsockname()[1], _loop_name(loop), checkout.relaxed_package())
    control(loop, lambda: finish(stop))
    await stop
    server.close()


#: The server kinds of this module, by the coroutine that serves each.
SERVERS = {"aiohttp-pg": serve_pg, "ws-broadcast": serve_ws, "resp": serve_resp}


def tls_paths() -> dict[str, Any]:
    """uvicorn's ``ssl_certfile`` and ``ssl_keyfile``: the harness's server
    file, which holds the key and then the certificate chain."""
    path = os.path.join(os.environ.get(tls.ENV, ""), tls.SERVER_FILE)
    if not os.path.isfile(path):
        raise LookupError(f"no {path}: the runner makes the certificates "
                          "(benchmarks.harness.tls.ensure) before it starts a TLS child")
    return {"ssl_certfile": path, "ssl_keyfile": path}



# -- the ws client's side of the broadcasts (benchmarks.workloads.client) ---------------

class Deliveries:
    """The client's side of the broadcasts: which one is under way, which
    connections have it.  Each connection must receive every broadcast
    once and in order; the last connection to receive one completes it."""

    def __init__(self, connections: int) -> None:
        self.connections = connections
        self.seq = 1  # the broadcast under way
        self.received = 0  # connections that have it
        self.last = [0] * connections  # per connection, the last one it received

    def deliver(self, index: int, seq: int) -> bool:
        """Connection *index* received broadcast *seq*; True when it was the
        last connection to, so the broadcast is complete and the next one
        under way."""
        if seq != self.seq or self.last[index] != seq - 1:
            raise ValueError(f"connection {index} received broadcast {seq} after "
                             f"{self.last[index]}, while {self.seq} is under way")
        self.last[index] = seq
        self.received += 1
        if self.received < self.connections:
            return False
        self.seq += 1
        self.received = 0
        return True
