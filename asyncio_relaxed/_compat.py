"""CPython's private asyncio names the package imports, its version gates,
and the handles it makes, in one place.

Checked against CPython 3.11.7, 3.12.1, 3.13.0 (pyenv builds), 3.14.10 and
3.15.2 (Debian's), the interpreters the conformance run uses.  Here, and
nowhere else (tests/test_layering.py checks each): an import from asyncio's
modules other than its public namespace (``base_events``, ``sslproto``,
``_FlowControlMixin``...), a test of ``sys.version_info`` (``PY312``...), a
write to a ``Handle``'s private fields, and the predicates that ask "is this
still stock's?" before a fast path bypasses it.

What this module does not hold: the private attributes of the stock classes
the package subclasses or is handed, which the loop and its transports use
as stock's own code does: ``BaseEventLoop``'s ``_ready``, ``_scheduled``,
``_selector``, ``_add_reader``, ``_debug``; a handle's ``_callback``,
``_args``, ``_cancelled`` and ``_when`` as the iteration reads them; the
``_sock``, ``_protocol`` and ``_extra`` of a transport.  Those are the
layout the conformance run holds to each version's test.test_asyncio.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import ssl
import sys
from asyncio import (
    base_events,
    constants,
    events,
    format_helpers,
    futures,
    selector_events,
    sslproto,
    transports,
    trsock,
)
from typing import Any

__all__ = [
    "ACCEPT_RETRY_DELAY",
    "DATAGRAM_CHECKS_FD",
    "DATAGRAM_HEADER_SIZE",
    "DATAGRAM_SENDS_EMPTY",
    "DEFAULT_SSL_TIMEOUTS",
    "FLOW_CONTROL_HIGH_WATER_SSL_READ",
    "FLOW_CONTROL_HIGH_WATER_SSL_WRITE",
    "LOG_THRESHOLD_FOR_CONNLOST_WRITES",
    "MAXIMUM_SELECT_TIMEOUT",
    "MIN_CANCELLED_TIMER_HANDLES_FRACTION",
    "MIN_SCHEDULED_TIMER_HANDLES",
    "PY312",
    "PY314",
    "PY315",
    "PY316",
    "SENDFILE_FALLBACK",
    "SENDFILE_TRY_NATIVE",
    "SSL_AGAIN_ERRORS",
    "START_TLS_TAKES_STREAM_BUFFER",
    "STOCK_GET_EXTRA_INFO",
    "STOCK_HANDLE_RUN",
    "STOCK_PROCESS_EVENTS",
    "TLS_ABORT_PASSES_EXC",
    "TLS_CLOSING_WITH_SOCKET",
    "TRANSPORT_EXTRA_SLOT",
    "AppProtocolState",
    "FlowControlMixin",
    "Handle",
    "SSLProtocol",
    "SSLProtocolState",
    "SelectorEventLoop",
    "SlotsWithDict",
    "TimerHandle",
    "TransportSocket",
    "base_default_policy",
    "call_soon",
    "create_tls_context",
    "end_time",
    "events",
    "flow_control_defaults",
    "format_call_graph",
    "format_callback_source",
    "format_handle",
    "loop_logger",
    "move_stream_buffer",
    "new_handle",
    "pipe_logger",
    "run",
    "server_active_count",
    "server_attach",
    "server_detach",
    "set_nodelay",
    "set_result_unless_cancelled",
    "ssl_object_core",
    "sslproto_logger",
    "transport_logger",
]

# The modules as Any: typeshed leaves out the private names used below.
_base_events: Any = base_events
_constants: Any = constants
_futures: Any = futures
_selector_events: Any = selector_events
_sslproto: Any = sslproto

PY312 = sys.version_info >= (3, 12)
PY314 = sys.version_info >= (3, 14)
#: 3.15 carries a server's context variables into its connections
#: (gh-140947): ``context=`` through _start_serving, _accept_connection,
#: _make_socket_transport and the transports' callbacks.
PY315 = sys.version_info >= (3, 15)
#: CPython's main branch for 3.16 has no policy system (gh-127949).
PY316 = sys.version_info >= (3, 16)

# Typed as Any: typeshed does not declare the private attributes the loop
# overrides and reads (_ready, _scheduled, _selector, _process_events, ...).
SelectorEventLoop: Any = asyncio.SelectorEventLoop

# Base of every selector transport: pause_writing/resume_writing bookkeeping
# (_protocol_paused, _high_water, _low_water, _maybe_pause_protocol, ...).
# _base_events._SendfileFallbackProtocol reads transp._protocol_paused.
FlowControlMixin: Any = transports._FlowControlMixin

TransportSocket: Any = trsock.TransportSocket
SSLProtocol: Any = sslproto.SSLProtocol
# Stock's stream transport, which a subclass of the loop may still make
# (loop.gauges() counts its connections beside ours).
StockSocketTransport: Any = _selector_events._SelectorSocketTransport

# -- TLS: what the loop's own TLS transport takes from stock's sslproto ------------
#
# Its states (their reprs are in stock's error texts), the errors after which
# OpenSSL wants more data, the default context of ssl=True, the flow-control
# defaults and marks, and two behaviours that changed: from 3.13 an abort
# passes its exception to the socket's transport (_abort(exc)); from 3.14
# the app transport is closing while the socket's is, and the shutdown
# timeout runs until connection_lost.  Each is probed on stock's class, not
# read off a version number: patch releases carry such fixes.
SSLProtocolState: Any = sslproto.SSLProtocolState
AppProtocolState: Any = sslproto.AppProtocolState
SSL_AGAIN_ERRORS: tuple[type[BaseException], ...] = sslproto.SSLAgainErrors
create_tls_context: Any = sslproto._create_transport_context
flow_control_defaults: Any = sslproto.add_flowcontrol_defaults
FLOW_CONTROL_HIGH_WATER_SSL_READ: int = _constants.FLOW_CONTROL_HIGH_WATER_SSL_READ
FLOW_CONTROL_HIGH_WATER_SSL_WRITE: int = _constants.FLOW_CONTROL_HIGH_WATER_SSL_WRITE
TLS_ABORT_PASSES_EXC = len(inspect.signature(sslproto.SSLProtocol._abort).parameters) > 1
TLS_CLOSING_WITH_SOCKET = hasattr(sslproto.SSLProtocol, "_is_transport_closing")
# gh-142352 (3.14+, and patch releases that carry it): a server-side
# start_tls() moves what its StreamReader had buffered into the TLS layer's
# incoming BIO; probed on the names base_events.start_tls's code uses.
START_TLS_TAKES_STREAM_BUFFER = (
    "StreamReaderProtocol" in _base_events.BaseEventLoop.start_tls.__code__.co_names)


def move_stream_buffer(protocol: Any, incoming: ssl.MemoryBIO) -> None:
    """base_events.start_tls's step for gh-142352: the bytes a
    StreamReaderProtocol's reader holds go to *incoming*."""
    from asyncio.streams import StreamReaderProtocol

    if isinstance(protocol, StreamReaderProtocol):
        reader = getattr(protocol, "_stream_reader", None)
        if reader is not None:
            buffer = reader._buffer
            if buffer:
                incoming.write(buffer)
                buffer.clear()


