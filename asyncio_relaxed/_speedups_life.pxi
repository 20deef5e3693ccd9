# A connection's life, compiled: an accepted socket's transport made, its
# connection_made() and first reader, its close and its end.  The pure
# methods are the reference (_basetransport, _transport); each function here
# takes the pure method where its fast path does not apply, and calls the
# transport's own private methods inline only while its class has them
# (TRANSPORT_METHODS: a class-level patch of one is then called instead).


cdef class ClassWatch:
    """Whether a class still has the attributes it had when this was made:
    by its version tag, which CPython changes whenever the class or a base
    is modified; after a change, by comparing each attribute, after which
    the new tag is the one to compare with."""

    cdef object cls
    cdef dict originals
    cdef unsigned int tag

    def __init__(self, cls, names):
        self.cls = cls
        self.originals = {name: getattr(cls, name) for name in names}
        self.tag = AR_TYPE_TAG(cls)

    cdef bint unchanged(self):
        if self.tag and AR_TYPE_TAG(self.cls) == self.tag:
            return True
        for name, original in self.originals.items():
            if getattr(self.cls, name, None) is not original:
                return False
        self.tag = AR_TYPE_TAG(self.cls)  # (the lookups gave it one)
        return True


cdef class StockAttribute:
    """Whether a class's attribute *name* is still *stock*: known, by a
    ClassWatch, from what it was when this was made while the class is
    unchanged; else looked up."""

    cdef ClassWatch watch
    cdef str name
    cdef object stock
    cdef bint was_stock

    def __init__(self, cls, str name, stock):
        self.watch = ClassWatch(cls, (name,))
        self.name = name
        self.stock = stock
        self.was_stock = getattr(cls, name, None) is stock

    cdef bint holds(self) except -1:
        if self.watch.unchanged():
            return self.was_stock
        return getattr(self.watch.cls, self.name, None) is self.stock


cdef object ASK = _basetransport.ASK
cdef object DEFAULT_HIGH_WATER = _basetransport._DEFAULT_HIGH_WATER
cdef object DEFAULT_LOW_WATER = _basetransport._DEFAULT_LOW_WATER
cdef dict SERVER_SOCKNAMES = _basetransport._SERVER_SOCKNAMES
cdef dict PEER_HOSTS = _basetransport._PEER_HOSTS
cdef object remember = _basetransport._remember
cdef bint SERVER_TAKES_TRANSPORT = _compat._ATTACH_TAKES_TRANSPORT  # (server_attach's gate)
cdef object C_CLOSE = _socket.socket.close
cdef object BufferedProtocol = asyncio.BufferedProtocol
cdef object new_weakref = weakref.ref
cdef long OWNED = _interest.OWNED
cdef object STOCK_CANCEL = Handle.cancel
#: The compiled transport's class, held here as its module global is: a
#: C global is read without the module dict's lookup, which Cython makes
#: on every read of a global since 3.12 (set once the class exists).
cdef object SOCKET_TRANSPORT = None
#: The compiled transport's methods that the functions here call inline (set
#: once the class exists, at the end of _speedups.pyx).
cdef ClassWatch TRANSPORT_METHODS
#: How the compiled transport is made: new_accepted() allocates it and runs
#: its __init__'s body while these two are as they are.
cdef ClassWatch TRANSPORT_NEW


# -- the server's clients -----------------------------------------------------------

# Since 3.13 stock's Server keeps its connections' transports in a WeakSet
# (_clients, for close_clients()): _attach adds one, _detach discards it and
# wakes the server's waiters at the last once it is closed.  Those two
# methods and the WeakSet's add, discard and __len__ are run here, without
# their four Python frames, for exactly stock's Server and WeakSet with
# those methods as they are; 3.13's and 3.14's WeakSet may hold removals
# pending from an iteration, which its methods commit first: then they are
# called.
cdef object StockServer = base_events_module.Server
cdef object WeakSet = weakref.WeakSet
cdef bint WEAKSET_PENDING = hasattr(WeakSet(), "_pending_removals")
cdef ClassWatch SERVER_CLIENTS = ClassWatch(StockServer, ("_attach", "_detach"))
cdef ClassWatch WEAKSET_METHODS = ClassWatch(WeakSet, ("add", "discard", "__len__"))


