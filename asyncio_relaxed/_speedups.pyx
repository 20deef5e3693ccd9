# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of the loop's hot path.

Theory of operation
===================

The pure-Python modules are the loop; this module is an accelerator for the
few methods every request runs, as CPython's ``_asyncio`` is for Task and
Future beside ``tasks.py``.  It defines subclasses of the pure classes
(:class:`Loop`, :class:`SocketTransport`, :class:`SSLTransport`,
:class:`DatagramTransport`, :class:`TransportShared`, the accept side) that
override those methods, and :class:`Counters` with C fields; everything
else (the settings, the poller's bookkeeping, the TLS engine, pipes,
closing, errors) is inherited, so there is one implementation of it.
``asyncio_relaxed._builds`` chooses which classes a loop is made of.

What makes the compiled methods fast is not compiling Python (a Cython or
mypyc build of the same classes costs more per request: every attribute is
then a generic lookup, where CPython's bytecode specializes it), but three
things bytecode cannot do:

* the transports' and handles' state is read and written in their slots by
  offset (``_speedups_capi.pxi``), a load from memory;
* a transport's socket is read and written with ``recv``/``send``/``sendmsg``
  on its descriptor, without the socket method's argument parsing and its
  release of the GIL, and ``epoll_wait`` fills a C array instead of a list
  of tuples;
* the counters are C integers.

Each compiled method keeps the reference's behaviour and takes the pure
method (the base class's) whenever its fast path's condition does not
hold: a socket that is not exactly ``socket.socket`` or whose class was
patched, data that is not ``bytes``, a transport past write_eof(), a loop
in debug mode, a patched ``Handle._run``, a selector that is not the
loop's own poller.  The pure method then does what it always does.  The
suite runs on both builds (``tests/conftest.py``), and so do the
conformance runs.
"""

include "_speedups_capi.pxi"

import asyncio
import heapq
import select
import sys
import socket as _socket_module
import time as _time_module

import weakref

from cpython.object cimport PyObject_RichCompareBool, Py_LT
from cpython.float cimport PyFloat_AS_DOUBLE

from . import (_accept, _basetransport, _compat, _health, _interest, _loop, _poller, _serving,
               _shared, _sockets, _stats, _transport, _writes)

# The pure classes: the reference, and the bases of this module's classes.
_PyLoop = _loop.Loop
_PySocketTransport = _transport.SocketTransport
_PyTransportShared = _shared.TransportShared

cdef object PySocketTransport = _PySocketTransport
cdef object PyTransportShared = _PyTransportShared
cdef object Handle = _compat.Handle
cdef object TimerHandle = _compat.TimerHandle
cdef object monotonic = _time_module.monotonic  # (Loop.time: read as a C global)
cdef object STOCK_HANDLE_RUN = _compat.STOCK_HANDLE_RUN
cdef object STOCK_PROCESS_EVENTS = _compat.STOCK_PROCESS_EVENTS
cdef object DeferredSelector = _poller.DeferredSelector
cdef object InterestTable = _interest.InterestTable
cdef object POLLER_SELECT = DeferredSelector.select
cdef object events_module = _compat.events
cdef object futures_module = _compat.futures
cdef object socket_type = _socket_module.socket
cdef object heappop = heapq.heappop
cdef object heappush = heapq.heappush
cdef object heapify = heapq.heapify
cdef object call_soon_pure = _compat.call_soon
cdef object _NO_BUFFER = _transport._NO_BUFFER
cdef bint _HAS_SENDMSG = _transport.HAS_SENDMSG
cdef double MAXIMUM_SELECT_TIMEOUT = _compat.MAXIMUM_SELECT_TIMEOUT
cdef Py_ssize_t MIN_SCHEDULED_TIMER_HANDLES = _compat.MIN_SCHEDULED_TIMER_HANDLES
cdef double MIN_CANCELLED_TIMER_HANDLES_FRACTION = _compat.MIN_CANCELLED_TIMER_HANDLES_FRACTION
cdef long QUEUED = _writes.QUEUED
cdef long IDLE = _writes.IDLE
cdef bint CONTEXTS = _compat.PY315
cdef bint PY315 = _compat.PY315
cdef bint PY314 = sys.version_info >= (3, 14)
cdef object tasks_module = asyncio.tasks
cdef object base_events_module = asyncio.base_events
#: time_metrics: a loop that never waits ends a stretch every 32nd iteration (_loop).
cdef long STRETCH_MASK = 31
cdef object EVENT_READ = _poller.EVENT_READ
cdef frozenset ROUTE_NAMES = _loop._ROUTE_NAMES
cdef frozenset TASK_KEYWORDS = frozenset({"name", "context"})

from ._backends import kernel_to_mask

# Whether an object is of a class whose slots this module reads (a subclass
# keeps its base's layout), by the C subtype check: isinstance() would ask
# the metaclass (the transports' is SlotsWithDict) for __instancecheck__.
cdef inline bint is_socket_transport(object o) noexcept:
    return PyObject_TypeCheck(o, <PyTypeObject *>PySocketTransport)


cdef inline bint is_shared(object o) noexcept:
    return PyObject_TypeCheck(o, <PyTypeObject *>PyTransportShared)


cdef inline bint is_handle(object o) noexcept:
    return PyObject_TypeCheck(o, <PyTypeObject *>Handle)


# Handle's slots (the same from 3.11 to 3.15: _compat checks them).
cdef Py_ssize_t H_CALLBACK = slot(Handle, "_callback")
cdef Py_ssize_t H_ARGS = slot(Handle, "_args")
cdef Py_ssize_t H_CANCELLED = slot(Handle, "_cancelled")
cdef Py_ssize_t H_CONTEXT = slot(Handle, "_context")
cdef Py_ssize_t H_LOOP = slot(Handle, "_loop")
cdef Py_ssize_t H_REPR = slot(Handle, "_repr")
cdef Py_ssize_t H_SOURCE_TRACEBACK = slot(Handle, "_source_traceback")
# TimerHandle's own (the same from 3.11 to 3.15).
cdef Py_ssize_t TH_WHEN = slot(TimerHandle, "_when")
cdef Py_ssize_t TH_SCHEDULED = slot(TimerHandle, "_scheduled")
# The poller's (DeferredSelector's and its InterestTable's), read where the
# poller is exactly a DeferredSelector (own_poller) and its table exactly an
# InterestTable (poller_table).
cdef Py_ssize_t P_ALWAYS_READY = slot(DeferredSelector, "_always_ready")
cdef Py_ssize_t P_DATA = slot(DeferredSelector, "_data")
cdef Py_ssize_t P_EPOLL = slot(DeferredSelector, "_epoll")
cdef Py_ssize_t P_FILEOBJS = slot(DeferredSelector, "_fileobjs")
cdef Py_ssize_t P_ON_ERROR = slot(DeferredSelector, "on_error")
cdef Py_ssize_t P_PATCHED = slot(DeferredSelector, "patched")
cdef Py_ssize_t P_REPLACED = slot(DeferredSelector, "replaced")
cdef Py_ssize_t P_STATE = slot(DeferredSelector, "_state")
cdef Py_ssize_t P_STATS = slot(DeferredSelector, "stats")
cdef Py_ssize_t P_TABLE = slot(DeferredSelector, "_table")
cdef Py_ssize_t I_DATA = slot(InterestTable, "data")
cdef Py_ssize_t I_DIRTY = slot(InterestTable, "dirty")
cdef Py_ssize_t I_STATES = slot(InterestTable, "states")
# The loop's time account's (_health.Health).
cdef object Health = _health.Health
cdef Py_ssize_t HE_TIMED = slot(Health, "timed")
cdef Py_ssize_t HE_SLOW = slot(Health, "slow")
# The socket transport's.
cdef Py_ssize_t T_BUFFER = slot(_PySocketTransport, "_buffer")
cdef Py_ssize_t T_BUFFER_SIZE = slot(_PySocketTransport, "_buffer_size")
cdef Py_ssize_t T_CLOSING = slot(_PySocketTransport, "_closing")
cdef Py_ssize_t T_CONN_LOST = slot(_PySocketTransport, "_conn_lost")
cdef Py_ssize_t T_FEEDS = slot(_PySocketTransport, "_feeds")
cdef Py_ssize_t T_HIGH_WATER = slot(_PySocketTransport, "_high_water")
cdef Py_ssize_t T_PROTOCOL = slot(_PySocketTransport, "_protocol")
cdef Py_ssize_t T_PROTOCOL_PAUSED = slot(_PySocketTransport, "_protocol_paused")
cdef Py_ssize_t T_SENDING = slot(_PySocketTransport, "_sending")
cdef Py_ssize_t T_SHARED = slot(_PySocketTransport, "_shared")
cdef Py_ssize_t T_SOCK = slot(_PySocketTransport, "_sock")
cdef Py_ssize_t T_WRITE_GUARD = slot(_PySocketTransport, "_write_guard")
cdef Py_ssize_t T_WRITE_STATE = slot(_PySocketTransport, "_write_state")
cdef Py_ssize_t T_EMPTY_WAITER = slot(_PySocketTransport, "_empty_waiter")
cdef Py_ssize_t T_EOF = slot(_PySocketTransport, "_eof")
cdef Py_ssize_t T_EXTRA_DICT = slot(_PySocketTransport, "_extra_dict")
cdef Py_ssize_t T_LOOP = slot(_PySocketTransport, "_loop")
cdef Py_ssize_t T_LOW_WATER = slot(_PySocketTransport, "_low_water")
cdef Py_ssize_t T_PAUSED = slot(_PySocketTransport, "_paused")
cdef Py_ssize_t T_PEERNAME = slot(_PySocketTransport, "_peername")
cdef Py_ssize_t T_PROTOCOL_CONNECTED = slot(_PySocketTransport, "_protocol_connected")
cdef Py_ssize_t T_RECV_SIZE = slot(_PySocketTransport, "_recv_size")
cdef Py_ssize_t T_SERVER = slot(_PySocketTransport, "_server")
cdef Py_ssize_t T_SOCK_FD = slot(_PySocketTransport, "_sock_fd")
cdef Py_ssize_t T_SOCKNAME = slot(_PySocketTransport, "_sockname")
cdef Py_ssize_t T_TSOCK = slot(_PySocketTransport, "_tsock")
cdef Py_ssize_t T_CONTEXT = slot(_PySocketTransport, "_context") if CONTEXTS else -1
# socket.socket's own (its __slots__, the same from 3.11 to 3.15).
cdef Py_ssize_t K_IO_REFS = slot(_socket_module.socket, "_io_refs")
cdef Py_ssize_t K_CLOSED = slot(_socket_module.socket, "_closed")
# The shared state's (the write queue's, settings, counters).
cdef Py_ssize_t S_DEFERRED = slot(_PyTransportShared, "deferred")
cdef Py_ssize_t S_FEEDING = slot(_PyTransportShared, "feeding")
cdef Py_ssize_t S_PENDING = slot(_PyTransportShared, "pending")
cdef Py_ssize_t S_PENDING_CONTEXTS = slot(_PyTransportShared, "pending_contexts")
cdef Py_ssize_t S_FEEDING_CONTEXTS = slot(_PyTransportShared, "feeding_contexts")
cdef Py_ssize_t S_READ_SIZE = slot(_PyTransportShared, "read_size")
cdef Py_ssize_t S_STATS = slot(_PyTransportShared, "stats")
cdef Py_ssize_t S_POLLER = slot(_PyTransportShared, "poller")
cdef Py_ssize_t S_SMALL_READ = slot(_PyTransportShared, "small_read")


def _check_socket_layout():
    """AR_SOCK_FD and AR_SOCK_FAMILY read the descriptor and the family
    where this Python's socket object keeps them (the module refuses to load
    otherwise)."""
    a, b = _socket_module.socketpair()
    c = _socket_module.socket(_socket_module.AF_INET, _socket_module.SOCK_DGRAM)
    try:
        if (AR_SOCK_FD(a) != a.fileno() or AR_SOCK_FD(b) != b.fileno()
                or AR_SOCK_FAMILY(a) != a.family or AR_SOCK_FAMILY(c) != c.family):
            raise ImportError("asyncio_relaxed._speedups: socket.socket's C layout is not "
                              "the one this module was written for")
    finally:
        a.close()
        b.close()
        c.close()


_check_socket_layout()


cdef object EPOLL_TYPE = getattr(select, "epoll", None)


def _check_epoll_layout():
    """AR_EPOLL_FD reads an epoll object's descriptor where this Python
    keeps it, and -1 once it is closed (the module refuses to load
    otherwise)."""
    if EPOLL_TYPE is None:
        return
    epoll = EPOLL_TYPE()
    read_open = AR_EPOLL_FD(epoll)
    fd = epoll.fileno()
    epoll.close()
    if read_open != fd or AR_EPOLL_FD(epoll) != -1:
        raise ImportError("asyncio_relaxed._speedups: select.epoll's C layout is not "
                          "the one this module was written for")


_check_epoll_layout()


cdef inline int epoll_fd(object epoll) except? -1:
    """The descriptor of *epoll*: read from a select.epoll's struct, else
    by fileno() (a subclass's, or a closed epoll's ValueError)."""
    cdef int fd
    if type(epoll) is EPOLL_TYPE:
        fd = AR_EPOLL_FD(epoll)
        if fd >= 0:
            return fd
    return epoll.fileno()

# socket.socket's recv, send and sendmsg (and recvfrom and sendto, for
# datagrams) are the C socket's own, and the compiled transports call them
# as system calls on the descriptor while the class still has them: its
# version tag (which CPython changes whenever the class or a base is
# modified) is the one it had when they were last found unchanged.  A patch
# of socket.socket.send, say, changes the tag, and the transport then calls
# the methods as the pure one does until the patch is undone.
import _socket
cdef object C_RECV = _socket.socket.recv
cdef object C_SEND = _socket.socket.send
cdef object C_SENDMSG = getattr(_socket.socket, "sendmsg", None)
cdef object C_RECVFROM = _socket.socket.recvfrom
cdef object C_SENDTO = _socket.socket.sendto
cdef unsigned int socket_tag = 0


cdef bint socket_unchanged():
    """Whether socket.socket has the C socket's recv, send, sendmsg,
    recvfrom and sendto (the lookups give the class a version tag, then
    kept)."""
    global socket_tag
    if (socket_type.recv is C_RECV and socket_type.send is C_SEND
            and getattr(socket_type, "sendmsg", None) is C_SENDMSG
            and socket_type.recvfrom is C_RECVFROM and socket_type.sendto is C_SENDTO):
        socket_tag = AR_TYPE_TAG(socket_type)
        return True
    return False


cdef inline bint plain_socket(object sock):
    """A socket the transport may read and write by system call."""
    if type(sock) is not socket_type:
        return False
    if socket_tag and AR_TYPE_TAG(socket_type) == socket_tag:
        return True
    return socket_unchanged()


def _plain_socket_now(sock):
    """plain_socket(), for the tests."""
    return plain_socket(sock)


# -- counters ---------------------------------------------------------------

cdef class Counters:
    """:class:`asyncio_relaxed._stats.Counters` with C integers: the same
    names (tests/test_speedups.py holds the two to one list), the same
    snapshot.  An increment from compiled code is one add; Python code
    reads and writes them as attributes."""

    cdef public long long iterations, events, callbacks, poll_waits
    cdef public long long epoll_ctl_add, epoll_ctl_mod, epoll_ctl_del
    cdef public long long recv, recv_eagain, send, sendmsg, send_eagain
    cdef public long long accept, accept_eagain
    cdef public long long writes, writes_deferred, writes_coalesced, partial_writes, write_feeds
    cdef public long long always_ready_fds
    cdef public long long datagram_read_events, datagram_recv, datagram_recv_eagain
    cdef public long long datagrams_received, datagram_bytes_received
    cdef public long long datagram_send, datagram_send_eagain, datagrams_sent
    cdef public long long datagram_bytes_sent, datagram_errors
    cdef public long long pipe_read, pipe_read_eagain, pipe_bytes_read
    cdef public long long pipe_write, pipe_write_eagain, pipe_bytes_written
    cdef public long long sent_at_once, queued_at_once, datagram_sent_ok

    def __init__(self):
        pass  # (C fields start at zero)

    def reset(self):
        for name in COUNTER_NAMES:
            setattr(self, name, 0)

    def snapshot(self, backend):
        return _stats.Counters.snapshot(self, backend)


#: Every counter's name, _stats.Counters' slots.
COUNTER_NAMES = _stats.Counters.__slots__


# -- the loop's hot state ------------------------------------------------------

cdef double window_end(double now, double resolution):
    """_compat.end_time: the end of an iteration's due-timer window, now
    plus the clock's resolution; 3.15's, at least math.ulp(now) (the ulp
    and the max as CPython's math.ulp and max() compute them)."""
    cdef double x, up
    if not PY315:
        return now + resolution
    x = fabs(now)  # (a NaN or an infinity gives what math.ulp gives: itself)
    up = nextafter(x, INFINITY)
    up = x - nextafter(x, -INFINITY) if isinf(up) else up - x
    return now + (up if up > resolution else resolution)


def _window_end_now(now, resolution):
    """window_end(), for the tests."""
    return window_end(now, resolution)


cdef class LoopCore:
    """What the compiled code reads of its loop most often, as C fields:
    the loop's own attributes of those names (in its instance dict, where
    stock's code reads and writes them) mirrored here by the compiled
    Loop's __setattr__ and __delattr__, which every assignment reaches.
    A read of one is then a load, not a lookup in the instance dict."""

    cdef object ready          # _ready (stock never rebinds it)
    cdef object ready_append   # its append and popleft, bound
    cdef object ready_popleft
    cdef object selector       # _selector
    cdef object shared         # _shared
    cdef object health         # _health
    cdef dict transports       # _transports.data (the WeakValueDictionary's dict)
    cdef bint closed           # _closed
    cdef bint debug            # _debug
    cdef bint stopping         # _stopping
    cdef bint patched          # a method of the loop's was replaced on the instance
    # The array epoll_wait fills (wait_readers), grown to the fds registered.
    cdef epoll_event *events
    cdef int capacity

    def __cinit__(self):
        self.closed = True  # (the pure Loop's class attribute, until the base __init__)

    def __dealloc__(self):
        free(self.events)


#: The attributes LoopCore mirrors, by name.
cdef frozenset MIRRORED = frozenset({"_ready", "_selector", "_shared", "_health",
                                     "_transports", "_closed", "_debug", "_stopping"})


cdef int mirror(LoopCore core, str name, object value) except -1:
    if name in LOOP_METHOD_NAMES:
        # The compiled code calls these directly only while none is
        # replaced on the instance (a test's mock), and never after.
        core.patched = True
    elif name == "_closed":
        core.closed = value
    elif name == "_debug":
        core.debug = value
    elif name == "_stopping":
        core.stopping = value
    elif name == "_ready":
        core.ready = value
        core.ready_append = getattr(value, "append", None)
        core.ready_popleft = getattr(value, "popleft", None)
    elif name == "_selector":
        core.selector = value
    elif name == "_shared":
        core.shared = value
    elif name == "_health":
        core.health = value
    elif name == "_transports":
        core.transports = getattr(value, "data", None) if value is not None else None
        if type(core.transports) is not dict:
            core.transports = None
    return 0


cdef Py_ssize_t LOOP_CORE  # the compiled Loop's _core slot (set once the class exists)
#: The compiled Loop's methods the compiled code calls directly (see
#: direct_loop()), and the transport class whose instances it makes itself
#: (new_accepted()); and the watch on its class (set once it exists).
cdef frozenset LOOP_METHOD_NAMES = frozenset({"call_soon", "_set_callback", "_SocketTransport"})
cdef object LOOP_METHODS = None
#: Whether the compiled Loop's _process_events is stock's (set once the
#: class exists).
cdef StockAttribute LOOP_EVENTS = None


cdef inline LoopCore direct_loop(object loop):
    """The LoopCore of *loop* if the compiled code may run its call_soon and
    _set_callback bodies itself: a loop of the compiled class (not a
    subclass), whose class and instance have them as they are; else None
    (then they are called as methods)."""
    cdef LoopCore core
    if type(loop) is not CLoop_type:
        return None
    core = core_of(loop)
    if core is None or core.patched or not (<ClassWatch>LOOP_METHODS).unchanged():
        return None
    return core


cdef inline LoopCore core_of(object loop):
    """The LoopCore of a compiled loop, or None (another loop, or one
    whose __init__ has not run)."""
    cdef PyObject *core
    if not PyObject_TypeCheck(loop, <PyTypeObject *>CLoop_type):
        return None
    core = AR_SLOT(loop, LOOP_CORE)
    if core == NULL:
        return None
    return <LoopCore>core


cdef object CLoop_type = object  # the compiled Loop (set once the class exists)


# -- the socket transport -------------------------------------------------------

include "_speedups_life.pxi"


# -- the poller ------------------------------------------------------------------

#: DeferredSelector's methods the compiled code runs the bodies of, or whose
#: identity decides the loop's route (select).
cdef ClassWatch POLLER_METHODS = ClassWatch(DeferredSelector, (
    "select", "ready_readers", "own", "release_reader", "set_callback"))


cdef inline bint own_poller(object poller):
    """*poller* is exactly a DeferredSelector, none of its methods replaced
    on the instance or the class: the compiled code may read its slots and
    run those methods' bodies itself."""
    return (type(poller) is DeferredSelector and not get(poller, P_PATCHED)
            and not get(poller, P_REPLACED) and POLLER_METHODS.unchanged())


cdef inline object poller_table(object poller):
    """The InterestTable of an own_poller() poller, or None if its _table
    is anything else."""
    table = get(poller, P_TABLE)
    return table if type(table) is InterestTable else None


#: Whether Handle's and TimerHandle's _run are stock's Handle._run.
cdef StockAttribute HANDLE_RUN = StockAttribute(Handle, "_run", STOCK_HANDLE_RUN)
cdef StockAttribute TIMER_RUN = StockAttribute(TimerHandle, "_run", STOCK_HANDLE_RUN)


cdef inline bint polls_by_select(object selector):
    """type(selector).select is DeferredSelector.select: by the class's
    watch where it is exactly a DeferredSelector."""
    if type(selector) is DeferredSelector and POLLER_METHODS.unchanged():
        return True
    return type(selector).select is POLLER_SELECT


class SocketTransport(_PySocketTransport):
    """The socket transport with its life (made, started, closed, ended),
    reads, write and send compiled."""

    __slots__ = ()

    __init__ = transport_init
    _connection_made = connection_made
    _start_reading = start_reading
    close = transport_close
    _read_ready__on_eof = on_eof
    _call_connection_lost = call_connection_lost
    __del__ = transport_del

    def _read_ready__data_received(self):
        """One read into the process's receive buffer (see
        _speedups_capi.pxi), then data_received with an exact-size copy:
        uvloop's read, where the pure transport chooses between recv() and
        recv_into() by the traffic (_transport, "Reads"), a choice made for
        what each costs in bytecode."""
        cdef Counters stats
        cdef Py_ssize_t n, size
        cdef object sock, shared
        if not is_socket_transport(self):  # (an unbound call's self)
            return _PySocketTransport._read_ready__data_received(self)
        if get(self, T_CONN_LOST):
            return
        sock = get(self, T_SOCK)
        if not plain_socket(sock):
            return _PySocketTransport._read_ready__data_received(self)
        shared = get(self, T_SHARED)
        stats = <Counters?>get(shared, S_STATS)
        size = get(shared, S_READ_SIZE)
        if size > read_buffer_size:
            reserve_read_buffer(size)
        stats.recv += 1
        n = c_recv(AR_SOCK_FD(sock), read_buffer, size, 0)
        if n < 0:
            if would_block(errno):
                stats.recv_eagain += 1
                return
            try:
                raise_errno()
            except OSError as exc:  # (raised: the handler's exc_info is this error, as stock's)
                self._fatal_error(exc, "Fatal read error on socket transport")
            return
        if n == 0:
            self._read_ready__on_eof()
            return
        data = PyBytes_FromStringAndSize(read_buffer, n)
        try:
            (get(self, T_PROTOCOL)).data_received(data)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.data_received() call failed.")

    def _read_ready__get_buffer(self):
        """A BufferedProtocol's read: recv() by system call into the buffer
        get_buffer() gave; any failure or buffer that is not plain is the
        pure method's (its errors, in stock's words)."""
        cdef Counters stats
        cdef Py_ssize_t n
        cdef Py_buffer view
        cdef object sock, protocol
        if not is_socket_transport(self):
            return _PySocketTransport._read_ready__get_buffer(self)
        if get(self, T_CONN_LOST):
            return
        sock = get(self, T_SOCK)
        if not plain_socket(sock):
            return _PySocketTransport._read_ready__get_buffer(self)
        protocol = get(self, T_PROTOCOL)
        try:
            buf = protocol.get_buffer(-1)
            if not len(buf):
                raise RuntimeError("get_buffer() returned an empty buffer")
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.get_buffer() call failed.")
            return
        stats = <Counters?>get(get(self, T_SHARED), S_STATS)
        try:
            PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE)
        except BaseException:
            # Not a writable buffer: recv_into() says so, as stock's does.
            return _buffered_read_failed(self, sock, buf, stats)
        try:
            stats.recv += 1
            n = c_recv(AR_SOCK_FD(sock), view.buf, view.len, 0)
        finally:
            PyBuffer_Release(&view)
        if n < 0:
            if would_block(errno):
                stats.recv_eagain += 1
                return
            try:
                raise_errno()
            except OSError as exc:  # (raised: the handler's exc_info is this error, as stock's)
                self._fatal_error(exc, "Fatal read error on socket transport")
            return
        if n == 0:
            self._read_ready__on_eof()
            return
        try:
            protocol.buffer_updated(n)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._fatal_error(exc, "Fatal error: protocol.buffer_updated() call failed.")

    def is_closing(self):
        if not is_socket_transport(self):
            return _PySocketTransport.is_closing(self)
        return get(self, T_CLOSING)

    def write(self, data):
        """write()'s common cases: bytes on a transport with nothing
        buffered, sent at once (eager, or past the high-water mark) or
        queued (deferred); everything else is the pure write()'s."""
        cdef Counters stats
        cdef Py_ssize_t size, n
        cdef object shared, sock
        if (type(data) is not bytes or not is_socket_transport(self) or get(self, T_WRITE_GUARD) is not False
                or get(self, T_BUFFER) or get(self, T_SENDING) is not False):
            return _PySocketTransport.write(self, data)
        size = len(<bytes>data)
        if not size:
            return
        shared = get(self, T_SHARED)
        stats = <Counters?>get(shared, S_STATS)
        if get(shared, S_DEFERRED) is not False and size <= get(self, T_HIGH_WATER):
            # Deferred, under the high-water mark: buffered (bytes need no
            # copy), the transport queued for the flush (WriteQueue.queue).
            ar_set(self, T_BUFFER, [data])
            ar_set(self, T_BUFFER_SIZE, size)
            stats.queued_at_once += 1
            # WriteQueue.queue: QUEUED, with the context its send runs in.
            ar_set(self, T_WRITE_STATE, QUEUED)
            (<list?>get(shared, S_PENDING)).append(self)
            context = transport_context(self)
            (<list?>get(shared, S_PENDING_CONTEXTS)).append(
                PyContext_CopyCurrent() if context is None else context)
            return
        sock = get(self, T_SOCK)
        if not plain_socket(sock):
            return _PySocketTransport.write(self, data)
        stats.sent_at_once += 1
        n = c_send(AR_SOCK_FD(sock), PyBytes_AS_STRING(data), size, 0)
        if n == size:
            return
        if n < 0:
            if not would_block(errno):
                try:
                    raise_errno()
                except OSError as exc:  # (raised: the handler's exc_info is this error, as stock's)
                    self._fatal_error(exc, "Fatal write error on socket transport")
                return
            stats.send_eagain += 1
            n = 0
        stats.partial_writes += 1
        self._append(memoryview(data)[n:] if n else data)
        shared.short(self)
        self._maybe_pause_protocol()

    def _write_now(self, vectored=False):
        """The send primitive (the pure one's docstring): send() of one
        buffer, sendmsg() of up to IOV_MAX, by system call on a plain
        socket; the pure method for the rest of what follows a send that
        did not take everything or had more to do."""
        cdef Counters stats
        cdef list buffer
        cdef Py_ssize_t chunks, n, total, i
        cdef object sock
        cdef iovec iov[64]
        cdef msghdr message
        if not is_socket_transport(self):
            return _PySocketTransport._write_now(self, vectored)
        buffer_object = get(self, T_BUFFER)
        if get(self, T_CONN_LOST) or not buffer_object:
            return
        sock = get(self, T_SOCK)
        if type(buffer_object) is not list or not plain_socket(sock):
            return _PySocketTransport._write_now(self, vectored)
        buffer = <list>buffer_object
        chunks = len(buffer)
        if chunks > 64 or (chunks > 1 and not _HAS_SENDMSG):
            return _PySocketTransport._write_now(self, vectored)
        for i in range(chunks):
            if type(buffer[i]) is not bytes:
                return _PySocketTransport._write_now(self, vectored)
        stats = <Counters?>get(get(self, T_SHARED), S_STATS)
        if chunks == 1 and not vectored:
            stats.send += 1
            n = c_send(AR_SOCK_FD(sock), PyBytes_AS_STRING(buffer[0]), len(<bytes>buffer[0]), 0)
        else:
            stats.sendmsg += 1
            if chunks > 1:
                stats.writes_coalesced += chunks
            for i in range(chunks):
                iov[i].iov_base = PyBytes_AS_STRING(buffer[i])
                iov[i].iov_len = len(<bytes>buffer[i])
            message.msg_name = NULL
            message.msg_namelen = 0
            message.msg_iov = iov
            message.msg_iovlen = chunks
            message.msg_control = NULL
            message.msg_controllen = 0
            message.msg_flags = 0
            n = c_sendmsg(AR_SOCK_FD(sock), &message, 0)
        if n < 0:
            if not would_block(errno):
                try:
                    raise_errno()
                except OSError as exc:  # (raised: the handler's exc_info is this error, as stock's)
                    self._write_failed(exc)
                return
            stats.send_eagain += 1
            n = 0
        total = get(self, T_BUFFER_SIZE)
        if n == total:
            # All of it went out: the list goes too (the reference's reason).
            ar_set(self, T_BUFFER, _NO_BUFFER)
            ar_set(self, T_BUFFER_SIZE, 0)
            if not (get(self, T_WRITE_STATE) or get(self, T_FEEDS)
                    or get(self, T_PROTOCOL_PAUSED)
                    or get(self, T_CLOSING)
                    or get(self, T_WRITE_GUARD)):
                return  # IDLE already, nothing to resume or end
            short = False
        else:
            if n:
                self._consume(n)
            stats.partial_writes += 1
            short = True
        if get(self, T_PROTOCOL_PAUSED):
            ar_set(self, T_SENDING, True)
            try:
                self._maybe_resume_protocol()  # May append to the buffer.
            finally:
                ar_set(self, T_SENDING, False)
        if get(self, T_BUFFER):
            if short:
                (get(self, T_SHARED)).short(self)
            elif not get(self, T_WRITE_STATE):
                stats.writes_deferred += 1
                (get(self, T_SHARED)).queue(self)
        else:
            self._write_done()


cdef object _buffered_read_failed(object transport, object sock, object buf, Counters stats):
    """The read of a buffer recv() cannot take by system call, by the
    socket's recv_into(), whose error is stock's."""
    stats.recv += 1
    try:
        sock.recv_into(buf)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        transport._fatal_error(exc, "Fatal read error on socket transport")
        return
    raise AssertionError(f"recv_into() took {buf!r}, which is no writable buffer")


SOCKET_TRANSPORT = SocketTransport
TRANSPORT_METHODS = ClassWatch(SocketTransport, (
    "_attach", "_schedule_start", "_connection_made", "_start_reading", "_read_method",
    "_lost", "_unwatch_for_good", "_socket_lost", "_forget", "_detach_server",
    "_call_connection_lost"))
TRANSPORT_NEW = ClassWatch(SocketTransport, ("__new__", "__init__"))



# -- the TLS layer's record path ---------------------------------------------------

include "_speedups_tls.pxi"


# -- the datagram transport ---------------------------------------------------------

include "_speedups_datagram.pxi"


# -- the accept path -------------------------------------------------------------

include "_speedups_accept.pxi"


class CompiledAccept:
    """The compiled accept, before each strategy's pure class in its MRO
    (no slots of its own: the pure Listener's layout holds)."""

    __slots__ = ()
    accept_one = accept_one
    burst = burst
    take_queued = take_queued
    read_queue_length = read_queue_length


class BatchListener(CompiledAccept, _accept.BatchListener):
    __slots__ = ()
    ready = take_queued  # (the pure class binds its take_queued by value)


class SingleListener(CompiledAccept, _accept.SingleListener):
    __slots__ = ()
    ready = accept_one  # (the pure class binds its accept_one by value)


class RelaxedListener(CompiledAccept, _accept.RelaxedListener):
    __slots__ = ()


class BalancedListener(CompiledAccept, _accept.BalancedListener):
    __slots__ = ()


#: The compiled listener of each accept strategy (_accept.listener_class's).
LISTENERS = {cls.strategy: cls for cls in (BatchListener, SingleListener, RelaxedListener,
                                           BalancedListener)}


class Serving(_serving.Serving):
    """The loop's accept side with a plain connection's serving compiled,
    and the compiled listeners."""

    __slots__ = ()

    def __init__(self, loop, config, stats, shared):
        _serving.Serving.__init__(self, loop, config, stats, shared)
        self.listener_class = LISTENERS[config.accept]

    accepted = serving_accepted


SERVING_TYPE = Serving
SERVING_METHODS = ClassWatch(Serving, ("accepted", "_serve"))


# -- the write queue -------------------------------------------------------------

class TransportShared(_PyTransportShared):
    """The loop's write queue with its flush compiled."""

    __slots__ = ()

    def flush(self, include_feeds):
        """WriteQueue.flush: the send of every queued transport, in the
        order queued, each in the context the queue kept for it."""
        cdef list queue, contexts, feeding
        cdef Py_ssize_t i
        if not is_shared(self):
            return _PyTransportShared.flush(self, include_feeds)
        queue = <list?>get(self, S_PENDING)
        contexts = <list?>get(self, S_PENDING_CONTEXTS)
        ar_set(self, S_PENDING, [])
        ar_set(self, S_PENDING_CONTEXTS, [])
        if include_feeds:
            feeding = <list?>get(self, S_FEEDING)
            if feeding:
                queue = queue + feeding
                contexts = contexts + <list?>get(self, S_FEEDING_CONTEXTS)
                ar_set(self, S_FEEDING, [])
                ar_set(self, S_FEEDING_CONTEXTS, [])
        if len(queue) != len(contexts):
            raise ValueError("the write queue's transports and contexts differ in number")
        for i in range(len(queue)):
            transport = queue[i]
            # The queue holds every kind of transport that writes through
            # it (pipes too): a socket transport's state is read in its slot.
            if is_socket_transport(transport):
                if get(transport, T_WRITE_STATE) != QUEUED:
                    continue
                ar_set(transport, T_WRITE_STATE, IDLE)
            elif transport._write_state == QUEUED:
                transport._write_state = IDLE
            else:
                continue
            context = contexts[i]
            try:
                PyContext_Enter(context)
                try:
                    transport._write_now()
                finally:
                    PyContext_Exit(context)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                if self.on_error is None:
                    raise
                self.on_error(transport, exc)


# -- the loop ------------------------------------------------------------------

cdef object wait_readers(LoopCore core, object selector, object timeout, Counters stats):
    """DeferredSelector.ready_readers, compiled: the wait in epoll_wait
    into the loop's C array (its own: loops in other threads wait at the
    same time, without the GIL), then each event that is input alone on a
    COMMON fd appends its reader to the loop's ready queue; the other
    events are returned as (fd, data, mask) through the poller's own _cut
    (None: interrupted)."""
    cdef int ms, n, i, fd, maxevents, epfd, delivered
    cdef epoll_event *events
    cdef unsigned int kmask
    cdef double seconds
    cdef dict datas = <dict?>get(selector, P_DATA)
    cdef dict states = <dict?>get(selector, P_STATE)
    if get(get(selector, P_TABLE), I_DIRTY):
        selector.flush()
    if timeout is None:
        ms = -1
    else:
        seconds = timeout
        if seconds <= 0:
            ms = 0
        else:
            # Millisecond resolution, rounded up (the pure _wait's reason).
            seconds *= 1e3
            ms = <int>seconds
            if ms < seconds:
                ms += 1
    stats.poll_waits += 1
    maxevents = len(datas) or 1
    if maxevents > core.capacity:
        memory = <epoll_event *>realloc(core.events, maxevents * sizeof(epoll_event))
        if memory == NULL:
            raise MemoryError()
        core.events = memory
        core.capacity = maxevents
    events = core.events
    epfd = epoll_fd(get(selector, P_EPOLL))
    if ms == 0:
        n = epoll_wait(epfd, events, maxevents, 0)
    else:
        with nogil:
            n = epoll_wait(epfd, events, maxevents, ms)
    if n <= 0:
        if n < 0:
            if errno != EINTR:
                raise_errno()
            PyErr_CheckSignals()  # a handler that raises: its exception, as select's
        return None
    rest = []
    delivered = n
    for i in range(n):
        fd = events[i].data.fd
        kmask = events[i].events
        if kmask == EPOLLIN and fd not in states:
            data = datas.get(fd)
            if type(data) is tuple:  # (a COMMON fd's data is its (reader, None))
                core.ready_append((<tuple>data)[0])
                continue
        if not selector._cut(fd, kernel_to_mask(kmask), rest.append):
            delivered -= 1
    stats.events += delivered
    return rest


cdef inline bint own_route(object loop, object selector):
    """The loop polls through its own poller, by epoll: the pure
    _run_once's condition for ready_readers, and an epoll backend with no
    always-ready fd (those take the pure ready_readers); its fields read
    only on an own_poller() poller with an InterestTable, which
    wait_readers needs."""
    return (own_poller(selector) and poller_table(selector) is not None
            and stock_process_events(loop)
            and get(selector, P_EPOLL) is not None and not get(selector, P_ALWAYS_READY))


cdef inline bint health_timed(object health) except -1:
    """health.timed (the time_metrics setting), by offset in a Health."""
    if type(health) is Health:
        return get(health, HE_TIMED)
    return health.timed


cdef inline bint health_slow(object health) except -1:
    """Whether health.slow (the slow_callback setting) is on."""
    if type(health) is Health:
        return get(health, HE_SLOW)
    return health.slow


cdef inline bint stock_process_events(object loop):
    """type(loop)._process_events is stock's: by the class's watch where
    *loop* is exactly the compiled Loop."""
    if type(loop) is CLoop_type:
        return LOOP_EVENTS.holds()
    return type(loop)._process_events is STOCK_PROCESS_EVENTS


cdef object set_callback(LoopCore core, object self, object fd, int which, object callback,
                         object args, object context):
    """Loop._set_callback for a compiled loop: a Handle made with its slots
    set; a transport's new socket (owned, not registered, the kernel
    holding nothing) made COMMON with one EPOLL_CTL_ADD written out here,
    the poller's set_callback for any other fd."""
    cdef int epfd
    cdef epoll_event event
    selector = core.selector
    if not own_poller(selector):
        return _PyLoop._set_callback(self, fd, which, callback, args, context)
    if core.closed:
        raise RuntimeError("Event loop is closed")
    if core.debug or events_module.Handle is not Handle:
        handle = events_module.Handle(callback, args, self, context)
    else:
        handle = new_handle(self, callback, args, context)
    table = poller_table(selector)
    epoll = get(selector, P_EPOLL)
    if not which and type(fd) is int and fd >= 0 and epoll is not None and table is not None:
        states = <dict?>get(table, I_STATES)
        datas = <dict?>get(table, I_DATA)
        if states.get(fd) == OWNED and fd not in datas:
            # InterestTable.start_common, then the ADD (DeferredSelector.set_callback).
            del states[fd]
            datas[fd] = (handle, None)
            (<Counters?>get(selector, P_STATS)).epoll_ctl_add += 1
            event.events = EPOLLIN
            event.data.u64 = 0
            event.data.fd = fd
            epfd = epoll_fd(epoll)
            if epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &event) == 0:
                return handle
            # Fresh again: register() knows what each refusal means.
            table.end_common(fd, None)
            table.own(fd)
            selector.register(fd, EVENT_READ, (handle, None))
            return handle
    replaced = selector.set_callback(fd, which, handle)
    if replaced is not None:
        replaced.cancel()
    return handle


