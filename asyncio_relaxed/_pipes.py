"""The pipe transports: a subprocess's stdin, stdout and stderr, and
``connect_read_pipe`` / ``connect_write_pipe``.

Theory of operation
===================

Semantics are stock's (``unix_events._UnixReadPipeTransport`` and
``_UnixWritePipeTransport``, the same from 3.11 to 3.15 on Linux): the
accepted file kinds and their ValueError texts, connection_made then reading
in two handles, EOF as ``eof_received`` then ``connection_lost`` one handle
later, EIO (a pty whose other end closed) logged in debug mode only, a write
after ``close()`` or a failed write dropped and counted (the warning past
LOG_THRESHOLD_FOR_CONNLOST_WRITES), ``close()`` as ``write_eof()``, the
write end's reader that learns of the read end's close, flow control on a
``bytearray`` buffer.  What differs is how the bytes move:

Reads.  ``os.readv`` into the loop's one receive buffer and one exact-size
copy, where stock's ``os.read(fd, 256 KiB)`` allocates 256 KiB per read
(above glibc's mmap threshold: an mmap, a shrink and a munmap each).

Writes.  The write side is in one of the write queue's states
(:mod:`asyncio_relaxed._writes`), and the loop's write settings hold for a
pipe as for a socket.  In eager mode a write that finds the buffer empty is
written at once (stock's path); in deferred mode a write from a callback is
appended to the buffer and the transport queued, so everything the
iteration's callbacks write to a pipe leaves in one ``write`` at its end (a
program that writes a child's stdin line by line); a write made while the
loop is not running goes at once, as stock's.  Past the high-water mark the
buffer is written at once in either mode, so that ``drain()`` learns to
wait.  After a short write the partial_write policy decides: EPOLLOUT
(stock's) or a retry on the next iteration.  ``write_eof()`` (and
``close()``) writes a deferred write still queued first: stock's ``write()``
had written it, so the end is ``write_eof()``'s, from its context
(:mod:`asyncio_relaxed._writes`, "Contexts").  The buffer is one
``bytearray`` (stock's), so the one ``write`` needs no vector: a pipe's
writes are small, and appending them is cheaper than a ``writev`` of many.

The fds are not owned (:meth:`~asyncio_relaxed._poller.DeferredSelector.own`):
a pipe's file object may be closed by its Popen, not only by the transport,
so every interest removal goes to the kernel at once, as stock's does.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import warnings
from typing import Any

from . import _compat
from ._basetransport import Reading, repr_head
from ._shared import TransportShared
from ._writes import IDLE

__all__ = ["ReadPipeTransport", "WritePipeTransport"]

_readv = os.readv
_write = os.write


def _file_kind(fileno: int) -> tuple[bool, bool, bool]:
    """(character device, FIFO, socket) for *fileno*."""
    mode = os.fstat(fileno).st_mode
    return stat.S_ISCHR(mode), stat.S_ISFIFO(mode), stat.S_ISSOCK(mode)


def _polling(loop: Any, fileno: int, event: int) -> bool:
    """Whether *loop* polls *fileno* for *event* (stock's repr asks its
    selector the same)."""
    try:
        return bool(loop._selector.get_key(fileno).events & event)
    except (KeyError, ValueError, AttributeError):
        return False


class _PipeBase:
    """What both pipe transports share: the pipe, its fd, the protocol, the
    loop's shared state, and the end (connection_lost, then the pipe closed)."""

    _loop: Any
    _pipe: Any
    _fileno: Any
    _protocol: Any
    _closing: bool
    _shared: TransportShared
    _extra: dict[str, Any]

    def _adopt(self, loop: Any, pipe: Any, protocol: Any, shared: TransportShared,
               error: str) -> tuple[bool, bool, bool]:
        """Take *pipe* if it is a pipe, a socket or a character device (else
        stock's ValueError with *error*), non-blocking; its kind."""
        self._extra["pipe"] = pipe
        self._loop = loop
        self._pipe = pipe
        self._fileno = pipe.fileno()
        self._protocol = protocol
        self._shared = shared
        self._closing = False
        kind = _file_kind(self._fileno)
        if not any(kind):
            self._pipe = None
            self._fileno = None
            self._protocol = None
            raise ValueError(error)
        os.set_blocking(self._fileno, False)
        return kind

    def _started(self, waiter: Any) -> None:
        """connection_made() now scheduled: the waiter wakes after it."""
        if waiter is not None:
            self._loop.call_soon(_compat.set_result_unless_cancelled, waiter, None)

    def _describe(self, event: int) -> list[str]:
        info = repr_head(self, self._pipe is None, self._fileno)
        if self._pipe is not None and getattr(self._loop, "_selector", None) is not None:
            info.append("polling" if _polling(self._loop, self._fileno, event) else "idle")
        elif self._pipe is not None:
            info.append("open")
        else:
            info.append("closed")
        return info

    def set_protocol(self, protocol: Any) -> None:
        self._protocol = protocol

    def get_protocol(self) -> Any:
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if getattr(self, "_pipe", None) is not None:
            _warn(f"unclosed transport {self!r}", ResourceWarning, source=self)
            self._pipe.close()

    def _fatal_error(self, exc: BaseException,
                     message: str = "Fatal error on pipe transport") -> None:
        """Stock's: an OSError of the kind this end expects (_quiet) in the
        debug log only, anything else to the exception handler; then the
        close.  Called from an exception handler only."""
        if isinstance(exc, OSError) and self._quiet(exc):
            if self._loop.get_debug():
                _compat.pipe_logger().debug("%r: %s", self, message, exc_info=True)
        else:
            self._loop.call_exception_handler(
                {"message": message, "exception": exc, "transport": self,
                 "protocol": self._protocol}
            )
        self._close(exc)

    @staticmethod
    def _quiet(exc: OSError) -> bool:
        """Whether *exc* ends the pipe without a report (a write end: any OSError)."""
        return True

    def _close(self, exc: BaseException | None) -> None:
        raise NotImplementedError

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._pipe.close()
            self._pipe = None
            self._protocol = None
            self._loop = None


