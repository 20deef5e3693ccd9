"""The socket transport: one read per event, deferred or eager writes.

Theory of operation
===================

Reads.  Each readiness event does one read.  A plain Protocol gets ``bytes``;
while the traffic comes in pieces under 64 KiB that is ``recv(64 KiB)``: CPython
allocates the 64 KiB from the heap (below glibc's 128 KiB mmap threshold) and
shrinks the result in place, cheaper than a copy out of a buffer.  A read that
fills those 64 KiB switches the transport to ``recv_into`` on the buffer the
loop allocated once (``read_size``, stock's 256 KiB, page-aligned: see
:func:`read_buffer`) plus an exact-size copy, until two reads in a row come in
under 64 KiB; so a bulk transfer still reads as much per call as stock, and a
message just over 64 KiB (the tail of each 100 KiB echo, the benchmark suite's
echo-protocol-100k) does not flip the transport back and forth, which cost a
second read and a second data_received per message.  A read that fills the
whole buffer means streaming: the transport then calls ``recv(read_size)``
like stock until a read comes in short.  Full-size reads are what glibc serves
from the heap (freeing one full-size mmapped chunk raises its mmap threshold),
so the copy out of the shared buffer is the dearer part there.
A BufferedProtocol gets ``recv_into`` on its own buffer.  Stock asyncio calls
``sock.recv(256 KiB)``, and glibc serves a 256 KiB allocation with mmap, so
every read costs mmap + mremap + munmap besides the recv (strace, 1 KiB echo).

Writes.  ``_buffer`` is a list of immutable chunks (a bytearray or a
memoryview of one is copied, so the caller may reuse it when ``write``
returns); ``_buffer_size`` is their total, kept so flow control never walks
the list.  The write states (idle, queued, polling) and the loop's write
queue are described in :mod:`asyncio_relaxed._writes`.

``write()`` in eager mode sends at once when idle (stock and uvloop 0.23);
in deferred mode it only queues.  In every mode, a write that takes the
buffer past the high-water mark is sent at once: code that writes a lot and
then waits for ``drain()`` must not wait for the end of the iteration to
learn it should pause (the stdlib start_tls tests depend on that); an idle
transport sends a write that alone passes the mark straight from ``write()``,
without a round trip through the queue.  After a short send the policy
decides: ``poll`` waits for EPOLLOUT, ``feed`` retries on the next iteration.

``close()`` keeps the connection until the buffer is empty, then closes;
``abort()`` drops the buffer.  Nothing written before ``close()`` is lost.

What the transport needs of its loop beyond stock's transport API
(``call_soon``, ``_add_reader``, ``_transports``...) is one object,
:class:`TransportShared`, that the loop makes and hands to every transport.

Error texts and the exception-handler contexts are stock asyncio's
(``selector_events._SelectorSocketTransport``), so logs and tests read the same.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import socket
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from . import _compat
from ._config import Config, PartialWrite, WriteMode
from ._stats import Counters
from ._writes import IDLE, POLLING, QUEUED, WriteQueue

__all__ = ["SocketTransport", "TransportShared", "is_tcp", "read_buffer", "set_options"]

try:
    IOV_MAX: int = max(16, os.sysconf("SC_IOV_MAX"))
except (AttributeError, ValueError, OSError):
    IOV_MAX = 16

# get_extra_info's fallback when the caller passed no extra keys of its own.
_NO_EXTRA: Mapping[str, Any] = MappingProxyType({})
# Where BaseTransport keeps _extra; the transport's _extra is a property.
_RAW_EXTRA: Any = _compat.TRANSPORT_EXTRA_SLOT
_STOCK_GET_EXTRA_INFO = _compat.STOCK_GET_EXTRA_INFO
_Base: Any = _compat.FlowControlMixin

# The local address of accepted sockets, one tuple per distinct address: every
# connection a listener accepts has the same sockname (one per local address
# the listener answers on), so they share it instead of holding a copy each
# (a tuple and a str, 114 bytes).
_SERVER_SOCKNAMES: dict[Any, Any] = {}

# The host strings of accepted connections' peer addresses, one str per
# distinct host: a server behind a proxy or load balancer (or a pre-forked
# pool behind nginx) sees every connection come from the same few hosts, and
# each accepted address would carry its own copy of the string (58 bytes for
# "127.0.0.1").  Peers from distinct hosts share nothing and cost one dict
# lookup each.
_PEER_HOSTS: dict[Any, Any] = {}

# Entries of each of those caches at most: at the cap one starts over
# (listeners and peers come and go).
_SHARED_MAX = 1024

# Flow control's default marks, stock's: 64 KiB, and a quarter of it.
_DEFAULT_HIGH_WATER = 64 * 1024
_DEFAULT_LOW_WATER = _DEFAULT_HIGH_WATER // 4

# The write buffer of a transport that never had to buffer (see __init__).
_NO_BUFFER: Any = ()

_HAS_SENDMSG = hasattr(socket.socket, "sendmsg")
# The most buffered chunks the deferred flush sends without _write_now: in
# one sendmsg, or one send where there is no sendmsg (_write_now sends the
# first chunk alone there).
_FLUSH_MAX_CHUNKS = IOV_MAX if _HAS_SENDMSG else 1

# The size of a small read (see "Reads" above): under glibc's default
# M_MMAP_THRESHOLD (128 KiB), so recv() allocates from the heap.
SMALL_READ = 64 * 1024

# write()'s TypeError, in each version's words.
_WRITE_TYPE_ERROR = (
    "data argument must be a bytes, bytearray, or memoryview object, not {!r}"
    if _compat.PY314
    else "data argument must be a bytes-like object, not {!r}"
)


def read_buffer(size: int) -> mmap.mmap | bytearray:
    """The loop's receive buffer: *size* bytes starting on a page boundary.

    Why aligned: the kernel's copy of received data into the buffer
    (``_copy_to_iter`` in a perf profile) is much dearer when the buffer
    starts a few bytes past a page boundary and the data came from the
    peer in page-sized chunks, as bulk data does.  A ``bytearray(256 KiB)``
    starts exactly there: glibc serves it with mmap and returns the page
    start + 16 (its chunk header); or, once freeing a large block has raised
    glibc's mmap threshold, a heap address whose offset depends on what the
    process allocated before.  echo-protocol-100k-c10 with the buffer placed
    at a chosen offset: 58-78 µs system CPU per request at page offset 16,
    26-33 at offset 0 or 2048, with the same system calls in every case.

    An anonymous mmap is page-aligned whatever the heap's history.
    MAP_PRIVATE because mmap's default, MAP_SHARED, would let a process
    forked after this and its parent overwrite each other's reads.  Where
    there is no anonymous mmap (Windows), a bytearray.
    """
    if hasattr(mmap, "MAP_ANONYMOUS"):
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return bytearray(size)


class TransportShared(WriteQueue):
    """What a loop hands its transports: its settings and counters, the write
    queue and the write settings (:class:`WriteQueue`), the poller's
    ownership calls, the one receive buffer of its plain-Protocol
    transports, and the keepalive options for TCP connections.  The
    transport reads nothing else of the loop that stock's transport would
    not.  (The loop keeps its listeners here too: one attribute of its own
    less.)"""

    __slots__ = ("config", "poller", "read_buffer", "read_size", "read_view", "serving",
                 "tcp_sockopts")

    def __init__(self, config: Config, stats: Counters, poller: Any) -> None:
        super().__init__(
            stats,
            _send_queued,
            deferred=config.write is WriteMode.DEFERRED,
            feed=config.partial_write is PartialWrite.FEED,
            feed_limit=config.feed_limit,
            contexts=_compat.PY315,
        )
        self.config = config
        self.poller = poller
        self.serving: Any = None  # the loop's listeners (_serving.Serving), not for transports
        self.read_size = config.read_size
        self.read_buffer = read_buffer(config.read_size)
        self.read_view = memoryview(self.read_buffer)
        # (level, option, value) for every TCP connection: the keepalive knobs.
        self.tcp_sockopts: list[tuple[int, int, int]] = [
            (getattr(socket, level), getattr(socket, option), value)
            for level, option, value in config.tcp_options()
            if hasattr(socket, option)
        ]


def _shared(cache: dict[Any, Any], value: Any) -> Any:
    """The object equal to *value* that *cache* holds (*value* itself, the
    first time): one object per distinct value, whoever asks."""
    shared = cache.get(value)
    if shared is None:
        if len(cache) >= _SHARED_MAX:
            cache.clear()
        cache[value] = shared = value
    return shared


def _share_peer_host(addr: Any) -> Any:
    """*addr* with its host string shared with earlier peers of that host."""
    if type(addr) is not tuple or len(addr) < 2:
        return addr  # a Unix socket's path, or nothing
    host = _shared(_PEER_HOSTS, addr[0])
    return addr if host is addr[0] else (host, *addr[1:])


def _peername(sock: socket.socket) -> Any:
    try:
        return sock.getpeername()
    except OSError:
        return None


def is_tcp(sock: socket.socket) -> bool:
    return (
        sock.family in (socket.AF_INET, socket.AF_INET6)
        and sock.type == socket.SOCK_STREAM
        and sock.proto in (0, socket.IPPROTO_TCP)
    )


def set_options(sock: socket.socket, options: list[tuple[int, int, int]]) -> None:
    """setsockopt each (level, option, value); a refused one is skipped."""
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError:
            pass


class SocketTransport(_Base, metaclass=_compat.SlotsWithDict):  # type: ignore[misc]
    """A stream transport over a non-blocking socket (TCP or Unix).

    Slots for its state, plus a ``__dict__`` as stock's transport has: tests
    and libraries patch a transport's methods (``mock.patch.object(transport,
    "write", ...)``) and set attributes on it.  The dict is made only when
    something is set that has no slot.
    """

    __slots__ = (
        "__dict__",
        "__weakref__",
        "_buffer",
        "_buffer_size",
        "_closing",
        "_conn_lost",
        "_empty_waiter",
        "_eof",
        "_extra_dict",
        "_feeds",
        "_paused",
        "_peername",
        "_protocol",
        "_protocol_connected",
        "_recv_size",
        "_sending",
        "_server",
        "_shared",
        "_sock",
        "_sock_fd",
        "_sockname",
        "_tsock",
        "_write_guard",
        "_write_state",
        *(("_context",) if _compat.PY315 else ()),
    )

    _loop: Any  # the Loop; None once connection_lost has run (a base-class slot)
    _protocol: Any  # None once connection_lost has run
    if not _compat.PY315:
        # Where 3.15 keeps the context the transport's callbacks run in
        # (gh-140947); before 3.15 each callback runs in a copy of the
        # context that scheduled it, as stock's do.
        _context: Any = None

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
        *,
        shared: TransportShared,
        inherited_options: bool = False,
        context: Any = None,
    ) -> None:
        # __del__ reads these even if __init__ fails half-way.
        self._sock: socket.socket | None = None
        self._server = None
        self._shared = shared
        self._extra_dict: dict[str, Any] | None = None  # see the _extra property
        if _compat.PY315:
            self._context = context
        # The socket and the two addresses of stock's extra dict live in
        # slots; the dict is kept only for other keys a caller passed (the
        # accept path passes just the peer name).  About 300 bytes less per
        # connection: a 3-entry dict, a TransportSocket made before anyone
        # asks for it, and a copy of the local address per accepted connection.
        if extra:
            if "peername" in extra:
                peername = extra["peername"]
                if len(extra) == 1:
                    extra = None
            else:
                peername = _peername(sock)
        else:
            peername = _peername(sock)
            extra = None
        super().__init__(extra or _NO_EXTRA, loop)
        self._peername = _share_peer_host(peername) if server is not None else peername
        try:
            sockname = sock.getsockname()
        except OSError:
            sockname = None
        else:
            if server is not None:
                sockname = _shared(_SERVER_SOCKNAMES, sockname)
        self._sockname = sockname
        # The socket, until get_extra_info("socket") wraps it (then the
        # TransportSocket): stock wraps every socket up front.
        self._tsock: Any = sock
        self._sock = sock
        self._sock_fd = sock.fileno()
        self._protocol_connected = False
        self._protocol = None  # set_protocol() compares with the previous one
        # recv() size for the next read while reads are small (SMALL_READ
        # or less) or streaming (read_size); in buffer mode (recv_into the
        # loop's buffer) 0, or -1 after one short read.
        self._recv_size = min(SMALL_READ, shared.read_size)
        self.set_protocol(protocol)
        self._server = server
        # A list, not a deque: an empty deque costs 760 bytes per connection
        # (its first block), a list 56; chunks leave from the front only in
        # _consume, with one slice deletion per send.  Made by the first
        # write that has to buffer (_NO_BUFFER until then), dropped again
        # when all of it went out: an idle connection has none.
        self._buffer: list[bytes | memoryview] = _NO_BUFFER
        self._buffer_size = 0
        self._conn_lost = 0  # Set when the call to connection_lost is scheduled.
        self._closing = False  # Set when close() is called.
        self._paused = False  # Set when pause_reading() is called.
        self._eof = False  # Set when write_eof() is called.
        self._empty_waiter: Any = None  # Set while loop.sendfile() waits.
        # Set when write() must check the three above (after write_eof(),
        # while sendfile waits, once the connection is lost); cleared only
        # when sendfile ends with neither of the others.
        self._write_guard = False
        self._write_state = IDLE  # IDLE, QUEUED or POLLING (see _writes)
        self._sending = False  # Set while _write_now runs resume_writing() (re-entrancy guard).
        self._feeds = 0  # Short writes retried without waiting, in a row.
        if server is not None:
            _compat.server_attach(server, self)
        loop._transports[self._sock_fd] = self
        # We release the fd before closing it, so the poller may defer the
        # removal of its interest (pause+resume in one iteration is free).
        shared.poller.own(self._sock_fd)

        # Disable Nagle: small writes leave without waiting for the peer's ACK.
        # An accepted socket inherited it and the keepalive options from its
        # listener (Linux), which saves a setsockopt per option per connection.
        if not inherited_options:
            _compat.set_nodelay(sock)
            if shared.tcp_sockopts and is_tcp(sock):
                set_options(sock, shared.tcp_sockopts)
        self._call_soon(self._protocol.connection_made, self)
        # Start reading only once connection_made() has run.
        self._call_soon(self._start_reading)
        if waiter is not None:
            self._call_soon(_compat.set_result_unless_cancelled, waiter, None)

    # -- the loop's scheduling, in the transport's context (3.15) ----------

    if _compat.PY315:
        def _call_soon(self, callback: Any, *args: Any) -> None:
            self._loop.call_soon(callback, *args, context=self._context)

        def _watch_read(self, callback: Any) -> None:
            self._loop._add_reader(self._sock_fd, callback, context=self._context)

        def _watch_write(self) -> None:
            self._loop._add_writer(self._sock_fd, self._write_ready, context=self._context)
    else:
        def _call_soon(self, callback: Any, *args: Any) -> None:
            self._loop.call_soon(callback, *args)

        def _watch_read(self, callback: Any) -> None:
            self._loop._add_reader(self._sock_fd, callback)

        def _watch_write(self) -> None:
            self._loop._add_writer(self._sock_fd, self._write_ready)

    def __repr__(self) -> str:
        info = [self.__class__.__name__]
        if self._sock is None:
            info.append("closed")
        elif self._closing:
            info.append("closing")
        info.append(f"fd={self._sock_fd}")
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                mask = self._shared.poller.get_key(self._sock_fd).events
            except (KeyError, ValueError):
                mask = 0
            info.append("read=polling" if mask & 1 else "read=idle")
            state = "polling" if mask & 2 else "idle"
            info.append(f"write=<{state}, bufsize={self._buffer_size}>")
        return "<{}>".format(" ".join(info))

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if self._sock is not None:
            _warn(f"unclosed transport {self!r}", ResourceWarning, source=self)
            self._release_fd()
            self._sock.close()
            if self._server is not None:
                _compat.server_detach(self._server, self)

    # -- protocol and state ---------------------------------------------

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

    def _set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None and low is None:
            # Stock's defaults, as shared int objects: stock computes the low
            # mark per transport, a 32-byte int per connection.
            # (Slots of the base class, which mypy sees as Any.)
            self._high_water = _DEFAULT_HIGH_WATER
            self._low_water = _DEFAULT_LOW_WATER
        else:
            super()._set_write_buffer_limits(high, low)

    # ``_extra`` is private to asyncio, but code in the wild reads and writes
    # ``transport._extra["peername"]``: it gets stock's dict (the caller's
    # keys, then socket, sockname and peername), made on first touch, after
    # which get_extra_info answers from it.  Until then the caller's own keys
    # stay in BaseTransport's slot and the addresses in ours.
    @property
    def _extra(self) -> dict[str, Any]:
        made = self._extra_dict
        if made is None:
            made = dict(_RAW_EXTRA.__get__(self, type(self)))
            made["socket"] = self._transport_socket()
            made["sockname"] = self._sockname
            made["peername"] = self._peername  # the caller's, when it gave one
            self._extra_dict = made
        return made

    @_extra.setter
    def _extra(self, extra: Any) -> None:  # BaseTransport.__init__
        _RAW_EXTRA.__set__(self, extra)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        stock = _Base.get_extra_info
        if stock is not _STOCK_GET_EXTRA_INFO:
            # Patched on a base class (asyncio.Transport, say): the patch
            # answers, called as stock's transport would call it.
            if default is None:
                return super().get_extra_info(name)
            return super().get_extra_info(name, default)
        made = self._extra_dict
        if made is not None:
            return made.get(name, default)
        if name == "peername":
            return self._peername
        if name == "sockname":
            return self._sockname
        if name == "socket":
            return self._transport_socket()
        return _RAW_EXTRA.__get__(self, type(self)).get(name, default)

    def _transport_socket(self) -> Any:
        tsock = self._tsock
        if tsock is not None and type(tsock) is not _compat.TransportSocket:
            tsock = self._tsock = _compat.TransportSocket(tsock)
        return tsock

    def get_protocol(self) -> Any:
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return not self._closing and not self._paused

    def pause_reading(self) -> None:
        if not self.is_reading():
            return
        self._paused = True
        # Only the wanted mask changes: the poller sends the kernel the net
        # change before it next waits, so pause+resume in one callback is free.
        self._loop._remove_reader(self._sock_fd)
        if self._loop.get_debug():
            _compat.transport_logger().debug("%r pauses reading", self)

    def resume_reading(self) -> None:
        if self._closing or not self._paused:
            return
        self._paused = False
        self._start_reading()
        if self._loop.get_debug():
            _compat.transport_logger().debug("%r resumes reading", self)

    def _add_reader(self, fd: Any, callback: Any, *args: Any) -> None:
        if not self.is_reading():
            return
        if _compat.PY315:
            self._loop._add_reader(fd, callback, *args, context=self._context)
        else:
            self._loop._add_reader(fd, callback, *args)

    def _start_reading(self) -> None:
        # The reader is the protocol kind's own read method, not _read_ready:
        # one call less per read.  set_protocol() re-registers on a change.
        if self.is_reading():
            self._watch_read(self._read_method(self._protocol))

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
            if size > 0:
                data = self._sock.recv(size)  # type: ignore[union-attr]
                if size > SMALL_READ:  # streaming
                    if len(data) < size:
                        self._recv_size = 0
                elif len(data) == SMALL_READ:
                    self._recv_size = 0
            else:
                buffer = shared.read_buffer
                nbytes = self._sock.recv_into(buffer)  # type: ignore[union-attr]
                data = shared.read_view[:nbytes].tobytes()
                if nbytes == len(buffer) and nbytes > SMALL_READ:
                    self._recv_size = nbytes  # streaming
                elif nbytes >= SMALL_READ:
                    self._recv_size = 0
                elif size:  # the second short read in a row
                    self._recv_size = SMALL_READ
                else:
                    self._recv_size = -1
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
        if self._conn_lost:
            return
        try:
            buf = self._protocol.get_buffer(-1)
            if not len(buf):
                raise RuntimeError("get_buffer() returned an empty buffer")
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.get_buffer() call failed.")
            return
        stats = self._shared.stats
        stats.recv += 1
        try:
            nbytes = self._sock.recv_into(buf)  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            stats.recv_eagain += 1
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal read error on socket transport")
            return
        if not nbytes:
            self._read_ready__on_eof()
            return
        try:
            self._protocol.buffer_updated(nbytes)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.buffer_updated() call failed.")

    def _read_ready__on_eof(self) -> None:
        if self._loop.get_debug():
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
            self._loop._remove_reader(self._sock_fd)
        else:
            self.close()

    # -- writing ----------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        kind = type(data)
        if kind is not bytes and not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(_WRITE_TYPE_ERROR.format(kind.__name__))
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
        if kind is memoryview and (data.ndim != 1 or data.format != "B"):  # type: ignore[union-attr]
            data = data.tobytes()  # type: ignore[union-attr]  # offsets below are bytes
        shared = self._shared
        if not self._buffer:
            # Both comparisons jump a short way: a comparison followed by a
            # long jump (EXTENDED_ARG) is never specialized on 3.11.
            if shared.deferred and ((size := len(data)) <= self._high_water or self._sending):
                if kind is bytes and not self._sending:
                    # Deferred mode, the first write since the buffer emptied:
                    # an empty buffer outside _write_now means IDLE (see _writes),
                    # and this write stays under the high-water mark, so all it
                    # needs is buffering and queueing; the general path below
                    # does the same in more steps.
                    self._buffer = [data]  # type: ignore[list-item]  # bytes: no copy needed
                    self._buffer_size = size
                    self._write_state = QUEUED
                    shared.pending.append(self)  # WriteQueue.queue(), inlined
                    shared.stats.queued_at_once += 1  # a write, and a deferred one (Counters)
                    return
            else:
                # Sent at once, safe only when nothing is buffered (order!),
                # which implies the transport is IDLE (see _writes).  Every
                # such write in eager mode.  In deferred mode a write that
                # alone passes the high-water mark: the queued path would send
                # it at once too (_check_high_water), only after a round trip
                # through the queue, 5 % more instructions per request on
                # echo-protocol-100k (benchmarks.instructions).  Not from
                # resume_writing() inside _write_now (_sending): there the
                # write is appended and _write_now decides, which re-pauses
                # the protocol as before.
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
                self._after_short_write()
                self._maybe_pause_protocol()
                return
        if kind is bytes:
            if self._buffer is _NO_BUFFER:  # bytes: no copy needed
                self._buffer = [data]  # type: ignore[list-item]
            else:
                self._buffer.append(data)  # type: ignore[arg-type]
            self._buffer_size += len(data)
        else:
            self._append(data)
        if not self._write_state and not self._sending:
            # WriteQueue.queue(), inlined: one call less per deferred write.
            shared.stats.queued_at_once += 1  # a write, and a deferred one (Counters)
            self._write_state = QUEUED
            shared.pending.append(self)
        else:
            shared.stats.writes += 1
        if self._buffer_size > self._high_water:  # else flow control has nothing to do
            self._check_high_water()

    def writelines(self, list_of_data: Any) -> None:
        if not _compat.PY312:
            # 3.11's stock is WriteTransport.writelines: it joins the chunks
            # (the join's TypeError comes first), then calls write().
            chunks = list(list_of_data)
            if not all(isinstance(data, (bytes, bytearray, memoryview)) for data in chunks):
                # The join's own TypeError, in this interpreter's words (PyPy's
                # says "expected bytes, str found"); a buffer it takes is
                # written, as stock writes it.
                b"".join(chunks)
            if self._eof:
                raise RuntimeError("Cannot call write() after write_eof()")
            if self._empty_waiter is not None:
                raise RuntimeError("unable to write; sendfile is in progress")
            views = [memoryview(data) for data in chunks if data]
            if not views:
                return  # write(b"") returns before it looks for a lost connection
        else:
            if self._eof:
                raise RuntimeError("Cannot call writelines() after write_eof()")
            if self._empty_waiter is not None:
                raise RuntimeError("unable to writelines; sendfile is in progress")
            chunks = list(list_of_data)
            if _compat.PY314:
                # Stock skips empty chunks before it looks at them (gh-155888).
                views = [memoryview(data) for data in chunks if data]
            else:
                views = [memoryview(data) for data in chunks]  # stock's TypeError text
            if not chunks:
                return
        if self._conn_lost:
            self._drop_write_after_loss()
            return
        views = [view for view in views if view.nbytes]
        if not views:
            return
        self._shared.stats.writes += 1
        for view in views:
            self._append(view)
        if self._write_state or self._sending:
            self._check_high_water()
        elif not self._shared.deferred:
            # IDLE before: one sendmsg for all of it, as stock 3.12+ does;
            # unlike stock 3.12.0-3.12.8 the protocol is paused if it stays
            # buffered (gh-127655: unbounded buffer growth).
            self._write_now(True)
            self._maybe_pause_protocol()
        else:
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
        if self._buffer_size > self._high_water and self._write_state == QUEUED:
            self._write_state = IDLE  # still in the queue, which will skip it
            self._write_now()
        self._maybe_pause_protocol()

    def _write_ready(self) -> None:
        """EPOLLOUT: the socket can take more (sendmsg, as stock's
        _write_sendmsg, whatever the buffer holds)."""
        self._write_now(True)

    def _write_now(self, vectored: bool = False) -> None:
        """Send as much of the buffer as the kernel takes, in one call:
        ``send`` for one buffer (what stock's write() calls), ``sendmsg`` for
        more, or for any number when *vectored* (EPOLLOUT and writelines,
        where stock calls sendmsg).

        Called by writelines, by the loop's flush and _check_high_water (for
        a transport that was QUEUED: they set it IDLE first) and on
        EPOLLOUT (POLLING).  A transport that still has data afterwards is
        queued again or polls, by policy.
        """
        buffer = self._buffer
        if self._conn_lost or not buffer:
            return
        stats = self._shared.stats
        sock = self._sock
        try:
            if (len(buffer) == 1 and not vectored) or not _HAS_SENDMSG:
                stats.send += 1
                n = sock.send(buffer[0])  # type: ignore[union-attr]
            else:
                stats.sendmsg += 1
                if len(buffer) > 1:
                    stats.writes_coalesced += min(len(buffer), IOV_MAX)
                n = sock.sendmsg(  # type: ignore[union-attr]
                    buffer if len(buffer) <= IOV_MAX else buffer[:IOV_MAX]
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
            self._buffer = buffer = _NO_BUFFER
            self._buffer_size = 0
        elif n:
            self._consume(n)
        short = bool(buffer)
        if short:
            stats.partial_writes += 1
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
                self._after_short_write()
            elif not self._write_state:
                # resume_writing() wrote more after everything went out.
                self._shared.queue(self)
        elif self._feeds or self._write_state or self._closing or self._write_guard:
            # _write_guard: write_eof() or sendfile waits (a lost connection
            # is closing too), the cases _write_done has work for.
            self._write_done()
        # else: _write_done would find nothing to do (the common case of a
        # deferred write, so its call is skipped).

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

    def _after_short_write(self) -> None:
        """The kernel took part of the buffer: feed or poll, by policy."""
        if self._write_state or self._shared.feed_retry(self):
            return
        self._write_state = POLLING
        self._watch_write()

    def _stop_polling_write(self) -> None:
        if self._write_state == POLLING:
            self._loop._remove_writer(self._sock_fd)
        self._write_state = IDLE

    def _write_done(self) -> None:
        """Everything buffered went out."""
        self._feeds = 0
        self._stop_polling_write()
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
            self._write_guard = True
            self._call_connection_lost(None)
        elif self._eof:
            self._sock.shutdown(socket.SHUT_WR)  # type: ignore[union-attr]

    def _write_failed(self, exc: BaseException) -> None:
        self._stop_polling_write()
        if self._buffer:
            self._buffer.clear()
        self._buffer_size = 0
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

    # -- closing ----------------------------------------------------------

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop._remove_reader(self._sock_fd)
        if not self._buffer:
            self._conn_lost += 1
            self._write_guard = True
            self._call_soon(self._call_connection_lost, None)
        # Otherwise the last flush or EPOLLOUT that empties the buffer calls
        # _call_connection_lost: data written before close() is delivered.

    def abort(self) -> None:
        self._force_close(None)

    def _fatal_error(self, exc: BaseException, message: str = "Fatal error on transport") -> None:
        # Should be called from an exception handler only.
        if isinstance(exc, OSError):
            if self._loop.get_debug():
                _compat.transport_logger().debug("%r: %s", self, message, exc_info=True)
        else:
            self._loop.call_exception_handler(
                {
                    "message": message,
                    "exception": exc,
                    "transport": self,
                    "protocol": self._protocol,
                }
            )
        self._force_close(exc)

    def _force_close(self, exc: BaseException | None) -> None:
        if self._conn_lost:
            return
        if self._buffer:
            self._buffer.clear()
            self._buffer_size = 0
        self._stop_polling_write()
        if not self._closing:
            self._closing = True
            self._loop._remove_reader(self._sock_fd)
        self._conn_lost += 1
        self._write_guard = True
        self._call_soon(self._call_connection_lost, exc)

    def _release_fd(self) -> None:
        """Tell the poller the fd is about to close (see _poller, edge 1)."""
        self._shared.poller.release(self._sock_fd)

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        try:
            if self._protocol_connected:
                self._protocol.connection_lost(exc)
        finally:
            self._release_fd()
            self._sock.close()  # type: ignore[union-attr]
            self._sock = None
            self._protocol = None
            self._loop = None
            server = self._server
            if server is not None:
                _compat.server_detach(server, self)
                self._server = None
            waiter = self._empty_waiter
            if waiter is not None and not waiter.done():
                waiter.set_exception(ConnectionError("Connection is closed by peer"))


def _send_queued(transport: SocketTransport) -> None:
    """The write queue's send (WriteQueue.send), run on a QUEUED transport
    set IDLE already: ``_write_now``, with its common case, the deferred
    writes of one iteration, here: up to _FLUSH_MAX_CHUNKS chunks buffered,
    sent as ``_write_now`` would send them (one ``send``, or one
    ``sendmsg``).  The send is ``_write_now``'s, repeated to spare its
    call and its checks (benchmarks.instructions, relaxed-deferred).

    Safe only for a transport with nothing else for ``_write_now`` to do
    around the send: no ``_write_guard`` (write_eof, sendfile, a lost
    connection), not closing, no feed retries in a row (their count is
    reset when the buffer empties), and not paused (resume_writing() is due
    when it empties).  Any other transport gets ``_write_now`` itself.
    """
    buffer = transport._buffer
    chunks = len(buffer)  # not 0: a QUEUED transport has a buffer (see _writes)
    if (
        chunks > _FLUSH_MAX_CHUNKS
        or transport._write_guard
        or transport._closing
        or transport._feeds
        or transport._protocol_paused
    ):
        transport._write_now()
        return
    stats = transport._shared.stats
    try:
        if chunks == 1:
            stats.send += 1
            n = transport._sock.send(buffer[0])  # type: ignore[union-attr]
        else:
            stats.sendmsg += 1
            stats.writes_coalesced += chunks
            n = transport._sock.sendmsg(buffer)  # type: ignore[union-attr]
    except (BlockingIOError, InterruptedError):
        stats.send_eagain += 1
        n = 0
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        transport._write_failed(exc)
        return
    if n == transport._buffer_size:
        transport._buffer = _NO_BUFFER
        transport._buffer_size = 0
        return
    # What _write_now does after a short send of a transport that passed
    # the check above.
    if n:
        transport._consume(n)
    stats.partial_writes += 1
    transport._after_short_write()