cdef inline object init_handle(object handle, object loop, object callback, object args,
                               object context):
    """*handle* (a new Handle or TimerHandle) with Handle's slots set as
    Handle.__init__ sets them outside debug mode."""
    ar_set(handle, H_CONTEXT, PyContext_CopyCurrent() if context is None else context)
    ar_set(handle, H_LOOP, loop)
    ar_set(handle, H_CALLBACK, callback)
    ar_set(handle, H_ARGS, args)
    ar_set(handle, H_CANCELLED, False)
    ar_set(handle, H_REPR, None)
    ar_set(handle, H_SOURCE_TRACEBACK, None)
    return handle


cdef inline object new_handle(object loop, object callback, object args, object context):
    """events.Handle(callback, args, loop, context) outside debug mode, its
    slots set as Handle.__init__ sets them (_compat.new_handle's)."""
    return init_handle(AR_NEW(Handle), loop, callback, args, context)


cdef object call_soon(LoopCore core, object self, object callback, tuple args, object context):
    """_compat.call_soon for a compiled loop: the handle made by new_handle()
    and queued."""
    if core.closed:
        raise RuntimeError("Event loop is closed")
    if core.debug or events_module.Handle is not Handle:
        return call_soon_pure(self, callback, *args, context=context)
    handle = new_handle(self, callback, args, context)
    core.ready_append(handle)
    return handle


