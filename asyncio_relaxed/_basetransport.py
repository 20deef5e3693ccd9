"""What every stream transport of the loop shares beside reading and writing:
the socket and its two addresses, ``get_extra_info``, the protocol and the
server, the loop's scheduling in the transport's context, the connection's
start (``connection_made``, then reading), a fatal error's report, and the
finaliser.

:class:`TransportBase` is to :class:`~asyncio_relaxed._transport.SocketTransport`
what uvloop's ``UVBaseTransport`` is to its ``UVStream``: the transport's
identity and bookkeeping, with read, write and close left to the subclass.

Addresses.  The socket and the two addresses of stock's extra dict live in
slots; the dict is made only when a caller touches ``_extra`` (code in the
wild reads ``transport._extra["peername"]``), and until then holds only the
keys a caller passed.  Accepted connections share their local address (one
tuple per address a listener answers on) and their peer's host string (a
server behind a proxy sees few hosts), in two caches of at most
:data:`SHARED_MAX` entries each: together about 300 bytes less per
connection than stock's three-entry dict, eager TransportSocket and copies.

This module's names from asyncio are its public transport classes and, through
:mod:`asyncio_relaxed._compat`, the private layout they are built on.
"""

from __future__ import annotations

import contextvars
import socket
import warnings
import weakref
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from . import _compat
from ._shared import TransportShared

__all__ = ["ASK", "SHARED_MAX", "Reading", "TransportBase", "repr_head"]

_copy_context = contextvars.copy_context
_ref = weakref.ref

#: A transport's peername argument when the caller has none to give: the
#: transport takes it from *extra*, or asks the socket.
ASK: Any = object()

# get_extra_info's fallback when the caller passed no extra keys of its own.
_NO_EXTRA: Mapping[str, Any] = MappingProxyType({})
# Where BaseTransport keeps _extra; the transport's _extra is a property.
_RAW_EXTRA: Any = _compat.TRANSPORT_EXTRA_SLOT
_STOCK_GET_EXTRA_INFO = _compat.STOCK_GET_EXTRA_INFO
_Base: Any = _compat.FlowControlMixin

# Flow control's default marks, stock's: 64 KiB, and a quarter of it.
_DEFAULT_HIGH_WATER = 64 * 1024
_DEFAULT_LOW_WATER = _DEFAULT_HIGH_WATER // 4

#: Entries of each address cache at most: at the cap one starts over
#: (listeners and peers come and go).
SHARED_MAX = 1024
_SERVER_SOCKNAMES: dict[Any, Any] = {}  # the local address of accepted sockets
_PEER_HOSTS: dict[Any, Any] = {}  # the host strings of accepted connections' peers


def _remember(cache: dict[Any, Any], value: Any) -> None:
    """*value* is the one its equals share from now on (at the cap the cache
    starts over)."""
    if len(cache) >= SHARED_MAX:
        cache.clear()
    cache[value] = value


def _accepted_addresses(peername: Any, sock: socket.socket, sockname: Any) -> tuple[Any, Any]:
    """An accepted connection's (peername, sockname): the local address the
    one its listener's other connections share (*sockname*, where the
    listener knows it: see _sockets.accepted_sockname), the peer's host
    string the one earlier peers of that host share (each cache hit is a
    dict lookup)."""
    if sockname is None:
        try:
            sockname = sock.getsockname()
        except OSError:
            sockname = None
        else:
            shared = _SERVER_SOCKNAMES.get(sockname)
            if shared is None:
                _remember(_SERVER_SOCKNAMES, sockname)
            else:
                sockname = shared
    if type(peername) is tuple and len(peername) >= 2:  # not a Unix path, not None
        host = _PEER_HOSTS.get(peername[0])
        if host is None:
            _remember(_PEER_HOSTS, peername[0])
        elif host is not peername[0]:
            peername = (host, peername[1]) if len(peername) == 2 else (host, *peername[1:])
    return peername, sockname


def repr_head(transport: Any, closed: bool, fd: Any) -> list[str]:
    """The start of a transport's repr as stock writes it: its class, then
    closed or closing, then its fd."""
    info = [transport.__class__.__name__]
    if closed:
        info.append("closed")
    elif transport._closing:
        info.append("closing")
    info.append(f"fd={fd}")
    return info


def _peername(sock: socket.socket) -> Any:
    try:
        return sock.getpeername()
    except OSError:
        return None


