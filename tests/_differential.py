"""The differential harness: one operation sequence, run on two loops, compared.

Theory of operation
===================

A *sequence* is a list of operations (tuples, so that a failing example
prints as code that can be pasted into a regression test) applied to one
stream connection, a socketpair or TCP on loopback, run from a fresh loop:

* the transport side: ``write`` (bytes, bytearray, a memoryview of either or
  of a slice, empty), ``writelines``, ``pause_reading``/``resume_reading``,
  ``set_write_buffer_limits`` (valid or not), ``write_eof``, ``close``,
  ``abort``, ``set_protocol`` (a new Protocol or BufferedProtocol, which may
  have a BEHAVIOUR: raise from one of its callbacks, or act on the
  transport from it), several of these in one callback (``batch``), and any
  of those from ``call_soon``, from ``call_later(0)`` (each with a ``mark``
  of when it ran) or from another thread through ``call_soon_threadsafe``;
* the peer, a plain non-blocking socket the harness drives between steps:
  ``peer_send`` (``peer_send_timed``: with a due timer in the same poll,
  nothing else ready), ``peer_read`` (n bytes, as the loop sends them: a slow
  reader; never reading is a reader that does not read), ``peer_read_all``,
  ``peer_shutdown`` (half-close), ``peer_reset`` (SO_LINGER 0; for a
  socketpair a close, which with bytes unread is AF_UNIX's reset) and
  ``peer_close``.

After every operation the harness lets the loop run until nothing changes
(:meth:`Session.settle`: a few iterations in a row, then 1 ms sleeps, so
the loop blocks in its poll too, with no change), then records what a
protocol can see: its callbacks in order (``data_received`` as a byte
stream), ``is_closing()``, ``is_reading()``, ``get_write_buffer_size()``,
``get_write_buffer_limits()``, the bytes still on their way to the peer,
what each call raised, and every call of the exception handler (message,
keys, exception type).  A finale closes the transport, has the peer read
to EOF and waits for ``connection_lost``; the bytes the peer received are
the last observation.  Each run also checks invariants that need no other
loop (:attr:`Session.invariant_errors`): flow control's contract,
connection_lost at most once, both byte streams prefixes of what was sent,
and, on our loop, no spinning while idle (``statistics().iterations``).

Two runs agree when :func:`compare` finds their normalised observations
equal; everything the comparison forgives is in :func:`normalise` (and the
two cuts :func:`compare` makes), each with its reason.  The faults
(:class:`FaultySocket`) are here too: test_faults.py drives the same
sessions with a FaultPlan.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
import struct
import sys
import termios
import threading
import warnings
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st

from conftest import LOOP_FACTORIES, RELAXED_SETTINGS

# A failing example makes hypothesis's pytest plugin import libcst (to write a
# patch), and libcst's import warns (DeprecationWarning from mypy_extensions):
# with the suite's filterwarnings=error that turns a failure into an
# INTERNALERROR.  Imported here first, where the warning is ignored.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import libcst  # noqa: F401
    except ImportError:  # hypothesis then writes no patch
        pass

# -- the loops ------------------------------------------------------------------------

#: Stock and ours in each setting of the suite (conftest's one loop table).
FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    name: factory
    for name, factory in LOOP_FACTORIES.items()
    if factory is not None and (name == "asyncio" or name in RELAXED_SETTINGS)
}


class _Probe(asyncio.Protocol):
    def __init__(self) -> None:
        self.events: list[str] = []

    def pause_writing(self) -> None:
        self.events.append("pause")

    def connection_lost(self, exc: BaseException | None) -> None:
        self.events.append("lost")


async def _probe_stock_writelines(loop: asyncio.AbstractEventLoop) -> tuple[bool, bool, bool]:
    """Three bugs of some stock writelines(), asked of this Python's stock
    loop rather than read off a version table (patch releases fix them):

    * 1 MiB past the high mark does not pause (gh-127655, 3.12.0-3.12.8 and
      3.13.0-3.13.1);
    * an empty chunk never drains, so close() never ends and the writer polls
      in a busy loop (gh-155888, 3.12 and 3.13);
    * a chunk that is not bytes-like raises TypeError after the chunks before
      it were buffered, where nothing sends them, so close() never ends
      (3.15.2)."""
    results = []
    for chunks in ([b"x" * 65536] * 16, [b"x", b""], [b"x", "not bytes"]):
        probe = _Probe()
        ours, peer = socket.socketpair()
        with ours, peer:
            transport, _ = await loop.connect_accepted_socket(lambda p=probe: p, ours)
            with contextlib.suppress(TypeError):
                transport.writelines(chunks)
            paused = "pause" in probe.events
            transport.close()
            for _ in range(10):
                await asyncio.sleep(0)
            closed = "lost" in probe.events
            if not closed:
                transport.abort()
                await asyncio.sleep(0)
        results.append((paused, closed))
    (paused, _), (_, empty_closed), (_, typed_closed) = results
    return not paused, not empty_closed, not typed_closed


def _stock_writelines_bugs() -> tuple[bool, bool, bool]:
    loop = asyncio.SelectorEventLoop()
    try:
        return loop.run_until_complete(_probe_stock_writelines(loop))
    finally:
        loop.close()


(
    STOCK_WRITELINES_SKIPS_FLOW_CONTROL,
    STOCK_WRITELINES_EMPTY_CHUNK_HANGS,
    STOCK_WRITELINES_TYPE_ERROR_STRANDS,
) = _stock_writelines_bugs()

# -- data -------------------------------------------------------------------------------

_BLOCK = bytes(range(251)) * (4 * 1024 * 1024 // 251 + 2)


def stream(offset: int, size: int) -> bytes:
    """*size* bytes of a stream of period 251 starting at *offset*: a lost,
    repeated or reordered piece of any length but a multiple of 251 shows."""
    start = offset % 251
    return _BLOCK[start : start + size]


def make_data(kind: str, payload: bytes) -> Any:
    if kind == "bytes":
        return payload
    if kind == "bytearray":
        return bytearray(payload)
    if kind == "memoryview":  # of a bytearray: mutable, format "B"
        return memoryview(bytearray(payload))
    if kind == "memoryview-bytes":
        return memoryview(payload)
    if kind == "memoryview-slice":  # a view that does not start at its object's start
        return memoryview(b"<" + payload + b">")[1:-1]
    if kind == "str":  # not bytes-like: TypeError, in stock's words
        return payload.decode("latin-1")
    raise AssertionError(kind)


def fionread(sock: socket.socket) -> int:
    """Bytes waiting in *sock*'s receive queue."""
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return -1
    value: int = struct.unpack("i", raw)[0]
    return value


def describe(exc: BaseException | None) -> Any:
    """What the comparison keeps of an exception: its type and errno."""
    if exc is None:
        return None
    return (type(exc).__name__, getattr(exc, "errno", None))


# -- the protocols -----------------------------------------------------------------------


