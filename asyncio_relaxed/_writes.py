"""The write side's states and the per-iteration write queue.

Theory of operation
===================

A transport's write side is in exactly one of three states (its
``_write_state``):

* ``IDLE``: nothing buffered, nothing pending;
* ``QUEUED``: in this queue, which sets it IDLE and runs its send once,
  after the iteration's callbacks: ``pending`` holds deferred writes
  (write=deferred), ``feeding`` the short sends retried on the next
  iteration without waiting for the socket (partial_write=feed);
* ``POLLING``: waiting for EPOLLOUT, as stock asyncio does after a short send.

Every transition is a method of :class:`WriteQueue`:

=====================  ==============================  ==========================
method                 from -> to                      when
=====================  ==============================  ==========================
:meth:`queue`          IDLE -> QUEUED (pending)        a deferred write
:meth:`short`          IDLE -> QUEUED (feeding)        a short send, feed policy
                       IDLE -> POLLING                 a short send, poll policy
                                                       (or feed_limit reached)
:meth:`unqueue`        QUEUED -> IDLE                  a send before the flush
                                                       (past the high-water mark)
:meth:`flush`          QUEUED -> IDLE, then the send   the end of the iteration
:meth:`emptied`        POLLING or IDLE -> IDLE         the buffer went out
=====================  ==============================  ==========================

The invariant: a transport's buffer is non-empty only while it is QUEUED or
POLLING, or while its send runs (``_sending``: a resume_writing() called
from the send may write); and it is QUEUED or POLLING only with a non-empty
buffer.  So outside a send, a write that finds the buffer empty knows the
transport is IDLE: it may send at once (the eager fast path) or queue it
(the deferred one) without asking the state.

write=deferred queues the transport at its first write of an iteration, so
that everything the iteration's callbacks write leaves in one ``sendmsg`` of
up to IOV_MAX buffers (uvloop <= 0.22's ``_queue_write`` /
``_exec_queued_writes``).  The loop flushes twice per iteration:

* after the ready callbacks, with the feed retries: what a callback wrote
  leaves before the loop can block or stop, so "write, then block in
  recv()" (uvloop #631) cannot hang;
* before the poll, without the feed retries (they wait for the next iteration
  on purpose): writes made while the loop was not running, e.g. before
  ``run_until_complete`` or from ``loop.close()``.

A flush can queue transports again (a ``resume_writing()`` that writes, a
short send under partial_write=feed): those wait for the next flush, and the
loop does not block in the poll while any is queued.

partial_write=feed retries a short send on the next iteration without
waiting for EPOLLOUT (libuv's pending queue), at most ``feed_limit`` times in
a row, then polls: with a peer that reads slowly, feeding alone would keep
the loop from ever blocking.

What the queue asks of a transport: ``_write_state``, ``_feeds`` (feed
retries in a row), ``_watch_write()`` / ``_unwatch_write()`` (EPOLLOUT on
and off) and, on 3.15, ``_context``: a transport made with a context (a
server's connections, gh-140947) has its send run there, so a
resume_writing() or a connection_lost() it triggers sees the connection's
context variables.

This module knows nothing of asyncio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._stats import Counters

__all__ = ["IDLE", "POLLING", "QUEUED", "WriteQueue"]

IDLE = 0
QUEUED = 1
POLLING = 2


class WriteQueue:
    """The loop's queued transports, the write settings they obey, and the
    transitions between the write states."""

    __slots__ = ("contexts", "deferred", "feed", "feed_limit", "feeding", "on_error", "pending",
                 "send", "stats")

    def __init__(self, stats: Counters, send: Callable[[Any], None], *, deferred: bool,
                 feed: bool, feed_limit: int, contexts: bool = False) -> None:
        self.stats = stats
        #: The transports' send, called as send(transport) on one that is
        #: QUEUED, after it is set IDLE (the class's function: no method
        #: lookup per transport).
        self.send = send
        #: Whether transports may carry a context to send in (3.15).
        self.contexts = contexts
        #: Told of an exception a transport's send let through (a protocol's
        #: connection_lost() that raised, say): stock runs the send as a
        #: handle, which reports it; here the flush does, and goes on.
        self.on_error: Callable[[Any, BaseException], None] | None = None
        self.deferred = deferred  # write=deferred
        self.feed = feed  # partial_write=feed
        self.feed_limit = feed_limit
        self.pending: list[Any] = []  # QUEUED by a deferred write
        self.feeding: list[Any] = []  # QUEUED for a feed retry

    def __bool__(self) -> bool:
        """Whether any transport waits for a flush."""
        return bool(self.pending or self.feeding)

    def queue(self, transport: Any) -> None:
        """IDLE -> QUEUED: *transport*'s buffer waits for the next flush."""
        transport._write_state = QUEUED
        self.pending.append(transport)

    def short(self, transport: Any) -> None:
        """After a short send: nothing while QUEUED or POLLING already (the
        rest goes with that); else a feed retry on the next iteration
        (QUEUED), or EPOLLOUT (POLLING) under partial_write=poll or once
        feed_limit retries in a row came up short."""
        if transport._write_state:
            return
        if self.feed and transport._feeds < self.feed_limit:
            transport._feeds += 1
            self.stats.write_feeds += 1
            transport._write_state = QUEUED
            self.feeding.append(transport)
            return
        transport._feeds = 0
        transport._write_state = POLLING
        transport._watch_write()

    @staticmethod
    def unqueue(transport: Any) -> bool:
        """QUEUED -> IDLE, for a send before the flush (which then skips the
        transport); whether it was QUEUED."""
        if transport._write_state == QUEUED:
            transport._write_state = IDLE
            return True
        return False

    @staticmethod
    def emptied(transport: Any) -> None:
        """-> IDLE: everything buffered went out (EPOLLOUT off if POLLING)."""
        transport._feeds = 0
        if transport._write_state == POLLING:
            transport._unwatch_write()
        transport._write_state = IDLE

    def flush(self, include_feeds: bool) -> None:
        """Run the send of every queued transport, in the order queued."""
        queue = self.pending
        self.pending = []
        if include_feeds and self.feeding:
            queue += self.feeding
            self.feeding = []
        contexts = self.contexts
        send = self.send
        for transport in queue:
            if transport._write_state == QUEUED:
                transport._write_state = IDLE
                try:
                    if not contexts or transport._context is None:
                        send(transport)
                    else:
                        transport._context.run(send, transport)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    if self.on_error is None:
                        raise
                    self.on_error(transport, exc)
