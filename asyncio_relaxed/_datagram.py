"""The datagram transport: a burst of datagrams read in one readiness event.

Theory of operation
===================

Reads.  Each readiness event reads up to ``datagram_batch`` datagrams (the
loop's setting; libuv's ``uv__udp_recvmsg`` reads up to 32 per event).  On
an IP socket each is one ``recvfrom(UDP_MAX)``: a UDP payload fits 64 KiB,
which CPython allocates from the heap (below glibc's mmap threshold) and
shrinks in place to the datagram, one call and no copy (the stream
transport's small reads make the same trade).  Other sockets (Unix
datagram sockets, whose datagrams may be larger) read with
``recvfrom_into`` into the loop's one receive buffer and hand
``datagram_received`` an exact-size ``bytes`` copy.  On a socket with a
peer (connected) it is ``recv``/``recv_into``: the kernel delivers only the
peer's datagrams to such a socket, so the address is the one
``getpeername()`` gave, in the form ``recvfrom`` would give it (checked for
IPv4, IPv6 and Unix sockets; a socketpair's peer has no name, and there
``recvfrom_into`` tells the ``None`` that stock passes).  Stock's transport
makes one ``recvfrom(256 KiB)`` per event instead: a burst of N datagrams
costs N loop iterations, and each read allocates 256 KiB.

The batch ends at the first of: EAGAIN (the socket ran dry), the limit, an
OSError (``error_received`` is called once per event, as on stock; an ICMP
error is reported once by the kernel, so the next event reads on), or a
callback that paused reading or closed the transport.  That last condition
is checked after every ``datagram_received``: a datagram that arrives after
``pause_reading()`` or ``close()`` stays in the kernel, as on stock.
Whatever the batch leaves, the level-triggered poller reports again.  An
exception from the protocol's callbacks ends the batch and reaches the loop's
exception handler as the reader's own, as stock's does.

Held datagrams (the compiled build).  The compiled transport reads a batch
with one ``recvmmsg``, so the datagrams after the one whose callback paused
reading or raised are out of the kernel already.  They wait, in order, in
``_held``: the next ``_read_ready`` delivers them before it reads again,
under the same rules (each may pause, close or raise), and one is scheduled
where no readiness event may come: after the exception, and at
``resume_reading()``.  Closing drops them, as closing a socket drops what its
kernel queue holds.  The pure transport reads one datagram per call and
never holds one; it delivers what a compiled read held (a class patched
between two events takes this path).

The buffer (sockets other than IP): a datagram read returns at most 256 KiB
on stock (its ``max_size``), so the loop's buffer serves when ``read_size``
is at least that; otherwise the transport reads into a 256 KiB buffer of its
own, so no datagram is cut shorter than stock would cut it.  Every read copies out of
the buffer before a callback runs, which keeps the buffer free for the next
read of any transport of the loop.

Writes.  As stock: ``sendto`` sends at once when nothing is buffered; a
datagram the kernel refuses with EAGAIN is copied into the buffer (a deque
of (bytes, address)) and waits for EPOLLOUT, where ``_sendto_ready`` sends
the buffer in order, one system call per datagram (each is one message).
Flow control counts each buffered datagram's payload plus the header bytes
stock counts on this Python (``_compat.DATAGRAM_HEADER_SIZE``: 8 on 3.13.0
and later, none on 3.11.7 and 3.12.1), added when it is buffered and
subtracted when it is sent; 3.13.0's stock subtracts the payload only, so its
count grows by 8 per datagram ever buffered and a paused protocol may never
resume: this behaves as 3.14's, which counts both ways.

Errors.  An OSError of a read or a send goes to ``error_received`` and the
transport stays open (an ICMP port unreachable arrives as
ConnectionRefusedError on a connected socket, at its next read or send);
anything else is fatal, with stock's texts.  Closing is stock's: ``close()``
stops reading and ends once the buffer has gone out, ``abort()`` drops it.
"""

from __future__ import annotations

import asyncio
import collections
import socket
from typing import Any

from . import _compat
from ._basetransport import TransportBase
from ._shared import TransportShared

__all__ = ["DatagramTransport"]

_SENDS_EMPTY = _compat.DATAGRAM_SENDS_EMPTY
_HEADER_SIZE = _compat.DATAGRAM_HEADER_SIZE

#: The most one datagram read returns: stock's max_size (its recvfrom size).
MAX_SIZE = 256 * 1024


#: What one recvfrom() of an IP socket asks for: a UDP payload is at most
#: 65,507 bytes over IPv4 and 65,527 over IPv6 (its length is 16 bits; a
#: jumbogram needs a link MTU over 64 KiB), and 64 KiB comes from the heap.
UDP_MAX = 65536


