"""Real database clients on every loop: asyncpg on PostgreSQL, redis-py on Redis (#27).

The servers are throwaway ones on loopback: ``.ci/services up`` starts them
and writes how to reach them to ``.services.json`` at the checkout's root
(docs/testing.md).  Without that file the tests skip, saying so; a client
with no build for this Python skips with the reason.  Nothing is faked: a
test that finds the file and cannot reach its server fails.

Each test runs on every loop of the suite (conftest.py) and asserts values
computed here, without a loop, and the exact type of every error; its run on
the stock loop is the check that stock gives exactly that.  Every name a test
makes on a server (temporary tables, channels, keys, client names) is its own,
so runs of several Pythons may share the servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import decimal
import functools
import hashlib
import json
import random
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import asyncio_relaxed
from conftest import run

ROOT = Path(__file__).resolve().parent.parent
#: Written by ``.ci/services up``, deleted by ``.ci/services down``.
SERVICES = ROOT / ".services.json"

# The scenarios take well under a second each on loopback; the bound is for a
# hang, and each run() inside has its own deadline.
pytestmark = pytest.mark.timeout(30)


def service(name: str) -> dict[str, Any]:
    """How to reach server *name* ("postgres", "redis"), or skip saying why not."""
    if not SERVICES.exists():
        pytest.skip(
            f"no {SERVICES.name}: no throwaway PostgreSQL and Redis here; start them with "
            "`.ci/services up` (root, Debian; docs/testing.md)"
        )
    with SERVICES.open() as f:
        about: dict[str, Any] = json.load(f)[name]
    return about


def unique(prefix: str) -> str:
    """A name no other test or run uses (a valid SQL identifier, in lower case)."""
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def outcome(exc: BaseException) -> tuple[type[BaseException], str | None]:
    """What a caller can tell of an error: its exact type, and PostgreSQL's SQLSTATE."""
    return type(exc), getattr(exc, "sqlstate", None)


