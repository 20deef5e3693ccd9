"""The accept path: one Listener per listening socket, and the strategies.

Theory of operation
===================

A :class:`Listener` is what stock asyncio threads through ``_start_serving``
-> ``_accept_connection`` -> ``_accept_connection2`` as six positional
arguments (protocol factory, socket, SSL context, server, backlog, the SSL
timeouts; on 3.15 the server's context too), plus the state a listener has
between readiness events, after uvloop's ``UVStreamServer``.  The loop
registers ``listener.ready`` as the socket's reader; each readiness event
runs one strategy (:class:`~asyncio_relaxed.AcceptStrategy`), one subclass
each.  A listener is in one of four states:

* ``POLLED``: its reader is registered; the next readiness event accepts;
* ``RESTING``: accept=balanced took it out of the poller for a rest, and
  ``timer`` ends the rest;
* ``BACKING_OFF``: accept() failed for lack of a resource (EMFILE and
  friends); Linux keeps reporting the listener ready, so it left the poller
  or the loop would spin, and ``timer`` (stock's retry, ACCEPT_RETRY_DELAY
  later) polls it again.  Open connections are served meanwhile.  The error
  is reported once per episode (``failing``), not once per retry as stock does;
* ``STOPPED``: the server closed it (``_stop_serving``); a pending timer is
  cancelled, so no rest or retry outlives its listener.

What a listener asks of its loop goes through one object, its *host*
(:class:`asyncio_relaxed._serving.Serving` binds it to the loop): the
counters and settings; ``poll``/``unpoll``/``reregister`` the listener;
``accepted`` (serve a new connection: a transport, or stock's task for TLS);
``starved`` (report the error, then stock's retry); ``rest`` (the timer
that ends a rest); ``open_count`` (what the listener's server holds).

The accept queue's length
-------------------------
An accept() that finds the queue empty is the dearest system call of the
path: Linux allocates the new socket and its file before it looks at the
queue (net/socket.c do_accept), then frees them again.  Stock's batch ends
every event with one.  On Linux a TCP listener's ``tcp_info.tcpi_unacked``
is its accept queue's length (what ``ss`` shows as Recv-Q), so after the
first accept of an event the batch takes no more than that; where the
length is unknown (not Linux, not TCP) it accepts until EAGAIN, as stock.
docs/design.md ("The accept path") has the cost of each call, measured.

Balanced: fairness without shared memory
----------------------------------------
Pre-forked workers sharing one listening socket each poll it in their own
epoll set, so one incoming connection wakes every idle worker, and the one
that runs first takes it before the others return from epoll_wait.  That
race does not look at load, and its winner is not random: the scheduler
picks the same workers, so under light load one worker can starve (the
fairness benchmark measures it: docs/design.md, "accept=balanced").

The loop is made after fork() by code that did not make the listener, so a
worker cannot see what its siblings hold.  accept=balanced changes the race
instead: after every event in which it accepted, the worker registers the
listener with its epoll set anew (``DeferredSelector.reregister``: EPOLL_CTL_DEL, then
EPOLL_CTL_ADD; a MOD would leave the registration where it is).  epoll puts
a new registration at the head of the file's wait queue (add_wait_queue), so
the worker that accepted last changes its place in the order in which the
next connection wakes the sleepers, and the winner rotates.  Why the
rotation comes out even is not proven (the scheduler decides which of the
woken runs first); the fairness benchmark measures it: Jain >= 0.99 at each
of its 12 points (2 and 4 workers; 1, 10 and 100 clients; keep-alive and
close per request), where batch reads 0.75 under one keep-alive client.

After the first accept the worker takes what is queued, as batch does (one
accept per event cost connections/s under close-per-request clients:
docs/design.md, "accept=balanced"); the rotation survives because connections queue
only while no worker has got to them yet, and the listener is re-registered
once per event whatever the burst.

Load: a worker that holds more connections should win fewer of the next ones
(nginx's ``accept_disabled``).  Without its share known, a worker steps aside
in proportion to what it holds: when, after an event's accepts, it holds more
than one open connection, the listener rests out of its poller for cooldown x
open connections (:class:`BalancedGate`), and the re-registration comes when
the rest ends; a worker holding less is back sooner and wins more.  At the
end of a rest the queue's length tells whether connections waited for it
(where it is unknown, one accept does): then they are taken and cooldown
halves, else it grows back towards its cap.  A worker holding one connection
or none re-registers at once: no timer.  A lost race (the first accept finds
nothing) changes nothing.  On backends other than epoll the re-registration sends
nothing: balanced is then batch.

This module knows nothing of asyncio; the loop binds it.
"""

from __future__ import annotations

import _socket
import dataclasses
import enum
import errno
import socket
import sys
import time
from typing import Any, ClassVar