#: What a protocol can be told to do in one of its callbacks, as
#: "callback:action": raise, or act on its transport (write 20,000 bytes,
#: write_eof, close, abort, pause_reading), once, after recording the call.
#: "get_buffer:empty": a BufferedProtocol's get_buffer() returns b"".
BEHAVIOURS = (
    *(f"{callback}:raise" for callback in (
        "connection_made", "data_received", "eof_received", "pause_writing",
        "resume_writing", "connection_lost", "get_buffer", "buffer_updated")),
    "get_buffer:empty",
    "connection_made:write", "connection_made:write_eof", "connection_made:pause_reading",
    "data_received:close", "data_received:abort", "data_received:pause_reading",
    "data_received:write_eof", "buffer_updated:close",
    "eof_received:write", "eof_received:close",
    "pause_writing:abort", "pause_writing:close",
    "resume_writing:write", "resume_writing:close", "resume_writing:abort",
    "resume_writing:write_eof",
)
#: Behaviours in a data callback that end (or pause) the reading there: how
#: much that call was given decides what the protocol got (see normalise).
CUTTING = ("raise", "close", "abort", "pause_reading")
FLOW_CALLBACK_NAMES = ("pause_writing", "resume_writing")
DATA_CALLBACKS = ("data_received", "buffer_updated")
REACTIONS: dict[str, tuple[Any, ...]] = {
    "write": ("write", "bytes", 20000),
    "write_eof": ("write_eof",),
    "close": ("close",),
    "abort": ("abort",),
    "pause_reading": ("pause_reading",),
}


class ProtocolFailed(Exception):
    """What a protocol told to raise (a "callback:raise" BEHAVIOUR) raises."""


class Recording(asyncio.Protocol):
    """Writes every callback into the session's trace, tagged with its
    number; does what its *behaviour* says (see BEHAVIOURS)."""

    def __init__(self, session: Session, number: int, keep_open: bool,
                 behaviour: str | None = None) -> None:
        self.session = session
        self.number = number
        self.keep_open = keep_open
        self.callback, _, self.action = (behaviour or ":").partition(":")

    def _event(self, *what: Any) -> None:
        self.session.event(self.number, *what)
        self._behave(what[0])

    def _behave(self, callback: str) -> None:
        if callback != self.callback:
            return
        action = self.action
        if action != "raise":
            self.callback = ""  # once
        self.session.event(self.number, "behaves", callback, action, self.session.step_now)
        if action == "raise":
            raise ProtocolFailed(callback)
        self.session.react(REACTIONS[action])

    def connection_made(self, transport: Any) -> None:
        self.session.connection_made(transport)
        self._event("connection_made")

    def data_received(self, data: bytes) -> None:
        self.session.received(self.number, bytes(data))
        self._behave("data_received")

    def eof_received(self) -> bool:
        self._event("eof_received")
        return self.keep_open

    def pause_writing(self) -> None:
        self.session.flow(self.number, "pause")
        self._event("pause_writing")

    def resume_writing(self) -> None:
        self.session.flow(self.number, "resume")
        self._event("resume_writing")

    def connection_lost(self, exc: BaseException | None) -> None:
        self.session.lost(exc)
        self._event("connection_lost", describe(exc))


class BufferedRecording(asyncio.BufferedProtocol, Recording):
    """The same, as a BufferedProtocol whose buffer has *size* bytes."""

    def __init__(self, session: Session, number: int, keep_open: bool, size: int,
                 behaviour: str | None = None) -> None:
        super().__init__(session, number, keep_open, behaviour)
        self.buffer = bytearray(0 if behaviour == "get_buffer:empty" else size)

    eof_received = Recording.eof_received  # not BufferedProtocol's

    def get_buffer(self, sizehint: int) -> bytearray:
        if self.callback == "get_buffer" and self.action == "raise":
            self._behave("get_buffer")
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.session.received(self.number, bytes(self.buffer[:nbytes]))
        self._behave("buffer_updated")


# -- faults ------------------------------------------------------------------------------

#: The faults a FaultySocket injects, by name: an errno, raised before the
#: real call (so nothing moved), or "short": the call moves less than asked.
FAULT_ERRNOS = {
    "EINTR": errno.EINTR,
    "EAGAIN": errno.EAGAIN,
    "ECONNRESET": errno.ECONNRESET,
    "EPIPE": errno.EPIPE,
    "ENOBUFS": errno.ENOBUFS,
    "EMFILE": errno.EMFILE,
}
#: Faults after which the call may simply be made again.
TRANSIENT = frozenset({"EINTR", "EAGAIN", "short"})


def fault_error(name: str) -> OSError:
    code = FAULT_ERRNOS[name]
    return OSError(code, os.strerror(code))  # OSError picks the subclass (InterruptedError, ...)


class FaultPlan:
    """Which calls fail: for each kind ("recv", "send", "accept", "connect"),
    a fault by call number (0: the first call of that kind).  recv and
    recv_into count as one kind, send and sendmsg as another: the loops
    choose between them differently, the plan means "the n-th read"."""

    def __init__(self, plan: dict[str, dict[int, str]]) -> None:
        self.plan = plan
        self.calls: dict[str, int] = {}
        self.fired: list[tuple[str, int, str]] = []
        self.observations: list[Any] | None = None  # a session's, to note each fault in

    def take(self, kind: str) -> str | None:
        number = self.calls.get(kind, 0)
        self.calls[kind] = number + 1
        fault = self.plan.get(kind, {}).get(number)
        if fault is not None:
            self.fired.append((kind, number, fault))
            if self.observations is not None:
                self.observations.append(("fault", kind, number, fault))
        return fault

    def fatal(self) -> list[tuple[str, int, str]]:
        return [f for f in self.fired if f[2] not in TRANSIENT]

    def __repr__(self) -> str:
        return f"FaultPlan({self.plan!r})"