cdef object schedule(object loop, object callback, tuple args, object context):
    """loop.call_soon(callback, *args, context=context): its body run here
    where direct_loop() allows it."""
    cdef LoopCore core = direct_loop(loop)
    if core is None:
        return loop.call_soon(callback, *args, context=context)
    return call_soon(core, loop, callback, args, context)


cdef object register_reader(object loop, object fd, object callback, object context):
    """loop._set_callback(fd, 0, callback, (), context), the same way."""
    cdef LoopCore core = direct_loop(loop)
    if core is None:
        return loop._set_callback(fd, 0, callback, (), context)
    return set_callback(core, loop, fd, 0, callback, (), context)


# -- the timers ------------------------------------------------------------------
#
# call_at and call_later make stock's TimerHandle with its slots set (as
# new_handle does a Handle), and the timer heap is kept by heapq's own
# algorithm (Modules/_heapqmodule.c: siftdown, and siftup's bottom-up
# variant) with TimerHandle.__lt__'s comparison of two stock TimerHandles
# made on their _when, without the Python frame of __lt__: uvicorn
# schedules and cancels a keep-alive timer per request.  Any other pair
# of items is compared by `<`, as heapq compares them.

cdef object TIMER_METHODS = None  # ClassWatch(TimerHandle, __init__, __lt__)


