# The datagram transport's read batch and sendto (asyncio_relaxed._datagram),
# compiled: what every datagram of a UDP service runs.  A readiness event
# reads its batch with one recvmmsg() on the descriptor (libuv's
# uv__udp_recvmmsg), the i-th datagram into the i-th 64 KiB slot of the
# process's receive buffer, and copies each into an exact-size bytes, with
# its sender's address made as socket.recvfrom() makes it, before any
# datagram_received runs (other code may then read into the buffer).  A
# recvmmsg() that returns fewer than it asked for found the socket dry: the
# batch ends without the EAGAIN read the pure batch makes.  The datagrams
# after a callback that pauses reading or raises wait in _held (see
# _datagram's "Held datagrams").  sendto() of bytes with nothing buffered is
# one sendto() (send()) system call.
#
# Consecutive datagrams of a batch from the same sockaddr share one address
# tuple.  The address of the datagram being delivered is remembered with its
# sockaddr (one for the process, with the family of the socket it came
# from): a sendto() to an address equal to it, on a socket of that family,
# sends to that sockaddr without parsing the tuple again (an echo, or a
# reply from datagram_received, the common case).  Any other address is the
# socket's own sendto()'s to parse, with its errors.
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
cdef Py_ssize_t D_HELD = slot(_PyDatagramTransport, "_held")
cdef Py_ssize_t D_LAST_READ = slot(_PyDatagramTransport, "_last_read")
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

    /* One recvmmsg() of up to AR_MMSG_WIDTH datagrams, the i-th into
       buf + i * slot, its sender's address into names[i] where `named`
       (an unconnected socket); the arrays are the caller's. */
    #define AR_MMSG_WIDTH 32
    typedef struct {
        struct mmsghdr msgs[AR_MMSG_WIDTH];
        struct iovec iov[AR_MMSG_WIDTH];
        struct sockaddr_storage names[AR_MMSG_WIDTH];
    } ar_mmsg_batch;

    static int ar_recvmmsg(int fd, ar_mmsg_batch *b, char *buf, size_t slot,
                           unsigned int want, int named) {
        for (unsigned int i = 0; i < want; i++) {
            struct msghdr *h = &b->msgs[i].msg_hdr;
            b->iov[i].iov_base = buf + i * slot;
            b->iov[i].iov_len = slot;
            h->msg_name = named ? &b->names[i] : NULL;
            h->msg_namelen = named ? sizeof(struct sockaddr_storage) : 0;
            h->msg_iov = &b->iov[i];
            h->msg_iovlen = 1;
            h->msg_control = NULL;
            h->msg_controllen = 0;
            h->msg_flags = 0;
        }
        return recvmmsg(fd, b->msgs, want, 0, NULL);
    }

    static inline size_t ar_mmsg_len(const ar_mmsg_batch *b, int i) {
        return b->msgs[i].msg_len;
    }

    static inline const struct sockaddr_storage *ar_mmsg_name(const ar_mmsg_batch *b, int i) {
        return &b->names[i];
    }

    static inline socklen_t ar_mmsg_namelen(const ar_mmsg_batch *b, int i) {
        return b->msgs[i].msg_hdr.msg_namelen;
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
    enum: AR_MMSG_WIDTH
    ctypedef struct ar_mmsg_batch:
        pass
    int ar_recvmmsg(int fd, ar_mmsg_batch *b, char *buf, size_t size, unsigned int want,
                    int named) nogil
    size_t ar_mmsg_len(const ar_mmsg_batch *b, int i) nogil
    const sockaddr_storage *ar_mmsg_name(const ar_mmsg_batch *b, int i) nogil
    socklen_t ar_mmsg_namelen(const ar_mmsg_batch *b, int i) nogil


# The address the last compiled read made, its sockaddr and the family of
# the socket it was read on (see above).
cdef object last_address = None
cdef sockaddr_storage last_sockaddr
cdef socklen_t last_sockaddr_len = 0
cdef int last_family = -1


cdef void keep_address(object addr, const sockaddr_storage *sa, socklen_t salen,
                       int family) noexcept:
    """*addr*, read from *sa* on a socket of *family*, becomes the last
    address (the one a reply's sendto() finds without parsing)."""
    global last_address, last_sockaddr_len, last_family
    last_address = addr
    memcpy(&last_sockaddr, sa, salen)
    last_sockaddr_len = salen
    last_family = family


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


# recvmmsg() costs more than recvfrom() when there is one datagram to read:
# on this project's machine (a VM, Linux 6.x) one datagram and the EAGAIN
# after it took 1,170 ns by two recvfrom() and 1,310 ns by one recvmmsg();
# two were even, and from four on recvmmsg() was 8-28 % cheaper a datagram
# (benchmarks/probes/recvmmsg.c; docs/benchmarks.md, "recvmmsg").  So an
# event reads by recvmmsg() where the transport's last event read MMSG_FROM
# or more, else one recvfrom() a datagram: a DNS-like server (a datagram an
# event) keeps the cheaper call, a burst (QUIC) the batch.
cdef Py_ssize_t MMSG_FROM = 3


cdef int read_failed(object self, Counters stats) except -1:
    """A read that failed with errno: EAGAIN ends the batch, any other
    OSError goes to error_received (once per event, as on stock)."""
    if would_block(errno):
        stats.datagram_recv_eagain += 1
        return 0
    try:
        raise_errno()
    except OSError as exc:  # (raised: its traceback as the socket's would be)
        stats.datagram_errors += 1
        (get(self, D_PROTOCOL)).error_received(exc)
    return 0


cdef int read_each(object self, Counters stats, int fd, int family, object peer) except -1:
    """The batch a datagram a system call (recvfrom, or recv when connected)
    into the receive buffer, its copy made before datagram_received runs."""
    cdef Py_ssize_t n, i, batch, got = 0
    cdef sockaddr_storage sa
    cdef socklen_t salen
    if read_buffer_size < UDP_MAX:
        reserve_read_buffer(UDP_MAX)
    batch = get(self, D_BATCH)
    try:
        for i in range(batch):
            stats.datagram_recv += 1
            if peer is None:
                salen = sizeof(sa)
                n = ar_recvfrom(fd, read_buffer, UDP_MAX, &sa, &salen)
            else:
                n = c_recv(fd, read_buffer, UDP_MAX, 0)
            if n < 0:
                return read_failed(self, stats)
            data = PyBytes_FromStringAndSize(read_buffer, n)
            if peer is None:
                addr = ar_ip_address(&sa, salen)
                keep_address(addr, &sa, salen, family)
            else:
                addr = peer
            got += 1
            stats.datagrams_received += 1
            stats.datagram_bytes_received += n
            (get(self, D_PROTOCOL)).datagram_received(data, addr)
            if get(self, D_CLOSING) or get(self, D_PAUSED):
                return 0
    finally:
        ar_set(self, D_LAST_READ, got)
    return 0


cdef int read_batches(object self, Counters stats, int fd, int family,
                      object peer) except -1:
    """The batch by recvmmsg(), AR_MMSG_WIDTH datagrams a call at most, each
    copied out of the receive buffer before the first datagram_received;
    what a pause or an exception leaves is held (see _datagram)."""
    cdef Py_ssize_t n, i, j, want, left, total = 0
    cdef socklen_t salen
    cdef ar_mmsg_batch mmsg
    left = get(self, D_BATCH)
    want = min(left, AR_MMSG_WIDTH)
    if read_buffer_size < want * UDP_MAX:
        reserve_read_buffer(want * UDP_MAX)
    try:
        while left > 0:
            want = min(left, AR_MMSG_WIDTH)
            stats.datagram_recv += 1
            n = ar_recvmmsg(fd, &mmsg, read_buffer, UDP_MAX, want, peer is None)
            if n < 0:
                return read_failed(self, stats)
            total += n
            # Every datagram out of the shared buffer before any callback runs.
            got = [None] * (2 * n)
            for i in range(n):
                got[2 * i] = PyBytes_FromStringAndSize(read_buffer + i * UDP_MAX,
                                                       ar_mmsg_len(&mmsg, i))
            if peer is not None:
                for i in range(n):
                    got[2 * i + 1] = peer
            else:
                for i in range(n):
                    salen = ar_mmsg_namelen(&mmsg, i)
                    if (i and salen == ar_mmsg_namelen(&mmsg, i - 1) and memcmp(
                            ar_mmsg_name(&mmsg, i), ar_mmsg_name(&mmsg, i - 1), salen) == 0):
                        got[2 * i + 1] = got[2 * i - 1]  # the same sender: the same tuple
                    else:
                        got[2 * i + 1] = ar_ip_address(ar_mmsg_name(&mmsg, i), salen)
            i = 0
            try:
                while i < n:
                    data = got[2 * i]
                    addr = got[2 * i + 1]
                    if peer is None:
                        keep_address(addr, ar_mmsg_name(&mmsg, i), ar_mmsg_namelen(&mmsg, i),
                                     family)
                    stats.datagrams_received += 1
                    stats.datagram_bytes_received += len(<bytes>data)
                    i += 1
                    (get(self, D_PROTOCOL)).datagram_received(data, addr)
                    if get(self, D_CLOSING) or get(self, D_PAUSED):
                        return 0
            finally:
                if i < n and not get(self, D_CLOSING):
                    # Read, not delivered: held for the next turn (scheduled
                    # after an exception, at resume_reading() after a pause).
                    held = get(self, D_HELD)
                    for j in range(i, n):
                        held.append((got[2 * j], got[2 * j + 1]))
                    self._schedule_held()
            if n < want:
                return 0  # the socket ran dry
            left -= n
    finally:
        ar_set(self, D_LAST_READ, total)
    return 0


class DatagramTransport(_PyDatagramTransport):
    """The datagram transport with its read batch and sendto() compiled
    for IP sockets."""

    __slots__ = ()

    def _read_ready(self):
        """One readiness event: up to the batch of datagrams, by recvmmsg()
        where the last event read MMSG_FROM or more, else one system call
        each (see _datagram for where the batch ends)."""
        cdef Counters stats
        cdef int fd
        if not is_datagram_transport(self):
            return _PyDatagramTransport._read_ready(self)
        if get(self, D_CLOSING) or get(self, D_PAUSED):
            return  # (a turn scheduled for held datagrams, since paused or closed)
        sock = get(self, D_SOCK)
        if get(self, D_VIEW) is not None or not plain_socket(sock):
            return _PyDatagramTransport._read_ready(self)
        if get(self, D_HELD) and not self._deliver_held():
            return
        stats = <Counters?>get(self, D_STATS)
        stats.datagram_read_events += 1
        peer = get(self, D_PEERNAME) or None  # a socketpair's is "": recvfrom tells None
        fd = AR_SOCK_FD(sock)
        if <Py_ssize_t>get(self, D_LAST_READ) >= MMSG_FROM:
            read_batches(self, stats, fd, AR_SOCK_FAMILY(sock), peer)
        else:
            read_each(self, stats, fd, AR_SOCK_FAMILY(sock), peer)

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
