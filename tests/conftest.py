"""One behaviour suite, every loop (uvloop's _testbase mixins, anyio's conftest).

``loop`` is parametrized over stock asyncio, uvloop (skipped with the reason
when it is not installed) and asyncio_relaxed in each write x partial-write
setting.  A test fails on any call of the loop's exception handler it did not
declare with ``loop_errors.expect(...)``.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

import asyncio_relaxed

try:
    import uvloop
except ImportError:  # optional peer
    uvloop = None

RELAXED_SETTINGS = {
    f"relaxed-{write}-{partial}": {"write": write, "partial_write": partial}
    for write in ("eager", "deferred")
    for partial in ("poll", "feed")
}

LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop] | None] = {
    "asyncio": asyncio.SelectorEventLoop,
    "uvloop": uvloop.new_event_loop if uvloop is not None else None,
    **{
        name: functools.partial(asyncio_relaxed.new_event_loop, **settings)
        for name, settings in RELAXED_SETTINGS.items()
    },
}


class Echo(asyncio.Protocol):
    """Writes back whatever it receives."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class LoopErrors:
    """Records exception-handler calls; unexpected ones fail the test."""

    def __init__(self) -> None:
        self.contexts: list[dict[str, Any]] = []
        self.expected: list[str] = []

    def handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.contexts.append(context)

    def expect(self, message_part: str) -> None:
        self.expected.append(message_part)

    def check(self) -> None:
        unexpected = [
            c
            for c in self.contexts
            if not any(part in str(c.get("message", "")) for part in self.expected)
        ]
        assert not unexpected, f"unexpected exception-handler calls: {unexpected!r}"


@pytest.fixture
def loop_errors() -> LoopErrors:
    return LoopErrors()


@pytest.fixture(params=list(LOOP_FACTORIES))
def loop_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if LOOP_FACTORIES[name] is None:
        pytest.skip(f"{name} is not installed")
    return name


@pytest.fixture
def loop(loop_name: str, loop_errors: LoopErrors) -> Iterator[asyncio.AbstractEventLoop]:
    factory = LOOP_FACTORIES[loop_name]
    assert factory is not None
    loop = factory()
    loop.set_exception_handler(loop_errors.handler)
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
    loop_errors.check()


@pytest.fixture(params=list(RELAXED_SETTINGS))
def relaxed_loop(
    request: pytest.FixtureRequest, loop_errors: LoopErrors
) -> Iterator[asyncio_relaxed.Loop]:
    """Only our loop, in each setting: for tests that read statistics()."""
    loop = asyncio_relaxed.new_event_loop(**RELAXED_SETTINGS[request.param])
    loop.set_exception_handler(loop_errors.handler)
    try:
        yield loop
    finally:
        loop.close()
    loop_errors.check()


def run(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], timeout: float = 20
) -> Any:
    """Run *coro* on *loop* with a deadline, so a hang fails instead of blocking."""
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


def iterate(loop: asyncio.AbstractEventLoop, n: int = 1) -> None:
    """Run exactly *n* loop iterations."""
    for _ in range(n):
        loop.call_soon(loop.stop)
        loop.run_forever()


def stalled_pair(sndbuf: int = 4096) -> tuple[socket.socket, socket.socket]:
    """A connected pair whose first end's send buffer fills fast."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf)
    a.setblocking(False)
    b.setblocking(False)
    return a, b