cdef inline bint timers_stock():
    """events.TimerHandle is stock's, with its own __init__ and __lt__."""
    return (events_module.TimerHandle is TimerHandle
            and (<ClassWatch>TIMER_METHODS).unchanged())


cdef int timer_lt(object a, object b, bint stock) except -1:
    """a < b, as heapq asks it."""
    cdef PyObject *wa
    cdef PyObject *wb
    if stock and type(a) is TimerHandle and type(b) is TimerHandle:
        wa = AR_SLOT(a, TH_WHEN)
        wb = AR_SLOT(b, TH_WHEN)
        if wa != NULL and wb != NULL:
            if type(<object>wa) is float and type(<object>wb) is float:
                return PyFloat_AS_DOUBLE(<object>wa) < PyFloat_AS_DOUBLE(<object>wb)
            return PyObject_RichCompareBool(<object>wa, <object>wb, Py_LT)
    return PyObject_RichCompareBool(a, b, Py_LT)


cdef int heap_siftdown(list heap, Py_ssize_t startpos, Py_ssize_t pos, bint stock) except -1:
    cdef Py_ssize_t parentpos, size = len(heap)
    cdef int lt
    newitem = heap[pos]
    while pos > startpos:
        parentpos = (pos - 1) >> 1
        parent = heap[parentpos]
        lt = timer_lt(newitem, parent, stock)
        if size != len(heap):
            raise RuntimeError("list changed size during iteration")
        if not lt:
            break
        parent = heap[parentpos]
        newitem = heap[pos]
        heap[parentpos] = newitem
        heap[pos] = parent
        pos = parentpos
    return 0


