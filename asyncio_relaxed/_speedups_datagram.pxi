# The datagram transport's read batch and sendto (asyncio_relaxed._datagram),
# compiled: what every datagram of a UDP service runs.  A readiness event
# reads its batch by recvfrom() (recv() on a connected socket) on the
# descriptor into the process's receive buffer, each datagram an exact-size
# bytes and its sender's address made as socket.recvfrom() makes it, then
# datagram_received; sendto() of bytes with nothing buffered is one
# sendto() (send()) system call.
#
# The address a read made is remembered with its sockaddr (one for the
# process, with the family of the socket it came from): a sendto() to an
# address equal to it, on a socket of that family, sends to that sockaddr
# without parsing the tuple again (an echo, or a reply from
# datagram_received, the common case).  Any other address is the socket's
# own sendto()'s to parse, with its errors.
#
# Every other path (a Unix datagram socket, a socket that is not exactly
# socket.socket or whose class was patched, data that is not bytes, a
# buffer waiting for EPOLLOUT, a transport closed or whose connection is
# lost, every failed send) is the pure method's; the counters are the
# same, counted as the pure methods count them.

from . import _datagram

_PyDatagramTransport = _datagram.DatagramTransport
cdef object PyDatagramTransport = _PyDatagramTransport
cdef Py_ssize_t UDP_MAX = _datagram.UDP_MAX
cdef bint SENDS_EMPTY = _compat.DATAGRAM_SENDS_EMPTY

cdef Py_ssize_t D_ADDRESS = slot(_PyDatagramTransport, "_address")
cdef Py_ssize_t D_BATCH = slot(_PyDatagramTransport, "_batch")
cdef Py_ssize_t D_BUFFER = slot(_PyDatagramTransport, "_buffer")
cdef Py_ssize_t D_CLOSING = slot(_PyDatagramTransport, "_closing")
cdef Py_ssize_t D_CONN_LOST = slot(_PyDatagramTransport, "_conn_lost")
cdef Py_ssize_t D_PAUSED = slot(_PyDatagramTransport, "_paused")
cdef Py_ssize_t D_PEERNAME = slot(_PyDatagramTransport, "_peername")
cdef Py_ssize_t D_PROTOCOL = slot(_PyDatagramTransport, "_protocol")
cdef Py_ssize_t D_SOCK = slot(_PyDatagramTransport, "_sock")
cdef Py_ssize_t D_STATS = slot(_PyDatagramTransport, "_stats")
cdef Py_ssize_t D_VIEW = slot(_PyDatagramTransport, "_view")

cdef extern from *:
    """
    /* The sender's address of a datagram as CPython's makesockaddr() makes
       it for AF_INET, (host, port), and AF_INET6, (host, port, flowinfo,
       scope_id), the host by inet_ntop(); None for an empty address (as
       recvfrom() gives it).  NULL with an exception set on failure. */
    static PyObject *ar_ip_address(const struct sockaddr_storage *sa, socklen_t len) {
        char host[INET6_ADDRSTRLEN];
        if (len == 0) {
            Py_RETURN_NONE;
        }
        if (sa->ss_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
            if (inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host)) == NULL) {
                return PyErr_SetFromErrno(PyExc_OSError);
            }
            return Py_BuildValue("si", host, ntohs(a->sin_port));
        }
        if (sa->ss_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
            if (inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host)) == NULL) {
                return PyErr_SetFromErrno(PyExc_OSError);
            }
            return Py_BuildValue("siII", host, ntohs(a->sin6_port),
                                 ntohl(a->sin6_flowinfo), a->sin6_scope_id);
        }
        PyErr_Format(PyExc_OSError, "a datagram from an address of family %d", sa->ss_family);
        return NULL;
    }

    /* recvfrom() and sendto() with a sockaddr_storage (glibc declares them
       with a transparent union of the sockaddr types). */
    static inline ssize_t ar_recvfrom(int fd, void *buf, size_t n,
                                      struct sockaddr_storage *sa, socklen_t *len) {
        return recvfrom(fd, buf, n, 0, (struct sockaddr *)sa, len);
    }

    static inline ssize_t ar_sendto(int fd, const void *buf, size_t n,
                                    const struct sockaddr_storage *sa, socklen_t len) {
        return sendto(fd, buf, n, 0, (const struct sockaddr *)sa, len);
    }
    """
    cdef struct sockaddr_storage:
        unsigned short ss_family
    ctypedef unsigned int socklen_t
    ssize_t ar_recvfrom(int fd, void *buf, size_t n, sockaddr_storage *sa,
                        socklen_t *len) nogil
    ssize_t ar_sendto(int fd, const void *buf, size_t n, const sockaddr_storage *sa,
                      socklen_t len) nogil
    object ar_ip_address(const sockaddr_storage *sa, socklen_t len)


# The address the last compiled read made, its sockaddr and the family of
# the socket it was read on (see above).
cdef object last_address = None
cdef sockaddr_storage last_sockaddr
cdef socklen_t last_sockaddr_len = 0
cdef int last_family = -1


