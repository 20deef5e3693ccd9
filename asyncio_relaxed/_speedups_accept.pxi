# The accept path, compiled: a listener's accept() and batch
# (_accept.Listener.accept_one, burst, take_queued) and the loop's side of
# a plain connection (_serving.Serving.accepted, _serve).  The pure methods
# are the reference; a TLS connection, debug mode and a socket that is not
# exactly socket.socket take them.

cdef object PyListener = _accept.Listener
cdef object PyServing = _serving.Serving
cdef object C_ACCEPT = _accept._C_ACCEPT
cdef object C_NEW = _sockets.C_NEW
cdef object C_INIT = _sockets.C_INIT
cdef tuple RESOURCE_ERRNOS = _accept.RESOURCE_ERRNOS
cdef object CONNECTION = _accept.Outcome.CONNECTION
cdef object ABORTED = _accept.Outcome.ABORTED
cdef object EMPTY = _accept.Outcome.EMPTY
cdef object STARVED = _accept.Outcome.STARVED
cdef object POLLED = _accept.ListenerState.POLLED
cdef object report_accept_error = _serving._report_accept_error

# Listener's slots (a slotted dataclass).
cdef Py_ssize_t L_HOST = slot(PyListener, "host")
cdef Py_ssize_t L_SOCK = slot(PyListener, "sock")
cdef Py_ssize_t L_STATS = slot(PyListener, "stats")
cdef Py_ssize_t L_PLAIN = slot(PyListener, "plain")
cdef Py_ssize_t L_FAMILY = slot(PyListener, "family")
cdef Py_ssize_t L_KIND = slot(PyListener, "kind")
cdef Py_ssize_t L_PROTO = slot(PyListener, "proto")
cdef Py_ssize_t L_FAILING = slot(PyListener, "failing")
cdef Py_ssize_t L_ACCEPTED = slot(PyListener, "accepted")
cdef Py_ssize_t L_STATE = slot(PyListener, "state")
cdef Py_ssize_t L_SSLCONTEXT = slot(PyListener, "sslcontext")
cdef Py_ssize_t L_CONTEXT = slot(PyListener, "context")
cdef Py_ssize_t L_PROTOCOL_FACTORY = slot(PyListener, "protocol_factory")
cdef Py_ssize_t L_SERVER = slot(PyListener, "server")
cdef Py_ssize_t L_INHERITS = slot(PyListener, "inherits")
cdef Py_ssize_t L_SOCKNAME = slot(PyListener, "sockname")
cdef Py_ssize_t L_QUEUE_LENGTH = slot(PyListener, "queue_length")
cdef Py_ssize_t L_QUEUE_LENGTH_MAX = slot(PyListener, "queue_length_max")
# Serving's.
cdef Py_ssize_t V_LOOP = slot(PyServing, "loop")
cdef Py_ssize_t V_OWN_TLS = slot(PyServing, "own_tls")
cdef Py_ssize_t V_SHARED = slot(PyServing, "shared")


#: The compiled Serving, and the methods accept_one runs inline (set once
#: the class exists, in _speedups.pyx).
cdef object SERVING_TYPE = None
cdef ClassWatch SERVING_METHODS


#: The host string of the last IPv4 peer accept_one() took, and its
#: characters: the next connection from that host gets the same string
#: without decoding, hashing and comparing a new one (the peer-host cache
#: of _basetransport._accepted_addresses then finds it as it is: the same
#: object, its hash kept).
cdef object last_peer_host = None
cdef char last_peer[16]
cdef Py_ssize_t last_peer_len = 0


cdef object peer_host(const char *peer, Py_ssize_t peer_len):
    """The str of an accepted IPv4 peer's dotted quad: the last one's when
    the characters are the same, else a new one, kept as the last."""
    global last_peer_host, last_peer_len
    if peer_len == last_peer_len and memcmp(peer, last_peer, peer_len) == 0:
        return last_peer_host
    host = PyUnicode_DecodeASCII(peer, peer_len, NULL)
    memcpy(last_peer, peer, peer_len)
    last_peer_len = peer_len
    last_peer_host = host
    return host