class ReadPipeTransport(_PipeBase, Reading, asyncio.ReadTransport):
    """The read end of a pipe (or a socket, or a character device)."""

    # Stock's attribute (its read size); reads here are bounded by the
    # loop's buffer (Config.read_size).
    max_size = 256 * 1024

    def __init__(self, loop: Any, pipe: Any, protocol: Any, waiter: Any = None,
                 extra: dict[str, Any] | None = None, *, shared: TransportShared) -> None:
        super().__init__(extra)
        self._paused = False
        self._adopt(loop, pipe, protocol, shared, "Pipe transport is for pipes/sockets only.")
        loop.call_soon(protocol.connection_made, self)
        # Reading starts only once connection_made() has run.
        loop.call_soon(self._start_reading)
        self._started(waiter)

    _logger = staticmethod(_compat.pipe_logger)

    def _add_reader(self, fd: int, callback: Any) -> None:
        """Stock's: watch *fd* unless reading is paused or closed."""
        if not self.is_reading():
            return
        self._loop._add_reader(fd, callback)

    def _start_reading(self) -> None:
        self._add_reader(self._fileno, self._read_ready)

    def _unwatch_read(self) -> None:
        self._loop._remove_reader(self._fileno)

    def __repr__(self) -> str:
        return "<{}>".format(" ".join(self._describe(1)))

    def _read_ready(self) -> None:
        shared = self._shared
        stats = shared.stats
        stats.pipe_read += 1
        try:
            nbytes = _readv(self._fileno, (shared.read_buffer,))
        except (BlockingIOError, InterruptedError):
            stats.pipe_read_eagain += 1
        except OSError as exc:
            self._fatal_error(exc, "Fatal read error on pipe transport")
        else:
            if nbytes:
                stats.pipe_bytes_read += nbytes
                self._protocol.data_received(shared.read_view[:nbytes].tobytes())
            else:
                if self._loop.get_debug():
                    _compat.pipe_logger().info("%r was closed by peer", self)
                self._closing = True
                self._loop._remove_reader(self._fileno)
                self._loop.call_soon(self._protocol.eof_received)
                self._loop.call_soon(self._call_connection_lost, None)

    def close(self) -> None:
        if not self._closing:
            self._close(None)

    @staticmethod
    def _quiet(exc: OSError) -> bool:
        """EIO: a pty whose other end closed."""
        return exc.errno == errno.EIO

    def _close(self, exc: BaseException | None) -> None:
        self._closing = True
        self._loop._remove_reader(self._fileno)
        self._loop.call_soon(self._call_connection_lost, exc)