cdef int heap_siftup(list heap, Py_ssize_t pos, bint stock) except -1:
    cdef Py_ssize_t endpos = len(heap), startpos = pos, limit, childpos
    cdef int lt
    limit = endpos >> 1
    while pos < limit:
        childpos = 2 * pos + 1
        if childpos + 1 < endpos:
            lt = timer_lt(heap[childpos], heap[childpos + 1], stock)
            if endpos != len(heap):
                raise RuntimeError("list changed size during iteration")
            childpos += lt ^ 1
        tmp1 = heap[childpos]
        tmp2 = heap[pos]
        heap[childpos] = tmp2
        heap[pos] = tmp1
        pos = childpos
    return heap_siftdown(heap, startpos, pos, stock)


cdef object heap_push(object heap, object item):
    """heapq.heappush(heap, item)."""
    if type(heap) is not list:
        return heappush(heap, item)
    (<list>heap).append(item)
    heap_siftdown(<list>heap, 0, len(<list>heap) - 1, timers_stock())
    return None


cdef object heap_pop(object heap):
    """heapq.heappop(heap)."""
    if type(heap) is not list:
        return heappop(heap)
    last = (<list>heap).pop()  # (IndexError on an empty heap, as heappop's)
    if not heap:
        return last
    item = (<list>heap)[0]
    (<list>heap)[0] = last
    heap_siftup(<list>heap, 0, timers_stock())
    return item