cdef inline bint is_serving(object o) noexcept:
    return PyObject_TypeCheck(o, <PyTypeObject *>PyServing)


cdef inline bint is_listener(object o) noexcept:
    return PyObject_TypeCheck(o, <PyTypeObject *>PyListener)


def accept_one(self):
    """Listener.accept_one: one accept(); a connection it gives is handed
    to the loop (the host's accepted())."""
    cdef Counters stats
    cdef char peer[16]
    cdef Py_ssize_t peer_len = 0
    cdef int c_fd, port = 0
    if not is_listener(self):
        return PyListener.accept_one(self)
    stats = <Counters?>get(self, L_STATS)
    stats.accept += 1
    try:
        if get(self, L_PLAIN):
            family = get(self, L_FAMILY)
            kind = get(self, L_KIND)
            if family == AF_INET:
                # What _socket.socket._accept and setblocking(False) do, in
                # one accept4(): the same fd and address tuple; SOCK_NONBLOCK
                # in the kind makes the object's timeout 0, as
                # setblocking(False) would (Modules/socketmodule.c,
                # init_sockobject).
                c_fd = ar_accept_inet(AR_SOCK_FD(get(self, L_SOCK)), peer, &peer_len, &port)
                if c_fd < 0:
                    raise_errno()
                fd = c_fd
                addr = (peer_host(peer, peer_len), port)
                kind = <int>kind | SOCK_NONBLOCK
            else:
                fd, addr = C_ACCEPT(get(self, L_SOCK))
            # socket.socket(family, kind, proto, fd), its body inline (_sockets.C_NEW)
            conn = C_NEW(socket_type)
            C_INIT(conn, family, kind, get(self, L_PROTO), fd)
            ar_set(conn, K_IO_REFS, 0)
            ar_set(conn, K_CLOSED, False)
            if family != AF_INET:
                conn.setblocking(False)
        else:
            conn, addr = get(self, L_SOCK).accept()
            conn.setblocking(False)
    except (BlockingIOError, InterruptedError):
        stats.accept_eagain += 1
        return EMPTY
    except ConnectionAbortedError:
        return ABORTED  # discarded, and the batch goes on (gh-127529)
    except OSError as exc:
        if exc.errno not in RESOURCE_ERRNOS:
            raise  # The event loop will catch, log and ignore it.
        self.back_off(exc)
        return STARVED
    ar_set(self, L_FAILING, False)
    ar_set(self, L_ACCEPTED, get(self, L_ACCEPTED) + 1)
    host = get(self, L_HOST)
    if type(host) is SERVING_TYPE and SERVING_METHODS.unchanged():
        accepted(host, self, conn, addr)
    else:
        host.accepted(self, conn, addr)
    return CONNECTION


def burst(self, budget, queued):
    """Listener.burst: up to *budget* accepts, no more than *queued* where
    known; how many gave a connection."""
    cdef Py_ssize_t n, taken = 0
    if queued is not None and queued < budget:
        budget = queued
    n = budget
    for _ in range(n):
        outcome = self.accept_one()
        if outcome is CONNECTION:
            taken += 1
        elif outcome is not ABORTED:
            break
    return taken


# The accept queue's length (_accept.accept_queue_length): the module's
# function, which a test may replace, and what it reads.
cdef dict ACCEPT_MODULE = vars(_accept)
cdef object ACCEPT_QUEUE_LENGTH = _accept.accept_queue_length
cdef object PY_READ_QUEUE_LENGTH = PyListener.read_queue_length
cdef bint QUEUE_LENGTH_KNOWN = _accept.QUEUE_LENGTH_KNOWN
cdef int TCPI_UNACKED_END = _accept._TCPI_UNACKED_END