class FaultySocket(socket.socket):
    """A socket whose recv/recv_into/send/sendmsg/accept/connect fail as its
    ``plan`` says.  An accepted connection is a FaultySocket on the same plan."""

    plan: FaultPlan

    @classmethod
    def adopt(cls, sock: socket.socket, plan: FaultPlan) -> FaultySocket:
        """*sock*'s descriptor in a FaultySocket (*sock* is left detached)."""
        adopted = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        adopted.plan = plan
        return adopted

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        fault = self.plan.take("recv")
        if fault == "short":
            bufsize = max(1, bufsize // 3)
        elif fault is not None:
            raise fault_error(fault)
        return super().recv(bufsize, flags)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        fault = self.plan.take("recv")
        if fault == "short":
            nbytes = max(1, (nbytes or len(buffer)) // 3)
        elif fault is not None:
            raise fault_error(fault)
        return super().recv_into(buffer, nbytes, flags)

    def send(self, data: Any, flags: int = 0) -> int:
        fault = self.plan.take("send")
        if fault == "short":
            view = memoryview(data).cast("B")
            return super().send(view[: max(1, len(view) // 2)], flags)
        if fault is not None:
            raise fault_error(fault)
        return super().send(data, flags)

    def sendmsg(self, buffers: Any, *args: Any) -> int:
        fault = self.plan.take("send")
        buffers = list(buffers)  # stock 3.12+ passes an islice
        if fault == "short":
            first = memoryview(buffers[0]).cast("B")
            return super().send(first[: max(1, len(first) // 2)])
        if fault is not None:
            raise fault_error(fault)
        return super().sendmsg(buffers, *args)

    def accept(self) -> tuple[socket.socket, Any]:
        fault = self.plan.take("accept")
        if fault in FAULT_ERRNOS:  # "short" means nothing to accept()
            raise fault_error(fault)
        conn, address = super().accept()
        return FaultySocket.adopt(conn, self.plan), address

    def connect(self, address: Any) -> None:
        fault = self.plan.take("connect")
        if fault == "EINTR":
            # As a signal during connect(): the connection goes on, in progress.
            with contextlib.suppress(BlockingIOError):
                super().connect(address)
        if fault in FAULT_ERRNOS:
            raise fault_error(fault)
        super().connect(address)


# -- the session -------------------------------------------------------------------------

MiB = 1 << 20
# Buffer sizes of the connection (the kernel doubles them): small, so that a
# peer that does not read fills the kernel's buffers with tens of KiB.
SNDBUF = 8 * 1024
RCVBUF = 8 * 1024
SETTLE_SECONDS = 5.0  # a settle that takes longer: the loop keeps changing what it shows
FINALE_DEADLINE = 5.0  # seconds for the peer to read to EOF, and for connection_lost
RUN_DEADLINE = 20.0  # seconds for a whole sequence
# Idling, a settled loop blocks in its poll: the sleep takes two iterations
# (its timer's poll, then the task's step), the most seen in 1,500 idle
# periods of random sequences with faults in every setting; the rest is
# slack (a window update the kernel sends late makes the socket writable).
# Each fault injected meanwhile may add one.  A loop that spins makes
# hundreds in the same time.
IDLE_SECONDS = 0.005
IDLE_ITERATIONS = 6


class Session:
    """One run of one sequence on one loop; ``observations`` is the result."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        kind: str,
        keep_open: bool,
        stock: bool,
        faults: FaultPlan | None = None,
        spin_check: str | None = None,
    ) -> None:
        self.loop = loop
        self.faults = faults
        # "end": count the loop's iterations while it idles once, before the
        # finale; "step": after every step (ours only: statistics()).
        self.spin_check = spin_check
        # Stock's writelines() may skip flow control (gh-127655): then a
        # buffer over the high mark need not mean paused, there.
        self.must_pause = not (stock and STOCK_WRITELINES_SKIPS_FLOW_CONTROL)
        self.stock = stock
        self.stock_broken = False  # set by a stock transport method that failed on None
        self.kind = kind
        self.keep_open = keep_open
        self.observations: list[Any] = []
        if faults is not None:
            faults.observations = self.observations  # each fault noted where it fired
        self.transport: Any = None
        self.protocols = 0
        self.made: asyncio.Future[None] = loop.create_future()
        self.lost_future: asyncio.Future[None] = loop.create_future()
        self.lost_calls = 0
        self.accepted = bytearray()  # what write()/writelines() took without raising
        self.sent_by_peer = 0
        self.peer_got = bytearray()
        self.peer_state = "open"  # "half-closed", "reset", "closed"
        self.peer_eof = False
        self.peer: socket.socket | None = None
        self.server: asyncio.AbstractServer | None = None
        self.sockets: list[socket.socket] = []
        self.data_bytes = 0  # what the protocols were given
        self.paused = False  # pause_writing() came, resume_writing() not yet
        self.invariant_errors: list[str] = []
        self.step_now: Any = "connected"  # the step whose observations come now

    # -- what the protocols report

    def event(self, number: int, *what: Any) -> None:
        self.observations.append(("callback", number, *what))

    def received(self, number: int, data: bytes) -> None:
        if not data:
            self.invariant_errors.append("data_received(b'')")
        if self.data_bytes + len(data) > self.sent_by_peer:
            # Bytes the peer did not send, maybe without end: stop them.
            self.invariant_errors.append(
                f"data_received: {self.data_bytes + len(data)} bytes of {self.sent_by_peer} sent")
            raise ProtocolFailed("more data than the peer sent")
        if data != stream(self.data_bytes, len(data)):
            self.invariant_errors.append(
                f"data_received: {len(data)} bytes at {self.data_bytes} the peer did not send")
        self.data_bytes += len(data)
        self.observations.append(("data", number, data))

    def flow(self, number: int, which: str) -> None:
        # Flow control's contract, checked in the callback itself.
        transport = self.transport
        size = transport.get_write_buffer_size()
        low, high = transport.get_write_buffer_limits()
        if which == "pause" and not size > high:
            self.invariant_errors.append(f"pause_writing() at size {size} <= high {high}")
        if which == "resume" and not size <= low:
            self.invariant_errors.append(f"resume_writing() at size {size} > low {low}")
        if self.paused == (which == "pause"):
            self.invariant_errors.append(f"{which}_writing() twice in a row")
        self.paused = which == "pause"

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if self.kind == "tcp":
            # Before any write: the accepted socket's send buffer, small.
            transport.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
        if not self.made.done():
            self.made.set_result(None)

    def lost(self, exc: BaseException | None) -> None:
        if self.kind == "tcp" and self.sent_by_peer > self.data_bytes and not self.lost_calls:
            # The socket closes with bytes unread: TCP answers with a reset
            # and drops what its send queue still held.
            self.observations.append(("closed with bytes unread",))
        self.lost_calls += 1
        if not self.lost_future.done():
            self.lost_future.set_result(None)

    def handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.observations.append((
            "exception_handler",
            str(context.get("message")),
            tuple(sorted(context)),
            describe(context.get("exception")),
            is_stock_bug(context.get("exception")),
        ))

    # -- setting up

    def new_protocol(self, buffer_size: int | None, behaviour: str | None = None) -> Recording:
        self.protocols += 1
        if buffer_size is None:
            return Recording(self, self.protocols, self.keep_open, behaviour)
        return BufferedRecording(self, self.protocols, self.keep_open, buffer_size, behaviour)

    def react(self, op: tuple[Any, ...]) -> None:
        """A protocol acts on its transport from one of its callbacks."""
        self.call(self.step_now, op)

    async def connect(self, first: tuple[int | None, str | None]) -> None:
        loop = self.loop
        protocol = self.new_protocol(*first)
        if self.kind == "socketpair":
            ours, peer = socket.socketpair()
            self.sockets.append(peer)
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            peer.setblocking(False)
            self.peer = peer
            if self.faults is not None:
                ours = FaultySocket.adopt(ours, self.faults)
            self.sockets.append(ours)
            await loop.connect_accepted_socket(lambda: protocol, ours)
        else:
            if self.faults is None:
                self.server = await loop.create_server(lambda: protocol, "127.0.0.1", 0)
            else:
                listener = FaultySocket(socket.AF_INET, socket.SOCK_STREAM)
                listener.plan = self.faults
                self.sockets.append(listener)
                listener.bind(("127.0.0.1", 0))
                self.server = await loop.create_server(lambda: protocol, sock=listener)
            port = self.server.sockets[0].getsockname()[1]
            peer = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sockets.append(peer)
            # Before connect(): the window the peer advertises stays small.
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer.setblocking(False)
            await loop.sock_connect(peer, ("127.0.0.1", port))
            self.peer = peer
            await asyncio.wait_for(asyncio.shield(self.made), 5)
            self.server.close()  # the connection stays; no other comes
        await self.settle()
        self.record_state("connected")

    # -- running

    def snapshot(self) -> tuple[Any, ...]:
        transport = self.transport
        peer = self.peer
        return (
            len(self.observations),
            transport.get_write_buffer_size(),
            transport.is_closing(),
            fionread(peer) if peer is not None and self.peer_state not in ("reset", "closed")
            else None,
            len(self.peer_got),
        )

    async def settle(self) -> None:
        """Run the loop until nothing it does changes what can be seen: three
        iterations in a row, then a 1 ms sleep (the loop blocks in its poll)."""
        last = None
        calm = 0
        deadline = self.loop.time() + SETTLE_SECONDS
        while self.loop.time() < deadline:
            if calm < 3:
                await asyncio.sleep(0)
            else:
                await asyncio.sleep(0.001)
            now = self.snapshot()
            if now == last:
                calm += 1
                if calm > 3:
                    return
            else:
                calm = 0
                last = now
        self.invariant_errors.append(f"never settled: {last}")

    def record_state(self, step: Any) -> None:
        transport = self.transport
        self.observations.append((
            "state",
            step,
            transport.is_closing(),
            transport.is_reading(),
            transport.get_write_buffer_size(),
            transport.get_write_buffer_limits(),
            self.outstanding(),
        ))
        if not transport.is_closing():
            size = transport.get_write_buffer_size()
            high = transport.get_write_buffer_limits()[1]
            if size > high and not self.paused and self.must_pause:
                self.invariant_errors.append(f"step {step}: {size} bytes buffered, not paused")
            if not size and self.paused:
                self.invariant_errors.append(f"step {step}: nothing buffered, still paused")

    def call(self, step: Any, op: tuple[Any, ...]) -> None:
        """Apply transport operation *op*; what it raised is an observation.
        A batch's operations run in one callback, each in its own ``try``:
        one that raises does not keep the others from running."""
        for one in op[1] if op[0] == "batch" else (op,):
            try:
                self.apply(step, one)
            except Exception as exc:  # the exception is what is compared
                self.observations.append(("raised", step, type(exc).__name__, str(exc)))
                if self.stock and is_stock_bug(exc):
                    self.stock_broken = True

    def apply(self, step: Any, op: tuple[Any, ...]) -> None:
        name = op[0]
        transport = self.transport
        if name not in ("batch", "mark"):
            self.observations.append(("op", step, name))
        if name == "write":
            _, kind, size = op
            payload = stream(len(self.accepted), size)
            lost = self.lost_calls
            transport.write(make_data(kind, payload))
            if not lost:  # after connection_lost a write is dropped, in silence
                self.accepted += payload
        elif name == "writelines":
            _, pieces = op
            offset = len(self.accepted)
            chunks = []
            for kind, size in pieces:
                payload = stream(offset, size)
                offset += size
                chunks.append((make_data(kind, payload), payload))
            lost = self.lost_calls
            transport.writelines([data for data, _ in chunks])
            if not lost:
                for _, payload in chunks:
                    self.accepted += payload
        elif name in ("pause_reading", "resume_reading", "write_eof", "close", "abort"):
            getattr(transport, name)()
        elif name == "set_write_buffer_limits":
            _, high, low = op
            transport.set_write_buffer_limits(high=high, low=low)
        elif name == "set_protocol":
            _, buffer_size, behaviour = op
            transport.set_protocol(self.new_protocol(buffer_size, behaviour))
        elif name == "mark":
            self.observations.append(("mark", op[1]))
        else:
            raise AssertionError(op)

    async def step(self, index: int, op: tuple[Any, ...]) -> None:
        self.step_now = index
        name = op[0]
        loop = self.loop
        if name.startswith("peer_"):
            await self.peer_op(op)
        elif name == "soon":
            # Schedule the operation, then mark: both run after whatever the
            # loop already has ready, in this order.
            loop.call_soon(self.call, index, op[1])
            loop.call_soon(self.call, index, ("mark", f"soon {index}"))
        elif name == "later":
            loop.call_later(0, self.call, index, op[1])
            loop.call_soon(self.call, index, ("mark", f"soon after later {index}"))
        elif name == "thread":
            done: asyncio.Future[None] = loop.create_future()

            def from_thread() -> None:
                loop.call_soon_threadsafe(self.call, index, op[1])
                loop.call_soon_threadsafe(done.set_result, None)

            thread = threading.Thread(target=from_thread)
            thread.start()
            await done
            thread.join()
        else:
            self.call(index, op)
        await self.settle()
        if self.spin_check == "step":
            await self.idle(index)
        self.record_state(index)

    async def idle(self, step: Any) -> None:
        """Let the loop idle for IDLE_SECONDS: nothing is ready (the loop has
        settled), so it must block in its poll, not spin."""
        stats: Any = self.loop.statistics()  # type: ignore[attr-defined]
        fired = len(self.faults.fired) if self.faults is not None else 0
        before = stats.iterations
        await asyncio.sleep(IDLE_SECONDS)
        iterations = self.loop.statistics().iterations - before  # type: ignore[attr-defined]
        fired = (len(self.faults.fired) if self.faults is not None else 0) - fired
        if iterations > IDLE_ITERATIONS + fired:
            self.invariant_errors.append(
                f"step {step}: {iterations} iterations in {IDLE_SECONDS * 1000:.0f} ms idle")

    async def peer_op(self, op: tuple[Any, ...]) -> None:
        peer = self.peer
        assert peer is not None
        name = op[0]
        if self.peer_state in ("reset", "closed"):
            return  # nothing left to drive
        if name in ("peer_send", "peer_send_timed"):
            if self.peer_state == "half-closed":
                return
            payload = stream(self.sent_by_peer, op[1])
            try:
                sent = peer.send(payload)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self.observations.append(("peer", "send", describe(exc)))
                return
            self.sent_by_peer += sent
            if sent and self.kind == "tcp" and self.lost_calls:
                # Bytes for a socket closed already: as for one closed with
                # bytes unread (lost), TCP resets and drops its send queue.
                self.observations.append(("closed with bytes unread",))
            if name == "peer_send_timed":
                await self.timed()
        elif name == "peer_read":
            await self.peer_read(op[1])
        elif name == "peer_read_all":
            await self.peer_read(None)
        elif name == "peer_shutdown":
            if self.peer_state == "open":
                self.peer_state = "half-closed"
                try:
                    peer.shutdown(socket.SHUT_WR)
                except OSError as exc:  # ENOTCONN: the connection was reset
                    self.observations.append(("peer", "shutdown", describe(exc)))
        elif name in ("peer_reset", "peer_close"):
            # What was still on its way when the peer went (how much of it
            # the kernel had taken depends on how the loop sent).
            self.observations.append(("peer gone", self.outstanding()))
            if name == "peer_reset" and self.kind == "tcp":
                peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer.close()
            self.peer_state = "reset" if name == "peer_reset" else "closed"
        else:
            raise AssertionError(op)

    async def timed(self) -> None:
        """Wait for a call_later(0) with nothing else ready: the loop's next
        iteration finds the peer's bytes and a due timer in one poll (ours
        then runs the I/O callbacks straight from it; stock queues them
        before the timers).  The mark shows what came first."""
        loop = self.loop
        fired: asyncio.Future[None] = loop.create_future()

        def mark() -> None:
            self.observations.append(("mark", "timer"))
            fired.set_result(None)

        loop.call_later(0, mark)
        await fired

    def outstanding(self) -> int:
        """Bytes the transport took that the peer has not read."""
        return len(self.accepted) - len(self.peer_got)

    async def peer_read(self, size: int | None) -> bool:
        """Read *size* bytes (None: all there is), waiting for the loop to
        send more while it does; stop early at EOF, an error, or when the
        loop settles without sending more.  True at EOF or error."""
        peer = self.peer
        assert peer is not None
        goal = len(self.peer_got) + size if size is not None else None
        progress = -1
        while goal is None or len(self.peer_got) < goal:
            want = goal - len(self.peer_got) if goal is not None else 1 << 20
            try:
                data = peer.recv(want)
            except (BlockingIOError, InterruptedError):
                if progress == len(self.peer_got):
                    return False  # the loop sent nothing more
                progress = len(self.peer_got)
                await self.settle()
                continue
            except OSError as exc:
                self.observations.append(("peer", "recv", describe(exc)))
                return True
            if not data:
                if not self.peer_eof:
                    self.peer_eof = True
                    self.observations.append(("peer", "eof"))
                return True
            self.peer_got += data
            # Bytes nobody wrote, maybe without end: stop reading them.  (A
            # stock method that failed on None may have sent its bytes.)
            extra = len(self.peer_got) - len(self.accepted)
            if extra > (MiB if self.stock_broken else 0):
                self.invariant_errors.append(
                    f"the peer received {len(self.peer_got)} bytes of {len(self.accepted)} written")
                return True
        return False

    async def finale(self) -> None:
        self.step_now = "finale"
        if not self.transport.is_closing():
            self.call("finale", ("close",))
        if self.peer_state in ("open", "half-closed"):
            try:
                eof = await asyncio.wait_for(self.peer_read_to_eof(), FINALE_DEADLINE)
            except TimeoutError:
                eof = False
            if not eof:
                self.observations.append(("peer", "no EOF"))
        try:
            await asyncio.wait_for(asyncio.shield(self.lost_future), FINALE_DEADLINE)
        except TimeoutError:
            self.observations.append(("no connection_lost",))
        await self.settle()
        self.record_state("finale")
        self.observations.append(("peer received", len(self.peer_got),
                                  zlib.crc32(self.peer_got)))
        if self.stock_broken:
            return  # such a call may have buffered its data, or closed, or not
        if self.lost_calls != 1:
            self.invariant_errors.append(f"connection_lost called {self.lost_calls} times")
        if bytes(self.peer_got) != bytes(self.accepted[: len(self.peer_got)]):
            self.invariant_errors.append("the peer received bytes nobody wrote")

    async def peer_read_to_eof(self) -> bool:
        while not await self.peer_read(None):
            await asyncio.sleep(0.001)
        return True

    async def run(self, ops: Sequence[tuple[Any, ...]],
                  first: tuple[int | None, str | None]) -> None:
        await self.connect(first)
        for index, op in enumerate(ops):
            await self.step(index, op)
        if self.spin_check == "end":
            await self.idle("end")
        await self.finale()

    async def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()
        for sock in self.sockets:
            sock.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        await asyncio.sleep(0)


def observe(
    loop_name: str,
    kind: str,
    ops: Sequence[tuple[Any, ...]],
    *,
    protocol: tuple[int | None, str | None] = (None, None),
    keep_open: bool = False,
    faults: FaultPlan | None = None,
    spin_check: str | None = None,
) -> tuple[list[Any], list[str]]:
    """Run *ops* on a new loop of FACTORIES[*loop_name*] over a connection of
    *kind* ("socketpair" or "tcp"): (observations, broken invariants).
    *protocol* is the first protocol's (buffer size, BEHAVIOUR): a buffer
    size makes it a BufferedProtocol.  With *faults*, the loop's
    side of the connection is a FaultySocket."""
    loop = FACTORIES[loop_name]()
    if loop_name == "asyncio":
        spin_check = None  # stock has no statistics()
    session = Session(loop, kind, keep_open, stock=loop_name == "asyncio", faults=faults,
                      spin_check=spin_check)
    loop.set_exception_handler(session.handler)
    try:
        try:
            loop.run_until_complete(asyncio.wait_for(session.run(ops, protocol), RUN_DEADLINE))
        finally:
            loop.run_until_complete(session.close())
            loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
    return session.observations, session.invariant_errors


# -- the comparison -----------------------------------------------------------------------


#: Leeway, by design: what one of our modes does differently from stock, so
#: that the comparison must forgive it (see normalise; README, Settings).
KERNEL_SHARE = "kernel-share"
SEND_AFTER_CALLBACK = "send-after-callback"
#: Leeway for this Python's stock loop: its writelines() does not pause the
#: protocol (gh-127655; probed at import).
FLOW_CALLBACKS = "flow-callbacks"
#: Leeway for a run with transient faults against one without (test_faults).
RETRIED = "retried"


def mode_leeway(settings: dict[str, str]) -> frozenset[str]:
    """The leeway our loop needs against stock in these settings."""
    leeway = set()
    if settings.get("partial_write") == "feed":
        leeway.add(KERNEL_SHARE)
    if settings.get("write") == "deferred":
        leeway |= {KERNEL_SHARE, SEND_AFTER_CALLBACK}
    return frozenset(leeway)


# 3.12+: stock's writelines() sends at once even while the transport waits
# for EPOLLOUT (GH-91166's sendmsg path calls _write_ready() directly), where
# its write(), and ours in poll mode, only append: the kernel share differs.
STOCK_WRITELINES_SENDS_WHILE_WAITING = sys.version_info >= (3, 12)

# PyPy: a run's operations can outlast TCP's delayed ACK (40 ms on Linux)
# in one run and not in the other (the JIT compiling, the collector), and
# the ACK frees send buffer, whose EPOLLOUT lets a waiting transport send
# more before the next observation: the kernel's share differs between two
# runs of stock itself (seen with PyPy 3.11's stock loop; not on CPython).
DELAYED_ACKS_RACE = sys.implementation.name == "pypy"


def leeway(loop_name: str) -> frozenset[str]:
    """What the comparison of *loop_name* with stock forgives (see normalise)."""
    extra = {KERNEL_SHARE} if DELAYED_ACKS_RACE else set()
    if loop_name == "asyncio":
        return frozenset(extra)
    if STOCK_WRITELINES_SKIPS_FLOW_CONTROL:
        extra.add(FLOW_CALLBACKS)
    if STOCK_WRITELINES_SENDS_WHILE_WAITING:
        extra.add(KERNEL_SHARE)
    return mode_leeway(RELAXED_SETTINGS[loop_name]) | extra


WRITES = ("write", "writelines")
FLOW_FAILURES = ("protocol.pause_writing() failed", "protocol.resume_writing() failed")


def is_stock_bug(exc: BaseException | None) -> bool:
    """Whether a stock transport method failed on its own cleared state:
    AttributeError or TypeError about None.  Stock's close() with data
    buffered leaves ``_conn_lost`` at 0 when the buffer drains and
    connection_lost runs, so a later write, writelines or abort reaches the
    cleared socket and loop (anyio#1250 reports the abort); 3.12+'s
    writelines never checks for a closed or lost connection (CPython
    gh-136234).  Ours drops such a write in silence, as stock's write()
    does on its other paths."""
    return isinstance(exc, (AttributeError, TypeError)) and "NoneType" in str(exc)


def differs_from_stock(stock: list[Any], ours: list[Any], loop_name: str) -> str | None:
    """None if *loop_name*'s observations agree with stock's, else where not."""
    return compare(stock, ours, leeway(loop_name), stock_expected=True,
                   stock_got=loop_name == "asyncio")


def compare(
    expected: list[Any],
    got: list[Any],
    leeway: frozenset[str],
    *,
    stock_expected: bool,
    stock_got: bool,
) -> str | None:
    """None if two runs' observations agree under *leeway*, else where not.

    Both lists are cut before the first step where there is nothing left to
    compare (the runs are still held to their invariants, in the run):

    * a stock transport method failed on None (is_stock_bug): stock is
      broken from there on;
    * with KERNEL_SHARE or FLOW_CALLBACKS, a protocol acted on its transport
      from pause_writing() or resume_writing(): those come at loop-dependent
      points, or in one run only (see normalise)."""
    cuts = [
        item[1]
        for observations, stock in ((expected, stock_expected), (got, stock_got)) if stock
        for item in observations
        if item[0] == "raised" and item[2] in ("AttributeError", "TypeError")
        and "NoneType" in item[3]
    ]
    if leeway & {KERNEL_SHARE, FLOW_CALLBACKS}:
        cuts += [
            item[5] for item in (*expected, *got)
            if item[0] == "callback" and item[2] == "behaves" and item[3] in FLOW_CALLBACK_NAMES
        ]
    if cuts:
        first = min(cuts, key=_step_order)
        expected, got = _before_step(expected, first), _before_step(got, first)
        if KERNEL_SHARE in leeway:
            # Where connection_lost comes is forgiven (normalise), so one run
            # may have had it before the cut, the other after: not compared.
            expected, got = (
                [item for item in observations if item[2:3] != ("connection_lost",)]
                for observations in (expected, got)
            )
    a = normalise(expected, leeway, stock=stock_expected)
    b = normalise(got, leeway, stock=stock_got)
    return None if a == b else first_divergence(a, b)


def _step_order(step: Any) -> float:
    if step == "connected":
        return -1
    if step == "finale":
        return float("inf")
    return float(step)


def _before_step(observations: list[Any], step: Any) -> list[Any]:
    """The observations before *step*'s: up to the state recorded at the end
    of the step before it (what a step caused comes before its own state)."""
    end = 0
    for index, item in enumerate(observations):
        if item[0] == "state":
            if item[1] == step or _step_order(item[1]) >= _step_order(step):
                break
            end = index + 1
    return observations[:end]


def normalise(
    observations: list[Any], leeway: frozenset[str] = frozenset(), *, stock: bool = False
) -> list[Any]:
    """What two loops must agree on: the one place differences are forgiven.

    Always:

    * data_received: consecutive calls to one protocol are joined into one
      stream (kept as length and CRC).  How bytes are cut into calls is not
      specified: stock reads up to 256 KiB per event, ours 64 KiB or its
      buffer's size, and the kernel decides what one read finds.  So a
      callback due in the same iteration (a timer, a call_soon) may run
      between two pieces of one burst in one loop and after both in the
      other: a mark between two data_received calls of one protocol counts
      as after them, as do the operations such callbacks made and a data
      callback's behaviour (it comes with the first piece).
    * data_received or buffer_updated that raised, closed, aborted or paused
      reading (a CUTTING behaviour): not how many bytes that call got, nor
      what that protocol got after it (where the loop cut the stream decides
      how much that call got, and so what was left), nor from then on the
      peer's EOF and errors and the bytes it received and had outstanding
      (whether bytes were left unread decides whether closing the socket
      resets the connection).  Checked
      instead, in every run: the protocols got a prefix of what the peer
      sent, the peer a prefix of what was written.
    * "Exception in callback <callback>": the message without the callback,
      which names the loop's and transport's own methods.

    In stock's observations only (*stock*), its known bugs (and see compare):

    * an exception handler call for an AttributeError or TypeError about
      None (is_stock_bug): dropped.  Stock's write path calls
      connection_lost itself when a close() or abort() from resume_writing()
      has scheduled it already; the scheduled call then fails on the
      cleared protocol (CPython gh-156512).
    * get_write_buffer_size() after connection_lost: 0.  3.12+'s writelines
      appends to the buffer of a lost connection (gh-136234), which then
      counts it forever.

    With KERNEL_SHARE (partial_write=feed, write=deferred; every mode on
    3.12+): how much of the buffer the kernel takes.  Stock and poll retry a
    short send on EPOLLOUT, which Linux reports only once a good part of the
    socket buffer is free (a third for TCP, three quarters for AF_UNIX);
    feed retries on the next iteration and gets in whatever is free then.
    Deferred sends what one callback wrote in one sendmsg where stock makes
    one send per write, and AF_UNIX charges its buffer per send (each makes
    an skb), so a full buffer takes a different number of bytes.  3.12+'s
    stock writelines() sends at once even while waiting for EPOLLOUT (its
    write() does not), which ours does not.  So the buffer level after a
    short send differs, and with it:

    * where pause_writing() and resume_writing() come (and a protocol's
      failure or action there: see compare);
    * when a close() with data buffered ends in connection_lost (the buffer
      empties sooner or later), when a write_eof() with data buffered shuts
      the socket down, and so where the peer sees EOF (compared at the end,
      not where it came); and whether a write() after close() is still
      sent (while data is buffered) or dropped (once connection_lost is due);
    * once the peer has gone (closed or reset) with bytes outstanding, or is
      written to after it went (how many sends the writes make decides
      whether one meets the reset): whether the transport learns it at its
      next send (the bytes were still its own) or only at its next read or
      write (the kernel had them all), and so whether it is closing, still
      reads what was there (feed retries a send before the next poll, where
      stock, waiting for EPOLLOUT, handles that poll's read first), and
      whether its write_eof()'s shutdown() meets the reset (OSError).

    Not compared: get_write_buffer_size(); the flow-control callbacks and
    the handler's calls for their failures; where connection_lost comes
    (compared at the end instead); after a write made once the transport
    was closing, the peer's bytes and EOF (as after an abort, below); after
    the peer went as above, is_closing(), is_reading(), connection_lost's
    exception, data_received and eof_received, and an OSError raised by a
    call.  Checked instead, in every run: each flow-control callback comes
    only where the buffer passes its mark, they alternate, and at every step
    a buffer over the high mark means paused and an empty one not paused;
    connection_lost once; the prefixes.

    With SEND_AFTER_CALLBACK (write=deferred): what a callback writes is
    sent after it returns, so a send that fails does so after the callback,
    not in write(): until then the transport is not closing, and a
    write_eof() in that callback takes effect, so that a later write()
    raises "after write_eof()" where stock's transport, closing already,
    had ignored the write_eof().  Not compared: from a step that ends with
    connection_lost(OSError) on, what a write() or writelines() raised
    ("after write_eof()" in ours, a TypeError or nothing in stock); and,
    as an abort() after a write in one callback drops that write unsent
    where stock's had failed, the exception of the connection_lost that
    follows.

    With either: what the kernel held when the rest was dropped, by abort(),
    by a protocol's failure ("Fatal error: ...", which aborts), or by a TCP
    socket closed with bytes unread or sent bytes after it closed (the
    kernel then resets the connection and drops its send queue; whether
    the close comes before the peer's bytes depends on how fast the kernel
    took the buffer); with SEND_AFTER_CALLBACK, what
    the aborting callback wrote is still the transport's, where stock had
    sent it from write().  Not compared, after either: the bytes the peer
    received and those outstanding, and the peer's EOF and errors.
    Checked instead, in every run: the peer received a prefix of what was
    written.

    With RETRIED (a run with transient faults, against the same without):
    a read or send that failed is made again on a later iteration, so what
    was due in between (timers, call_soon) may run before it: the marks are
    not compared.

    With FLOW_CALLBACKS: the flow-control callbacks are not compared, and
    stock is not held to their contract (Session.must_pause).  With either
    of these two, nor the exception handler's calls for the flow-control
    callbacks that raised.

    The operations themselves ("op") are markers for these rules, and left
    out of the result, as are the notes of injected faults ("fault").
    """
    observations = _join_data(observations)
    share = KERNEL_SHARE in leeway
    flow = bool(leeway & {KERNEL_SHARE, FLOW_CALLBACKS})
    dropping = bool(leeway & {KERNEL_SHARE, SEND_AFTER_CALLBACK})
    if SEND_AFTER_CALLBACK in leeway:
        observations = _forgive_late_send_errors(observations)
    result = []
    # Set when: connection_lost came; the transport is closing; what the
    # peer gets is no longer comparable; the peer closed or reset; it did so
    # with bytes outstanding, or was written to after.
    lost = closing = unaccounted = peer_left = peer_gone = peer_eof = False
    losses = []
    for item in observations:
        kind = item[0]
        if kind == "op":
            if item[2] == "abort":
                unaccounted = unaccounted or dropping
            elif item[2] in WRITES and share:
                # Once the peer left, how many sends a write makes decides
                # whether one of them meets the reset.
                peer_gone = peer_gone or peer_left
                unaccounted = unaccounted or closing or peer_gone
            closing = closing or item[2] in ("close", "abort")
            continue
        if kind == "closed with bytes unread":
            unaccounted = unaccounted or dropping
            continue
        if kind == "fault":  # a note of where an injected fault fired
            continue
        if kind == "mark" and RETRIED in leeway:
            continue
        if kind == "peer gone":
            peer_left = True
            peer_gone = item[1] > 0 or unaccounted
            if dropping:
                item = ("peer gone", "?")
        elif kind == "callback":
            if item[2] == "behaves":
                if item[3] in DATA_CALLBACKS and item[4] in CUTTING:
                    unaccounted = True
                item = item[:5]  # without the step it came in
            elif item[2] == "connection_lost":
                lost = True
                if share:
                    # Compared at the end, so not to which protocol (a
                    # set_protocol may come before it in one run only).
                    losses.append(item[3])
                    continue
                closing = True
            elif item[2] in ("pause_writing", "resume_writing") and flow:
                continue
            elif item[2] == "eof_received" and share and peer_gone:
                continue
        elif kind == "data" and share and peer_gone:
            continue
        elif kind == "state":
            _, step, is_closing, reading, size, limits, outstanding = item
            if stock and lost:
                size = 0
            if share:
                size = "?"
                if peer_gone:
                    is_closing = reading = "?"
            closing = closing or is_closing is True
            if unaccounted:
                outstanding = "?"
            item = ("state", step, is_closing, reading, size, limits, outstanding)
        elif kind == "exception_handler":
            message = item[1]
            if stock and item[4]:
                continue
            if message.startswith("Fatal error"):  # the buffer dropped, as by abort()
                unaccounted = unaccounted or dropping
            if message.startswith("Exception in callback "):
                message = "Exception in callback ..."
            elif flow and message in FLOW_FAILURES:
                continue
            item = ("exception_handler", message, *item[2:4])
        elif kind == "raised" and share and peer_gone and item[2] == "OSError":
            continue  # write_eof()'s shutdown() meets the reset, if nothing else did
        elif kind == "peer" and unaccounted:
            continue
        elif kind == "peer" and item[1] == "eof" and share:
            peer_eof = True
            continue
        elif kind == "peer received" and unaccounted:
            item = ("peer received", "?")
        result.append(item)
    if share:  # where the connection went, it may have ended before or after
        result += [("callback", "?", "connection_lost", "?" if peer_gone else exc)
                   for exc in losses]
        if peer_eof:
            result.append(("peer", "eof"))
    return result


def _between_reads(item: tuple[Any, ...]) -> bool:
    """What may run between two pieces of one burst in one loop and after
    both in another: callbacks due in the same iteration (marks, and the
    operations they or a data callback's behaviour made), and the notes of
    injected faults (a read that failed, retried on a later iteration)."""
    return item[0] in ("mark", "op", "fault") or (
        item[0] == "callback" and item[2] == "behaves" and item[3] in DATA_CALLBACKS)


def _join_data(observations: list[Any]) -> list[Any]:
    """Consecutive data_received calls to one protocol as one (length, CRC),
    and what ran between them (_between_reads) after them.
    A data callback with a CUTTING behaviour: its data as "?", and none of
    that protocol's data after it (where the loop cut the stream decides how
    much that call got, and so what is left for later)."""
    out: list[Any] = []
    cut: set[int] = set()
    for item in observations:
        if (item[0] == "callback" and item[2] == "behaves" and item[3] in DATA_CALLBACKS
                and item[4] in CUTTING):
            cut.add(item[1])
            if out and out[-1][0] == "data" and out[-1][1] == item[1]:
                out[-1] = ("data", item[1], None)
        elif item[0] == "data" and item[1] in cut:
            continue
        elif item[0] == "data":
            marks = []  # what ran between this and the protocol's previous data
            while out and _between_reads(out[-1]):
                marks.append(out.pop())
            if out and out[-1][0] == "data" and out[-1][1] == item[1]:
                out[-1] = ("data", item[1], out[-1][2] + item[2])
                out.extend(reversed(marks))
                continue
            out.extend(reversed(marks))
        out.append(item)
    return [
        (("data", i[1], "?") if i[2] is None else ("data", i[1], len(i[2]), zlib.crc32(i[2])))
        if i[0] == "data" else i
        for i in out
    ]


def _forgive_late_send_errors(observations: list[Any]) -> list[Any]:
    """SEND_AFTER_CALLBACK: a write's send fails after its callback, if at all.

    From the first write of the first step with a write that ends in
    connection_lost(OSError) on, drop what writes raised (ours has taken a
    write_eof() that stock, closing already, ignored: "after write_eof()"
    where stock's raises a TypeError for the data, or nothing); and a
    connection_lost in a step that wrote, then aborted, has its exception
    forgiven (stock's write had failed, ours was dropped unsent by the
    abort)."""
    step = None
    written: set[Any] = set()
    aborted_after_write: set[Any] = set()
    failed = None  # the index of the first write of the first failed step
    out = []
    for index, item in enumerate(observations):
        if item[0] == "op":
            step = item[1]
            if item[2] in WRITES and step not in written:
                written.add(step)
                first_write = index
            elif item[2] == "abort" and step in written:
                aborted_after_write.add(step)
        elif item[0] == "callback" and item[2] == "connection_lost":
            if step in aborted_after_write:
                item = (*item[:3], "?")
            elif item[3] is not None and step in written and failed is None:
                failed = first_write
        elif item[0] == "state":
            step = None
        out.append(item)
    if failed is None:
        return out
    kept = out[:failed]
    last_op = None
    for item in out[failed:]:
        if item[0] == "op":
            last_op = item[2]
        elif item[0] == "raised" and last_op in WRITES:
            continue  # "after write_eof()" here, where stock checks the data first
        kept.append(item)
    return kept


def first_divergence(expected: list[Any], got: list[Any]) -> str:
    """Where two normalised observation lists part, with some context."""
    for index, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return (f"at observation {index}:\n  stock: {a!r}\n  ours:  {b!r}\n"
                    f"  before: {expected[max(0, index - 3):index]!r}")
    shorter = min(len(expected), len(got))
    return (f"lengths differ ({len(expected)} vs {len(got)}); then stock: "
            f"{expected[shorter:shorter + 3]!r}, ours: {got[shorter:shorter + 3]!r}")


# -- strategies ---------------------------------------------------------------------------

DATA_KINDS = ["bytes", "bytearray", "memoryview", "memoryview-bytes", "memoryview-slice"]
#: What a write is given: mostly bytes-likes, now and then a str.
DATA = st.one_of(st.sampled_from(DATA_KINDS), st.sampled_from([*DATA_KINDS, "str"]))
WRITE_SIZES = st.sampled_from([0, 1, 100, 1000, 4096, 20000, 70000, 300000])
LIMITS = st.sampled_from([0, 1, 100, 4096, 16384, 65536, 1 << 20])
BUFFER_SIZES = st.sampled_from([None, None, 16, 1000, 65536])  # None: a plain Protocol
BEHAVIOUR = st.one_of(st.none(), st.none(), st.sampled_from(BEHAVIOURS))


@st.composite
def limits(draw: Any) -> tuple[str, int | None, int | None]:
    high = draw(st.one_of(st.none(), LIMITS))
    low = draw(st.one_of(st.none(), LIMITS, st.just(-1)))
    return ("set_write_buffer_limits", high, low)


def transport_ops(behaving: bool = True) -> st.SearchStrategy[tuple[Any, ...]]:
    # Not what stock's writelines() hangs on (empty chunks, gh-155888; a str
    # after bytes, 3.15.2): that would test only stock.
    piece_sizes = WRITE_SIZES.filter(bool) if STOCK_WRITELINES_EMPTY_CHUNK_HANGS else WRITE_SIZES
    piece_data = st.sampled_from(DATA_KINDS) if STOCK_WRITELINES_TYPE_ERROR_STRANDS else DATA
    piece = st.tuples(piece_data, piece_sizes)
    return st.one_of(
        st.tuples(st.just("write"), DATA, WRITE_SIZES),
        st.tuples(st.just("writelines"), st.lists(piece, max_size=4).map(tuple)),
        st.just(("pause_reading",)),
        st.just(("resume_reading",)),
        limits(),
        st.just(("write_eof",)),
        st.just(("close",)),
        st.just(("abort",)),
        st.tuples(st.just("set_protocol"), BUFFER_SIZES, BEHAVIOUR if behaving else st.none()),
    )


def peer_ops() -> st.SearchStrategy[tuple[Any, ...]]:
    return st.one_of(
        st.tuples(st.sampled_from(["peer_send", "peer_send_timed"]),
                  st.sampled_from([1, 100, 5000, 70000])),
        st.tuples(st.just("peer_read"), st.sampled_from([1, 100, 4096, 65536])),
        st.just(("peer_read_all",)),
        st.just(("peer_shutdown",)),
        st.just(("peer_reset",)),
        st.just(("peer_close",)),
    )


def operations(behaving: bool = True) -> st.SearchStrategy[tuple[Any, ...]]:
    single = transport_ops(behaving)
    batch = st.tuples(st.just("batch"), st.lists(single, min_size=2, max_size=4).map(tuple))
    inner = st.one_of(single, batch)
    return st.one_of(
        single,
        batch,
        peer_ops(),
        peer_ops(),
        st.tuples(st.sampled_from(["soon", "later", "thread"]), inner),
    )


BIG_WRITES = st.sampled_from([20000, 70000, 300000])  # more than the kernel's buffers take


@st.composite
def episode(draw: Any, behaving: bool) -> list[tuple[Any, ...]]:
    """A write the kernel cannot take at once, what the transport is told
    while it is buffered, then what the peer does: the sequences where a
    buffer's end decides what happens (write_eof's shutdown, close's
    connection_lost, resume_writing), which lists of independent random
    operations rarely draw."""
    fill = draw(st.tuples(st.just("write"), DATA, BIG_WRITES))
    told = draw(st.lists(transport_ops(behaving), min_size=1, max_size=2))
    peer = draw(st.one_of(st.just(("peer_read_all",)), peer_ops()))
    return [fill, *told, peer]


def sequences(
    max_size: int = 12, *, behaving: bool = True
) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    """Operation lists: independent random operations, or up to three
    episodes (one in three); *behaving*: a protocol set may have a BEHAVIOUR."""
    episodes = st.lists(episode(behaving), min_size=1, max_size=min(3, max_size // 4)).map(
        lambda parts: [op for part in parts for op in part])
    return st.one_of(st.lists(operations(behaving), max_size=max_size),
                     st.lists(operations(behaving), max_size=max_size), episodes)


def fault_plans(
    faults: dict[str, Sequence[str]], calls: int = 16
) -> st.SearchStrategy[dict[str, dict[int, str]]]:
    """For each kind of call, up to four of its first *calls* calls that
    fail, with one of the faults given for that kind."""
    return st.fixed_dictionaries({
        kind: st.dictionaries(st.integers(0, calls - 1), st.sampled_from(list(names)),
                              max_size=4)
        for kind, names in faults.items()
    })
