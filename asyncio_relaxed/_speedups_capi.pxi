# The C the compiled twin needs beside Cython's own: a Python class's slots
# read and written by their offsets, the fd inside a socket object, the
# contextvars and exception calls of the C API, and the system calls.
#
# Slots by offset.  A slot of a class with __slots__ is a PyObject* at a
# fixed offset in every instance of the class and of its subclasses (a
# subclass only appends to the layout); its member descriptor holds that
# offset.  Reading it there is what the descriptor's __get__ does, without
# the attribute lookup that finds the descriptor: Python 3.11 specializes
# that lookup in bytecode (LOAD_ATTR_SLOT), C code reaching the descriptor
# through PyObject_GetAttr does not.  A NULL slot is one never set (the
# descriptor's AttributeError); callers that meet one take the pure path.

from cpython.object cimport PyObject, PyObject_TypeCheck, PyTypeObject
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from libc.errno cimport errno, EAGAIN, EBADF, EEXIST, EINTR, ENOENT
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy
from libc.math cimport fabs, isinf, nextafter, INFINITY

cdef extern from *:
    """
    #ifdef Py_GIL_DISABLED
    #error "asyncio_relaxed._speedups assumes the GIL: a free-threaded Python runs the pure loop"
    #endif
    #include <structmember.h>
    #include <errno.h>
    #if EAGAIN != EWOULDBLOCK
    #error "would_block() assumes EAGAIN == EWOULDBLOCK (Linux)"
    #endif
    #include <sys/epoll.h>
    #include <sys/socket.h>
    #include <sys/uio.h>
    #include <netinet/in.h>
    #include <arpa/inet.h>

    #define AR_SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

    static Py_ssize_t ar_member_offset(PyObject *d) {
        if (!PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%R is not a slot", d);
            return -1;
        }
        return ((PyMemberDescrObject *)d)->d_member->offset;
    }

    /* A new reference to the value of slot *off*, NULL (no error set) if unset. */
    static inline PyObject *ar_get(PyObject *o, Py_ssize_t off) {
        PyObject *v = AR_SLOT(o, off);
        Py_XINCREF(v);
        return v;
    }

    static inline void ar_set(PyObject *o, Py_ssize_t off, PyObject *v) {
        PyObject *old = AR_SLOT(o, off);
        Py_INCREF(v);
        AR_SLOT(o, off) = v;
        Py_XDECREF(old);
    }

    /* The descriptor and the address family of a socket object: its C
       struct begins with them after the object header (PySocketSockObject,
       Modules/socketmodule.h, the same from 3.11 to 3.15).  Checked against
       fileno() and family when the module loads. */
    typedef struct { PyObject_HEAD int sock_fd; int sock_family; } ar_socket;
    #define AR_SOCK_FD(o) (((ar_socket *)(o))->sock_fd)
    #define AR_SOCK_FAMILY(o) (((ar_socket *)(o))->sock_family)

    /* The descriptor of a select.epoll object, -1 once closed: its C struct
       begins with it after the object header (pyEpoll_Object,
       Modules/selectmodule.c, the same from 3.11 to 3.15).  Checked against
       fileno() when the module loads. */
    typedef struct { PyObject_HEAD int epfd; } ar_epoll;
    #define AR_EPOLL_FD(o) (((ar_epoll *)(o))->epfd)

    /* An object's type version tag: CPython changes it whenever the class or
       one of its bases is modified (an attribute set or deleted), so an
       unchanged tag means an unchanged class. */
    #define AR_TYPE_TAG(t) (((PyTypeObject *)(t))->tp_version_tag)

    /* An instance of *t* with every slot unset (object.__new__(t) without
       the call: the class's own allocator, which zeroes the slots). */
    #define AR_NEW(t) (((PyTypeObject *)(t))->tp_alloc((PyTypeObject *)(t), 0))

    /* accept4() on an IPv4 listener: the connection's fd, non-blocking and
       close-on-exec (no second call to make it non-blocking), its peer's
       address written to *host* (at least 16 bytes; its length in
       *host_len*, dotted quad as inet_ntop writes it, without its sprintf)
       and port to *port*.  -1 with errno set on failure. */
    static int ar_accept_inet(int fd, char *host, Py_ssize_t *host_len, int *port) {
        struct sockaddr_in sa;
        socklen_t n = sizeof(sa);
        int conn = accept4(fd, (struct sockaddr *)&sa, &n, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (conn < 0) {
            return -1;
        }
        const unsigned char *b = (const unsigned char *)&sa.sin_addr.s_addr;
        char *p = host;
        for (int i = 0; i < 4; i++) {
            unsigned int v = b[i];
            if (v >= 100) {
                *p++ = (char)('0' + v / 100);
                v %= 100;
                *p++ = (char)('0' + v / 10);
                v %= 10;
            } else if (v >= 10) {
                *p++ = (char)('0' + v / 10);
                v %= 10;
            }
            *p++ = (char)('0' + v);
            if (i < 3) {
                *p++ = '.';
            }
        }
        *host_len = p - host;
        *port = ntohs(sa.sin_port);
        return conn;
    }
    """
    PyObject *AR_SLOT(object o, Py_ssize_t off)
    Py_ssize_t ar_member_offset(object d) except -1
    void ar_set(object o, Py_ssize_t off, object v)
    int AR_SOCK_FD(object o)
    int AR_SOCK_FAMILY(object o)
    int AR_EPOLL_FD(object o)
    unsigned int AR_TYPE_TAG(object t)

    int PyObject_GenericSetAttr(object o, object name, object value) except -1
    int PyContext_Enter(object ctx) except -1
    int PyContext_Exit(object ctx) except -1
    object PyContext_CopyCurrent()
    object PyErr_SetFromErrno(object exc)
    int PyErr_CheckSignals() except -1
    int PyObject_GetBuffer(object obj, Py_buffer *view, int flags) except -1
    void PyBuffer_Release(Py_buffer *view)
    enum: PyBUF_WRITABLE
    object AR_NEW(object t)
    int ar_accept_inet(int fd, char *host, Py_ssize_t *host_len, int *port)
    object PyUnicode_DecodeASCII(const char *s, Py_ssize_t size, const char *errors)
    enum: AF_INET
    enum: AF_INET6
    enum: SOCK_NONBLOCK

    # Not in libc's .pxd files.
    ctypedef union epoll_data_t:
        void *ptr
        int fd
        unsigned int u32
        unsigned long long u64
    cdef struct epoll_event:
        unsigned int events
        epoll_data_t data
    int epoll_wait(int epfd, epoll_event *events, int maxevents, int timeout) nogil
    int epoll_ctl(int epfd, int op, int fd, epoll_event *event) nogil
    enum: EPOLLIN
    enum: EPOLL_CTL_ADD
    enum: EPOLL_CTL_DEL
    cdef struct iovec:
        void *iov_base
        size_t iov_len
    cdef struct msghdr:
        void *msg_name
        int msg_namelen
        iovec *msg_iov
        size_t msg_iovlen
        void *msg_control
        size_t msg_controllen
        int msg_flags
    ssize_t c_recv "recv"(int fd, void *buf, size_t n, int flags) nogil
    ssize_t c_send "send"(int fd, const void *buf, size_t n, int flags) nogil
    ssize_t c_sendmsg "sendmsg"(int fd, const msghdr *msg, int flags) nogil
    int posix_memalign(void **memptr, size_t alignment, size_t size) nogil