cdef object stock_clients(object server):
    """*server*'s _clients where this module may run _attach and _detach
    itself (above: neither replaced on the class nor on the server), else
    None."""
    if (not SERVER_TAKES_TRANSPORT or type(server) is not StockServer
            or not SERVER_CLIENTS.unchanged() or not WEAKSET_METHODS.unchanged()):
        return None
    attributes = <dict?>server.__dict__
    if "_attach" in attributes or "_detach" in attributes:
        return None
    clients = attributes.get("_clients")
    if type(clients) is not WeakSet or (WEAKSET_PENDING and clients._pending_removals):
        return None
    return clients


cdef int server_attach(object server, object transport) except -1:
    """_compat.server_attach: Server._attach, its body here where
    stock_clients() allows it."""
    clients = stock_clients(server)
    if clients is not None:
        assert server._sockets is not None  # Server._attach's
        (<set?>clients.data).add(new_weakref(transport, clients._remove))
    elif SERVER_TAKES_TRANSPORT:
        server._attach(transport)
    else:
        server._attach()
    return 0


cdef int server_detach(object server, object transport) except -1:
    """_compat.server_detach: Server._detach, its body here where
    stock_clients() allows it."""
    cdef set data
    clients = stock_clients(server)
    if clients is not None:
        data = <set?>clients.data
        data.discard(new_weakref(transport))
        if len(data) == 0 and server._sockets is None:  # len(clients): nothing pending
            server._wakeup()
    elif SERVER_TAKES_TRANSPORT:
        server._detach(transport)
    else:
        server._detach()
    return 0


cdef inline bint loop_debug(object loop) except -1:
    """loop._debug, from its LoopCore where it has one."""
    cdef LoopCore core = core_of(loop)
    if core is not None:
        return core.debug
    return loop._debug


cdef inline dict loop_transports(object loop):
    """loop._transports.data, the dict of the loop's weak references to its
    transports by fd."""
    cdef LoopCore core = core_of(loop)
    if core is not None and core.transports is not None:
        return core.transports
    return <dict?>loop._transports.data


cdef inline object transport_context(object transport):
    """The context a transport's callbacks run in (3.15's server
    connections), or None: a copy of the scheduler's, as stock's."""
    if CONTEXTS:
        return get(transport, T_CONTEXT)
    return None


cdef object accepted_addresses(object peername, object sock, object sockname):
    """_basetransport._accepted_addresses, compiled (the same caches)."""
    if sockname is None:
        try:
            sockname = sock.getsockname()
        except OSError:
            sockname = None
        else:
            shared = SERVER_SOCKNAMES.get(sockname)
            if shared is None:
                remember(SERVER_SOCKNAMES, sockname)
            else:
                sockname = shared
    if type(peername) is tuple and len(<tuple>peername) >= 2:
        host = PEER_HOSTS.get((<tuple>peername)[0])
        if host is None:
            remember(PEER_HOSTS, (<tuple>peername)[0])
        elif host is not (<tuple>peername)[0]:
            peername = (host,) + (<tuple>peername)[1:]
    return peername, sockname


cdef int own_fd(object poller, int fd) except -1:
    """DeferredSelector.own: a new socket's fd (no entry) owned, written
    into the interest table's dict; anything else through the poller."""
    if not own_poller(poller):
        poller.own(fd)
        return 0
    table = poller_table(poller)
    if table is None:
        poller.own(fd)
        return 0
    states = <dict?>get(table, I_STATES)
    if fd not in states and fd not in <dict?>get(table, I_DATA):
        states[fd] = OWNED
    else:
        table.own(fd)
    return 0