def ssl_object_core(sslobj: Any) -> Any:
    """*sslobj*'s C object, whose read(len, buffer), write(data) and
    pending() ``ssl.SSLObject``'s methods of those names call with their
    arguments unchanged (CPython 3.11-3.15, PyPy's ssl module alike); the
    SSLObject itself where it has none or they are not its plain calls."""
    core = getattr(sslobj, "_sslobj", None)
    if core is None or type(sslobj).read is not _SSL_OBJECT_READ:
        return sslobj
    return core


_SSL_OBJECT_READ = ssl.SSLObject.read


def sslproto_logger() -> logging.Logger:
    """asyncio's logger as sslproto sees it now (tests patch it there)."""
    return _sslproto.logger  # type: ignore[no-any-return]

SENDFILE_TRY_NATIVE: Any = _constants._SendfileMode.TRY_NATIVE
SENDFILE_FALLBACK: Any = _constants._SendfileMode.FALLBACK
LOG_THRESHOLD_FOR_CONNLOST_WRITES: int = _constants.LOG_THRESHOLD_FOR_CONNLOST_WRITES
ACCEPT_RETRY_DELAY: float = _constants.ACCEPT_RETRY_DELAY

# The timer-heap housekeeping constants of BaseEventLoop._run_once.
MAXIMUM_SELECT_TIMEOUT: float = _base_events.MAXIMUM_SELECT_TIMEOUT
MIN_SCHEDULED_TIMER_HANDLES: int = _base_events._MIN_SCHEDULED_TIMER_HANDLES
MIN_CANCELLED_TIMER_HANDLES_FRACTION: float = (
    _base_events._MIN_CANCELLED_TIMER_HANDLES_FRACTION
)