from ._config import AcceptStrategy
from ._sockets import C_INIT, C_NEW

__all__ = [
    "BALANCED_GROW",
    "BALANCED_MAX_COOLDOWN",
    "BALANCED_MAX_REST",
    "BALANCED_MIN_COOLDOWN",
    "BALANCED_SHRINK",
    "BalancedGate",
    "Listener",
    "ListenerState",
    "ListenerStatistics",
    "Outcome",
    "accept_queue_length",
    "listener_class",
]

# socket.socket.accept() without its Python frame and enum members: the C
# accept (the descriptor and the address) and the C attributes.
_C_ACCEPT = getattr(_socket.socket, "_accept", None)
_SOCKET: Any = socket.socket
_FAMILY = _socket.socket.family
_TYPE = _socket.socket.type
_TCP_FAMILIES = (int(socket.AF_INET), int(socket.AF_INET6))

#: accept() errors that mean "out of a resource", not "this connection failed":
#: the listener backs off instead of spinning on an fd that stays ready.
RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

#: Linux exposes a TCP listener's accept-queue length in struct tcp_info
#: (tcpi_unacked, bytes 24-27 in host order, after eight one-byte fields and
#: four 32-bit ones; stable since Linux 2.6, read by ss for Recv-Q).
QUEUE_LENGTH_KNOWN = sys.platform.startswith("linux") and hasattr(socket, "TCP_INFO")
_TCPI_UNACKED_END = 28

#: Bounds of cooldown, seconds of rest per open connection; cooldown starts
#: at the cap.  The cap: 0.1 ms, where 4 workers under one keep-alive or one
#: close-per-request client were as fair as with any fixed cooldown from
#: 1 us to 0.3 ms (Jain 0.999-1.000, the fairness benchmark), and below the
#: gap between a close-per-request client's connections (about 0.35 ms).
#: The floor keeps the rest short under saturation.
BALANCED_MIN_COOLDOWN = 10e-6
BALANCED_MAX_COOLDOWN = 0.1e-3
#: Longest rest, seconds, whatever the open connections.
BALANCED_MAX_REST = 0.05
#: Factors on cooldown after a rest that kept nobody waiting (GROW) and after
#: one that did (SHRINK): from any history, back at the cap after at most
#: ln(MAX/MIN)/ln(GROW) = 48 idle rests, so workers' cooldowns converge.
BALANCED_GROW = 1.05
BALANCED_SHRINK = 0.5


def accept_queue_length(sock: socket.socket) -> int | None:
    """Connections waiting in *sock*'s accept queue, or None where unknown."""
    # The C socket's family is an int: socket.socket.family would make the
    # AddressFamily member, an enum lookup per call (a listener's every event).
    family = _FAMILY.__get__(sock) if isinstance(sock, _socket.socket) else sock.family
    if not QUEUE_LENGTH_KNOWN or family not in _TCP_FAMILIES:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCPI_UNACKED_END)
    except OSError:
        return None
    if len(info) < _TCPI_UNACKED_END:
        return None
    return int.from_bytes(info[_TCPI_UNACKED_END - 4:_TCPI_UNACKED_END], sys.byteorder)


class BalancedGate:
    """accept=balanced's cooldown: how long a listener rests (see above)."""

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


class Outcome(enum.Enum):
    """What one accept() gave."""

    CONNECTION = "connection"  # a new connection, now being served
    EMPTY = "empty"  # the queue was empty (a sibling may have won the race)
    ABORTED = "aborted"  # the peer reset it before accept(); others may wait
    STARVED = "starved"  # out of a resource: the listener is backing off


class ListenerState(enum.Enum):
    POLLED = "polled"
    RESTING = "resting"
    BACKING_OFF = "backing off"
    STOPPED = "stopped"


_CONNECTION = Outcome.CONNECTION
_ABORTED = Outcome.ABORTED
_POLLED = ListenerState.POLLED


@dataclasses.dataclass(frozen=True)
class ListenerStatistics:
    """One listener's counts (``loop.listener_statistics()``).

    ``queue_length`` is the accept queue's length (connections waiting, on
    Linux TCP) when the listener last read it, ``queue_length_max`` the
    longest it saw; both None where it never read one (single and relaxed
    do not).  ``rest_seconds`` adds up the rests as scheduled.
    """

    address: Any
    strategy: str
    state: str
    accepted: int
    queue_length: int | None
    queue_length_max: int | None
    rests: int
    rest_seconds: float