def transport_init(self, loop, sock, protocol, waiter=None, extra=None, server=None,
                   shared=None, inherited_options=False, context=None, peername=ASK,
                   sockname=None):
    """SocketTransport.__init__ for the accept path's call (a server's
    socket, its peer address, no extra, no waiter, the listener's TCP
    options inherited, outside debug mode): the pure __init__'s slots set
    by offset, its _attach and _schedule_start inline.  Any other call is
    the pure __init__'s."""
    if (waiter is not None or extra or type(self) is not SOCKET_TRANSPORT
            or not accepted_fast(loop, sock, server, shared, inherited_options, peername)):
        _PySocketTransport.__init__(self, loop, sock, protocol, waiter, extra, server,
                                    shared, inherited_options, context, peername, sockname)
        return
    init_accepted(self, loop, sock, protocol, server, shared, context, peername, sockname)


cdef inline bint accepted_fast(object loop, object sock, object server, object shared,
                               object inherited_options, object peername) except -1:
    """The condition of init_accepted() (besides no waiter, no extra and a
    transport of exactly the compiled class)."""
    return not (server is None or peername is ASK or inherited_options is not True
                or not is_shared(shared) or not plain_socket(sock)
                or not TRANSPORT_METHODS.unchanged() or loop_debug(loop))


cdef int init_accepted(object self, object loop, object sock, object protocol, object server,
                       object shared, object context, object peername,
                       object sockname) except -1:
    """SocketTransport.__init__'s body where accepted_fast() holds."""
    cdef int fd
    fd = AR_SOCK_FD(sock)
    # TransportBase.__init__ (the fields __del__ reads first).
    ar_set(self, T_SOCK, None)
    ar_set(self, T_SERVER, None)
    ar_set(self, T_CONN_LOST, 0)
    ar_set(self, T_CLOSING, False)
    ar_set(self, T_PAUSED, False)
    ar_set(self, T_SHARED, shared)
    ar_set(self, T_EXTRA_DICT, None)
    if CONTEXTS:
        ar_set(self, T_CONTEXT, context)
    ar_set(self, T_LOOP, loop)
    ar_set(self, T_PROTOCOL_PAUSED, False)
    ar_set(self, T_HIGH_WATER, DEFAULT_HIGH_WATER)
    ar_set(self, T_LOW_WATER, DEFAULT_LOW_WATER)
    peername, sockname = accepted_addresses(peername, sock, sockname)
    ar_set(self, T_PEERNAME, peername)
    ar_set(self, T_SOCKNAME, sockname)
    ar_set(self, T_TSOCK, sock)
    ar_set(self, T_SOCK, sock)
    ar_set(self, T_SOCK_FD, fd)
    # SocketTransport.__init__.
    ar_set(self, T_RECV_SIZE, get(shared, S_SMALL_READ))
    ar_set(self, T_PROTOCOL, protocol)
    ar_set(self, T_PROTOCOL_CONNECTED, True)
    ar_set(self, T_BUFFER, _NO_BUFFER)
    ar_set(self, T_BUFFER_SIZE, 0)
    ar_set(self, T_EOF, False)
    ar_set(self, T_EMPTY_WAITER, None)
    ar_set(self, T_WRITE_GUARD, False)
    ar_set(self, T_WRITE_STATE, IDLE)
    ar_set(self, T_SENDING, False)
    ar_set(self, T_FEEDS, 0)
    # _attach: the server's count, the loop's transports, the fd owned.
    ar_set(self, T_SERVER, server)
    server_attach(server, self)
    loop_transports(loop)[fd] = new_weakref(self)
    own_fd(get(shared, S_POLLER), fd)
    # _schedule_start, outside debug mode: one handle.
    schedule(loop, self._connection_made, (), context)
    return 0


cdef object new_accepted(object loop, object sock, object protocol, object server,
                         object shared, object inherited_options, object context,
                         object peername, object sockname):
    """loop._SocketTransport(loop, sock, protocol, None, None, server, ...)
    for the accept path: where the loop is exactly the compiled one whose
    _SocketTransport is the compiled class, whose __new__ and __init__ are
    as they are, and init_accepted() applies, the transport is allocated
    and its __init__'s body run without the call through the class; any
    other case is that call."""
    cdef LoopCore core
    if type(loop) is CLoop_type:
        core = core_of(loop)
        if (core is not None and not core.patched and (<ClassWatch>LOOP_METHODS).unchanged()
                and TRANSPORT_NEW.unchanged()
                and accepted_fast(loop, sock, server, shared, inherited_options, peername)):
            transport = AR_NEW(SOCKET_TRANSPORT)
            init_accepted(transport, loop, sock, protocol, server, shared, context, peername,
                          sockname)
            return transport
    return loop._SocketTransport(loop, sock, protocol, None, None, server, shared,
                                 inherited_options, context, peername, sockname)


