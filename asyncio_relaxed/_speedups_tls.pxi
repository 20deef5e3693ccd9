# The TLS layer's record path (asyncio_relaxed._tls), compiled: what every
# request of an open connection runs.  A read: the byte stream's recv into
# the loop's buffer (get_buffer), the ciphertext to the incoming BIO and the
# application's data out of the SSLObject into the same buffer
# (buffer_updated, _do_read), one exact-size bytes to data_received.  A
# write: the SSLObject encrypts into the outgoing BIO (write), its records
# go to the byte stream's write (_process_outgoing).  The calls into the
# ssl module are the same calls the pure layer makes, in the same order;
# what is compiled is the layer's own bookkeeping around them: its slots
# and the engine's state read by offset, no Python frame per step.
#
# Every other state and path (the handshake, a backlog, a BufferedProtocol
# above, reading paused, a partial or a last record, the shutdown, every
# failure) is the pure method's: the compiled one hands over before it has
# done anything the pure one would do again.

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release

from . import _tls, _tlsengine

_PySSLTransport = _tls.SSLTransport
cdef object PySSLTransport = _PySSLTransport
cdef object TLS_WRAPPED = _tlsengine.WRAPPED
cdef object SSL_AGAIN = _compat.SSL_AGAIN_ERRORS
cdef object NO_BACKLOG = _tls._NO_BACKLOG

# The layer's slots (its own, and FlowControlMixin's _protocol_paused).
cdef Py_ssize_t L_APP_BUFFERED = slot(_PySSLTransport, "_app_buffered")
cdef Py_ssize_t L_APP_HIGH = slot(_PySSLTransport, "_app_high")
cdef Py_ssize_t L_APP_READING_PAUSED = slot(_PySSLTransport, "_app_reading_paused")
cdef Py_ssize_t L_BACKLOG = slot(_PySSLTransport, "_backlog")
cdef Py_ssize_t L_BACKLOG_SIZE = slot(_PySSLTransport, "_backlog_size")
cdef Py_ssize_t L_ENGINE = slot(_PySSLTransport, "_engine")
cdef Py_ssize_t L_IN_HIGH = slot(_PySSLTransport, "_in_high")
cdef Py_ssize_t L_INCOMING = slot(_PySSLTransport, "_incoming")
cdef Py_ssize_t L_LOWER = slot(_PySSLTransport, "_lower")
cdef Py_ssize_t L_OUTGOING = slot(_PySSLTransport, "_outgoing")
cdef Py_ssize_t L_PROTOCOL = slot(_PySSLTransport, "_protocol")
cdef Py_ssize_t L_PROTOCOL_PAUSED = slot(_PySSLTransport, "_protocol_paused")
cdef Py_ssize_t L_SHARED = slot(_PySSLTransport, "_shared")
cdef Py_ssize_t L_SSL = slot(_PySSLTransport, "_ssl")
cdef Py_ssize_t L_SSL_READING_PAUSED = slot(_PySSLTransport, "_ssl_reading_paused")
cdef Py_ssize_t L_SSL_WRITING_PAUSED = slot(_PySSLTransport, "_ssl_writing_paused")
# The engine's state, and the shared state's view of the loop's buffer.
cdef Py_ssize_t E_STATE = slot(_tlsengine.TLSEngine, "state")
cdef Py_ssize_t S_READ_VIEW = slot(_PyTransportShared, "read_view")


cdef inline bint is_tls_layer(object o) noexcept:
    return PyObject_TypeCheck(o, <PyTypeObject *>PySSLTransport)


cdef int process_outgoing(object self) except -1:
    """SSLTransport._process_outgoing: the records the SSLObject made, to
    the byte stream (unless its buffer paused this layer: they wait in the
    outgoing BIO); the application's flow control where it can have work."""
    outgoing = get(self, L_OUTGOING)
    if get(self, L_SSL_WRITING_PAUSED) is False:
        records = outgoing.read()
        lower = get(self, L_LOWER)
        if records and lower is not None:
            lower.write(records)
    if (get(self, L_PROTOCOL_PAUSED) is not False
            or <Py_ssize_t>outgoing.pending + <Py_ssize_t>get(self, L_BACKLOG_SIZE)
            >= <Py_ssize_t>get(self, L_APP_HIGH)):
        self._control_app_writing()
    return 0