class Reading:
    """Reading paused or not: stock's is_reading, pause_reading and
    resume_reading, over a transport's _unwatch_read and _start_reading
    (which starts only while is_reading())."""

    if not TYPE_CHECKING:  # (mypy would hold the subclasses' slots to this)
        __slots__ = ()

    _closing: bool
    _paused: bool
    _loop: Any
    #: asyncio's logger as the stock module of the transport kind sees it.
    _logger = staticmethod(_compat.transport_logger)

    def _unwatch_read(self) -> None:
        raise NotImplementedError

    def _start_reading(self) -> None:
        raise NotImplementedError

    def is_reading(self) -> bool:
        return not self._closing and not self._paused

    def pause_reading(self) -> None:
        if self._closing or self._paused:
            return
        self._paused = True
        # Only the wanted mask changes: the poller sends the kernel the net
        # change before it next waits, so pause+resume in one callback is free
        # (for an fd the poller owns; any other's removal goes out at once).
        self._unwatch_read()
        if self._loop.get_debug():
            self._logger().debug("%r pauses reading", self)

    def resume_reading(self) -> None:
        if self._closing or not self._paused:
            return
        self._paused = False
        self._start_reading()
        if self._loop.get_debug():
            self._logger().debug("%r resumes reading", self)


class TransportBase(Reading, _Base, metaclass=_compat.SlotsWithDict):  # type: ignore[misc]
    """A stream transport's identity: socket, addresses, protocol, server.

    Slots for its state, plus a ``__dict__`` as stock's transport has: tests
    and libraries patch a transport's methods (``mock.patch.object(transport,
    "write", ...)``) and set attributes on it.  The dict is made only when
    something is set that has no slot.
    """

    __slots__ = (
        "__dict__",
        "__weakref__",
        "_closing",
        "_conn_lost",
        "_extra_dict",
        "_paused",
        "_peername",
        "_protocol",
        "_protocol_connected",
        "_server",
        "_shared",
        "_sock",
        "_sock_fd",
        "_sockname",
        "_tsock",
        *(("_context",) if _compat.PY315 else ()),
    )

    _loop: Any  # the Loop; None once connection_lost has run (a base-class slot)
    _protocol: Any  # None once connection_lost has run
    _buffer: Any  # the subclass's write buffer (a sized container)
    # FlowControlMixin's slots, which mypy sees as Any.
    _protocol_paused: bool
    _high_water: int
    _low_water: int
    if not _compat.PY315:
        # Where 3.15 keeps the context the transport's callbacks run in
        # (gh-140947); before 3.15 each callback runs in a copy of the
        # context that scheduled it, as stock's do.
        _context: Any = None

    def __init__(self, loop: Any, sock: socket.socket, extra: dict[str, Any] | None,
                 server: Any, shared: TransportShared, context: Any,
                 peername: Any = ASK, sockname: Any = None) -> None:
        # __del__ reads these even if __init__ fails half-way.
        self._sock: socket.socket | None = None
        self._server = None
        self._conn_lost = 0  # Set when the call to connection_lost is scheduled.
        self._closing = False  # Set when close() is called.
        self._paused = False  # Set when pause_reading() is called.
        self._shared = shared
        self._extra_dict: dict[str, Any] | None = None  # see the _extra property
        if _compat.PY315:
            self._context = context
        if peername is ASK:  # else the accept path's peer address, and no extra
            if extra:
                if "peername" in extra:
                    peername = extra["peername"]
                    if len(extra) == 1:
                        extra = None  # an accept path's only key: kept in a slot
                else:
                    peername = _peername(sock)
            else:
                peername = _peername(sock)
                extra = None
        # FlowControlMixin.__init__ and BaseTransport.__init__ (the same code
        # from 3.11 to 3.15 and on PyPy; tests/test_transport.py holds this
        # to them), without their three frames and the property setter's.
        # BaseTransport's _extra slot holds the caller's keys, set only when
        # it gave some (_caller_extra reads it).
        if extra:
            _RAW_EXTRA.__set__(self, extra)
        self._loop = loop
        self._protocol_paused = False
        self._high_water = _DEFAULT_HIGH_WATER
        self._low_water = _DEFAULT_LOW_WATER
        if server is not None:
            self._peername, self._sockname = _accepted_addresses(peername, sock, sockname)
        else:
            self._peername = peername
            try:
                self._sockname = sock.getsockname()
            except OSError:
                self._sockname = None
        # The socket, until get_extra_info("socket") wraps it (then the
        # TransportSocket): stock wraps every socket up front.
        self._tsock: Any = sock
        self._sock = sock
        self._sock_fd = sock.fileno()
        # The subclass sets _protocol and _protocol_connected next.

    def _attach(self, server: Any) -> None:
        """Count the transport in its asyncio Server's connections, enter it
        in the loop's transports, and promise the poller to release the fd
        before closing it (so it may defer removing its interest: a
        pause+resume in one iteration is free)."""
        if server is not None:
            self._server = server
            _compat.server_attach(server, self)
        # The entry of loop._transports (a WeakValueDictionary, read by
        # stock's _ensure_fd_no_transport) as a plain weak reference put in
        # its dict: no KeyedRef, and no removal callback when the transport
        # dies, since _forget() removes the entry when the socket closes.
        self._loop._transports.data[self._sock_fd] = _ref(self)
        self._shared.poller.own(self._sock_fd)

    def _forget(self) -> None:
        """The socket closes: the loop's entry for its fd goes, if it is
        this transport's (a dead reference too: the collector may clear the
        reference before a finaliser runs)."""
        transports = self._loop._transports.data
        reference = transports.pop(self._sock_fd, None)
        if reference is not None and reference() not in (self, None):
            transports[self._sock_fd] = reference  # another's: it stays

    # -- the loop's scheduling, in the transport's context (3.15) ----------

    # A callback is scheduled with self._loop.call_soon(..., context=self._context):
    # None before 3.15 and for a transport made without a context, so a
    # copy of the current context, as stock's.

    # The reader and the writer go to the loop's _set_callback, which its
    # _add_reader and _add_writer call (slot 0 and 1): one frame less.
    def _watch_read(self, callback: Any) -> None:
        self._loop._set_callback(self._sock_fd, 0, callback, (), self._context)

    def _watch_write(self) -> None:
        self._loop._set_callback(self._sock_fd, 1, self._write_ready, (), self._context)

    def _add_reader(self, fd: Any, callback: Any, *args: Any) -> None:
        """Stock's transport method (start_tls and tests call it)."""
        if not self.is_reading():
            return
        if _compat.PY315:
            self._loop._add_reader(fd, callback, *args, context=self._context)
        else:
            self._loop._add_reader(fd, callback, *args)

    def _unwatch_read(self) -> None:
        self._loop._remove_reader(self._sock_fd)

    def _unwatch_for_good(self) -> None:
        """Reading ends for good and the fd is released (close, abort):
        _unwatch_read() then _release_fd(), in one call of the loop's
        poller (see DeferredSelector.release_reader) unless the loop polls
        through another selector or is closed."""
        loop = self._loop
        poller = self._shared.poller
        if loop._selector is not poller or poller.replaced or loop._closed:
            self._unwatch_read()
            self._release_fd()
            return
        removed = poller.release_reader(self._sock_fd)
        if removed is not None:
            removed.cancel()

    def _unwatch_write(self) -> None:
        self._loop._remove_writer(self._sock_fd)

    def _write_ready(self) -> None:
        raise NotImplementedError

    # -- the connection's start ---------------------------------------------

    def _schedule_start(self, waiter: Any) -> None:
        """connection_made(), then reading, then *waiter*'s result, each in
        a handle of its own as stock schedules them (connection_made and
        reading in one outside debug mode, which times and names each)."""
        if self._loop._debug:
            self._loop.call_soon(self._protocol.connection_made, self, context=self._context)
            self._loop.call_soon(self._start_reading, context=self._context)
        else:
            self._loop.call_soon(self._connection_made, context=self._context)
        if waiter is not None:
            self._loop.call_soon(_compat.set_result_unless_cancelled, waiter, None,
                                 context=self._context)

    def _connection_made(self) -> None:
        """connection_made(), then reading starts (only once it has run):
        stock's two handles in one, an exception reported as the first
        handle's would be.  Each of stock's handles runs in a copy of the
        context that scheduled it, so what connection_made() sets is not
        what the reader (made from the second) sees: it runs in a copy here
        too, unless the transport has a context of its own (3.15's server
        connections, whose callbacks all share it)."""
        try:
            if self._context is None:
                _copy_context().run(self._protocol.connection_made, self)
            else:
                self._protocol.connection_made(self)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            loop = self._loop
            handle = _compat.events.Handle(self._protocol.connection_made, (self,), loop, None)
            loop._callback_failed(handle, exc)
        self._start_reading()

    # -- identity ---------------------------------------------------------

    def __repr__(self) -> str:
        info = repr_head(self, self._sock is None, self._sock_fd)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                mask = self._shared.poller.get_key(self._sock_fd).events
            except (KeyError, ValueError):
                mask = 0
            info.append("read=polling" if mask & 1 else "read=idle")
            state = "polling" if mask & 2 else "idle"
            info.append(f"write=<{state}, bufsize={self.get_write_buffer_size()}>")
        return "<{}>".format(" ".join(info))

    def __del__(self, _warn: Any = warnings.warn) -> None:
        # Only what no scheduled _call_connection_lost will do.  The collector
        # can finalise a transport whose close() or abort() (say from a
        # StreamWriter's own finaliser in the same cycle) has just scheduled
        # _call_connection_lost: that handle resurrects the transport and
        # closes the socket, releases the fd and detaches the server itself,
        # so here nothing is done twice (a second detach fails an assertion
        # on 3.11-3.12, or takes the server's count below zero under -O).
        # A transport collected with nothing scheduled is marked lost first,
        # so a close() or abort() on it afterwards does nothing.
        if self._sock is None or self._conn_lost:
            return
        _warn(f"unclosed transport {self!r}", ResourceWarning, source=self)
        self._closing = True
        self._conn_lost += 1
        self._lost()
        self._release_fd()
        self._forget()
        self._sock.close()
        self._detach_server()

    def _fatal_error(self, exc: BaseException, message: str = "Fatal error on transport") -> None:
        """A failure that ends the connection: an OSError logged in debug mode
        only, anything else to the exception handler (stock's contexts), then
        the close without flushing.  Called from an exception handler only."""
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

    # -- closing ----------------------------------------------------------

    def close(self) -> None:
        """Stop reading now; end once nothing is buffered for writing (the
        subclass's send that empties the buffer ends it otherwise)."""
        if self._closing:
            return
        if self._buffer:
            self._send_before_close()
            if self._closing:  # the send failed: its end is scheduled
                return
        self._closing = True
        self._unwatch_for_good()  # never read again: the removal goes out now, not lazily
        if not self._buffer:
            self._conn_lost += 1
            self._lost()
            self._loop.call_soon(self._call_connection_lost, None, context=self._context)

    def _send_before_close(self) -> None:
        """What close() finds buffered that stock's write() would have sent
        already goes now (the subclass's): the end is then close()'s."""

    def abort(self) -> None:
        self._force_close(None)

    def _force_close(self, exc: BaseException | None) -> None:
        """The end without flushing: the buffer dropped, connection_lost(exc)
        one callback later."""
        if self._conn_lost:
            return
        self._drop_buffer()
        if not self._closing:
            self._closing = True
            self._unwatch_for_good()
        self._conn_lost += 1
        self._lost()
        self._loop.call_soon(self._call_connection_lost, exc, context=self._context)

    def _drop_buffer(self) -> None:
        """Drop what is buffered for writing (and stop waiting to send it)."""
        raise NotImplementedError

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        raise NotImplementedError

    def _lost(self) -> None:
        """The connection is lost (``_conn_lost`` was just set): whatever the
        subclass must stop accepting."""

    def _detach_server(self) -> None:
        """Detach from the asyncio Server that accepted the connection, once."""
        server = self._server
        if server is not None:
            self._server = None
            _compat.server_detach(server, self)

    def _release_fd(self) -> None:
        """Tell the poller the fd is about to close (see _poller, edge 1)."""
        self._shared.poller.release(self._sock_fd)

    def get_protocol(self) -> Any:
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def _set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None and low is None:
            # Stock's defaults, as shared int objects: stock computes the low
            # mark per transport, a 32-byte int per connection.
            # (Slots of the base class, which mypy sees as Any.)
            self._high_water = _DEFAULT_HIGH_WATER
            self._low_water = _DEFAULT_LOW_WATER
        else:
            super()._set_write_buffer_limits(high, low)

    # -- extra info ---------------------------------------------------------

    # ``_extra`` is private to asyncio, but code in the wild reads and writes
    # ``transport._extra["peername"]``: it gets stock's dict (the caller's
    # keys, then socket, sockname and peername), made on first touch, after
    # which get_extra_info answers from it.  Until then the caller's own keys
    # stay in BaseTransport's slot and the addresses in ours.
    @property
    def _extra(self) -> dict[str, Any]:
        made = self._extra_dict
        if made is None:
            made = dict(self._caller_extra())
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
        return self._caller_extra().get(name, default)

    def _caller_extra(self) -> Mapping[str, Any]:
        """The extra keys the transport's maker passed (none: an empty map)."""
        try:
            return _RAW_EXTRA.__get__(self, type(self))  # type: ignore[no-any-return]
        except AttributeError:  # the slot was never set
            return _NO_EXTRA

    def _transport_socket(self) -> Any:
        tsock = self._tsock
        if tsock is not None and type(tsock) is not _compat.TransportSocket:
            tsock = self._tsock = _compat.TransportSocket(tsock)
        return tsock