# ssl_handshake_timeout and ssl_shutdown_timeout: the trailing positional
# arguments of _start_serving/_accept_connection/_accept_connection2.
DEFAULT_SSL_TIMEOUTS: tuple[float, ...] = (
    _constants.SSL_HANDSHAKE_TIMEOUT,
    _constants.SSL_SHUTDOWN_TIMEOUT,
)

format_handle: Any = _base_events._format_handle

set_nodelay: Any = _base_events._set_nodelay
set_result_unless_cancelled: Any = _futures._set_result_unless_cancelled

# -- handles --------------------------------------------------------------
#
# The loop's fast paths make and run handles without stock's frames.  Both
# are safe only while asyncio's Handle is the class these lines were checked
# against; each fast path asks the predicate named here before it takes the
# shortcut, and takes stock's way otherwise.

#: asyncio's Handle and TimerHandle as imported (the loop looks
#: ``events.Handle`` up per call as stock does: a test or a library may
#: replace it), and Handle._run as this Python defines it, which TimerHandle
#: inherits.  A handle runs without that frame only while its class is one
#: of the two and its _run is still this one: instrumentation that replaces
#: it (aiodebug's slow-callback logging) must keep seeing every call, and
#: 3.14's ``_ThreadSafeHandle`` (call_soon_threadsafe) overrides it to hold
#: the lock a cross-thread cancel() waits on.
Handle: Any
TimerHandle: Any
STOCK_HANDLE_RUN: Any
Handle, TimerHandle, STOCK_HANDLE_RUN = events.Handle, events.TimerHandle, events.Handle._run

# Handle.__init__'s fields, identical in every version above; call_soon below
# sets them itself.
_HANDLE_SLOTS = ("_callback", "_args", "_cancelled", "_loop", "_source_traceback", "_repr",
                 "__weakref__", "_context")
assert events.Handle.__slots__ == _HANDLE_SLOTS, events.Handle.__slots__
_new_object: Any = object.__new__
_copy_context = contextvars.copy_context
_stock_call_soon: Any = base_events.BaseEventLoop.call_soon


def call_soon(self: Any, callback: Any, *args: Any, context: Any = None) -> Any:
    """BaseEventLoop.call_soon without its four Python calls per handle
    (_check_closed, _call_soon, Handle.__init__, get_debug): Tasks and
    Futures schedule every step and done-callback through it, three times
    per request in an aiohttp server.  The loop binds it as its call_soon.

    Fast path, safe only outside debug mode (stock then checks the thread
    and the callback and records where the handle was made: it runs as is)
    and while ``asyncio.events.Handle`` is stock's, whose ``__init__`` sets
    the fields below (_HANDLE_SLOTS); a replaced Handle class is used as
    stock uses it.
    """
    if self._closed:
        raise RuntimeError("Event loop is closed")
    if self._debug or events.Handle is not Handle:
        handle = _stock_call_soon(self, callback, *args, context=context)
        if handle._source_traceback:
            del handle._source_traceback[-1]  # this frame: the caller's is last
        return handle
    handle = _new_object(Handle)
    handle._context = _copy_context() if context is None else context
    handle._loop = self
    handle._callback = callback
    handle._args = args
    handle._cancelled = False
    handle._repr = None
    handle._source_traceback = None
    self._ready.append(handle)
    return handle


