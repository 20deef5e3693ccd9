"""Loop: binds config, statistics, poller, transport and accept path.

One iteration (``_run_once``) runs its phases in a fixed order, after libuv's
``uv_run``::

    flush writes queued outside the loop -> apply interest changes -> poll
    -> dispatch I/O -> move due timers -> run ready callbacks
    -> flush deferred writes and feed retries

The flush after the callbacks is what makes deferred writes safe: everything a
callback wrote leaves before the loop can block or stop, so "write, then block
in recv()" (uvloop #631) cannot hang.  The flush before the poll sends writes
made while the loop was not running (before ``run_until_complete``); it skips
the feed queue, whose retries wait for the next iteration on purpose.  The
poller applies interest changes inside ``select()``, after both.

Everything else is stock ``BaseEventLoop._run_once`` (identical in 3.10-3.13):
the timer-heap housekeeping, the timeout computation, the debug-mode
slow-callback warning.
"""

from __future__ import annotations

import contextvars
import errno
import heapq
import selectors
import socket
import sys
import time
from asyncio import events as _events
from typing import Any

from . import _compat
from ._config import AcceptStrategy, Config, PartialWrite, WriteMode, resolve
from ._poller import Poller, default_backend
from ._stats import Counters, LoopStatistics
from ._transport import SocketTransport, is_tcp, read_buffer, set_options

__all__ = ["Loop"]

_STOCK_HANDLE = _compat.Handle
_new_object: Any = object.__new__
_copy_context = contextvars.copy_context
_EVENT_READ = selectors.EVENT_READ  # module globals: one lookup less per event
_EVENT_WRITE = selectors.EVENT_WRITE
#: The due timers of an iteration without any (never appended to).
_NO_TIMERS: tuple[Any, ...] = ()

_ACCEPT_RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

# Linux copies TCP_NODELAY (and the keepalive options) from a listening socket
# to the sockets accept() returns; checked with getsockopt in the tests.
_ACCEPTED_INHERIT_TCP_OPTIONS = sys.platform.startswith("linux")

