"""The socket transport: one read per event, deferred or eager writes.

Theory of operation
===================

Reads.  Each readiness event does one read.  A plain Protocol gets ``bytes``;
while the traffic comes in pieces under 64 KiB that is ``recv(64 KiB)``: CPython
allocates the 64 KiB from the heap (below glibc's 128 KiB mmap threshold) and
shrinks the result in place, cheaper than a copy out of a buffer.  A read that
fills those 64 KiB switches the transport to ``recv_into`` on the buffer the
loop allocated once (``read_size``, stock's 256 KiB, page-aligned: see
:func:`~asyncio_relaxed._sockets.read_buffer`) plus an exact-size copy, until
two reads in a row come in under 64 KiB; so a bulk transfer still reads as
much per call as stock, and a message just over 64 KiB (the tail of each
100 KiB echo, the benchmark suite's echo-protocol-100k) does not flip the
transport back and forth, which cost a second read and a second
data_received per message.  A read that fills the whole buffer means
streaming: the transport then calls ``recv(read_size)`` like stock until a
read comes in short.  A BufferedProtocol gets ``recv_into`` on its own
buffer.  Stock asyncio calls ``sock.recv(256 KiB)``, and glibc serves a
256 KiB allocation with mmap, so every read costs mmap + mremap + munmap
besides the recv (strace, 1 KiB echo).

Writes.  ``_buffer`` is a list of immutable chunks (a bytearray or a
memoryview of one is copied, so the caller may reuse it when ``write``
returns); ``_buffer_size`` is their total, kept so flow control never walks
the list.  The write states (idle, queued, polling), their transitions and
the loop's write queue are :mod:`asyncio_relaxed._writes`'.

One send primitive, :meth:`SocketTransport._write_now`, sends what the buffer
holds (``send`` for one chunk, ``sendmsg`` for more), counts it, handles
EAGAIN and errors, keeps what the kernel did not take and moves the state:
the queue's flush, EPOLLOUT, ``writelines`` and a send past the high-water
mark all call it.  ``write()`` has the one fast path beside it: in eager
mode a write that finds nothing buffered is sent from ``write()`` itself
(stock and uvloop 0.23), without buffering it first.  In deferred mode a
write only queues.  In every mode, a write that takes the buffer past the
high-water mark is sent at once: code that writes a lot and then waits for
``drain()`` must not wait for the end of the iteration to learn it should
pause (the stdlib start_tls tests depend on that).  After a short send the
policy decides: ``poll`` waits for EPOLLOUT, ``feed`` retries on the next
iteration.

``close()`` keeps the connection until the buffer is empty, then closes;
``abort()`` drops the buffer.  Nothing written before ``close()`` is lost.
A deferred write still queued goes out first, from ``close()``: stock's
``write()`` had sent it, so the end is ``close()``'s, from its context.

Error texts and the exception-handler contexts are stock asyncio's
(``selector_events._SelectorSocketTransport``), so logs and tests read the same.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from . import _compat
from ._basetransport import ASK, TransportBase
from ._shared import TransportShared
from ._sockets import C_CLOSE, HAS_SENDMSG, IOV_MAX, SMALL_READ, is_tcp, set_options
from ._writes import IDLE

__all__ = ["SMALL_READ", "SocketTransport"]

_SOCKET: Any = socket.socket

# The write buffer of a transport that never had to buffer (see __init__).
_NO_BUFFER: Any = ()

# The read modes of a plain Protocol's transport, kept in _recv_size (see
# "Reads" above), with the one read routine _read_ready__data_received:
#   shared.small_read  recv(small_read); a read that fills it -> _BUFFER
#   a larger size      streaming: recv(size); a short read -> _BUFFER
#   _BUFFER            recv_into the loop's buffer; a read that fills it
#                      -> streaming, a short one -> _BUFFER_SHORT
#   _BUFFER_SHORT      the same; a second short read in a row -> small_read
_BUFFER = 0
_BUFFER_SHORT = -1

# A BufferedProtocol read's failures, by the step that failed (stock's texts).
_BUFFERED_FAILED = {
    "get_buffer": "Fatal error: protocol.get_buffer() call failed.",
    "recv": "Fatal read error on socket transport",
    "buffer_updated": "Fatal error: protocol.buffer_updated() call failed.",
}

# write()'s TypeError, in each version's words.
_WRITE_TYPE_ERROR = (
    "data argument must be a bytes, bytearray, or memoryview object, not {!r}"
    if _compat.PY314
    else "data argument must be a bytes-like object, not {!r}"
)


def _writelines_views(list_of_data: Any, eof: bool, sendfile: bool) -> list[memoryview] | None:
    """writelines()'s chunks as views, checked as each version's stock
    checks them (its errors, in its order), or None where stock returns
    before it looks for a lost connection."""
    if not _compat.PY312:
        # 3.11's stock is WriteTransport.writelines: it joins the chunks
        # (the join's TypeError comes first), then calls write().
        chunks = list(list_of_data)
        if not all(isinstance(data, (bytes, bytearray, memoryview)) for data in chunks):
            # The join's own TypeError, in this interpreter's words (PyPy's
            # says "expected bytes, str found"); a buffer it takes is
            # written, as stock writes it.
            b"".join(chunks)
        if eof:
            raise RuntimeError("Cannot call write() after write_eof()")
        if sendfile:
            raise RuntimeError("unable to write; sendfile is in progress")
        views = [memoryview(data) for data in chunks if data]
        # write(b"") returns before it looks for a lost connection.
        return views or None
    if eof:
        raise RuntimeError("Cannot call writelines() after write_eof()")
    if sendfile:
        raise RuntimeError("unable to writelines; sendfile is in progress")
    chunks = list(list_of_data)
    if _compat.PY314:
        # Stock skips empty chunks before it looks at them (gh-155888).
        views = [memoryview(data) for data in chunks if data]
    else:
        views = [memoryview(data) for data in chunks]  # stock's TypeError text
    return views if chunks else None


class SocketTransport(TransportBase):
    """A stream transport over a non-blocking socket (TCP or Unix): read,
    write, close."""

    __slots__ = (
        "_buffer",
        "_buffer_size",
        "_empty_waiter",
        "_eof",
        "_feeds",
        "_recv_size",
        "_sending",
        "_write_guard",
        "_write_state",
    )

    # Read by base_events.start_tls and base_events.sendfile.
    _start_tls_compatible = True
    _sendfile_compatible = _compat.SENDFILE_TRY_NATIVE

    # Kept for code that reads it; our reads are bounded by the loop's
    # buffer (Config.read_size), not by this attribute.
    max_size = 256 * 1024

    def __init__(
        self,
        loop: Any,
        sock: socket.socket,
        protocol: Any,
        waiter: Any = None,
        extra: dict[str, Any] | None = None,
        server: Any = None,
        shared: TransportShared | None = None,
        inherited_options: bool = False,
        context: Any = None,
        peername: Any = ASK,
        sockname: Any = None,
    ) -> None:
        # (The accept path passes every argument by position: a call with
        # keywords makes a dict of them, per connection.)
        assert shared is not None, "a transport needs its loop's TransportShared"
        TransportBase.__init__(self, loop, sock, extra, server, shared, context, peername,
                               sockname)
        # The read mode (see _BUFFER): small reads first.
        self._recv_size = shared.small_read
        # set_protocol(protocol) on a transport that had none: nothing to swap.
        self._protocol = protocol
        self._protocol_connected = True
        # A list, not a deque: an empty deque costs 760 bytes per connection
        # (its first block), a list 56; chunks leave from the front only in
        # _consume, with one slice deletion per send.  Made by the first
        # write that has to buffer (_NO_BUFFER until then), dropped again
        # when all of it went out: an idle connection has none.
        self._buffer: list[bytes | memoryview] = _NO_BUFFER
        self._buffer_size = 0
        self._eof = False  # Set when write_eof() is called.
        self._empty_waiter: Any = None  # Set while loop.sendfile() waits.
        # Set when write() must check the three above (after write_eof(),
        # while sendfile waits, once the connection is lost); cleared only
        # when sendfile ends with neither of the others.
        self._write_guard = False
        self._write_state = IDLE  # IDLE, QUEUED or POLLING (see _writes)
        self._sending = False  # Set while _write_now runs resume_writing() (re-entrancy guard).
        self._feeds = 0  # Short writes retried without waiting, in a row.
        self._attach(server)

        # Disable Nagle: small writes leave without waiting for the peer's ACK.
        # An accepted socket inherited it and the keepalive options from its
        # listener (Linux), which saves a setsockopt per option per connection.
        if not inherited_options:
            _compat.set_nodelay(sock)
            if shared.tcp_sockopts and is_tcp(sock):
                set_options(sock, shared.tcp_sockopts)
        self._schedule_start(waiter)

    # -- protocol and reading state ------------------------------------------

    def set_protocol(self, protocol: Any) -> None:
        old = self._protocol
        self._protocol = protocol
        self._protocol_connected = True
        if old is not None and self._read_method(old) != self._read_method(protocol):
            # The poller holds the old kind's read method: swap it (same
            # mask, so no system call).
            try:
                reader = self._shared.poller.get_key(self._sock_fd).data[0]
            except (KeyError, ValueError):
                return
            if (reader is not None and not reader._cancelled
                    and reader._callback == self._read_method(old)):
                self._watch_read(self._read_method(protocol))

    def _read_method(self, protocol: Any) -> Any:
        """The read method for *protocol*'s kind (buffered or not)."""
        if isinstance(protocol, asyncio.BufferedProtocol):
            return self._read_ready__get_buffer
        return self._read_ready__data_received

    @property
    def _read_ready_cb(self) -> Any:
        """The protocol kind's read method (stock's attribute), derived from
        the protocol instead of kept: a slot less per connection.  None once
        the transport is closing on 3.14+, where stock clears it at close()."""
        if _compat.PY314 and (self._closing or self._protocol is None):
            return None
        return self._read_method(self._protocol)

    def _start_reading(self) -> None:
        # The reader is the protocol kind's own read method, not _read_ready:
        # one call less per read.  set_protocol() re-registers on a change.
        # (_watch_read's call, made here: one frame less per connection.)
        if not self._closing and not self._paused:
            self._loop._set_callback(self._sock_fd, 0, self._read_method(self._protocol), (),
                                     self._context)

    def get_write_buffer_size(self) -> int:
        return self._buffer_size

    def can_write_eof(self) -> bool:
        return True

    # -- reading ----------------------------------------------------------

    def _read_ready(self) -> None:
        self._read_method(self._protocol)()

    def _read_ready__data_received(self) -> None:
        if self._conn_lost:
            return
        shared = self._shared
        shared.stats.recv += 1
        try:
            size = self._recv_size
            if size == shared.small_read:
                data = self._sock.recv(size)  # type: ignore[union-attr]
                if len(data) == size:
                    self._recv_size = _BUFFER
            elif size > 0:  # streaming
                data = self._sock.recv(size)  # type: ignore[union-attr]
                if len(data) < size:
                    self._recv_size = _BUFFER
            else:
                buffer = shared.read_buffer
                nbytes = self._sock.recv_into(buffer)  # type: ignore[union-attr]
                data = shared.read_view[:nbytes].tobytes()
                if nbytes == len(buffer) and nbytes > SMALL_READ:
                    self._recv_size = nbytes  # streaming
                elif nbytes >= SMALL_READ:
                    self._recv_size = _BUFFER
                elif size == _BUFFER_SHORT:
                    self._recv_size = shared.small_read
                else:
                    self._recv_size = _BUFFER_SHORT
        except (BlockingIOError, InterruptedError):
            shared.stats.recv_eagain += 1
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal read error on socket transport")
            return
        if not data:
            self._read_ready__on_eof()
            return
        try:
            self._protocol.data_received(data)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.data_received() call failed.")

    def _read_ready__get_buffer(self) -> None:
        """A BufferedProtocol's read: recv_into its own buffer.  Its three
        steps' failures are stock's (_SelectorSocketTransport), each fatal."""
        if self._conn_lost:
            return
        protocol = self._protocol
        step = "get_buffer"
        try:
            buf = protocol.get_buffer(-1)
            if not len(buf):
                raise RuntimeError("get_buffer() returned an empty buffer")
            step = "recv"
            self._shared.stats.recv += 1
            nbytes = self._sock.recv_into(buf)  # type: ignore[union-attr]
            if nbytes:
                step = "buffer_updated"
                protocol.buffer_updated(nbytes)
                return
        except (BlockingIOError, InterruptedError) as exc:
            if step == "recv":
                self._shared.stats.recv_eagain += 1
            else:
                self._fatal_error(exc, _BUFFERED_FAILED[step])
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, _BUFFERED_FAILED[step])
            return
        self._read_ready__on_eof()

    def _read_ready__on_eof(self) -> None:
        if self._loop._debug:  # get_debug()
            _compat.transport_logger().debug("%r received EOF", self)
        try:
            keep_open = self._protocol.eof_received()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.eof_received() call failed.")
            return
        if keep_open:
            # The protocol may still write, but nothing more can be read.
            self._unwatch_read()
        else:
            self.close()

    # -- writing ----------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if type(data) is not bytes:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(_WRITE_TYPE_ERROR.format(type(data).__name__))
            if type(data) is memoryview and (data.ndim != 1 or data.format != "B"):
                data = data.tobytes()  # offsets below are bytes
        if self._write_guard:
            # Stock's three refusals, in stock's order; one flag read instead
            # of three while none applies (the flag's comment in __init__).
            if self._eof:
                raise RuntimeError("Cannot call write() after write_eof()")
            if self._empty_waiter is not None:
                raise RuntimeError("unable to write; sendfile is in progress")
            if data and self._conn_lost:
                self._drop_write_after_loss()
                return
        if not data:
            return
        shared = self._shared
        if not self._buffer:
            # Nothing buffered: the transport is IDLE, or its send is running
            # (_sending: resume_writing() writes) (see _writes).
            if not shared.deferred or (len(data) > self._high_water and not self._sending):
                # The one fast path beside _write_now: sent from write()
                # without buffering it first (order is safe: nothing is
                # buffered).  Every such write in eager mode; in deferred
                # mode a write that alone passes the high-water mark, which
                # the queue would send at once anyway (_check_high_water).
                # What it saves: docs/design.md, "The write queue".
                shared.stats.sent_at_once += 1  # one write, one send (Counters)
                try:
                    n = self._sock.send(data)  # type: ignore[union-attr]
                except (BlockingIOError, InterruptedError):
                    shared.stats.send_eagain += 1
                    n = 0
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._fatal_error(exc, "Fatal write error on socket transport")
                    return
                if n == len(data):
                    return
                shared.stats.partial_writes += 1
                self._append(memoryview(data)[n:] if n else data)
                shared.short(self)
                self._maybe_pause_protocol()
                return
            if type(data) is bytes and not self._sending:
                # Deferred mode, the first write since the buffer emptied,
                # under the high-water mark: buffer it (bytes need no copy)
                # and queue the transport.
                self._buffer = [data]
                self._buffer_size = len(data)
                shared.stats.queued_at_once += 1  # a write, and a deferred one (Counters)
                shared.queue(self)
                return
        self._append(data)
        if not self._write_state and not self._sending:
            shared.stats.queued_at_once += 1
            shared.queue(self)
        else:
            shared.stats.writes += 1
        if self._buffer_size > self._high_water:  # else flow control has nothing to do
            self._check_high_water()

    def writelines(self, list_of_data: Any) -> None:
        views = _writelines_views(list_of_data, self._eof, self._empty_waiter is not None)
        if views is None:
            return
        if self._conn_lost:
            self._drop_write_after_loss()
            return
        views = [view for view in views if view.nbytes]
        if not views:
            return
        for view in views:
            self._append(view)
        stats = self._shared.stats
        if self._write_state or self._sending:
            stats.writes += 1
            self._check_high_water()
        elif not self._shared.deferred:
            # IDLE before: one sendmsg for all of it, as stock 3.12+ does;
            # unlike stock 3.12.0-3.12.8 the protocol is paused if it stays
            # buffered (gh-127655: unbounded buffer growth).
            stats.writes += 1
            self._write_now(True)
            self._maybe_pause_protocol()
        else:
            stats.queued_at_once += 1  # a write, and a deferred one (Counters)
            self._shared.queue(self)
            self._check_high_water()

    def _drop_write_after_loss(self) -> None:
        """A write after the connection was lost: dropped, as in stock (which
        warns once the count passes LOG_THRESHOLD_FOR_CONNLOST_WRITES)."""
        if self._conn_lost >= _compat.LOG_THRESHOLD_FOR_CONNLOST_WRITES:
            _compat.transport_logger().warning("socket.send() raised exception.")
        self._conn_lost += 1  # _write_guard is set already (with the first _conn_lost)

    def _append(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer *data*, copying what the caller could mutate afterwards."""
        if isinstance(data, memoryview):
            if (
                data.readonly
                and isinstance(data.obj, bytes)
                and data.ndim == 1
                and data.format == "B"
            ):
                chunk: bytes | memoryview = data  # a view of immutable bytes
            else:
                chunk = data.tobytes()
        elif isinstance(data, bytes):
            chunk = data
        else:
            chunk = bytes(data)
        if self._buffer is _NO_BUFFER:
            self._buffer = [chunk]
        else:
            self._buffer.append(chunk)
        self._buffer_size += len(chunk)

    def _check_high_water(self) -> None:
        """Send at once past the high-water mark, then apply flow control."""
        if self._buffer_size > self._high_water and self._shared.unqueue(self):
            self._write_now()  # the queue will skip it
        self._maybe_pause_protocol()

    def _write_ready(self) -> None:
        """EPOLLOUT: the socket can take more (sendmsg, as stock's
        _write_sendmsg, whatever the buffer holds)."""
        self._write_now(True)

    def _write_now(self, vectored: bool = False) -> None:
        """The send primitive: as much of the buffer as the kernel takes, in
        one call, and what follows.

        ``send`` for one buffer (what stock's write() calls), ``sendmsg`` of
        up to IOV_MAX for more, or for any number when *vectored* (EPOLLOUT
        and writelines, where stock calls sendmsg).  EAGAIN sends nothing;
        any other error is fatal.  The rest stays buffered and waits by
        policy (WriteQueue.short); a paused protocol may resume (and write:
        ``_sending``); an emptied buffer sets the transport IDLE and ends a
        close(), a write_eof() or a sendfile wait.

        Called on an IDLE transport (the queue's flush, writelines, a send
        past the high-water mark) or a POLLING one (EPOLLOUT).
        """
        buffer = self._buffer
        if self._conn_lost or not buffer:
            return
        stats = self._shared.stats
        chunks = len(buffer)
        try:
            if (chunks == 1 and not vectored) or not HAS_SENDMSG:
                stats.send += 1
                n = self._sock.send(buffer[0])  # type: ignore[union-attr]
            else:
                stats.sendmsg += 1
                if chunks > 1:
                    stats.writes_coalesced += min(chunks, IOV_MAX)
                n = self._sock.sendmsg(  # type: ignore[union-attr]
                    buffer if chunks <= IOV_MAX else buffer[:IOV_MAX]
                )
        except (BlockingIOError, InterruptedError):
            stats.send_eagain += 1
            n = 0
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._write_failed(exc)
            return
        if n == self._buffer_size:
            # All of it went out, the common case.  The list goes too: an
            # idle connection then holds no buffer (56 bytes each, measured
            # on the idle-10000 workload in deferred mode), and the next
            # write makes a new one for about what refilling this would cost.
            self._buffer = _NO_BUFFER
            self._buffer_size = 0
            if not (self._write_state or self._feeds or self._protocol_paused
                    or self._closing or self._write_guard):
                return  # IDLE already, nothing to resume or end
            short = False
        else:
            if n:
                self._consume(n)
            stats.partial_writes += 1
            short = True
        if self._protocol_paused:  # else _maybe_resume_protocol does nothing
            # _sending: a write() from resume_writing() appends, and this
            # call decides below whether to queue or poll.
            self._sending = True
            try:
                self._maybe_resume_protocol()  # May append to the buffer.
            finally:
                self._sending = False
        if self._buffer:
            if short:
                self._shared.short(self)
            elif not self._write_state:
                # resume_writing() wrote more after everything went out.
                self._shared.stats.writes_deferred += 1
                self._shared.queue(self)
        else:
            self._write_done()

    def _consume(self, n: int) -> None:
        """Drop the first *n* bytes sent from the buffer."""
        buffer = self._buffer
        self._buffer_size -= n
        sent = 0  # chunks sent whole
        while n:
            chunk = buffer[sent]
            size = len(chunk)
            if size <= n:
                sent += 1
                n -= size
            else:
                buffer[sent] = memoryview(chunk)[n:]
                break
        del buffer[:sent]

    def _write_done(self) -> None:
        """Everything buffered went out."""
        self._shared.emptied(self)
        waiter = self._empty_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self._conn_lost:
            # close() or abort() from resume_writing() already scheduled
            # connection_lost; running it here too would tear down twice
            # (stock guards the same case since 3.14, gh-156512).
            return
        if self._closing:
            self._conn_lost += 1
            self._lost()
            self._call_connection_lost(None)
        elif self._eof:
            self._sock.shutdown(socket.SHUT_WR)  # type: ignore[union-attr]

    def _write_failed(self, exc: BaseException) -> None:
        if self._buffer:
            self._buffer.clear()
        self._buffer_size = 0
        self._shared.emptied(self)
        self._fatal_error(exc, "Fatal write error on socket transport")
        waiter = self._empty_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def write_eof(self) -> None:
        if self._closing or self._eof:
            return
        self._eof = True
        self._write_guard = True
        if not self._buffer:
            self._sock.shutdown(socket.SHUT_WR)  # type: ignore[union-attr]

    # -- sendfile support (base_events._sendfile_native) ------------------

    def _make_empty_waiter(self) -> Any:
        if self._empty_waiter is not None:
            raise RuntimeError("Empty waiter is already set")
        self._empty_waiter = self._loop.create_future()
        self._write_guard = True
        if not self._buffer:
            self._empty_waiter.set_result(None)
        return self._empty_waiter

    def _reset_empty_waiter(self) -> None:
        self._empty_waiter = None
        self._write_guard = self._eof or bool(self._conn_lost)

    # -- closing (close, abort: TransportBase's) ----------------------------
    #
    # With data buffered, close() leaves the end to the last flush or
    # EPOLLOUT that empties the buffer (_write_done): data written before
    # close() is delivered.

    def _send_before_close(self) -> None:
        # A deferred write still queued: stock's write() sent it, so its end
        # is close()'s, from the closer's context (_writes, "Contexts").
        if self._shared.take_back(self):
            self._write_now()

    def _drop_buffer(self) -> None:
        if self._buffer:
            self._buffer.clear()
            self._buffer_size = 0
        self._shared.emptied(self)

    def _lost(self) -> None:
        self._write_guard = True  # write() now checks _conn_lost

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        try:
            if self._protocol_connected:
                self._protocol.connection_lost(exc)
        finally:
            self._socket_lost()

    def _socket_lost(self) -> None:
        """The end: the socket closed, the transport out of its loop and server."""
        # close() or _force_close() released the fd: nothing is deferred.
        self._forget()
        sock: Any = self._sock
        if type(sock) is _SOCKET:
            # socket.socket.close(), its body inline (_sockets.C_CLOSE).
            sock._closed = True
            if sock._io_refs <= 0:
                C_CLOSE(sock)
        else:
            sock.close()
        self._sock = None
        self._protocol = None
        self._loop = None
        self._detach_server()
        waiter = self._empty_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError("Connection is closed by peer"))