cdef Py_ssize_t slot(cls, str name) except -1:
    """The offset of slot *name* of *cls* (or of one of its bases)."""
    for klass in cls.__mro__:
        descriptor = klass.__dict__.get(name)
        if descriptor is not None:
            return ar_member_offset(descriptor)
    raise AttributeError(f"{cls.__qualname__} has no slot {name!r}")


cdef object unset_slot(object o, Py_ssize_t off):
    """Raise the AttributeError of reading a slot that was never set, as
    its descriptor would (the attribute found by its offset)."""
    for klass in type(o).__mro__:
        for name, descriptor in vars(klass).items():
            if type(descriptor) is _MEMBER_DESCRIPTOR and ar_member_offset(descriptor) == off:
                return getattr(o, name)  # raises
    raise AttributeError(f"{type(o).__qualname__!r} object has no slot at offset {off}")


cdef inline object get(object o, Py_ssize_t off):
    """The value of slot *off* of *o*; AttributeError if it was never set."""
    cdef PyObject *value = AR_SLOT(o, off)
    if value == NULL:
        return unset_slot(o, off)
    return <object>value


cdef object _MEMBER_DESCRIPTOR = type(type.__dict__["__dictoffset__"])


cdef inline bint would_block(int error) noexcept:
    """EAGAIN (EWOULDBLOCK: the same number on Linux), or the call was
    interrupted: what stock's transports catch as (BlockingIOError,
    InterruptedError) and retry on the next event."""
    return error == EAGAIN or error == EINTR


cdef int raise_errno() except -1:
    """Raise the OSError of errno, of the subclass socket's methods raise
    (ConnectionResetError for ECONNRESET...)."""
    PyErr_SetFromErrno(OSError)
    return -1


# -- the receive buffer -----------------------------------------------------
#
# One buffer for every compiled transport of the process: a read copies what
# the kernel put there into an exact-size bytes before any other code runs,
# and the GIL is held from the recv() to the end of the copy, so no other
# thread's loop can use it in between (the module refuses to build for a
# free-threaded Python).  Page-aligned, as the pure loop's (see
# _sockets.read_buffer); as large as the largest read_size a loop asked for.

cdef char *read_buffer = NULL
cdef Py_ssize_t read_buffer_size = 0


cdef int reserve_read_buffer(Py_ssize_t size) except -1:
    global read_buffer, read_buffer_size
    cdef void *memory = NULL
    if size <= read_buffer_size:
        return 0
    if posix_memalign(&memory, 4096, size) != 0:
        raise MemoryError()
    free(read_buffer)
    read_buffer = <char *>memory
    read_buffer_size = size
    return 0