# -- balanced accept: theory of operation --------------------------------------
#
# Pre-forked workers sharing one listening socket each poll it in their own
# epoll set, so one incoming connection wakes every idle worker, and the one
# that runs first takes it before the others even return from epoll_wait
# (they find nothing and go back to sleep, never seeing the event).  Nothing
# in that race looks at load, and its winner is not random: the scheduler
# picks the same workers, so under light load one worker can starve
# (benchmarks/fairness.py, 4 workers on one CPU, one keep-alive client: one
# worker got 0-2 % of the connections under every loop, stock asyncio and
# uvloop included).
#
# accept=balanced needs no shared memory: the loop is made after fork() by
# code that did not make the listener, so there is no place for a shared
# counter (an mmap would need the cooperation of whoever forks), and a worker
# cannot see the connections its siblings win.  It changes the race instead.
# After every readiness event in which it accepted, the worker registers the
# listener with its epoll set anew (Poller.requeue: EPOLL_CTL_DEL, then
# EPOLL_CTL_ADD; a MOD would not do, it leaves the registration where it is).
# epoll puts a new registration at the head of the file's wait queue
# (add_wait_queue), so the worker that accepted last changes its place in the
# order in which the next connection wakes the sleeping workers, and the
# winner rotates instead of being the same worker every time.  Why the
# rotation comes out even is not proven (the scheduler decides which of the
# woken runs first); what the design rests on is measured:
#
# * Fairness comes from the re-registration, not from staying out of the
#   poller.  Until 2026-11-30 the worker rested after each accept (the
#   listener out of its poller for 0.1 ms per open connection), then tried
#   one accept and registered the listener again; fixed rests from 1 us to
#   0.3 ms per connection all gave Jain 0.999-1.000.  Re-registering at once,
#   no rest, gives the same: 4 workers, one keep-alive client, Jain 1.000
#   (batch 0.753), one close-per-request client 1.000 (batch 0.964), and
#   with the burst below >= 0.99 at all 12 points of the fairness benchmark
#   (results/20261130T053000Z-balanced-variants.txt).
# * The rest cost throughput: a timer per accept, and an accept at the end
#   of each rest that usually found the queue empty.  An accept that finds
#   nothing is the dearest system call here (Linux allocates the new socket
#   and its file before it looks at the queue, net/socket.c do_accept, and
#   frees them again).
#   Measured in one process on the benchmark's machine: accept() -> EAGAIN
#   6-8 us, EPOLL_CTL_DEL + ADD of a listener 2.7-2.8 us, getsockopt
#   TCP_INFO 1.5-1.8 us, call_later + cancel 3.4-5.2 us.
# * One accept per event is not enough without the rest: under 100
#   close-per-request clients, one accept and a requeue per event ran at
#   0.64-0.66x batch's connections/s.  So after the first accept the worker
#   takes what is queued, as batch does, but without batch's accept into an
#   empty queue: on Linux it reads the queue's length (a TCP listener's
#   tcp_info.tcpi_unacked is its accept queue, what ss shows as Recv-Q) and
#   accepts that many more, at most what batch would take per event.  A
#   connection counted there that a sibling takes first ends the burst with
#   an EAGAIN.  Where the length is unknown (not Linux, not TCP) the burst
#   runs until EAGAIN, as batch's does.  Taking a burst does not undo the
#   rotation: connections queue only while no worker has got to them yet,
#   and the listener is re-registered once per event whatever the burst
#   (Jain >= 0.99 under 10 and 100 clients in the same runs).
#
# (accept=batch now reads the length the same way: stock's accepts without
# its last, plus the getsockopt.)
#
# Per event, a worker holding one connection or none pays stock batch's
# accepts, without its last (EAGAIN), plus a getsockopt and a DEL + ADD; one
# holding more pays a timer too (the load-aware rest below).  Without the
# rest, counted per connection over the 12 points of the fairness benchmark
# (loop.statistics(), results/20261130T053000Z-balanced-variants.txt):
# accepts that found nothing 0.00-0.07 (batch: 0.07-1.05), 0.06-1.0 more
# DEL + ADD pairs than batch.  Connections/s against batch, paired runs of
# `python3 -m benchmarks.fairness --loops relaxed-batch,relaxed-balanced
# --workers 2,4 --concurrency 1,10,100 --mode close,keepalive --duration 3
# --repeat 5`:
#
# * with the rest after every accept and an accept ending each rest (the
#   first implementation): 0.93-1.08x (results/20261130T032900Z-...);
# * no rest at all: 0.948-1.07x (results/20261130T061241Z-...), 0.92-1.14x
#   in a run that shared its CPUs (...T060316Z-...); its two low points with
#   9 repeats: 1.01x and 1.01x (...T062100Z-fairness-recheck-*);
# * as built (the rest only above one open connection, ended by reading the
#   queue's length): 0.939-1.10x (results/20261130T062948Z-...); its three
#   points under 0.95x (2 workers, 10 close-per-request clients; 4 workers,
#   100; 4 workers, 100 keep-alive clients) with 9 repeats: 0.99x, 1.00x,
#   1.02x (...T063745Z-fairness-recheck-*, ...T072640Z-fairness-recheck-*).
#
# Jain >= 0.996 at every point of all of them (>= 0.999 as built).  Medians
# of 5 move by several per cent between runs here (per-repeat ratios of one
# point spread over 0.79-1.16x), so the three versions cannot be told apart
# on cost by these runs; the one built keeps the rest for load.
#
# Load: a worker that holds more connections should win fewer of the next
# ones (nginx's accept_disabled; the issue's "stops accepting while it holds
# more than its share").  Without shared memory a worker cannot know its
# share, so it steps aside in proportion to what it holds: when, after an
# event's accepts, it holds more than one open connection, the listener
# leaves its poller (EPOLL_CTL_DEL) for a *rest* of cooldown x open
# connections (BalancedGate), and the re-registration (EPOLL_CTL_ADD) comes
# when the rest ends; a worker holding less is back sooner and wins more.
# At the end of a rest the queue's length tells whether connections waited
# for it (where it is unknown, one accept does): then they are taken (a
# burst, as above) and cooldown halves, else it grows back towards its cap
# (0.1 ms per connection).  A worker holding one connection or none (light
# load) re-registers at once: no timer.  The first implementation rested
# after every accept and ended each rest with an accept that usually found
# nothing; that cost 0.93-0.94x batch at three close-per-request points.
# A rest never outlives its listener: Server.close() cancels the timer
# (_stop_serving), and the end of the rest checks the socket.
#
# A lost race (the first accept finds nothing: a sibling took it) changes
# nothing, no requeue; EMFILE hands over to _accept_starved's back-off.
# On backends other than epoll the requeue is a no-op: balanced is then
# batch (without its wasted accept where the queue's length is known).

#: Linux exposes a TCP listener's accept-queue length in struct tcp_info
#: (tcpi_unacked, bytes 24-27 in host order, after eight one-byte fields and
#: four 32-bit ones; stable since Linux 2.6, read by ss for Recv-Q).
_ACCEPT_QUEUE_INFO = sys.platform.startswith("linux") and hasattr(socket, "TCP_INFO")
_TCPI_UNACKED_END = 28