class WritePipeTransport(_PipeBase, _compat.FlowControlMixin,  # type: ignore[misc]
                         asyncio.WriteTransport):
    """The write end of a pipe (or a socket, or a character device), on the
    loop's write queue."""

    # A pipe has no context of its own (nor has stock's): the write queue
    # runs its send in the context that queued it.
    _context = None

    def __init__(self, loop: Any, pipe: Any, protocol: Any, waiter: Any = None,
                 extra: dict[str, Any] | None = None, *, shared: TransportShared) -> None:
        super().__init__(extra, loop)  # type: ignore[call-arg]  # FlowControlMixin's
        self._buffer = bytearray()
        self._conn_lost = 0
        self._write_state = IDLE  # IDLE, QUEUED or POLLING (see _writes)
        self._feeds = 0  # Short writes retried without waiting, in a row.
        _, is_fifo, is_socket = self._adopt(
            loop, pipe, protocol, shared,
            "Pipe transport is only for pipes, sockets and character devices")
        loop.call_soon(protocol.connection_made, self)
        if is_socket or is_fifo:
            # The read end's close makes the write end readable (EOF): the
            # reader learns of it; it starts once connection_made() has run.
            loop.call_soon(loop._add_reader, self._fileno, self._read_ready)
        self._started(waiter)

    def __repr__(self) -> str:
        info = self._describe(2)
        if self._pipe is not None and getattr(self._loop, "_selector", None) is not None:
            info.append(f"bufsize={self.get_write_buffer_size()}")
        return "<{}>".format(" ".join(info))

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def _read_ready(self) -> None:
        # The pipe was closed by its read end.
        if self._loop.get_debug():
            _compat.pipe_logger().info("%r was closed by peer", self)
        if self._buffer:
            self._close(BrokenPipeError())
        else:
            self._close()

    def write(self, data: Any) -> None:
        assert isinstance(data, (bytes, bytearray, memoryview)), repr(data)
        if isinstance(data, memoryview) and (data.ndim != 1 or data.format != "B"):
            data = data.tobytes()  # sizes below are bytes
        if not data:
            return
        if self._conn_lost or self._closing:
            if self._conn_lost >= _compat.LOG_THRESHOLD_FOR_CONNLOST_WRITES:
                _compat.pipe_logger().warning(
                    "pipe closed by peer or os.write(pipe, data) raised exception.")
            self._conn_lost += 1
            return
        shared = self._shared
        if not self._buffer:
            # IDLE: nothing buffered (see the invariant in _writes).  A write
            # made while the loop is not running goes at once, as stock's:
            # its caller may block on the other end (os.read of a pty's
            # master, say) before the loop runs to flush it.
            if shared.deferred and len(data) <= self._high_water and self._loop.is_running():
                self._buffer += data
                shared.queue(self)
                return
            n = self._send(data)
            if n < 0 or n == len(data):
                return
            self._keep(data, n)
            shared.short(self)
        else:
            self._buffer += data  # QUEUED or POLLING: it leaves with the rest
            if len(self._buffer) > self._high_water and shared.unqueue(self):
                self._write_now()  # the queue will skip it
        self._maybe_pause_protocol()

    def _keep(self, data: Any, n: int) -> None:
        """Buffer what the kernel did not take of *data*: a copy, and no view
        of the caller's object left behind (PyPy frees views late, and a
        bytearray with a view cannot be resized)."""
        with memoryview(data) as view, view[n:] as rest:
            self._buffer += rest

    def _watch_write(self) -> None:
        self._loop._add_writer(self._fileno, self._write_ready)

    def _unwatch_write(self) -> None:
        self._loop._remove_writer(self._fileno)

    def _write_ready(self) -> None:
        """EPOLLOUT: the pipe can take more."""
        self._write_now()

    def _send(self, data: Any) -> int:
        """The one send: ``os.write`` of *data*, counted.  What the pipe took
        (0 when it is full), or -1 after a failure, which is fatal: the
        buffer is dropped and the transport closes."""
        stats = self._shared.stats
        stats.pipe_write += 1
        try:
            n = _write(self._fileno, data)
        except (BlockingIOError, InterruptedError):
            stats.pipe_write_eagain += 1
            return 0
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._buffer.clear()  # (as stock's, before the exception handler hears of it)
            self._conn_lost += 1
            self._fatal_error(exc, "Fatal write error on pipe transport")  # _close: IDLE
            return -1
        stats.pipe_bytes_written += n
        return n

    def _write_now(self) -> None:
        """The send: as much of the buffer as the pipe takes, in one write,
        then what follows (called IDLE by the queue's flush or a write past
        the high-water mark, or POLLING by EPOLLOUT).  Short: the policy
        waits (WriteQueue.short); all of it: IDLE, the protocol may resume
        (and write), a close() waiting for the buffer ends."""
        buffer = self._buffer
        if not buffer:  # (a failed write or an abort emptied it)
            return
        n = self._send(buffer)
        if n < 0:
            return
        shared = self._shared
        if n < len(buffer):
            del buffer[:n]
            shared.short(self)
            return
        buffer.clear()
        shared.emptied(self)
        # A close() made while the buffer was full ends now; one made by
        # resume_writing() below found the buffer empty and scheduled its end.
        closing = self._closing
        self._maybe_resume_protocol()  # May write (IDLE now: as any write).
        if closing:
            self._loop._remove_reader(self._fileno)
            self._call_connection_lost(None)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self._closing:
            return
        assert self._pipe
        if self._buffer and self._shared.take_back(self):
            # A deferred write still queued: stock's write() sent it, so its
            # end is this call's, from its context (_writes, "Contexts").
            self._write_now()
            if self._closing:  # the write failed: its end is scheduled
                return
        self._closing = True
        if not self._buffer:
            self._loop._remove_reader(self._fileno)
            self._loop.call_soon(self._call_connection_lost, None)
        # Otherwise the send that empties the buffer ends the connection.

    def close(self) -> None:
        if self._pipe is not None and not self._closing:
            self.write_eof()  # all a write end needs to close

    def abort(self) -> None:
        self._close(None)

    def _close(self, exc: BaseException | None = None) -> None:
        self._closing = True
        self._shared.emptied(self)  # IDLE: EPOLLOUT off if POLLING, a QUEUED flush skips it
        self._buffer.clear()
        self._loop._remove_reader(self._fileno)
        self._loop.call_soon(self._call_connection_lost, exc)