@dataclasses.dataclass(slots=True, eq=False, repr=False)
class Listener:
    """One listening socket being served (see the theory of operation).

    The fields named as stock's ``_start_serving`` arguments hold what it
    was called with; ``context`` is the server's context on 3.15 (None
    before, or when the caller gave none).
    """

    host: Any
    protocol_factory: Any
    sock: socket.socket
    sslcontext: Any
    server: Any
    backlog: int
    timeouts: tuple[Any, ...]
    context: Any
    stats: Any = dataclasses.field(init=False)  # the host's counters
    state: ListenerState = dataclasses.field(init=False, default=_POLLED)
    # In an accept-resource-error episode (reported once).
    failing: bool = dataclasses.field(init=False, default=False)
    # Ends a rest or a back-off.
    timer: Any = dataclasses.field(init=False, default=None)
    # What statistics() shows: connections accepted, the accept queue's
    # length as last read and at its longest (None: never read), and
    # accept=balanced's rests and their scheduled seconds.
    accepted: int = dataclasses.field(init=False, default=0)
    queue_length: int | None = dataclasses.field(init=False, default=None)
    queue_length_max: int | None = dataclasses.field(init=False, default=None)
    rests: int = dataclasses.field(init=False, default=0)
    rest_seconds: float = dataclasses.field(init=False, default=0.0)
    # A plain socket.socket is accepted from without socket.accept(), which
    # reads the family and type as enum members per call: its C accept and
    # the three numbers, read once.
    plain: bool = dataclasses.field(init=False)
    family: int = dataclasses.field(init=False)
    kind: int = dataclasses.field(init=False)
    proto: int = dataclasses.field(init=False)
    # Whether its connections inherit TCP_NODELAY and the keepalive options
    # set on it (its host decides: Linux copies them from a TCP listener).
    inherits: bool = dataclasses.field(init=False, default=False)
    # The local address its connections share, where one is (else None:
    # each is asked; its host decides).
    sockname: Any = dataclasses.field(init=False, default=None)

    #: The AcceptStrategy a subclass implements.
    strategy: ClassVar[AcceptStrategy]

    def __post_init__(self) -> None:
        self.stats = self.host.stats
        sock = self.sock
        self.plain = type(sock) is socket.socket and _C_ACCEPT is not None
        if self.plain:
            self.family, self.kind, self.proto = _FAMILY.__get__(sock), _TYPE.__get__(sock), \
                sock.proto

    def __repr__(self) -> str:
        return f"<{type(self).__name__} fd={self.sock.fileno()} {self.state.value}>"

    @property
    def stock_args(self) -> tuple[Any, ...]:
        """What stock threads through _start_serving for this socket,
        positionally, up to the SSL timeouts (3.15 adds the context)."""
        return (self.protocol_factory, self.sock, self.sslcontext, self.server, self.backlog,
                *self.timeouts)

    @property
    def batch(self) -> int:
        """Most accepts per readiness event: accept_batch, else the backlog."""
        return int(self.host.accept_batch or self.backlog)

    # -- one readiness event ----------------------------------------------

    def ready(self) -> None:
        """The listening socket is readable: accept by the strategy."""
        raise NotImplementedError

    def accept_one(self) -> Outcome:
        """One accept(); a connection it gives is handed to the loop."""
        stats = self.stats
        stats.accept += 1
        try:
            if self.plain:
                fd, addr = _C_ACCEPT(self.sock)  # type: ignore[misc]
                # socket.socket(family, kind, proto, fd), its body inline (_sockets.C_NEW)
                conn = C_NEW(_SOCKET)
                C_INIT(conn, self.family, self.kind, self.proto, fd)
                conn._io_refs = 0
                conn._closed = False
            else:
                conn, addr = self.sock.accept()
            conn.setblocking(False)
        except (BlockingIOError, InterruptedError):
            stats.accept_eagain += 1
            return Outcome.EMPTY
        except ConnectionAbortedError:
            # Discarded, and the batch goes on (gh-127529, stock from 3.14).
            return _ABORTED
        except OSError as exc:
            if exc.errno not in RESOURCE_ERRNOS:
                raise  # The event loop will catch, log and ignore it.
            self.back_off(exc)
            return Outcome.STARVED
        self.failing = False
        self.accepted += 1
        self.host.accepted(self, conn, addr)
        return _CONNECTION

    def take_queued(self) -> bool:
        """One accept, then as many as the queue holds, up to :attr:`batch`
        in all: whether any gave a connection and no resource error stopped
        them (then the listener is still polled)."""
        first = self.accept_one()
        if first is not _CONNECTION and first is not _ABORTED:
            return False
        budget = self.batch - 1
        taken = 0
        if budget > 0:  # a batch of one needs no queue length
            taken = self.burst(budget, self.read_queue_length())
        return (first is _CONNECTION or taken > 0) and self.state is _POLLED

    def read_queue_length(self) -> int | None:
        """The accept queue's length now (None where unknown), recorded."""
        queued = accept_queue_length(self.sock)
        if queued is not None:
            self.queue_length = queued
            if self.queue_length_max is None or queued > self.queue_length_max:
                self.queue_length_max = queued
        return queued

    def burst(self, budget: int, queued: int | None) -> int:
        """Up to *budget* accepts, no more than *queued* where known (so none
        finds the queue empty), else until one finds it empty or a resource
        error stops them: how many gave a connection."""
        if queued is not None:
            budget = min(budget, queued)
        taken = 0
        for _ in range(budget):
            outcome = self.accept_one()
            if outcome is _CONNECTION:
                taken += 1
            elif outcome is not _ABORTED:
                break
        return taken

    # -- leaving and rejoining the poller ---------------------------------

    def back_off(self, exc: OSError) -> None:
        """EMFILE and friends: out of the poller until stock's retry."""
        self.host.unpoll(self)
        self.state = ListenerState.BACKING_OFF
        self.timer = self.host.starved(self, exc, not self.failing)
        self.failing = True

    def resume(self) -> None:
        """Polled again (the loop's _start_serving registered the reader)."""
        self.state = _POLLED
        self.timer = None

    def statistics(self) -> ListenerStatistics:
        try:
            address = self.sock.getsockname()
        except (OSError, AttributeError):
            address = None
        return ListenerStatistics(
            address=address, strategy=type(self).strategy.value, state=self.state.value,
            accepted=self.accepted, queue_length=self.queue_length,
            queue_length_max=self.queue_length_max, rests=self.rests,
            rest_seconds=self.rest_seconds,
        )

    def stop(self) -> None:
        """The server stopped serving this socket: no timer outlives it."""
        self.state = ListenerState.STOPPED
        timer, self.timer = self.timer, None
        if timer is not None:
            timer.cancel()