def _receive_view(sock: socket.socket, shared: TransportShared) -> memoryview | None:
    """Where a datagram is read: nowhere for an IP socket (recvfrom of
    UDP_MAX makes the bytes), else the loop's buffer, or one of MAX_SIZE."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        return None
    if len(shared.read_buffer) >= MAX_SIZE:
        return shared.read_view
    return memoryview(bytearray(MAX_SIZE))


class DatagramTransport(TransportBase, asyncio.DatagramTransport):
    """A datagram transport over a non-blocking socket (UDP or Unix)."""

    __slots__ = ("_address", "_batch", "_buffer", "_buffer_size", "_held", "_last_read",
                 "_stats", "_view")

    # Kept for code that reads it, as on stock; reads are bounded by MAX_SIZE.
    max_size = MAX_SIZE

    def __init__(
        self,
        loop: Any,
        sock: socket.socket,
        protocol: Any,
        address: Any = None,
        waiter: Any = None,
        extra: dict[str, Any] | None = None,
        *,
        shared: TransportShared,
    ) -> None:
        super().__init__(loop, sock, extra, None, shared, None)
        self._address = address  # create_datagram_endpoint's remote_addr, or None
        self._buffer: collections.deque[tuple[bytes, Any]] = collections.deque()
        self._buffer_size = 0  # payloads plus header bytes (see the module docstring)
        self._batch = shared.config.datagram_batch
        self._held: collections.deque[tuple[bytes, Any]] = collections.deque()
        self._last_read = 0  # datagrams the last event read (the compiled read's choice)
        self._stats = shared.stats  # (an attribute read less per event and per send)
        self._view = _receive_view(sock, shared)
        self.set_protocol(protocol)
        self._attach(None)
        self._schedule_start(waiter)

    # -- protocol and reading state ------------------------------------------

    def set_protocol(self, protocol: Any) -> None:
        self._protocol = protocol
        self._protocol_connected = True

    def _start_reading(self) -> None:
        if not self._closing and not self._paused:
            self._watch_read(self._read_ready)
            self._schedule_held()

    def get_write_buffer_size(self) -> int:
        return self._buffer_size

    # -- reading ----------------------------------------------------------

    def _read_ready(self) -> None:
        """One readiness event: up to the batch of datagrams (see the module
        docstring for where the batch ends)."""
        if self._closing or self._paused:
            return  # (a turn scheduled for held datagrams, since paused or closed)
        if self._held and not self._deliver_held():
            return
        stats = self._stats
        stats.datagram_read_events += 1
        sock: Any = self._sock
        view = self._view
        peer = self._peername or None  # a socketpair's is "": recvfrom tells None
        received = nbytes_in = 0
        last = 0  # the read that gave no datagram (EAGAIN, an error), if one did
        try:
            for _ in range(self._batch):
                last = 1
                try:
                    if view is None:  # an IP socket: the bytes in one call
                        if peer is None:
                            data, addr = sock.recvfrom(UDP_MAX)
                        else:
                            data = sock.recv(UDP_MAX)
                            addr = peer
                    elif peer is None:
                        nbytes, addr = sock.recvfrom_into(view)
                        data = view[:nbytes].tobytes()
                    else:
                        nbytes = sock.recv_into(view)
                        data = view[:nbytes].tobytes()
                        addr = peer
                except (BlockingIOError, InterruptedError):
                    stats.datagram_recv_eagain += 1
                    return
                except OSError as exc:
                    stats.datagram_errors += 1
                    self._protocol.error_received(exc)
                    return
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._fatal_error(exc, "Fatal read error on datagram transport")
                    return
                last = 0
                received += 1
                nbytes_in += len(data)
                self._protocol.datagram_received(data, addr)
                if self._closing or self._paused:
                    return
        finally:
            # Once per event, not per datagram: three increments per batch.
            stats.datagram_recv += received + last
            stats.datagrams_received += received
            stats.datagram_bytes_received += nbytes_in

    def _deliver_held(self) -> bool:
        """The held datagrams, in order: True once all are delivered, False
        if a callback paused reading or closed the transport (the rest stay
        held, or are dropped by the close).  After an exception, a turn is
        scheduled for the rest."""
        held = self._held
        stats = self._stats
        try:
            while held:
                data, addr = held.popleft()
                stats.datagrams_received += 1
                stats.datagram_bytes_received += len(data)
                self._protocol.datagram_received(data, addr)
                if self._closing or self._paused:
                    return False
        finally:
            self._schedule_held()
        return True

    def _schedule_held(self) -> None:
        """A turn for the held datagrams, where no readiness event may come
        for them (see the module docstring), unless reading is paused or
        the transport closing."""
        if self._held and not self._paused and not self._closing:
            self._loop.call_soon(self._read_ready, context=self._context)

    # -- writing ----------------------------------------------------------

    def sendto(self, data: Any, addr: Any = None) -> None:
        if type(data) is not bytes and not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data argument must be a bytes-like object, "
                            f"not {type(data).__name__!r}")
        if not data and not _SENDS_EMPTY:
            return
        if self._address:
            if addr not in (None, self._address):
                raise ValueError(f"Invalid address: must be None or {self._address}")
            addr = self._address
        if self._conn_lost and self._address:
            if self._conn_lost >= _compat.LOG_THRESHOLD_FOR_CONNLOST_WRITES:
                _compat.transport_logger().warning("socket.send() raised exception.")
            self._conn_lost += 1
            return
        if not self._buffer:
            # Nothing buffered: sent at once, as stock does (_send, its
            # success inline: a frame less per datagram).
            sock: Any = self._sock
            try:
                n = sock.send(data) if self._peername else sock.sendto(data, addr)
            except BaseException as exc:
                if self._send_failed(exc) is not False:
                    return
                self._watch_write()
            else:
                stats = self._stats
                stats.datagram_sent_ok += 1  # a send and a datagram sent (Counters)
                stats.datagram_bytes_sent += n
                return
        self._enqueue(data, addr)

    def _enqueue(self, data: Any, addr: Any) -> None:
        """A datagram to wait in the buffer for EPOLLOUT."""
        # A copy: the caller may reuse a bytearray once sendto() returns.
        chunk = bytes(data)
        self._buffer.append((chunk, addr))
        self._buffer_size += len(chunk) + _HEADER_SIZE
        self._maybe_pause_protocol()

    def _sendto_ready(self) -> None:
        """EPOLLOUT: the buffered datagrams, in order, until EAGAIN."""
        buffer = self._buffer
        while buffer:
            data, addr = buffer.popleft()
            self._buffer_size -= len(data) + _HEADER_SIZE
            sent = self._send(data, addr)
            if sent is None:
                return
            if not sent:
                buffer.appendleft((data, addr))  # Try again later.
                self._buffer_size += len(data) + _HEADER_SIZE
                break
        self._maybe_resume_protocol()  # May append to the buffer.
        if not buffer:
            self._unwatch_write()
            if self._closing and not self._conn_lost:
                # close() waited for the buffer: the end, now.
                self._conn_lost += 1
                self._call_connection_lost(None)

    def _send(self, data: Any, addr: Any) -> bool | None:
        """One datagram to the socket: True once sent, False if the kernel's
        buffer is full (EAGAIN), None if it failed (an OSError to
        error_received, as stock's; anything else fatal)."""
        sock: Any = self._sock
        try:
            n = sock.send(data) if self._peername else sock.sendto(data, addr)
        except BaseException as exc:
            return self._send_failed(exc)
        stats = self._stats
        stats.datagram_sent_ok += 1  # a send and a datagram sent (Counters)
        stats.datagram_bytes_sent += n
        return True

    def _send_failed(self, exc: BaseException) -> bool | None:
        """A send that raised *exc*: False for EAGAIN (the datagram waits),
        None after an OSError (to error_received, as stock's) or anything
        else (fatal, with stock's text)."""
        stats = self._stats
        stats.datagram_send += 1
        if isinstance(exc, (BlockingIOError, InterruptedError)):
            stats.datagram_send_eagain += 1
            return False
        if isinstance(exc, OSError):
            stats.datagram_errors += 1
            self._protocol.error_received(exc)
            return None
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            raise exc
        self._fatal_error(exc, "Fatal write error on datagram transport")
        return None

    # The writer TransportBase._watch_write registers.
    _write_ready = _sendto_ready

    # -- closing (close, abort: TransportBase's) ----------------------------
    #
    # With datagrams buffered, close() leaves the end to _sendto_ready, once
    # the buffer has gone out.

    def _drop_buffer(self) -> None:
        self._buffer.clear()
        self._buffer_size = 0

    def _lost(self) -> None:
        # EPOLLOUT off, as stock's close: a send that failed (error_received)
        # may have left the writer registered over an empty buffer.
        self._unwatch_write()

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        try:
            if self._protocol_connected:
                self._protocol.connection_lost(exc)
        finally:
            self._forget()
            self._held.clear()  # (a close drops them: see the module docstring)
            self._sock.close()  # type: ignore[union-attr]
            self._sock = None
            self._protocol = None
            self._loop = None