cdef object schedule_timer(object loop, object when, object callback, tuple args,
                           object context):
    """The rest of BaseEventLoop.call_at outside debug mode, once when and
    the loop are checked: events.TimerHandle(when, callback, args, loop,
    context) with its slots set as its __init__ sets them, pushed on the
    heap, then marked scheduled."""
    timer = init_handle(AR_NEW(TimerHandle), loop, callback, args, context)
    ar_set(timer, TH_WHEN, when)
    ar_set(timer, TH_SCHEDULED, False)
    heap_push(loop._scheduled, timer)
    ar_set(timer, TH_SCHEDULED, True)
    return timer


cdef inline int set_plain(object loop, str name, object value) except -1:
    """setattr(loop, name, value) for a name neither mirrored nor routed
    (Loop.__setattr__ does nothing more for it): the generic setattr on
    the compiled class itself, without the __setattr__ call."""
    if type(loop) is CLoop_type:
        return PyObject_GenericSetAttr(loop, name, value)
    setattr(loop, name, value)
    return 0


class Loop(_PyLoop):
    """The loop with its iteration and call_soon compiled; the transports
    and the counters it makes are this module's."""

    __slots__ = ("_core",)
    _build = "compiled"

    def __init__(self, *args, **kwargs):
        ar_set(self, LOOP_CORE, LoopCore())
        _PyLoop.__init__(self, *args, **kwargs)

    def __setattr__(self, name, value):
        # The pure Loop's __setattr__, then the mirror.
        PyObject_GenericSetAttr(self, name, value)
        if name in ROUTE_NAMES:
            self._route_changed()
        if name in MIRRORED or name in LOOP_METHOD_NAMES:
            core = core_of(self)
            if core is not None:
                mirror(core, name, value)

    def __delattr__(self, name):
        _PyLoop.__delattr__(self, name)
        if name in MIRRORED:
            core = core_of(self)
            if core is not None:
                mirror(core, name, getattr(self, name, None))

    _Counters = Counters
    _SocketTransport = SocketTransport
    _SSLTransport = SSLTransport
    _DatagramTransport = DatagramTransport
    _TransportShared = TransportShared
    _Serving = Serving

    def call_soon(self, callback, *args, context=None):
        """_compat.call_soon, compiled: a Handle made with its slots set."""
        cdef LoopCore core = core_of(self)
        if core is None:
            return call_soon_pure(self, callback, *args, context=context)
        return call_soon(core, self, callback, args, context)

    def _set_callback(self, fd, which, callback, args, context):
        """Loop._set_callback (the readers' and writers' registration), by
        set_callback()."""
        cdef LoopCore core = core_of(self)
        if core is None:
            return _PyLoop._set_callback(self, fd, which, callback, args, context)
        return set_callback(core, self, fd, which, callback, args, context)

    def create_future(self):
        """BaseEventLoop.create_future without its frame: a Future of
        asyncio.futures' (looked up per call, as stock's)."""
        return futures_module.Future(loop=self)

    def get_debug(self):
        return self._debug

    def is_running(self):
        """BaseEventLoop.is_running without its frame (asyncio's C Task
        asks it at each eager start)."""
        return self._thread_id is not None

    def time(self):
        return monotonic()

    def call_at(self, when, callback, *args, context=None):
        """BaseEventLoop.call_at, compiled outside debug mode while
        events.TimerHandle is stock's: schedule_timer()."""
        cdef LoopCore core = core_of(self)
        if core is None or core.debug or not timers_stock():
            return _PyLoop.call_at(self, when, callback, *args, context=context)
        if when is None:
            raise TypeError("when cannot be None")
        if core.closed:
            raise RuntimeError("Event loop is closed")
        return schedule_timer(self, when, callback, args, context)

    def call_later(self, delay, callback, *args, context=None):
        """BaseEventLoop.call_later, compiled."""
        cdef LoopCore core = core_of(self)
        if core is None or core.debug or not timers_stock():
            return _PyLoop.call_later(self, delay, callback, *args, context=context)
        if delay is None:
            raise TypeError("delay must not be None")
        # Through self.call_at, as stock's: a call_at patched on the
        # instance or a subclass sees every timer.
        return self.call_at(self.time() + delay, callback, *args, context=context)

    def _timer_handle_cancelled(self, handle):
        """BaseEventLoop._timer_handle_cancelled (TimerHandle.cancel calls it)."""
        if handle._scheduled:
            set_plain(self, "_timer_cancelled_count", self._timer_cancelled_count + 1)

    def create_task(self, coro, **kwargs):
        """BaseEventLoop.create_task without its frame and _check_closed's,
        outside debug mode and with no task factory: a Task of
        asyncio.tasks' (looked up per call, as stock's); the rest, and any
        keyword stock's signature does not take before 3.14, stock's."""
        cdef LoopCore core = core_of(self)
        if (core is None or core.debug or self._task_factory is not None
                or (not PY314 and kwargs and not kwargs.keys() <= TASK_KEYWORDS)):
            return _PyLoop.create_task(self, coro, **kwargs)
        if core.closed:
            raise RuntimeError("Event loop is closed")
        return tasks_module.Task(coro, loop=self, **kwargs)

    def _asyncgen_firstiter_hook(self, agen):
        """BaseEventLoop._asyncgen_firstiter_hook without its frame (an
        async generator's first step runs it); its warning, stock's."""
        if self._asyncgens_shutdown_called:
            return _PyLoop._asyncgen_firstiter_hook(self, agen)
        self._asyncgens.add(agen)

    def _run_once(self):
        """Loop._run_once (the reference, and its comments), compiled."""
        cdef Py_ssize_t ntodo, ran, i, sched_count
        cdef bint due = False, timed, inline_timers
        cdef double timeout_value
        cdef LoopCore core = core_of(self)
        if core is None:
            return _PyLoop._run_once(self)
        writes = core.shared
        if not is_shared(writes):
            return _PyLoop._run_once(self)
        cdef Counters stats = <Counters?>get(writes, S_STATS)
        stats.iterations += 1
        scheduled = self._scheduled
        if scheduled:
            sched_count = len(scheduled)
            if (sched_count > MIN_SCHEDULED_TIMER_HANDLES
                    and self._timer_cancelled_count / sched_count
                    > MIN_CANCELLED_TIMER_HANDLES_FRACTION):
                new_scheduled = []
                for handle in scheduled:
                    if handle._cancelled:
                        handle._scheduled = False
                    else:
                        new_scheduled.append(handle)
                heapify(new_scheduled)
                self._scheduled = scheduled = new_scheduled
                self._timer_cancelled_count = 0
            else:
                while scheduled and scheduled[0]._cancelled:
                    set_plain(self, "_timer_cancelled_count", self._timer_cancelled_count - 1)
                    handle = heap_pop(scheduled)
                    handle._scheduled = False

        # Phase: writes made while the loop was not running.
        if get(writes, S_PENDING):
            writes.flush(False)

        timeout = None
        ready = core.ready
        if (ready or core.stopping or get(writes, S_PENDING)
                or get(writes, S_FEEDING)):
            timeout = 0
        elif scheduled:
            timeout_value = scheduled[0]._when - self.time()
            if timeout_value > MAXIMUM_SELECT_TIMEOUT:
                timeout_value = MAXIMUM_SELECT_TIMEOUT
            elif timeout_value < 0:
                timeout_value = 0
            timeout = timeout_value

        # Phase: apply interest changes, then poll.
        selector = core.selector
        health = core.health
        if polls_by_select(selector) and own_route(self, selector):
            timed = health_timed(health)
            if timeout == 0 or not timed:
                rest = wait_readers(core, selector, timeout, stats)
                if timed and not stats.iterations & STRETCH_MASK:
                    now = health.stretch_end()
                    if health.publisher is not None:
                        health.publisher.due(now, 0)
            else:
                rest = wait_readers(core, selector, 0, stats)
                if not rest and not ready:
                    waited = health.stretch_end()
                    if health.publisher is not None:
                        timeout = health.publisher.due(waited, timeout)
                    rest = wait_readers(core, selector, timeout, stats)
                    health.waited(waited)
            if rest:
                self._process_rest(rest)
        elif (polls_by_select(selector) and not selector.replaced
                and stock_process_events(self)):
            # Our poller on another backend, or with always-ready fds.
            if timeout == 0 or not health.timed:
                rest = selector.ready_readers(timeout, ready)
            else:
                rest = selector.ready_readers(0, ready)
                if not rest and not ready:
                    rest = self._timed_wait(timeout)
            if rest:
                self._process_rest(rest)
        else:
            self._poll_stock(timeout)

        # Phase: due timers join the queue.
        if scheduled:
            loop_now = self.time()
            end = window_end(loop_now, self._clock_resolution)
            lag = health.lag if health_timed(health) else None
            while scheduled:
                handle = scheduled[0]
                if handle._when >= end:
                    break
                handle = heap_pop(scheduled)
                handle._scheduled = False
                core.ready_append(handle)
                due = True
                if lag is not None:
                    lag.record(loop_now - handle._when)

        # Phase: run the callbacks that are ready now (the reference's
        # rules: Handle._run inlined for stock's Handle, and for
        # TimerHandle when a timer joined, while their _run is stock's).
        ntodo = len(ready)
        ran = ntodo
        timed = core.debug or health_slow(health)
        inline = not timed and HANDLE_RUN.holds()
        inline_timers = inline and due and TIMER_RUN.holds()
        for i in range(ntodo):
            handle = core.ready_popleft()
            # Anything may be in the queue (tests append their own objects):
            # the slots are read only in a Handle's, by offset.
            if is_handle(handle):
                if get(handle, H_CANCELLED):
                    ran -= 1
                    continue
            elif handle._cancelled:
                ran -= 1
                continue
            if inline and (type(handle) is Handle or (inline_timers and type(handle) is TimerHandle)):
                callback = get(handle, H_CALLBACK)
                args = get(handle, H_ARGS)
                context = get(handle, H_CONTEXT)
                try:
                    PyContext_Enter(context)
                    try:
                        if type(args) is not tuple:
                            callback(*args)
                        elif not args:
                            callback()
                        elif len(<tuple>args) == 1:
                            callback((<tuple>args)[0])
                        else:
                            callback(*args)
                    finally:
                        PyContext_Exit(context)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._callback_failed(handle, exc)
            elif timed:
                self._run_timed(handle)
            else:
                handle._run()
        handle = None  # Needed to break cycles when an exception occurs.
        stats.callbacks += ran

        # Phase: everything the callbacks wrote, and last iteration's feeds.
        if get(writes, S_PENDING) or get(writes, S_FEEDING):
            writes.flush(True)
        if core.stopping and health_timed(health):
            health.stopped()


LOOP_CORE = slot(Loop, "_core")
CLoop_type = Loop
LOOP_METHODS = ClassWatch(Loop, ("call_soon", "_set_callback", "_SocketTransport"))
LOOP_EVENTS = StockAttribute(Loop, "_process_events", STOCK_PROCESS_EVENTS)
TIMER_METHODS = ClassWatch(TimerHandle, ("__init__", "__lt__"))