class BatchListener(Listener):
    """accept=batch: up to accept_batch per event (stock, bpo-27906), none
    into an empty queue where its length is known."""

    strategy = AcceptStrategy.BATCH
    __slots__ = ()
    ready = Listener.take_queued  # type: ignore[assignment]


class SingleListener(Listener):
    """accept=single: one accept per event (libuv >= 1.45, uvloop); the
    poller reports the listener again while more are queued."""

    strategy = AcceptStrategy.SINGLE
    __slots__ = ()
    ready = Listener.accept_one  # type: ignore[assignment]


class RelaxedListener(Listener):
    """accept=relaxed: one accept, then give up the time slice so a sibling
    process sharing the listener wins the next connection."""

    strategy = AcceptStrategy.RELAXED
    __slots__ = ()

    def ready(self) -> None:
        if self.accept_one() is _CONNECTION:
            # nanosleep, not sched_yield, which yields only to processes on
            # this CPU (libuv's relaxed accept).
            time.sleep(1e-9)


class BalancedListener(Listener):
    """accept=balanced: take what is queued, then register the listener anew
    so the race rotates: at once, or after a rest when this worker holds more
    than one connection (see the theory of operation)."""

    strategy = AcceptStrategy.BALANCED
    __slots__ = ("gate",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.gate = BalancedGate()

    def ready(self) -> None:
        if not self.take_queued():
            return  # a sibling won the race, or a resource error: backing off
        fd = self.sock.fileno()
        if fd < 0:
            return  # a protocol closed the listener meanwhile
        held = self.host.open_count(self)
        if held <= 1:
            self.host.reregister(self)  # sends nothing if it is not polled now
            return
        self.host.unpoll(self)
        self.state = ListenerState.RESTING
        seconds = self.gate.rest(held)
        self.rests += 1
        self.rest_seconds += seconds
        self.timer = self.host.rest(self, seconds)

    def rested(self) -> None:
        """The rest is over: take what waited for it, poll the listener again
        (the ADD that re-registers it)."""
        self.timer = None
        if self.state is not ListenerState.RESTING:
            return
        sock = self.sock
        if sock.fileno() < 0 or (self.server is not None and not self.server.is_serving()):
            self.state = ListenerState.STOPPED
            return
        self.state = _POLLED
        queued = self.read_queue_length()
        taken = self.burst(self.batch, queued)
        if self.state is not _POLLED:
            return  # a resource error: backing off now
        # Connections waited for the rest if the queue held some (a sibling
        # may have taken them since); where its length is unknown, if the
        # first accept found one.
        self.gate.rested(queued > 0 if queued is not None else taken > 0)
        if sock.fileno() >= 0:
            self.host.poll(self)


_CLASSES: dict[AcceptStrategy, type[Listener]] = {
    AcceptStrategy.BATCH: BatchListener,
    AcceptStrategy.SINGLE: SingleListener,
    AcceptStrategy.RELAXED: RelaxedListener,
    AcceptStrategy.BALANCED: BalancedListener,
}


def listener_class(strategy: AcceptStrategy) -> type[Listener]:
    """The Listener subclass that implements *strategy*."""
    return _CLASSES[strategy]