#: Bounds of cooldown, seconds of rest per open connection; cooldown starts
#: at the cap.  The cap: 0.1 ms, where 4 workers under one keep-alive or one
#: close-per-request client were as fair as with any shorter or longer fixed
#: cooldown up to 0.3 ms (Jain 0.999-1.000), and below the gap between a
#: close-per-request client's connections (about 0.35 ms).  The floor keeps
#: the rest short under saturation.
BALANCED_MIN_COOLDOWN = 10e-6
BALANCED_MAX_COOLDOWN = 0.1e-3
#: Longest rest, seconds, whatever the open connections.
BALANCED_MAX_REST = 0.05
#: Factors on cooldown after a rest that kept nobody waiting (GROW) and after
#: one that did (SHRINK): from any history, back at the cap after at most
#: ln(MAX/MIN)/ln(GROW) = 48 idle rests, so workers' cooldowns converge.
BALANCED_GROW = 1.05
BALANCED_SHRINK = 0.5


class BalancedGate:
    """The per-loop state of accept=balanced's rest (see above)."""

    __slots__ = ("cooldown", "rests_idle", "rests_waited")

    def __init__(self) -> None:
        self.cooldown = BALANCED_MAX_COOLDOWN  # seconds of rest per open connection
        self.rests_idle = 0  # rests that kept nobody waiting (for tests, debugging)
        self.rests_waited = 0  # rests that ended with connections waiting

    def rest(self, open_connections: int) -> float:
        """Seconds to stay out of the poller, holding *open_connections*."""
        return min(self.cooldown * open_connections, BALANCED_MAX_REST)

    def rested(self, waited: bool) -> None:
        """A rest ended; connections *waited* for it, or none did."""
        if waited:
            self.rests_waited += 1
            self.cooldown = max(self.cooldown * BALANCED_SHRINK, BALANCED_MIN_COOLDOWN)
        else:
            self.rests_idle += 1
            self.cooldown = min(self.cooldown * BALANCED_GROW, BALANCED_MAX_COOLDOWN)


def accept_queue_length(sock: socket.socket) -> int | None:
    """Connections waiting in *sock*'s accept queue, or None where unknown."""
    if not _ACCEPT_QUEUE_INFO or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCPI_UNACKED_END)
    except OSError:
        return None
    if len(info) < _TCPI_UNACKED_END:
        return None
    return int.from_bytes(info[_TCPI_UNACKED_END - 4:_TCPI_UNACKED_END], sys.byteorder)


# The poller's own select(): the loop polls through Poller.ready() only while
# this is what the selector's select is (see _run_once).
_POLLER_SELECT = Poller.select