@pytest.fixture(autouse=True)
def _no_stray_tasks(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """A client that leaves a task running past its aclose() fails the test."""
    yield
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    assert not left, f"tasks still running: {left!r}"


# -- asyncpg on PostgreSQL ------------------------------------------------------


@pytest.fixture
def postgres() -> dict[str, Any]:
    """asyncpg.connect()'s keywords for the throwaway cluster, without TLS."""
    pytest.importorskip(
        "asyncpg",
        reason="asyncpg is not installed (the test extra has it where a wheel exists: CPython)",
    )
    about = service("postgres")
    return {
        "host": about["host"],
        "port": about["port"],
        "user": about["user"],
        "database": about["database"],
        # asyncpg's default (sslmode "prefer") would take TLS, which has its
        # own test: these connections are plain TCP.
        "ssl": False,
    }


@contextlib.asynccontextmanager
async def pg_connection(postgres: dict[str, Any], **options: Any) -> AsyncIterator[Any]:
    import asyncpg

    conn = await asyncpg.connect(**{**postgres, **options})
    try:
        yield conn
    finally:
        await conn.close()


def test_asyncpg_queries(loop: asyncio.AbstractEventLoop, postgres: dict[str, Any]) -> None:
    import asyncpg

    typed_query = (
        "SELECT 1::int4, 'é'::text, '\\x00ff'::bytea, 1.5::numeric, "
        "'2026-12-01 12:00:00+00'::timestamptz, ARRAY[1, 2, 3], '{\"a\": [1, null]}'::jsonb"
    )
    utc = datetime.UTC
    typed_row = (
        1,
        "é",
        b"\x00\xff",
        decimal.Decimal("1.5"),
        datetime.datetime(2026, 12, 1, 12, tzinfo=utc),
        [1, 2, 3],
        '{"a": [1, null]}',
    )
    # Half a megabyte of rows: many reads, each cut wherever the loop's read ends.
    many = [(i, hashlib.md5(str(i).encode()).hexdigest()) for i in range(1, 10_001)]
    failing = [
        ("SELECT 1 / 0", asyncpg.DivisionByZeroError, "22012"),
        ("SELECT * FROM no_such_table", asyncpg.UndefinedTableError, "42P01"),
        ("SELEC 1", asyncpg.PostgresSyntaxError, "42601"),
    ]

    async def main() -> None:
        async with pg_connection(postgres) as conn:
            assert tuple(await conn.fetchrow(typed_query)) == typed_row
            rows = await conn.fetch("SELECT i, md5(i::text) FROM generate_series(1, 10000) i")
            assert [tuple(r) for r in rows] == many

            table = unique("queries")
            await conn.execute(f"CREATE TEMP TABLE {table} (id int PRIMARY KEY, name text)")
            await conn.executemany(
                f"INSERT INTO {table} VALUES ($1, $2)", [(i, f"n{i}") for i in range(1000)]
            )
            statement = await conn.prepare(f"SELECT name FROM {table} WHERE id = $1")
            assert [await statement.fetchval(i) for i in (0, 500, 999, 1000)] == [
                "n0",
                "n500",
                "n999",
                None,
            ]
            with pytest.raises(ZeroDivisionError):
                async with conn.transaction():
                    await conn.execute(f"DELETE FROM {table}")
                    1 / 0  # noqa: B018
            assert await conn.fetchval(f"SELECT sum(id) FROM {table}") == sum(range(1000))

            seen = []
            for query, _, _ in failing:
                with pytest.raises(asyncpg.PostgresError) as raised:
                    await conn.fetch(query)
                seen.append(outcome(raised.value))
                assert await conn.fetchval("SELECT 1") == 1  # the connection goes on
            with pytest.raises(asyncpg.PostgresError) as raised:
                await conn.execute(f"INSERT INTO {table} VALUES (1, 'again')")
            seen.append(outcome(raised.value))
            assert seen == [
                *((kind, state) for _, kind, state in failing),
                (asyncpg.UniqueViolationError, "23505"),
            ]

    run(loop, main())


def test_asyncpg_pool_of_20_under_50_tasks(
    loop: asyncio.AbstractEventLoop, postgres: dict[str, Any]
) -> None:
    import asyncpg

    async def main() -> None:
        held = peak = 0

        async def task(pool: Any, i: int) -> tuple[int, int]:
            nonlocal held, peak
            async with pool.acquire() as conn:
                held += 1
                peak = max(peak, held)
                try:
                    # The sleep keeps each connection busy while the other
                    # tasks queue for one.
                    row = await conn.fetchrow(
                        "SELECT pg_backend_pid(), $1::int * 2, pg_sleep(0.01)", i
                    )
                finally:
                    held -= 1
            return row[0], row[1]

        async with asyncpg.create_pool(**postgres, min_size=20, max_size=20) as pool:
            results = await asyncio.gather(*(task(pool, i) for i in range(50)))
        assert [twice for _, twice in results] == [2 * i for i in range(50)]
        # Twenty tasks held a connection at once, each a server process of its own.
        assert (peak, len({pid for pid, _ in results})) == (20, 20)

    run(loop, main())


@functools.cache
def copy_payload() -> bytes:
    """10 MiB of COPY text: 81,920 lines of ``id<TAB>118 hex digits<LF>``."""
    rng = random.Random(27)
    return b"".join(b"%08d\t%s\n" % (i, rng.randbytes(59).hex().encode()) for i in range(81_920))


def test_asyncpg_copy_10_mib(loop: asyncio.AbstractEventLoop, postgres: dict[str, Any]) -> None:
    payload = copy_payload()
    assert len(payload) == 10 * 1024 * 1024

    async def chunks() -> AsyncIterator[bytes]:
        view = memoryview(payload)
        for start in range(0, len(payload), 256 * 1024):
            yield bytes(view[start : start + 256 * 1024])

    async def main() -> None:
        async with pg_connection(postgres) as conn:
            table = unique("copy")
            await conn.execute(f"CREATE TEMP TABLE {table} (id text, payload text)")
            assert await conn.copy_to_table(table, source=chunks()) == "COPY 81920"
            # What comes back in the same text format is what went in: both
            # ways are checked, byte for byte.
            received: list[bytes] = []

            async def output(data: bytes) -> None:
                received.append(data)

            status = await conn.copy_from_query(f"SELECT * FROM {table} ORDER BY id", output=output)
            assert status == "COPY 81920"
            assert b"".join(received) == payload

    run(loop, main())


def test_asyncpg_listen_notify(loop: asyncio.AbstractEventLoop, postgres: dict[str, Any]) -> None:
    channel = unique("channel")
    sent = [f"payload {i} " + "x" * 100 * i for i in range(60)]

    async def main() -> None:
        got: list[tuple[int, str, str]] = []
        done = asyncio.get_running_loop().create_future()

        def on_notify(conn: Any, pid: int, chan: str, payload: str) -> None:
            got.append((pid, chan, payload))
            if payload == "the end" and not done.done():
                done.set_result(None)

        async with pg_connection(postgres) as listener, pg_connection(postgres) as notifier:
            await listener.add_listener(channel, on_notify)
            for payload in sent[:30]:
                await notifier.execute("SELECT pg_notify($1, $2)", channel, payload)
            # A rolled-back transaction notifies no one; a committed one, at commit.
            with pytest.raises(ZeroDivisionError):
                async with notifier.transaction():
                    await notifier.execute("SELECT pg_notify($1, 'rolled back')", channel)
                    1 / 0  # noqa: B018
            async with notifier.transaction():
                for payload in sent[30:]:
                    await notifier.execute("SELECT pg_notify($1, $2)", channel, payload)
            await notifier.execute(f"NOTIFY {channel}, 'the end'")
            await asyncio.wait_for(done, 10)
            await listener.remove_listener(channel, on_notify)
            pid = notifier.get_server_pid()
        assert got == [(pid, channel, payload) for payload in [*sent, "the end"]]

    run(loop, main())


def test_asyncpg_cancelled_pg_sleep(
    loop: asyncio.AbstractEventLoop, postgres: dict[str, Any]
) -> None:
    async def sleeping(observer: Any, pid: int) -> None:
        """Until the server runs the sleep, so that the cancel meets a running
        query (the server sends no event for it: poll its activity view)."""
        query = "SELECT state FROM pg_stat_activity WHERE pid = $1"
        while await observer.fetchval(query, pid) != "active":
            await asyncio.sleep(0.005)

    async def main() -> None:
        async with pg_connection(postgres) as conn, pg_connection(postgres) as observer:
            pid = conn.get_server_pid()
            start = time.monotonic()
            seen = []
            # A timeout: asyncpg sends PostgreSQL a cancel request; the
            # connection's next query waits until the server ended the sleep.
            with pytest.raises(BaseException) as raised:
                await asyncio.wait_for(conn.fetchval("SELECT pg_sleep(60)"), 0.05)
            seen.append(type(raised.value))
            assert await conn.fetchval("SELECT 1") == 1
            # A cancelled task, once the server runs its query.
            task = asyncio.ensure_future(conn.fetchval("SELECT pg_sleep(60)"))
            await sleeping(observer, pid)
            task.cancel()
            with pytest.raises(BaseException) as raised:
                await task
            seen.append(type(raised.value))
            assert await conn.fetchval("SELECT 2") == 2
            assert seen == [TimeoutError, asyncio.CancelledError]
            # The server cancelled the sleeps; no one waited them out.
            assert time.monotonic() - start < 10

    run(loop, main())


def test_asyncpg_tls(loop: asyncio.AbstractEventLoop, postgres: dict[str, Any]) -> None:
    ca = ssl.create_default_context(cadata=service("postgres")["ca_pem"])
    blob = random.Random(27).randbytes(1024 * 1024)

    async def main() -> None:
        async with pg_connection(postgres, ssl=ca) as conn:
            on_tls = await conn.fetchrow(
                "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
            )
            assert tuple(on_tls) == (True, "TLSv1.3")
            # PostgreSQL negotiates TLS with loop.start_tls(): under tls=own
            # the loop's own TLS layer carries it, under tls=stock stock's.
            kind = type(conn._transport).__name__
            if isinstance(loop, asyncio_relaxed.PyLoop):
                tls = loop.config.tls.value
                assert kind == ("SSLTransport" if tls == "own" else "_SSLProtocolTransport")
            # Records bigger than a read both ways, through the loop's start_tls.
            assert await conn.fetchval("SELECT $1::bytea", blob) == blob
            text = await conn.fetchval("SELECT repeat('0123456789', 100000)")
            assert text == "0123456789" * 100_000
        # A context that does not trust the test CA refuses the server.
        with pytest.raises(BaseException) as raised:
            async with pg_connection(postgres, ssl=ssl.create_default_context()):
                pass
        assert type(raised.value) is ssl.SSLCertVerificationError

    run(loop, main())


# -- redis-py on Redis ----------------------------------------------------------


@pytest.fixture
def redis_server() -> dict[str, Any]:
    """redis.asyncio.Redis()'s keywords for the throwaway server."""
    pytest.importorskip("redis.asyncio", reason="redis (redis-py) is not installed")
    about = service("redis")
    return {"host": about["host"], "port": about["port"]}


@contextlib.asynccontextmanager
async def redis_client(redis_server: dict[str, Any], **options: Any) -> AsyncIterator[Any]:
    import redis.asyncio

    client = redis.asyncio.Redis(**{**redis_server, **options})
    try:
        yield client
    finally:
        await client.aclose()


def test_redis_pipelines(loop: asyncio.AbstractEventLoop, redis_server: dict[str, Any]) -> None:
    import redis.exceptions

    key = unique("pipeline")
    values = [random.Random(i).randbytes(8192) for i in range(200)]

    async def main() -> None:
        async with redis_client(redis_server) as r:
            try:
                async with r.pipeline(transaction=True) as p:
                    p.set(f"{key}:n", 41).incr(f"{key}:n").get(f"{key}:n")
                    p.rpush(f"{key}:l", "a", "b", "c").lrange(f"{key}:l", 0, -1)
                    assert await p.execute() == [True, 42, b"42", 3, [b"a", b"b", b"c"]]
                # An error in a transaction: in its place, or raised.
                async with r.pipeline(transaction=True) as p:
                    p.incr(f"{key}:n").incr(f"{key}:l").get(f"{key}:n")
                    results = await p.execute(raise_on_error=False)
                assert results[0::2] == [43, b"43"]
                assert type(results[1]) is redis.exceptions.ResponseError
                assert str(results[1]).startswith("WRONGTYPE")
                with pytest.raises(BaseException) as raised:
                    async with r.pipeline(transaction=False) as p:
                        await p.incr(f"{key}:l").execute()
                assert type(raised.value) is redis.exceptions.ResponseError
                # 400 commands, 1.6 MiB each way in one round trip.
                async with r.pipeline(transaction=False) as p:
                    for i, value in enumerate(values):
                        p.set(f"{key}:v{i}", value)
                    for i in range(len(values)):
                        p.get(f"{key}:v{i}")
                    assert await p.execute() == [True] * len(values) + values
            finally:
                await r.delete(f"{key}:n", f"{key}:l", *(f"{key}:v{i}" for i in range(200)))

    run(loop, main())


def test_redis_pubsub(loop: asyncio.AbstractEventLoop, redis_server: dict[str, Any]) -> None:
    channel = unique("news")
    pattern = f"{channel}*"
    sent = [f"message {i} ".encode() + b"x" * (i * 100) for i in range(50)]
    # The confirmations first (with the count of subscriptions), then for each
    # message what a channel's subscribers get, then what the matching patterns'.
    expected = [("subscribe", None, channel, 1), ("psubscribe", None, pattern, 2)]
    for data in sent:
        expected += [("message", None, channel, data), ("pmessage", pattern, channel, data)]

    def seen(message: dict[str, Any]) -> tuple[Any, ...]:
        matched = message["pattern"] and message["pattern"].decode()
        return message["type"], matched, message["channel"].decode(), message["data"]

    async def main() -> None:
        async with redis_client(redis_server) as r, redis_client(redis_server) as publisher:
            pubsub = r.pubsub()
            try:
                await pubsub.subscribe(channel)
                await pubsub.psubscribe(pattern)
                async with contextlib.aclosing(pubsub.listen()) as messages:
                    # Publish only once the server confirmed both subscriptions.
                    got = [seen(await anext(messages)) for _ in range(2)]
                    receivers = [await publisher.publish(channel, data) for data in sent]
                    while len(got) < len(expected):
                        got.append(seen(await anext(messages)))
                assert got == expected
                assert receivers == [2] * len(sent)  # one subscription, one pattern
                await pubsub.unsubscribe(channel)
                await pubsub.punsubscribe(pattern)
            finally:
                await pubsub.aclose()

    run(loop, main())


def test_redis_cancelled_blpop(
    loop: asyncio.AbstractEventLoop, redis_server: dict[str, Any]
) -> None:
    key = unique("queue")
    name = unique("blpop")

    async def blocked(r: Any) -> list[str]:
        """Our clients the server holds in BLPOP."""
        return [
            c["name"] for c in await r.client_list() if c["name"] == name and c["cmd"] == "blpop"
        ]

    async def released(r: Any) -> None:
        """Until the server holds none of ours in BLPOP.  The client closed
        the connection it gave up; the server sees that close when it reads
        the socket, which can come after it has answered the next CLIENT
        LIST (on every loop): so ask until it is gone, within seconds."""
        deadline = asyncio.get_running_loop().time() + 5
        while held := await blocked(r):
            assert asyncio.get_running_loop().time() < deadline, held
            await asyncio.sleep(0.005)

    async def main() -> None:
        async with redis_client(redis_server, client_name=name) as r:
            # Connected first, so the timeout meets the BLPOP and not redis-py's
            # connection setup (where, on 3.11 and on stock too, a cancellation
            # can leave the BLPOP running and wait_for raise CancelledError).
            assert await r.ping() is True
            seen = []
            with pytest.raises(BaseException) as raised:
                await asyncio.wait_for(r.blpop(key, timeout=60), 0.05)
            seen.append(type(raised.value))
            # redis-py drops a connection whose reply it gave up, so the
            # server no longer blocks it and a value pushed now stays.
            await released(r)
            task = asyncio.ensure_future(r.blpop(key, timeout=60))
            async with redis_client(redis_server) as observer:
                while not await blocked(observer):
                    await asyncio.sleep(0.005)
                task.cancel()
                with pytest.raises(BaseException) as raised:
                    await task
                seen.append(type(raised.value))
                await released(observer)
            assert seen == [TimeoutError, asyncio.CancelledError]
            try:
                assert await r.rpush(key, "after") == 1
                assert await r.blpop(key, timeout=1) == (key.encode(), b"after")
            finally:
                await r.delete(key)

    run(loop, main())


def test_redis_1000_concurrent_gets_on_a_large_pool(
    loop: asyncio.AbstractEventLoop, redis_server: dict[str, Any]
) -> None:
    import redis.asyncio

    key = unique("get")
    name = unique("pool")
    # asyncio's debug mode keeps a traceback of each callback and task: with
    # redis-py about 5 ms a GET and 10 ms a connection on every loop, stock
    # included (3.11.7), which would make this test 6 s per loop.  There it
    # keeps its shape, more GETs than connections, at a twentieth.
    gets, size = (50, 10) if loop.get_debug() else (1000, 50)
    values = {f"{key}:{i}": f"value {i}".encode() * (1 + i % 50) for i in range(gets)}

    async def main() -> None:
        pool = redis.asyncio.BlockingConnectionPool(
            **redis_server, max_connections=size, timeout=10, client_name=name
        )
        r = redis.asyncio.Redis.from_pool(pool)  # closes the pool at aclose()
        try:
            await r.mset(values)
            got = await asyncio.gather(*(r.get(k) for k in values))
            assert got == list(values.values())
            # The pool opened every connection it may: the server has them all.
            clients = [c for c in await r.client_list() if c["name"] == name]
            assert len(clients) == size
        finally:
            try:
                await r.delete(*values)
            finally:
                await r.aclose()

    run(loop, main())