def connection_made(self):
    """TransportBase._connection_made: connection_made() in a copy of the
    current context (or the transport's own), then reading starts."""
    if not is_socket_transport(self):
        return _PySocketTransport._connection_made(self)
    protocol = get(self, T_PROTOCOL)
    context = transport_context(self)
    try:
        if context is None:
            context = PyContext_CopyCurrent()
            PyContext_Enter(context)
            try:
                protocol.connection_made(self)
            finally:
                PyContext_Exit(context)
        else:
            protocol.connection_made(self)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        loop = get(self, T_LOOP)
        handle = events_module.Handle(protocol.connection_made, (self,), loop, None)
        loop._callback_failed(handle, exc)
    if type(self) is SOCKET_TRANSPORT and TRANSPORT_METHODS.unchanged():
        reading_started(self)
    else:
        self._start_reading()


def start_reading(self):
    """SocketTransport._start_reading: the protocol kind's read method
    registered as the fd's reader (not while closing or paused)."""
    if not is_socket_transport(self):
        return _PySocketTransport._start_reading(self)
    reading_started(self)


cdef int reading_started(object self) except -1:
    """start_reading()'s body, for a transport of the compiled layout."""
    if get(self, T_CLOSING) or get(self, T_PAUSED):
        return 0
    protocol = get(self, T_PROTOCOL)
    if isinstance(protocol, BufferedProtocol):
        method = self._read_ready__get_buffer
    else:
        method = self._read_ready__data_received
    register_reader(get(self, T_LOOP), get(self, T_SOCK_FD), method, transport_context(self))
    return 0


cdef object release_reader(object loop, object poller, object fd):
    """DeferredSelector.release_reader for a COMMON fd on epoll (owned,
    reading only, the kernel told): the table's entry dropped and one
    EPOLL_CTL_DEL, both written out here; any other fd through the
    poller.  The reader removed, or None."""
    cdef int epfd, error
    if not own_poller(poller):
        return poller.release_reader(fd)
    table = poller_table(poller)
    epoll = get(poller, P_EPOLL)
    if table is None or epoll is None:
        return poller.release_reader(fd)
    datas = <dict?>get(table, I_DATA)
    if fd in <dict?>get(table, I_STATES) or fd not in datas:  # not COMMON
        return poller.release_reader(fd)
    dirty = get(table, I_DIRTY)
    if dirty:
        (<set?>dirty).discard(fd)
    data = datas.pop(fd)
    fileobjs = get(poller, P_FILEOBJS)
    if fileobjs:
        (<dict?>fileobjs).pop(fd, None)
    (<Counters?>get(poller, P_STATS)).epoll_ctl_del += 1
    epfd = epoll_fd(epoll)
    if epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL) < 0:
        error = errno
        if error != ENOENT and error != EBADF:
            try:
                raise_errno()
            except OSError as exc:
                on_error = get(poller, P_ON_ERROR)
                if on_error is None:
                    raise
                on_error(fd, exc)
    return data[0]


cdef int cancel(object handle) except -1:
    """Handle.cancel, for a Handle of stock's class and cancel()."""
    if type(handle) is not Handle or Handle.cancel is not STOCK_CANCEL:
        handle.cancel()
        return 0
    if get(handle, H_CANCELLED):
        return 0
    ar_set(handle, H_CANCELLED, True)
    if get(handle, H_LOOP).get_debug():
        ar_set(handle, H_REPR, repr(handle))
    ar_set(handle, H_CALLBACK, None)
    ar_set(handle, H_ARGS, None)
    return 0