class Loop(_compat.SelectorEventLoop):  # type: ignore[misc]
    """A drop-in asyncio event loop; see the package docs for the options.

    *selector* may be a :class:`~asyncio_relaxed._poller.Poller` or any stdlib
    selector, which is then driven through the poller's deferred bookkeeping.
    Keyword *options* are the fields of :class:`~asyncio_relaxed.Config`; each
    beats its ``ASYNCIO_RELAXED_*`` environment variable.
    """

    # Read by BaseEventLoop.__del__: true until the base __init__ has run, so
    # a loop whose settings were rejected is not reported as unclosed.
    _closed = True
    # Set by BaseEventLoop.__init__; declared for the type checker.
    _scheduled: list[Any]
    _timer_cancelled_count: int

    def __init__(self, selector: selectors.BaseSelector | None = None, **options: Any) -> None:
        # Resolve the settings first: a bad value fails before any fd exists.
        config = resolve(options)
        self._config: Config = config
        self._stats = Counters()
        if selector is None:
            poller = Poller(default_backend(config.poller.value), stats=self._stats)
        elif isinstance(selector, Poller):
            poller = selector
            poller.stats = self._stats
        else:
            poller = Poller(selector, stats=self._stats)
        poller.on_error = self._poller_error
        self._backend_name = poller.backend_name  # statistics() works after close()
        # The write settings every transport reads (kept here, not in a
        # slot per transport: 16 bytes per connection).
        self._deferred_writes = config.write is WriteMode.DEFERRED
        self._feed_writes = config.partial_write is PartialWrite.FEED
        # Transports with deferred writes, and short writes to retry (feed).
        self._write_queue: list[SocketTransport] = []
        self._feed_queue: list[SocketTransport] = []
        # (level, option, value) for every TCP connection: the keepalive knobs.
        self._tcp_sockopts: list[tuple[int, int, int]] = [
            (getattr(socket, level), getattr(socket, option), value)
            for level, option, value in config.tcp_options()
            if hasattr(socket, option)
        ]
        # Listener fds in an accept-resource-error episode (reported once).
        self._accept_failing: set[int] = set()
        # accept=balanced: the cooldown, and the end-of-rest timer per
        # listener fd while that listener is out of the poller.
        self._balanced = BalancedGate()
        self._accept_delayed: dict[int, Any] = {}
        # The one receive buffer of every plain-Protocol transport.
        self._read_buffer = read_buffer(config.read_size)
        self._read_view = memoryview(self._read_buffer)
        super().__init__(poller)

    @property
    def config(self) -> Config:
        """The settings this loop was created with."""
        return self._config

    def statistics(self) -> LoopStatistics:
        """A frozen snapshot of this loop's counters."""
        return self._stats.snapshot(self._backend_name)

    def call_soon(self, callback: Any, *args: Any, context: Any = None) -> Any:
        """Stock's call_soon without its four Python calls per handle
        (_check_closed, _call_soon, Handle.__init__, get_debug): Tasks and
        Futures schedule every step and done-callback through here, three
        times per request in an aiohttp server.

        Fast path, safe only outside debug mode (stock then checks the
        thread and the callback and records where the handle was made: it
        runs as is) and while ``asyncio.events.Handle`` is stock's, whose
        ``__init__`` (identical in 3.10-3.13) is what the fields below
        repeat; a replaced Handle class is used as stock uses it.
        """
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle: Any
        if self._debug or _events.Handle is not _STOCK_HANDLE:
            handle = super().call_soon(callback, *args, context=context)
            if handle._source_traceback:
                del handle._source_traceback[-1]  # this frame: the caller's is last
            return handle
        handle = _new_object(_STOCK_HANDLE)
        handle._context = _copy_context() if context is None else context
        handle._loop = self
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._repr = None
        handle._source_traceback = None
        self._ready.append(handle)
        return handle

    def _poller_error(self, fd: int, exc: BaseException) -> None:
        self.call_exception_handler(
            {
                "message": f"the kernel refused the interest change for fd {fd}; "
                "it is not polled until its registration changes again",
                "exception": exc,
            }
        )

    def close(self) -> None:
        # Writes queued by code that ran outside the loop must still go out:
        # stock asyncio would have sent them from write() itself.
        if not self.is_running() and not self.is_closed():
            if self._write_queue or self._feed_queue:
                self._flush_writes(include_feeds=True)
        super().close()

    # -- transports ---------------------------------------------------------

    def _make_socket_transport(
        self,
        sock: socket.socket,
        protocol: Any,
        waiter: Any = None,
        *,
        extra: dict[str, Any] | None = None,
        server: Any = None,
    ) -> SocketTransport:
        return SocketTransport(self, sock, protocol, waiter, extra, server)

    def _make_ssl_transport(
        self,
        rawsock: socket.socket,
        protocol: Any,
        sslcontext: Any,
        waiter: Any = None,
        *,
        server_side: bool = False,
        server_hostname: str | None = None,
        extra: dict[str, Any] | None = None,
        server: Any = None,
        **timeouts: Any,  # ssl_handshake_timeout; ssl_shutdown_timeout on 3.11+
    ) -> Any:
        ssl_protocol = _compat.SSLProtocol(
            self, protocol, sslcontext, waiter, server_side, server_hostname, **timeouts
        )
        SocketTransport(self, rawsock, ssl_protocol, extra=extra, server=server)
        return ssl_protocol._app_transport

    # -- accept -------------------------------------------------------------

    def _start_serving(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any = None,
        server: Any = None,
        backlog: int = 100,
        *timeouts: Any,
    ) -> None:
        # TCP_NODELAY and the keepalive options once on the listener instead
        # of once per connection: Linux copies them to every accepted socket.
        if _ACCEPTED_INHERIT_TCP_OPTIONS and is_tcp(sock):
            set_options(sock, [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1), *self._tcp_sockopts])
        if self._config.exclusive_accept:
            self._selector.exclusive(sock.fileno())
        super()._start_serving(protocol_factory, sock, sslcontext, server, backlog, *timeouts)

    def _accept_connection(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any = None,
        server: Any = None,
        backlog: int = 100,
        *timeouts: Any,
    ) -> None:
        """Accept for one readiness event of a listener, by the accept strategy.

        batch: up to accept_batch (default: the backlog) accepts, as stock
        (bpo-27906); after the first, no more than the accept queue holds
        where its length is known (Linux TCP), so the usual last accept,
        stock's EAGAIN on an empty queue (the dearest call of the accept
        path, 6-8 us here, against 1.5-1.8 us for reading the length), is not
        made.  single and relaxed: one; the poller reports the listener
        again while more are queued.  balanced: one, then what is queued,
        then the listener is registered anew (see the theory of operation
        above accept_queue_length).
        """
        if not timeouts:
            timeouts = _compat.DEFAULT_SSL_TIMEOUTS
        config = self._config
        strategy = config.accept
        if strategy is AcceptStrategy.BATCH:
            self._accept_queued(protocol_factory, sock, sslcontext, server, backlog, timeouts)
            return
        if strategy is AcceptStrategy.BALANCED:
            self._accept_balanced(protocol_factory, sock, sslcontext, server, backlog, timeouts)
            return
        if (self._accept_one(protocol_factory, sock, sslcontext, server, backlog, timeouts)
                and strategy is AcceptStrategy.RELAXED):
            # Give up the time slice so a sibling process sharing the
            # listener wins the next connection: nanosleep, not
            # sched_yield, which yields only to processes on this CPU
            # (libuv 2012, "unix: add relaxed accept() setting").
            time.sleep(1e-9)

    def _accept_one(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any,
        server: Any,
        backlog: int,
        timeouts: tuple[Any, ...],
    ) -> bool | None:
        """One accept(): True when it gave a connection (now being served),
        False when the queue was empty, None after a resource error (the
        listener is then out of the poller until _accept_starved's retry)."""
        stats = self._stats
        stats.accept += 1
        try:
            conn, addr = sock.accept()
            if self._debug:
                _compat.loop_logger().debug(
                    "%r got a new connection from %r: %r", server, addr, conn
                )
            conn.setblocking(False)
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            stats.accept_eagain += 1  # the accept queue is empty
            return False
        except OSError as exc:
            if exc.errno not in _ACCEPT_RESOURCE_ERRNOS:
                raise  # The event loop will catch, log and ignore it.
            self._accept_starved(exc, protocol_factory, sock, sslcontext, server,
                                 backlog, timeouts)
            return None
        if self._accept_failing:
            self._accept_failing.discard(sock.fileno())
        extra = {"peername": addr}
        if sslcontext:
            self.create_task(
                self._accept_connection2(
                    protocol_factory, conn, extra, sslcontext, server, *timeouts
                )
            )
        else:
            # Plain TCP needs no Task: nothing is awaited before the
            # protocol owns the connection (stock's task only awaits the
            # connection_made callback).  A context copy per connection
            # keeps the task's isolation of context variables.
            contextvars.copy_context().run(
                self._accept_plain, protocol_factory, conn, extra, server
            )
        return True

    def _accept_balanced(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any,
        server: Any,
        backlog: int,
        timeouts: tuple[Any, ...],
    ) -> None:
        """accept=balanced, one readiness event: accept, take what is
        queued, and register the listener anew so the race rotates: at once,
        or after a rest when this worker holds more than one connection."""
        if not self._accept_queued(protocol_factory, sock, sslcontext, server, backlog,
                                   timeouts):
            return  # a sibling won the race, or EMFILE: _accept_starved's now
        fd = sock.fileno()
        if fd < 0:
            return
        active = _compat.server_active_count(server) if server is not None else 1
        if active <= 1:
            # False (nothing sent) when a protocol closed the server meanwhile.
            self._selector.requeue(fd)
            return
        self._remove_reader(fd)
        self._accept_delayed[fd] = self.call_later(
            self._balanced.rest(active), self._accept_rested,
            protocol_factory, sock, sslcontext, server, backlog, timeouts,
        )

    def _accept_queued(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any,
        server: Any,
        backlog: int,
        timeouts: tuple[Any, ...],
    ) -> bool:
        """batch and balanced, one readiness event: one accept, then as many
        as the queue holds, up to accept_batch in all.  False when the first
        found nothing or a resource error stopped them (the listener is then
        _accept_starved's)."""
        if not self._accept_one(protocol_factory, sock, sslcontext, server, backlog, timeouts):
            return False
        budget = (self._config.accept_batch or backlog) - 1
        if budget <= 0:  # a batch of one: no need to read the queue's length
            return True
        return self._accept_burst(protocol_factory, sock, sslcontext, server, backlog,
                                  timeouts, budget, accept_queue_length(sock)) is not None

    def _accept_burst(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any,
        server: Any,
        backlog: int,
        timeouts: tuple[Any, ...],
        budget: int,
        queued: int | None,
    ) -> int | None:
        """Up to *budget* accepts, no more than *queued* where known (so none
        finds the queue empty), else until one finds it empty: how many gave
        a connection, or None after a resource error (as _accept_one)."""
        if queued is not None:
            budget = min(budget, queued)
        for taken in range(budget):
            got = self._accept_one(protocol_factory, sock, sslcontext, server, backlog, timeouts)
            if not got:
                return None if got is None else taken
        return budget

    def _accept_rested(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any,
        server: Any,
        backlog: int,
        timeouts: tuple[Any, ...],
    ) -> None:
        """accept=balanced: the rest is over; take what waited for it, poll
        the listener again (the ADD that re-registers it)."""
        fd = sock.fileno()
        self._accept_delayed.pop(fd, None)
        if fd < 0 or (server is not None and not server.is_serving()):
            return
        queued = accept_queue_length(sock)
        taken = self._accept_burst(protocol_factory, sock, sslcontext, server, backlog,
                                   timeouts, self._config.accept_batch or backlog, queued)
        if taken is None:
            return  # EMFILE and friends: _accept_starved owns the listener now
        # Connections waited for the rest if the queue held some (a sibling
        # may have taken them since); where its length is unknown, if the
        # first accept found one.
        self._balanced.rested(queued > 0 if queued is not None else taken > 0)
        if sock.fileno() >= 0:
            self._add_reader(fd, self._accept_connection, protocol_factory, sock,
                             sslcontext, server, backlog, *timeouts)

    def _stop_serving(self, sock: socket.socket) -> None:
        # A balanced rest's timer must not outlive its listener.
        handle = self._accept_delayed.pop(sock.fileno(), None)
        if handle is not None:
            handle.cancel()
        super()._stop_serving(sock)

    def _accept_plain(
        self, protocol_factory: Any, conn: socket.socket, extra: dict[str, Any], server: Any
    ) -> None:
        protocol = transport = None
        try:
            protocol = protocol_factory()
            transport = SocketTransport(
                self, conn, protocol, None, extra, server,
                inherited_options=_ACCEPTED_INHERIT_TCP_OPTIONS and is_tcp(conn),
            )
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            if transport is not None:
                transport.close()
            else:
                conn.close()
            # Reported in debug mode only, as stock _accept_connection2 does.
            if self._debug:
                context = {
                    "message": "Error on transport creation for incoming connection",
                    "exception": exc,
                }
                if protocol is not None:
                    context["protocol"] = protocol
                if transport is not None:
                    context["transport"] = transport
                self.call_exception_handler(context)

    def _accept_starved(
        self,
        exc: OSError,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any,
        server: Any,
        backlog: int,
        timeouts: tuple[Any, ...],
    ) -> None:
        """EMFILE and friends: stop polling the listener, retry after a delay.

        Linux keeps reporting the listener ready, so it must leave the poller
        or the loop spins; open connections are served meanwhile.  Unlike
        stock, the batch stops here (the next accept would fail the same way)
        and the error is reported once per episode, not once per retry.
        """
        fd = sock.fileno()
        if fd not in self._accept_failing:
            self._accept_failing.add(fd)
            self.call_exception_handler(
                {
                    "message": "socket.accept() out of system resource",
                    "exception": exc,
                    "socket": _compat.TransportSocket(sock),
                }
            )
        self._remove_reader(fd)
        self.call_later(
            _compat.ACCEPT_RETRY_DELAY,
            self._resume_serving,
            protocol_factory,
            sock,
            sslcontext,
            server,
            backlog,
            *timeouts,
        )

    def _resume_serving(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any,
        server: Any,
        backlog: int,
        *timeouts: Any,
    ) -> None:
        """The back-off is over: poll the listener again, unless it was closed
        meanwhile (stock retries on the closed socket and reports ValueError)."""
        if sock.fileno() < 0 or (server is not None and not server.is_serving()):
            return
        self._start_serving(protocol_factory, sock, sslcontext, server, backlog, *timeouts)

    # -- the iteration ------------------------------------------------------

    def _flush_writes(self, include_feeds: bool) -> None:
        """Run the queued transports' sends; a short send re-queues by policy."""
        queue = self._write_queue
        self._write_queue = []
        if include_feeds and self._feed_queue:
            queue += self._feed_queue
            self._feed_queue = []
        for transport in queue:
            if transport._queued:
                transport._write_now()

    def _poll_wrapped(self, timeout: float | None) -> list[tuple[int, Any, int]]:
        """The poll through a select() someone wrapped or overrode (time
        freezers in tests, I/O-time meters): called as stock calls it."""
        return [(key.fd, key.data, mask) for key, mask in self._selector.select(timeout)]

    def _queue_events(self, event_list: list[tuple[int, Any, int]]) -> None:
        """Stock's _process_events, for (fd, data, mask) triples; a
        _process_events replaced by a subclass or a patch gets what stock
        passes it, (key, mask) pairs."""
        # Through the bound method, not self.__dict__: reading an instance's
        # __dict__ makes CPython build it, which slows every attribute of the
        # object from then on (+650 instructions per 1 KiB echo, callgrind).
        try:
            stock = self._process_events.__func__ is _compat.STOCK_PROCESS_EVENTS
        except AttributeError:  # replaced by a function or a mock
            stock = False
        if not stock:
            self._process_events(self._as_keys(event_list))
            return
        for fd, (reader, writer), mask in event_list:
            if mask & _EVENT_READ and reader is not None:
                if reader._cancelled:
                    self._remove_reader(fd)
                else:
                    self._add_callback(reader)
            if mask & _EVENT_WRITE and writer is not None:
                if writer._cancelled:
                    self._remove_writer(fd)
                else:
                    self._add_callback(writer)

    def _dispatch_events(self, event_list: list[tuple[int, Any, int]]) -> int:
        """Run the I/O callbacks of *event_list* at once; return how many ran.

        Safe only when the ready queue was empty before the poll (the
        caller checks): stock ``_process_events`` would queue these handles
        and ``_run_once`` would run them first, in this order, with nothing
        in between but themselves.  Each runs as ``Handle._run`` would run
        it (its context; an exception to the handler with the ``handle`` key).
        A handle cancelled by an earlier callback of this batch is skipped,
        as stock skips it in the ready queue; stock's removal of a reader
        cancelled before the poll applies only while it is still the fd's
        reader (an earlier callback may have registered a new one).
        """
        ran = 0
        # Handle._run without its frame (one Python call less per event):
        # the callback in the handle's context; an exception goes to the
        # handler as Handle._run sends it.  Only while Handle._run is stock's:
        # whoever replaced it (slow-callback loggers) must see these calls.
        inline = _compat.Handle._run is _compat.STOCK_HANDLE_RUN
        for event in event_list:
            fd, (reader, writer), mask = event
            if mask & _EVENT_READ and reader is not None:
                if reader._cancelled:
                    self._remove_cancelled(fd, reader, 0)
                else:
                    ran += 1
                    try:
                        if not inline:
                            reader._run()
                        elif reader._args:
                            reader._context.run(reader._callback, *reader._args)
                        else:  # a transport's reader: no call with *args
                            reader._context.run(reader._callback)
                    except (SystemExit, KeyboardInterrupt):
                        if not mask & _EVENT_WRITE:
                            writer = None
                        self._requeue(event_list, event, writer)
                        raise
                    except BaseException as exc:
                        self._callback_failed(reader, exc)
            if mask & _EVENT_WRITE and writer is not None:
                if writer._cancelled:
                    self._remove_cancelled(fd, writer, 1)
                else:
                    ran += 1
                    try:
                        self._run_handle(writer, inline)  # EPOLLOUT: rare, a frame is fine
                    except (SystemExit, KeyboardInterrupt):
                        self._requeue(event_list, event, None)
                        raise
        # As Handle._run's "self = None": a traceback kept by whoever got an
        # exception holds this frame; it must not hold the batch too.
        event_list = event = reader = writer = None  # type: ignore[assignment]
        return ran

    def _run_handle(self, handle: Any, inline: bool) -> None:
        """Run *handle* as Handle._run does (its frame left out when *inline*);
        the hot paths (readers, the ready queue) repeat this in place."""
        if not inline:
            handle._run()
            return
        try:
            handle._context.run(handle._callback, *handle._args)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._callback_failed(handle, exc)
        handle = None  # as Handle._run's "self = None" (a kept traceback)

    def _callback_failed(self, handle: Any, exc: BaseException) -> None:
        """Report a callback's exception as Handle._run does (3.10-3.13)."""
        source = _compat.format_callback_source(handle._callback, handle._args, self._debug)
        context = {"message": f"Exception in callback {source}", "exception": exc,
                   "handle": handle}
        if handle._source_traceback:
            context["source_traceback"] = handle._source_traceback
        self.call_exception_handler(context)

    def _as_keys(
        self, event_list: list[tuple[int, Any, int]]
    ) -> list[tuple[selectors.SelectorKey, int]]:
        """(key, mask) pairs for the poll's triples (the key as registered)."""
        pairs = []
        for fd, data, mask in event_list:
            try:
                key = self._selector.get_key(fd)
            except (KeyError, ValueError):
                key = selectors.SelectorKey(fd, fd, mask, data)
            if key.data is not data:
                key = key._replace(data=data)
            pairs.append((key, mask))
        return pairs

    def _requeue(self, event_list: list[tuple[int, Any, int]], event: tuple[int, Any, int],
                 writer: Any) -> None:
        """SystemExit or KeyboardInterrupt left a batch half run at *event*
        (Handle._run reports everything else): queue what stock would have
        queued.  *event* is found by identity (the loop above keeps no index)."""
        if writer is not None and not writer._cancelled:
            self._ready.append(writer)
        index = next(i for i, item in enumerate(event_list) if item is event)
        self._queue_events(event_list[index + 1:])

    def _remove_cancelled(self, fd: int, handle: Any, which: int) -> None:
        """Stock drops a cancelled reader/writer that the poll reported."""
        try:
            current = self._selector.get_key(fd).data[which]
        except KeyError:
            return
        if current is handle:
            if which:
                self._remove_writer(fd)
            else:
                self._remove_reader(fd)

    def _run_once(self) -> None:
        """Run one full iteration of the event loop (see the module docstring)."""
        stats = self._stats
        stats.iterations += 1
        scheduled = self._scheduled
        sched_count = len(scheduled)
        if (
            sched_count > _compat.MIN_SCHEDULED_TIMER_HANDLES
            and self._timer_cancelled_count / sched_count
            > _compat.MIN_CANCELLED_TIMER_HANDLES_FRACTION
        ):
            # Remove delayed calls that were cancelled if their number is too high.
            new_scheduled = []
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
                else:
                    new_scheduled.append(handle)
            heapq.heapify(new_scheduled)
            self._scheduled = scheduled = new_scheduled
            self._timer_cancelled_count = 0
        else:
            # Remove delayed calls that were cancelled from head of queue.
            while scheduled and scheduled[0]._cancelled:
                self._timer_cancelled_count -= 1
                handle = heapq.heappop(scheduled)
                handle._scheduled = False

        # Phase: writes made while the loop was not running.
        if self._write_queue:
            self._flush_writes(include_feeds=False)

        # The flush above can queue writes again (a resume_writing() that
        # writes): they must not wait for an unrelated event, so no blocking.
        timeout: float | None = None
        if self._ready or self._stopping or self._feed_queue or self._write_queue:
            timeout = 0
        elif scheduled:
            # Compute the desired timeout.
            timeout = scheduled[0]._when - self.time()
            if timeout > _compat.MAXIMUM_SELECT_TIMEOUT:
                timeout = _compat.MAXIMUM_SELECT_TIMEOUT
            elif timeout < 0:
                timeout = 0

        # Phase: apply interest changes, then poll (both inside select()).
        # Poller.ready(): select() without a SelectorKey per event, unless
        # select() was wrapped or overridden (then that is called).
        selector = self._selector
        try:
            own_select = selector.select.__func__ is _POLLER_SELECT
        except AttributeError:  # replaced by a function or a callable object
            own_select = False
        if own_select:
            event_list = selector.ready(timeout)
        else:
            event_list = self._poll_wrapped(timeout)
        ready = self._ready
        # Fast path, safe only when nothing was ready before the poll (and
        # not in debug mode, which times each callback): stock would queue
        # the I/O handles, then the due timers, and run exactly those, in
        # that order, before anything they schedule.  The same happens here
        # without the queue round trip: the due timers are collected first
        # (before any callback can add or cancel one, as in stock), the I/O
        # callbacks run straight from the poll's results, then the timers;
        # what the callbacks scheduled waits for the next iteration.
        direct = not ready and not self._debug
        if not direct:
            self._queue_events(event_list)

        # Handle 'later' callbacks that are ready (no clock read without
        # timers: stock reads it every iteration, for nothing then).
        due: Any = _NO_TIMERS  # read only in the direct case
        if scheduled:
            end_time = self.time() + self._clock_resolution
            due = [] if direct else ready
            while scheduled:
                handle = scheduled[0]
                if handle._when >= end_time:
                    break
                handle = heapq.heappop(scheduled)
                handle._scheduled = False
                due.append(handle)

        ran = added = 0
        if direct:
            try:
                ran = self._dispatch_events(event_list)
            finally:
                # What the I/O callbacks scheduled (or, after SystemExit /
                # KeyboardInterrupt, the rest of the batch) stays behind the
                # due timers' turn.
                added = len(ready)
                ready.extendleft(reversed(due))
        # Needed to break cycles when an exception occurs.
        event_list = None

        # Phase: run the callbacks that are ready now, not those they add:
        # those run next time, after another poll.  The popleft idiom is
        # thread-safe without locks (call_soon_threadsafe appends).
        ntodo = len(ready) - added
        # Handle._run inlined as in _dispatch_events, on the same condition.
        inline = _compat.Handle._run is _compat.STOCK_HANDLE_RUN
        for _ in range(ntodo):
            handle = ready.popleft()
            if handle._cancelled:
                continue
            ran += 1
            if self._debug:
                try:
                    self._current_handle = handle
                    t0 = self.time()
                    handle._run()
                    dt = self.time() - t0
                    if dt >= self.slow_callback_duration:
                        # Looked up per call: tests patch _compat.loop_logger().
                        _compat.loop_logger().warning(
                            "Executing %s took %.3f seconds", _compat.format_handle(handle), dt
                        )
                finally:
                    self._current_handle = None
            elif inline:
                try:
                    handle._context.run(handle._callback, *handle._args)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._callback_failed(handle, exc)
            else:
                handle._run()
        handle = None  # Needed to break cycles when an exception occurs.
        stats.callbacks += ran

        # Phase: everything the callbacks wrote, and last iteration's feeds.
        if self._write_queue or self._feed_queue:
            self._flush_writes(include_feeds=True)
