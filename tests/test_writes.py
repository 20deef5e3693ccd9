"""The write states and queue (asyncio_relaxed._writes) without sockets or a
loop: fake transports record what the transitions make them do."""

from __future__ import annotations

import contextvars
from typing import Any

import pytest

from asyncio_relaxed import _writes
from asyncio_relaxed._stats import Counters

IDLE, QUEUED, POLLING = _writes.IDLE, _writes.QUEUED, _writes.POLLING


class Fake:
    """A transport as the queue sees it."""

    _context: Any = None

    def __init__(self, name: str, log: list[str], send: Any = None) -> None:
        self.name = name
        self.log = log
        self._write_state = IDLE
        self._feeds = 0
        self.send = send

    def _write_now(self) -> None:
        if self.send is not None:
            self.send(self)
        else:
            self.log.append(f"send {self.name} {self._write_state}")

    def _watch_write(self) -> None:
        self.log.append(f"watch {self.name}")

    def _unwatch_write(self) -> None:
        self.log.append(f"unwatch {self.name}")


def queue_of(log: list[str], **settings: Any) -> _writes.WriteQueue:
    options = {"deferred": True, "feed": True, "feed_limit": 2, **settings}
    return _writes.WriteQueue(Counters(), **options)


def test_flush_sends_each_queued_transport_once_in_order_and_idle() -> None:
    log: list[str] = []
    queue = queue_of(log)
    a, b = Fake("a", log), Fake("b", log)
    queue.queue(a)
    queue.queue(b)
    assert (a._write_state, b._write_state) == (QUEUED, QUEUED)
    assert queue.pending == [a, b] and queue
    queue.flush(include_feeds=True)
    assert log == [f"send a {IDLE}", f"send b {IDLE}"]  # set IDLE before its send
    assert not queue.pending and not queue.feeding


def test_flush_skips_a_transport_that_left_the_queued_state() -> None:
    """A transport sent meanwhile (past the high-water mark) or now polling
    is skipped; queued twice, it is sent once."""
    log: list[str] = []
    queue = queue_of(log)
    a, b = Fake("a", log), Fake("b", log)
    queue.queue(a)
    queue.queue(b)
    assert queue.unqueue(a)  # an early send...
    queue.queue(a)  # ...and queued again
    b._write_state = POLLING
    queue.flush(include_feeds=False)
    assert log == [f"send a {IDLE}"]


def test_feed_retries_wait_for_the_flush_that_includes_them() -> None:
    log: list[str] = []
    queue = queue_of(log)
    a = Fake("a", log)
    queue.short(a)
    assert a._write_state == QUEUED and a._feeds == 1 and queue.feeding == [a]
    queue.flush(include_feeds=False)  # the flush before the poll: not yet
    assert log == []
    queue.flush(include_feeds=True)
    assert log == [f"send a {IDLE}"] and queue.stats.write_feeds == 1


def test_feed_retries_are_capped_then_the_transport_polls() -> None:
    log: list[str] = []
    queue = queue_of(log, feed_limit=2)
    a = Fake("a", log)
    for _ in range(2):
        queue.short(a)
        assert a._write_state == QUEUED
        queue.flush(include_feeds=True)
    queue.short(a)  # the third in a row: poll instead
    assert a._write_state == POLLING and a._feeds == 0 and log[-1] == "watch a"
    b = Fake("b", log)
    queue_of(log, feed=False).short(b)
    assert b._write_state == POLLING and log[-1] == "watch b"


def test_a_short_send_while_queued_or_polling_changes_nothing() -> None:
    log: list[str] = []
    queue = queue_of(log)
    a = Fake("a", log)
    queue.queue(a)
    queue.short(a)
    assert a._write_state == QUEUED and queue.pending == [a] and not queue.feeding
    a._write_state = POLLING
    queue.short(a)
    assert a._write_state == POLLING and log == []


def test_unqueue_and_emptied() -> None:
    """A send before the flush takes a QUEUED transport out (the flush then
    skips it); an emptied buffer ends polling and the feed count."""
    log: list[str] = []
    queue = queue_of(log)
    a = Fake("a", log)
    assert not queue.unqueue(a)  # IDLE: nothing to take out
    queue.queue(a)
    assert queue.unqueue(a) and a._write_state == IDLE
    queue.flush(include_feeds=True)
    assert log == []
    a._write_state, a._feeds = POLLING, 1
    queue.emptied(a)
    assert (a._write_state, a._feeds, log) == (IDLE, 0, ["unwatch a"])
    queue.emptied(a)  # IDLE already: no second unwatch
    assert log == ["unwatch a"]


def test_a_send_that_raises_is_reported_and_the_flush_goes_on() -> None:
    log: list[str] = []
    reported: list[tuple[str, BaseException]] = []

    def send(transport: Fake) -> None:
        if transport.name == "a":
            raise ZeroDivisionError("from connection_lost")
        log.append(transport.name)

    queue = _writes.WriteQueue(Counters(), deferred=True, feed=False, feed_limit=1)
    queue.on_error = lambda transport, exc: reported.append((transport.name, exc))
    for name in ("a", "b"):
        queue.queue(Fake(name, log, send))
    queue.flush(include_feeds=True)
    assert log == ["b"] and reported[0][0] == "a"
    queue.on_error = None
    queue.queue(Fake("a", log, send))
    with pytest.raises(ZeroDivisionError):
        queue.flush(include_feeds=True)


def test_a_send_runs_in_the_transports_context_or_in_the_one_that_queued_it() -> None:
    """Stock sends from the writer's code, and registers EPOLLOUT there after
    a short send: a queued send runs in a copy of the context that queued it
    (a deferred write's, a feed retry's short send's), as it was then, or in
    the transport's own context where it has one (3.15's connections)."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="outside")
    seen: list[str] = []

    def send(transport: Fake) -> None:
        seen.append(var.get())
        var.set("set by the send")

    queue = _writes.WriteQueue(Counters(), deferred=True, feed=True, feed_limit=1)
    writer = contextvars.copy_context()
    a, b, c = Fake("a", [], send), Fake("b", [], send), Fake("c", [], send)
    writer.run(var.set, "the writer's")
    writer.run(queue.queue, a)
    writer.run(queue.short, b)
    writer.run(var.set, "set after the write")
    own = contextvars.copy_context()
    own.run(var.set, "the connection's")
    c._context = own
    queue.queue(c)
    queue.flush(include_feeds=True)
    assert seen == ["the writer's", "the connection's", "the writer's"]  # a, c, then b
    # Each ran in a copy: the writer's context is as it was.
    assert writer.run(var.get) == "set after the write" and var.get() == "outside"


def test_take_back_takes_a_deferred_write_not_a_feed_retry() -> None:
    """close() sends a deferred write itself (stock's write() had sent it);
    a feed retry is a short send's, whose end stock leaves to EPOLLOUT."""
    log: list[str] = []
    queue = queue_of(log)
    a, b = Fake("a", log), Fake("b", log)
    assert not queue.take_back(a)  # IDLE: nothing to take
    queue.queue(a)
    queue.short(b)
    assert queue.take_back(a) and a._write_state == IDLE
    assert not queue.take_back(b) and b._write_state == QUEUED
    queue.flush(include_feeds=True)
    assert log == [f"send b {IDLE}"]