class SSLTransport(_PySSLTransport):
    """The TLS layer with its record path compiled: the read of an open
    connection into a plain Protocol, and write() of bytes with nothing
    waiting before them."""

    __slots__ = ()

    def get_buffer(self, n):
        if not is_tls_layer(self):
            return _PySSLTransport.get_buffer(self, n)
        return get(get(self, L_SHARED), S_READ_VIEW)

    def buffer_updated(self, nbytes):
        """The ciphertext to the incoming BIO, then, on an open connection,
        the read (_do_read); in every other state the step the pure method
        takes."""
        if not is_tls_layer(self):
            return _PySSLTransport.buffer_updated(self, nbytes)
        engine = get(self, L_ENGINE)
        view = get(get(self, L_SHARED), S_READ_VIEW)
        if get(engine, E_STATE) is not TLS_WRAPPED or type(nbytes) is not int:
            return _PySSLTransport.buffer_updated(self, nbytes)
        get(self, L_INCOMING).write(view[:nbytes])  # (a BIO write moves no state)
        self._do_read()

    def _do_read(self):
        """SSLTransport._do_read on an open connection whose application
        reads with data_received and has not paused reading: one read of
        what the incoming BIO decrypts to, into the loop's buffer, handed
        over as one exact-size bytes when it was all there was
        (_do_read__copied's common case); then what the pure method does
        after a read."""
        cdef Py_buffer buf
        cdef Py_ssize_t count
        if (not is_tls_layer(self) or get(get(self, L_ENGINE), E_STATE) is not TLS_WRAPPED
                or get(self, L_APP_READING_PAUSED) is not False
                or get(self, L_APP_BUFFERED) is not False):
            return _PySSLTransport._do_read(self)
        view = get(get(self, L_SHARED), S_READ_VIEW)
        ssl_core = get(self, L_SSL)
        incoming = get(self, L_INCOMING)
        try:
            try:
                count = ssl_core.read(len(view), view)
            except SSL_AGAIN:
                count = -1  # a partial record: the rest comes with the next read
            if count > 0 and not incoming.pending and not ssl_core.pending():
                # All there was, in one read: the common case.
                PyObject_GetBuffer(view, &buf, PyBUF_SIMPLE)
                try:
                    data = PyBytes_FromStringAndSize(<char *>buf.buf, count)
                finally:
                    PyBuffer_Release(&buf)
                get(self, L_PROTOCOL).data_received(data)
            elif count >= 0:
                self._read_more(view, count)
            if get(self, L_BACKLOG):
                self._do_write()
            elif (get(self, L_OUTGOING).pending or get(self, L_PROTOCOL_PAUSED) is not False
                    or <Py_ssize_t>get(self, L_APP_HIGH) <= 0):
                process_outgoing(self)
            if (get(self, L_SSL_READING_PAUSED) is not False
                    or <Py_ssize_t>incoming.pending >= <Py_ssize_t>get(self, L_IN_HIGH)):
                self._control_ssl_reading()
        except Exception as exc:
            self._tls_fatal(exc, "Fatal error on SSL protocol")

    def write(self, data):
        """write() of bytes on an open connection with no backlog: encrypted
        now, its records to the byte stream; anything else is the pure
        write()'s (its checks, errors and backlog)."""
        cdef Py_ssize_t written, size
        if (type(data) is not bytes or not is_tls_layer(self)
                or get(get(self, L_ENGINE), E_STATE) is not TLS_WRAPPED
                or get(self, L_BACKLOG)):
            return _PySSLTransport.write(self, data)
        size = len(data)
        if not size:
            return
        try:
            written = get(self, L_SSL).write(data)
        except SSL_AGAIN:
            written = 0
        except Exception as exc:
            self._tls_fatal(exc, "Fatal error on SSL protocol")
            return
        if written < size:
            self._backlog = [memoryview(data)[written:]]
            self._backlog_size = size - written
        process_outgoing(self)

    def _process_outgoing(self):
        if not is_tls_layer(self):
            return _PySSLTransport._process_outgoing(self)
        process_outgoing(self)