def new_handle(callback: Any, args: tuple[Any, ...], loop: Any, context: Any) -> Any:
    """``events.Handle(callback, args, loop, context)`` without the frames of
    Handle.__init__ and get_debug: the fields call_soon sets.  For the
    loop's readers and writers (Loop._set_callback), which call it only
    outside debug mode and while ``events.Handle`` is stock's, as call_soon's
    fast path (tests/test_loop.py holds the two to Handle.__init__)."""
    handle = _new_object(Handle)
    handle._context = _copy_context() if context is None else context
    handle._loop = loop
    handle._callback = callback
    handle._args = args
    handle._cancelled = False
    handle._repr = None
    handle._source_traceback = None
    return handle


# The selector loop's _process_events: a subclass or a patch that replaces it
# gets stock's (key, mask) pairs, not the poller's (fd, data, mask).
STOCK_PROCESS_EVENTS: Any = selector_events.BaseSelectorEventLoop._process_events  # type: ignore[attr-defined]


def format_callback_source(callback: Any, args: Any, debug: bool) -> str:
    """The "Exception in callback ..." text of Handle._run (3.13 added *debug*)."""
    source: Any = format_helpers._format_callback_source
    if sys.version_info >= (3, 13):
        return source(callback, args, debug=debug)  # type: ignore[no-any-return]
    return source(callback, args)  # type: ignore[no-any-return]


if PY315:
    import math as _math

    def end_time(now: float, resolution: float) -> float:
        """The end of the due-timer window of one iteration: 3.15 makes it
        strictly increasing where the clock resolution is below the float
        spacing of *now* (math.ulp)."""
        return now + max(resolution, _math.ulp(now))
else:
    def end_time(now: float, resolution: float) -> float:
        """The end of the due-timer window of one iteration (stock's)."""
        return now + resolution

# -- transports -----------------------------------------------------------

class SlotsWithDict(type):
    """Metaclass of a class whose state is all in __slots__ but which keeps a
    ``__dict__`` for what callers set on its instances (tests patch methods).

    CPython 3.13+ gives each instance of such a class room for inline
    ``__dict__`` values, one entry per name in the class's
    ``__static_attributes__`` (every ``self.name = ...`` in its methods).
    Here every such name is a slot, so that room is never used: 30 entries,
    256 bytes per transport on 3.14 (tests/test_memory.py).  Dropping the
    tuple from the class body leaves the dict to be made on first use, as it
    is before 3.13.
    """

    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any],
                **kwargs: Any) -> Any:
        namespace.pop("__static_attributes__", None)
        return super().__new__(mcls, name, bases, namespace, **kwargs)


# BaseTransport's storage slot for _extra, under the transport's property.
TRANSPORT_EXTRA_SLOT: Any = transports.BaseTransport.__dict__["_extra"]
#: BaseTransport.get_extra_info.  The transport answers the address keys
#: from its own slots only while the method its bases give it is still this
#: one: a class-level patch of asyncio.Transport.get_extra_info (tests do
#: that) must reach our transports as it reaches stock's.
STOCK_GET_EXTRA_INFO: Any = transports.BaseTransport.get_extra_info

# -- datagrams ----------------------------------------------------------------
#
# What stock's _SelectorDatagramTransport and _make_datagram_transport do
# differently from one release to another, each probed on stock's code, as
# patch releases carry such changes: 3.11.7, 3.12.1 and PyPy 3.11 drop an
# empty datagram and count no header bytes; 3.13.0 sends it and counts 8
# header bytes per buffered datagram (taken off again by 3.14's
# _header_size only); 3.12.1 onwards refuse an fd that has a transport.
_StockDatagramTransport: Any = _selector_events._SelectorDatagramTransport


class _SendtoProbe:
    """Stands in for a transport: any attribute read raises _SendtoRead."""

    def __getattr__(self, name: str) -> Any:
        raise _SendtoRead


class _SendtoRead(Exception):
    pass


def _sends_empty() -> bool:
    """Stock's sendto(b"") reads the transport's state (to send an empty
    datagram) rather than returning first."""
    try:
        _StockDatagramTransport.sendto(_SendtoProbe(), b"")
    except _SendtoRead:
        return True
    return False