cdef extern from *:
    """
    #include <netinet/tcp.h>
    #include <stdint.h>
    #include <string.h>

    /* The first *end* bytes of a TCP socket's tcp_info, and in them the
       32-bit count ending at *end* (tcpi_unacked: a listener's accept
       queue); -1 where getsockopt fails or gives fewer bytes. */
    static long ar_accept_queue(int fd, int end) {
        unsigned char info[64];
        socklen_t n = (socklen_t)end;
        uint32_t value;
        if (end < 4 || end > (int)sizeof(info)
                || getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &n) < 0 || (int)n < end) {
            return -1;
        }
        memcpy(&value, info + end - 4, sizeof(value));
        return (long)value;
    }
    """
    long ar_accept_queue(int fd, int end)


def read_queue_length(self):
    """Listener.read_queue_length on a plain TCP listener while _accept's
    accept_queue_length is its own: the same getsockopt(TCP_INFO) on the
    descriptor, recorded as the pure method records it; anything else is
    the pure method's."""
    cdef long queued
    if (not is_listener(self) or not QUEUE_LENGTH_KNOWN or not get(self, L_PLAIN)
            or ACCEPT_MODULE.get("accept_queue_length") is not ACCEPT_QUEUE_LENGTH):
        return PY_READ_QUEUE_LENGTH(self)
    family = get(self, L_FAMILY)
    if family != AF_INET and family != AF_INET6:
        return None
    queued = ar_accept_queue(AR_SOCK_FD(get(self, L_SOCK)), TCPI_UNACKED_END)
    if queued < 0:
        return None
    value = queued
    ar_set(self, L_QUEUE_LENGTH, value)
    most = get(self, L_QUEUE_LENGTH_MAX)
    if most is None or queued > <long>most:
        ar_set(self, L_QUEUE_LENGTH_MAX, value)
    return value


def take_queued(self):
    """Listener.take_queued: one accept, then as many as the queue holds,
    up to the batch in all."""
    first = self.accept_one()
    if first is not CONNECTION and first is not ABORTED:
        return False
    budget = self.batch - 1
    taken = 0
    if budget > 0:
        taken = self.burst(budget, self.read_queue_length())
    return (first is CONNECTION or taken > 0) and get(self, L_STATE) is POLLED


def serving_accepted(self, listener, conn, addr):
    """Serving.accepted for a plain connection outside debug mode: _serve
    in a copy of the current context (or of the server's, 3.15)."""
    if not is_serving(self) or not is_listener(listener):
        return PyServing.accepted(self, listener, conn, addr)
    return accepted(self, listener, conn, addr)


cdef object accepted(object self, object listener, object conn, object addr):
    """serving_accepted()'s body, for a Serving and a Listener of the
    compiled layouts."""
    loop = get(self, V_LOOP)
    if loop_debug(loop) or (get(listener, L_SSLCONTEXT) and not get(self, V_OWN_TLS)):
        return PyServing.accepted(self, listener, conn, addr)
    server_context = get(listener, L_CONTEXT)
    if server_context is None:
        context = PyContext_CopyCurrent()
        PyContext_Enter(context)
        try:
            serve(self, loop, listener, conn, addr, None)
        finally:
            PyContext_Exit(context)
    else:
        conn_context = server_context.copy()
        PyContext_Enter(conn_context)
        try:
            serve(self, loop, listener, conn, addr, conn_context)
        finally:
            PyContext_Exit(conn_context)


cdef object serve(object self, object loop, object listener, object conn, object addr,
                  object context):
    """Serving._serve: the protocol and its transport (a TLS listener's
    connection is the pure method's)."""
    if get(listener, L_SSLCONTEXT):
        return PyServing._serve(self, listener, conn, addr, context)
    protocol = transport = None
    try:
        protocol = get(listener, L_PROTOCOL_FACTORY)()
        transport = new_accepted(loop, conn, protocol, get(listener, L_SERVER),
                                 get(self, V_SHARED), get(listener, L_INHERITS), context, addr,
                                 get(listener, L_SOCKNAME))
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        if transport is not None:
            transport.close()
        else:
            conn.close()
        report_accept_error(loop, exc, protocol, transport)
