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
:meth:`take_back`      QUEUED -> IDLE                  a close() before the flush
                                                       finds a deferred write
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

Contexts (#45).  Every protocol callback runs in the ``contextvars`` context
stock's would.  Stock sends from the writer's code: ``write()`` sends at once,
and after a short send it registers its EPOLLOUT writer from there, which
captures the writer's context, so what its sends bring about later (a
``resume_writing()``, the end of a closing transport, a failed send's
``connection_lost()``) runs in a copy of it.  A queued send runs after the
iteration's callbacks, outside all of them: so the queue keeps with each
transport the context its send runs in, the transport's own if it has one
(``_context``: 3.15's connections, gh-140947), else a copy of the context
that queued it (the deferred write's; a feed retry's is the short send's,
whose EPOLLOUT writer stock would have registered there).  Whatever the send
starts, the EPOLLOUT writer included, starts there.  One end is not the
send's: stock's ``write()`` had sent a deferred write already, so a
``close()`` that finds one queued ends the connection itself, from the
closer's context (``connection_lost()`` scheduled with ``call_soon``, as on
stock); the transport takes it back (:meth:`take_back`) and sends it first.

What the queue asks of a transport: ``_write_state``, ``_feeds`` (feed
retries in a row), ``_write_now()`` (its send, on a transport set IDLE),
``_watch_write()`` / ``_unwatch_write()`` (EPOLLOUT on and off) and
``_context`` (None for none).

This module knows nothing of asyncio.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from ._stats import Counters

__all__ = ["IDLE", "POLLING", "QUEUED", "WriteQueue"]

_copy_context = contextvars.copy_context

IDLE = 0
QUEUED = 1
POLLING = 2


class WriteQueue:
    """The loop's queued transports, the write settings they obey, and the
    transitions between the write states."""

    __slots__ = ("deferred", "feed", "feed_limit", "feeding", "feeding_contexts", "on_error",
                 "pending", "pending_contexts", "stats")

    def __init__(self, stats: Counters, *, deferred: bool, feed: bool, feed_limit: int) -> None:
        self.stats = stats
        #: Told of an exception a transport's send let through (a protocol's
        #: connection_lost() that raised, say): stock runs the send as a
        #: handle, which reports it; here the flush does, and goes on.
        self.on_error: Callable[[Any, BaseException], None] | None = None
        self.deferred = deferred  # write=deferred
        self.feed = feed  # partial_write=feed
        self.feed_limit = feed_limit
        self.pending: list[Any] = []  # QUEUED by a deferred write
        self.feeding: list[Any] = []  # QUEUED for a feed retry
        # The context each one's send runs in, in the same order.
        self.pending_contexts: list[Any] = []
        self.feeding_contexts: list[Any] = []

    def __bool__(self) -> bool:
        """Whether any transport waits for a flush."""
        return bool(self.pending or self.feeding)

    def queue(self, transport: Any) -> None:
        """IDLE -> QUEUED: *transport*'s buffer waits for the next flush, to
        be sent in the context that queued it (see "Contexts")."""
        transport._write_state = QUEUED
        self.pending.append(transport)
        context = transport._context
        self.pending_contexts.append(_copy_context() if context is None else context)

    def short(self, transport: Any) -> None:
        """After a short send: nothing while QUEUED or POLLING already (the
        rest goes with that); else a feed retry on the next iteration
        (QUEUED, in the context of this send), or EPOLLOUT (POLLING) under
        partial_write=poll or once feed_limit retries in a row came up short."""
        if transport._write_state:
            return
        if self.feed and transport._feeds < self.feed_limit:
            transport._feeds += 1
            self.stats.write_feeds += 1
            transport._write_state = QUEUED
            self.feeding.append(transport)
            context = transport._context
            self.feeding_contexts.append(_copy_context() if context is None else context)
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
    def take_back(transport: Any) -> bool:
        """QUEUED by a deferred write -> IDLE, for a close() that sends it
        before it ends the connection (see "Contexts"; the flush then skips
        the transport); whether it was.  A transport whose feed retries
        count (``_feeds``) stays QUEUED: on stock the rest of a short send
        ends from the EPOLLOUT writer, registered in the context the queue
        keeps for the retry."""
        if transport._write_state == QUEUED and not transport._feeds:
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
        """Run the send of every queued transport, in the order queued, each
        in its context."""
        queue = self.pending
        contexts = self.pending_contexts
        self.pending = []
        self.pending_contexts = []
        if include_feeds and self.feeding:
            queue += self.feeding
            contexts += self.feeding_contexts
            self.feeding = []
            self.feeding_contexts = []
        for transport, context in zip(queue, contexts, strict=True):
            if transport._write_state == QUEUED:
                transport._write_state = IDLE
                try:
                    context.run(transport._write_now)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    if self.on_error is None:
                        raise
                    self.on_error(transport, exc)