#: sendto(b"") sends an empty datagram (3.13.0; 3.11.7 and 3.12.1 return first).
DATAGRAM_SENDS_EMPTY = _sends_empty()
#: The bytes flow control counts per buffered datagram beyond its payload:
#: 3.14's _header_size, or the 8 that 3.13's sendto adds ("header bytes").
DATAGRAM_HEADER_SIZE: int = getattr(
    _StockDatagramTransport, "_header_size",
    8 if 8 in _StockDatagramTransport.sendto.__code__.co_consts else 0)
#: _make_datagram_transport refuses an fd that already has a transport.
DATAGRAM_CHECKS_FD = ("_ensure_fd_no_transport"
                      in SelectorEventLoop._make_datagram_transport.__code__.co_names)

# -- servers ----------------------------------------------------------------

# Server._attach/_detach take the transport since 3.13 (Server.close_clients).
_ATTACH_TAKES_TRANSPORT = (
    len(inspect.signature(_base_events.Server._attach).parameters) == 2
)


# (Each chosen once, here: they run twice per accepted connection.)
if _ATTACH_TAKES_TRANSPORT:
    def server_attach(server: Any, transport: Any) -> None:
        server._attach(transport)

    def server_detach(server: Any, transport: Any) -> None:
        server._detach(transport)
else:
    def server_attach(server: Any, transport: Any) -> None:
        server._attach()

    def server_detach(server: Any, transport: Any) -> None:
        server._detach()


def server_active_count(server: Any) -> int:
    """Open transports of an asyncio Server (attached in the transport's
    __init__, detached at connection_lost): Server._active_count on
    3.11-3.12, the size of Server._clients (a WeakSet of them) from 3.13."""
    count = getattr(server, "_active_count", None)
    if count is not None:
        return int(count)
    clients = getattr(server, "_clients", None)
    return len(clients) if clients is not None else 1


# -- introspection --------------------------------------------------------------


def format_call_graph(task: Any) -> str | None:
    """asyncio.format_call_graph(task) on 3.14+ (None before, or if it fails:
    it needs a real asyncio.Task)."""
    formatter: Any = getattr(asyncio, "format_call_graph", None)
    if formatter is None:
        return None
    try:
        return str(formatter(task))
    except Exception:
        return None


# -- running --------------------------------------------------------------------


def run(main: Any, debug: bool | None, loop_factory: Any) -> Any:
    """asyncio.run(main) on a loop from *loop_factory* (3.12 added the
    argument; 3.11 has asyncio.Runner, which takes it)."""
    if sys.version_info >= (3, 12):
        return asyncio.run(main, debug=debug, loop_factory=loop_factory)
    with asyncio.Runner(debug=debug, loop_factory=loop_factory) as runner:
        return runner.run(main)


# -- loggers ------------------------------------------------------------------


def loop_logger() -> logging.Logger:
    """asyncio's logger as base_events sees it now (tests patch it there)."""
    return _base_events.logger  # type: ignore[no-any-return]


def transport_logger() -> logging.Logger:
    """asyncio's logger as selector_events sees it now (tests patch it there)."""
    return _selector_events.logger  # type: ignore[no-any-return]


def pipe_logger() -> logging.Logger:
    """asyncio's logger as unix_events sees it now (tests patch it there)."""
    from asyncio import unix_events

    return unix_events.logger  # type: ignore[attr-defined,no-any-return]


# -- policies -----------------------------------------------------------------


def base_default_policy() -> Any:
    """The class our EventLoopPolicy derives from, or None where asyncio has
    no policy system (removed on CPython's main branch for 3.16, gh-127949).

    asyncio.DefaultEventLoopPolicy is deprecated from 3.14 (reading it warns);
    the class behind it is reached without the warning.
    """
    if PY314:
        if sys.platform == "win32":
            from asyncio import windows_events

            return getattr(windows_events, "_DefaultEventLoopPolicy", None)
        from asyncio import unix_events

        return getattr(unix_events, "_UnixDefaultEventLoopPolicy", None)
    return getattr(asyncio, "DefaultEventLoopPolicy", None)


def set_event_loop_policy(policy: Any) -> None:
    """asyncio.set_event_loop_policy without 3.14's deprecation warning (the
    caller of install() was warned already, at its own line)."""
    setter: Any = getattr(events, "_set_event_loop_policy", None)
    if setter is None:
        setter = asyncio.set_event_loop_policy
    setter(policy)