cdef int unwatch_for_good(object self) except -1:
    """TransportBase._unwatch_for_good: reading ends, the fd is released."""
    cdef LoopCore core
    loop = get(self, T_LOOP)
    poller = get(get(self, T_SHARED), S_POLLER)
    core = core_of(loop)
    if core is not None:
        selector, closed = core.selector, core.closed
    else:
        selector, closed = loop._selector, loop._closed
    if (selector is not poller or closed
            or (get(poller, P_REPLACED) if type(poller) is DeferredSelector
                else poller.replaced)):
        self._unwatch_read()
        self._release_fd()
        return 0
    removed = release_reader(loop, poller, get(self, T_SOCK_FD))
    if removed is not None:
        cancel(removed)
    return 0


def transport_close(self):
    """TransportBase.close: reading stops now; the end waits for the
    buffer to empty."""
    if not is_socket_transport(self):
        return _PySocketTransport.close(self)
    if get(self, T_CLOSING):
        return
    if type(self) is not SOCKET_TRANSPORT or not TRANSPORT_METHODS.unchanged():
        return _PySocketTransport.close(self)
    if get(self, T_BUFFER):
        self._send_before_close()
        if get(self, T_CLOSING):  # the send failed: its end is scheduled
            return
    ar_set(self, T_CLOSING, True)
    unwatch_for_good(self)
    if not get(self, T_BUFFER):
        ar_set(self, T_CONN_LOST, get(self, T_CONN_LOST) + 1)
        ar_set(self, T_WRITE_GUARD, True)  # SocketTransport._lost
        schedule(get(self, T_LOOP), self._call_connection_lost, (None,),
                 transport_context(self))


def on_eof(self):
    """SocketTransport._read_ready__on_eof: eof_received(), then the
    transport stops reading or closes."""
    if not is_socket_transport(self):
        return _PySocketTransport._read_ready__on_eof(self)
    if loop_debug(get(self, T_LOOP)):
        return _PySocketTransport._read_ready__on_eof(self)
    try:
        keep_open = get(self, T_PROTOCOL).eof_received()
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        self._fatal_error(exc, "Fatal error: protocol.eof_received() call failed.")
        return
    if keep_open:
        self._unwatch_read()
    else:
        self.close()


def call_connection_lost(self, exc):
    """SocketTransport._call_connection_lost: connection_lost(), then the
    socket closes and the transport leaves its loop and server."""
    if (not is_socket_transport(self) or type(self) is not SOCKET_TRANSPORT
            or not TRANSPORT_METHODS.unchanged()):
        return _PySocketTransport._call_connection_lost(self, exc)
    try:
        if get(self, T_PROTOCOL_CONNECTED):
            get(self, T_PROTOCOL).connection_lost(exc)
    finally:
        socket_lost(self)


cdef int socket_lost(object self) except -1:
    """SocketTransport._socket_lost (with _forget and _detach_server)."""
    cdef int fd_value
    fd = get(self, T_SOCK_FD)
    loop = get(self, T_LOOP)
    transports = loop_transports(loop)
    reference = transports.pop(fd, None)
    if reference is not None:
        alive = reference()
        if alive is not self and alive is not None:
            transports[fd] = reference  # another's: it stays
    sock = get(self, T_SOCK)
    if type(sock) is socket_type:
        # socket.socket.close(), its body inline (_sockets.C_CLOSE).
        ar_set(sock, K_CLOSED, True)
        if get(sock, K_IO_REFS) <= 0:
            C_CLOSE(sock)
    else:
        sock.close()
    ar_set(self, T_SOCK, None)
    ar_set(self, T_PROTOCOL, None)
    ar_set(self, T_LOOP, None)
    server = get(self, T_SERVER)
    if server is not None:
        ar_set(self, T_SERVER, None)
        server_detach(server, self)
    waiter = get(self, T_EMPTY_WAITER)
    if waiter is not None and not waiter.done():
        waiter.set_exception(ConnectionError("Connection is closed by peer"))
    return 0


def transport_del(self):
    """TransportBase.__del__: nothing to do (the common case: the
    transport was closed) without the pure finaliser's frame."""
    if (is_socket_transport(self) and AR_SLOT(self, T_SOCK) != NULL
            and AR_SLOT(self, T_CONN_LOST) != NULL
            and (get(self, T_SOCK) is None or get(self, T_CONN_LOST))):
        return
    _PySocketTransport.__del__(self)