cdef inline bint is_datagram_transport(object o) noexcept:
    return PyObject_TypeCheck(o, <PyTypeObject *>PyDatagramTransport)


cdef bint is_last_address(object addr, int family):
    """Whether *addr* is the last address a read made (or a tuple of
    exactly its types equal to it) and *family* the family it was read on."""
    if family != last_family or last_address is None:
        return False
    if addr is last_address:
        return True
    if type(addr) is not tuple or len(<tuple>addr) != len(<tuple>last_address):
        return False
    for item in <tuple>addr:
        if type(item) is not str and type(item) is not int:
            return False
    return addr == last_address


class DatagramTransport(_PyDatagramTransport):
    """The datagram transport with its read batch and sendto() compiled
    for IP sockets."""

    __slots__ = ()

    def _read_ready(self):
        """One readiness event: up to the batch of datagrams, each read by
        a system call (see _datagram for where the batch ends)."""
        global last_address, last_sockaddr_len, last_family
        cdef Counters stats
        cdef Py_ssize_t n, i, batch
        cdef int fd, family
        cdef sockaddr_storage sa
        cdef socklen_t salen
        if not is_datagram_transport(self):
            return _PyDatagramTransport._read_ready(self)
        if get(self, D_CONN_LOST):
            return
        sock = get(self, D_SOCK)
        if get(self, D_VIEW) is not None or not plain_socket(sock):
            return _PyDatagramTransport._read_ready(self)
        stats = <Counters?>get(self, D_STATS)
        stats.datagram_read_events += 1
        if read_buffer_size < UDP_MAX:
            reserve_read_buffer(UDP_MAX)
        peer = get(self, D_PEERNAME) or None  # a socketpair's is "": recvfrom tells None
        fd = AR_SOCK_FD(sock)
        family = AR_SOCK_FAMILY(sock)
        batch = get(self, D_BATCH)
        for i in range(batch):
            stats.datagram_recv += 1
            if peer is None:
                salen = sizeof(sa)
                n = ar_recvfrom(fd, read_buffer, UDP_MAX, &sa, &salen)
            else:
                n = c_recv(fd, read_buffer, UDP_MAX, 0)
            if n < 0:
                if would_block(errno):
                    stats.datagram_recv_eagain += 1
                    return
                try:
                    raise_errno()
                except OSError as exc:  # (raised: its traceback as the socket's would be)
                    stats.datagram_errors += 1
                    (get(self, D_PROTOCOL)).error_received(exc)
                return
            data = PyBytes_FromStringAndSize(read_buffer, n)
            if peer is None:
                addr = ar_ip_address(&sa, salen)
                last_address = addr
                memcpy(&last_sockaddr, &sa, salen)
                last_sockaddr_len = salen
                last_family = family
            else:
                addr = peer
            stats.datagrams_received += 1
            stats.datagram_bytes_received += n
            (get(self, D_PROTOCOL)).datagram_received(data, addr)
            if get(self, D_CLOSING) or get(self, D_PAUSED):
                return

    def sendto(self, data, addr=None):
        """sendto() of bytes with nothing buffered, on an open IP socket:
        one system call; everything else is the pure sendto()'s."""
        cdef Counters stats
        cdef Py_ssize_t n
        cdef int fd
        if (type(data) is not bytes or not is_datagram_transport(self)
                or get(self, D_CONN_LOST) or get(self, D_BUFFER)
                or get(self, D_VIEW) is not None):
            return _PyDatagramTransport.sendto(self, data, addr)
        if not SENDS_EMPTY and not data:
            return
        address = get(self, D_ADDRESS)
        if address:
            if addr is not None and addr is not address and addr != address:
                raise ValueError(f"Invalid address: must be None or {address}")
            addr = address
        sock = get(self, D_SOCK)
        if not plain_socket(sock):
            return _PyDatagramTransport.sendto(self, data, addr)
        fd = AR_SOCK_FD(sock)
        if get(self, D_PEERNAME):
            n = c_send(fd, PyBytes_AS_STRING(data), len(<bytes>data), 0)
        elif is_last_address(addr, AR_SOCK_FAMILY(sock)):
            n = ar_sendto(fd, PyBytes_AS_STRING(data), len(<bytes>data),
                          &last_sockaddr, last_sockaddr_len)
        else:
            # An address to parse: the socket's sendto(), its errors stock's.
            return _PyDatagramTransport.sendto(self, data, addr)
        if n < 0:
            try:
                raise_errno()
            except OSError as exc:  # counted and told as the pure method does
                if self._send_failed(exc) is not False:
                    return
            self._watch_write()  # EAGAIN: the datagram waits
            self._enqueue(data, addr)
            return
        stats = <Counters?>get(self, D_STATS)
        stats.datagram_sent_ok += 1  # a send and a datagram sent (Counters)
        stats.datagram_bytes_sent += n
