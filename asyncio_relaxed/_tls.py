"""The loop's own TLS: a layer between a byte stream and the application.

Theory of operation
===================

Stock asyncio carries a TLS connection in three objects: the socket's
transport, an ``SSLProtocol`` (the TLS state machine, with an ``SSLObject``
and two memory BIOs) as that transport's protocol, and an
``_SSLProtocolTransport`` that the application sees.  Each connection holds
a 256 KiB receive buffer of its own besides the fresh 256 KiB ``bytes``
each copied read allocates.

:class:`SSLTransport` (named as stock's transports are: code and tests look
for "ssl" in the class name) is the last two in one object: the protocol of
the byte stream below it and the transport of the application's protocol
above it.  It runs stock's state machine (``sslproto.SSLProtocol``'s,
ported method by method, so its states, timeouts, error types and texts are
stock's on every Python version) over a :class:`~._tlsengine.TLSEngine`,
which holds the SSLObject, its memory BIOs, the state, the table of
transitions and what each state makes of an event; this module moves the
bytes, runs the timers and calls the application.  The byte stream is one of the loop's
socket transports (``ssl=``, ``start_tls()`` on a plain connection) or
another TLS layer (``start_tls()`` on a TLS connection: TLS over TLS).  The
two meet only through the byte stream's transport and protocol methods:

* *Down*: ``write`` (records), ``pause_reading``/``resume_reading`` (the
  incoming BIO's marks), ``close`` (after close_notify), ``abort`` and
  ``_force_close`` (failures, timeouts), ``get_extra_info`` and
  ``is_closing``.
* *Up*: ``connection_made`` (the handshake starts), ``get_buffer`` and
  ``buffer_updated`` (ciphertext, read into the loop's one buffer),
  ``eof_received``, ``pause_writing``/``resume_writing`` (the byte stream's
  buffer over its marks pauses this layer, whose records then wait in the
  outgoing BIO), ``connection_lost``.

What it does with them:

* *Reads.*  Ciphertext arrives in the loop's one buffer and goes to the
  incoming BIO; decrypted data for a plain Protocol is read back into the
  same buffer and handed over as one exact-size ``bytes`` per readiness
  event (stock reads each record into a fresh 256 KiB ``bytes``); a
  BufferedProtocol (a TLS layer above, say) gets it in its own buffer.
* *Writes.*  ``write()`` encrypts at once (the TLS records go to the
  outgoing BIO) and the records go to the byte stream's ``write``: on a
  socket's transport, sent from ``write()`` in eager mode, or queued for the
  end of the iteration in deferred mode, where everything a callback wrote
  leaves as one batch of records in one ``sendmsg``.  Data written before
  the handshake waits in a backlog, as stock's does.
* *Flow control* has stock's two levels: the byte stream's marks pause this
  layer; the application's marks (512 KiB and a quarter) count the backlog
  and the outgoing BIO, as stock's do, and call the protocol's
  ``pause_writing``/``resume_writing``.  Reading has stock's marks on the
  incoming BIO (256 KiB).
* *States* (the engine's): UNWRAPPED -> DO_HANDSHAKE -> WRAPPED -> FLUSHING
  -> SHUTDOWN, stock's ``SSLProtocolState``; ``close()`` flushes, sends close_notify and
  waits ``ssl_shutdown_timeout`` for the peer's; a peer's close_notify is
  EOF to the protocol; ``ssl_handshake_timeout`` aborts a handshake that
  takes longer.  The protocol's ``connection_lost`` is scheduled from the
  byte stream's, as stock schedules it.

What stock keeps on its own objects and code in the wild reads is here too:
``get_extra_info`` (``sslcontext``, and after the handshake ``peercert``,
``cipher``, ``compression``, ``ssl_object``, before the byte stream's keys),
``_ssl_protocol`` (this object), ``_transport`` (the byte stream),
``_incoming`` (start_tls moves a StreamReader's buffer there, 3.14+),
``_app_reading_paused`` (the application paused reading, read by CPython's
own tests), ``_protocol_paused`` (the application's writing paused, read by
loop.sendfile's fallback), ``_test__append_write_backlog`` (stock's test
hook), ``get_read_buffer_limits`` and its siblings.
"""

from __future__ import annotations

import asyncio
import ssl
import warnings
from typing import Any

from . import _compat
from ._shared import TransportShared
from ._tlsengine import (
    CLOSE,
    DELIVERS,
    DO_HANDSHAKE,
    END,
    FLUSHED,
    FLUSHING,
    ON_CIPHERTEXT,
    ON_CLOSE,
    ON_EOF,
    SHUTDOWN,
    START,
    TAKES_APPDATA,
    WRAPPED,
    TLSEngine,
)

__all__ = ["SSLTransport"]

_Base: Any = _compat.FlowControlMixin

_App = _compat.AppProtocolState
_SSL_AGAIN = _compat.SSL_AGAIN_ERRORS
#: The layer's method for each step the engine's ON_CIPHERTEXT names.
_STEPS = {state: "_do_" + step for state, step in ON_CIPHERTEXT.items()}
#: get_extra_info's keys that the handshake adds (stock's SSLProtocol._extra).
_HANDSHAKE_KEYS = ("peercert", "cipher", "compression", "ssl_object")
#: A backlog of application data that never had to wait (see __init__).
_NO_BACKLOG: Any = ()
_IN_HIGH, _IN_LOW = _compat.flow_control_defaults(None, None,
                                                  _compat.FLOW_CONTROL_HIGH_WATER_SSL_READ)
_OUT_HIGH, _OUT_LOW = _compat.flow_control_defaults(None, None,
                                                    _compat.FLOW_CONTROL_HIGH_WATER_SSL_WRITE)
#: What ON_CIPHERTEXT and ON_CLOSE say for the handshake and for an open
#: connection, which the hot paths name without a table lookup (a state is
#: stock's Enum, whose hash is a Python call).
assert _STEPS[DO_HANDSHAKE] == "_do_handshake", _STEPS[DO_HANDSHAKE]
_CLOSE_WRAPPED = ON_CLOSE[WRAPPED]


class SSLTransport(_Base, asyncio.BufferedProtocol,  # type: ignore[misc]
                   metaclass=_compat.SlotsWithDict):
    """A TLS connection as a layer: the protocol of the byte stream below
    (a socket's transport, or another TLS layer) and the transport of the
    application's protocol above, stock's SSLProtocol and its app transport
    in one object."""

    __slots__ = (
        "__dict__",
        "__weakref__",
        "_app_buffered",
        "_app_high",
        "_app_low",
        "_app_reading_paused",
        "_app_state",
        "_backlog",
        "_backlog_size",
        "_closed",
        "_drop_ssl",
        "_engine",
        "_eof_received",
        "_handshake_start",
        "_handshake_timeout",
        "_handshake_timer",
        "_in_high",
        "_in_low",
        "_incoming",
        "_lower",
        "_outgoing",
        "_protocol",
        "_server_hostname",
        "_server_side",
        "_shared",
        "_shutdown_timeout",
        "_shutdown_timer",
        "_ssl",
        "_ssl_info",
        "_ssl_lost",
        "_ssl_reading_paused",
        "_ssl_writing_paused",
        "_sslcontext",
        "_waiter",
    )

    _loop: Any  # FlowControlMixin's slots, which mypy sees as Any
    _protocol_paused: bool  # the application's writing is paused

    # Read by base_events.start_tls and base_events.sendfile: a TLS
    # transport serves sendfile through the fallback (it must encrypt).
    _start_tls_compatible = True
    _sendfile_compatible = _compat.SENDFILE_FALLBACK

    def __init__(
        self,
        loop: Any,
        protocol: Any,
        sslcontext: Any,
        waiter: Any = None,
        server_side: bool = False,
        server_hostname: str | None = None,
        *,
        ssl_handshake_timeout: float | None = None,
        ssl_shutdown_timeout: float | None = None,
        call_connection_made: bool = True,
    ) -> None:
        # SSLProtocol.__init__'s checks and defaults, before anything exists.
        self._closed = True  # __del__ reads it even if __init__ fails
        if ssl_handshake_timeout is None:
            ssl_handshake_timeout = _compat.DEFAULT_SSL_TIMEOUTS[0]
        elif ssl_handshake_timeout <= 0:
            raise ValueError(f"ssl_handshake_timeout should be a positive number, "
                             f"got {ssl_handshake_timeout}")
        if ssl_shutdown_timeout is None:
            ssl_shutdown_timeout = _compat.DEFAULT_SSL_TIMEOUTS[1]
        elif ssl_shutdown_timeout <= 0:
            raise ValueError(f"ssl_shutdown_timeout should be a positive number, "
                             f"got {ssl_shutdown_timeout}")
        if not sslcontext:
            sslcontext = _compat.create_tls_context(server_side, server_hostname)
        _Base.__init__(self, None, loop)
        self._shared: TransportShared = loop._shared
        self._lower: Any = None  # the byte stream, from connection_made to connection_lost
        self._protocol: Any = None
        self._server_side = server_side
        self._server_hostname = server_hostname if server_hostname and not server_side else None
        self._sslcontext = sslcontext
        engine = self._engine = TLSEngine(sslcontext, server_side, self._server_hostname)
        # The engine's BIOs and SSL core, a slot away on the per-request paths.
        self._incoming = engine.incoming
        self._outgoing = engine.outgoing
        self._ssl = engine.core
        self._handshake_timeout = ssl_handshake_timeout
        self._shutdown_timeout = ssl_shutdown_timeout
        self._handshake_timer: Any = None
        self._shutdown_timer: Any = None
        self._handshake_start: float | None = None
        # start_tls() upgrades a connection whose protocol is connected already.
        self._app_state = _App.STATE_INIT if call_connection_made else _App.STATE_CON_MADE
        self._waiter = waiter
        # Application data written before the handshake (stock's backlog):
        # a list only once some had to wait.
        self._backlog: list[Any] = _NO_BACKLOG
        self._backlog_size = 0
        self._ssl_info: tuple[Any, Any, Any] | None = None  # peercert, cipher, compression
        self._ssl_lost = 0  # SSLProtocol._conn_lost: writes after close, counted
        self._closed = False  # the application's transport is closed (stock's _closed)
        self._drop_ssl = False  # closed twice: the SSL objects go with the connection
        self._eof_received = False
        self._app_reading_paused = False  # the application paused reading
        self._ssl_reading_paused = False  # the incoming BIO passed its high mark
        self._ssl_writing_paused = False  # the byte stream's buffer paused this layer
        self._app_high, self._app_low = _OUT_HIGH, _OUT_LOW
        self._in_high, self._in_low = _IN_HIGH, _IN_LOW
        self.set_protocol(protocol)

    def __repr__(self) -> str:
        state = "closed" if self._closed else self._engine.state.name.lower()
        return f"<{type(self).__name__} {state} over {self._lower!r}>"

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if not self._closed:
            self._closed = True
            _warn(f"unclosed transport {self!r}", ResourceWarning, source=self)

    # -- the protocol of the byte stream below --------------------------------

    def connection_made(self, transport: Any) -> None:
        """SSLProtocol.connection_made: the handshake starts."""
        self._lower = transport
        self._start_handshake()

    def get_buffer(self, n: int) -> Any:
        """Ciphertext is read into the loop's one buffer, as a memoryview: a
        TLS layer below fills the rest of it through slices (which of a
        bytearray or an mmap would be copies)."""
        return self._shared.read_view

    def buffer_updated(self, nbytes: int) -> None:
        """Ciphertext in the loop's buffer: to the incoming BIO, then the
        state's step.  What this raises the byte stream reports as fatal."""
        self._incoming.write(self._shared.read_view[:nbytes])
        state = self._engine.state
        if state is WRAPPED:
            self._do_read()
        elif state is DO_HANDSHAKE:
            self._do_handshake()  # ON_CIPHERTEXT's step (asserted above)
        elif state in _STEPS:
            getattr(self, _STEPS[state])()

    # -- the application's transport ----------------------------------------

    @property
    def _ssl_protocol(self) -> SSLTransport:
        """Stock's app transport's SSLProtocol: here, this object."""
        return self

    @property
    def _transport(self) -> Any:
        """Stock's SSLProtocol's transport: the byte stream below, until the
        connection is lost."""
        return self._lower

    def set_protocol(self, protocol: Any) -> None:
        self._protocol = protocol
        self._app_buffered = (hasattr(protocol, "get_buffer")
                              and isinstance(protocol, asyncio.BufferedProtocol))

    def get_protocol(self) -> Any:
        return self._protocol

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sslcontext":
            return self._sslcontext
        info = self._ssl_info
        if info is not None and name in _HANDSHAKE_KEYS:
            if name == "ssl_object":
                return self._engine.sslobj
            return info[_HANDSHAKE_KEYS.index(name)]
        lower = self._lower
        if lower is None:
            return default  # stock's SSLProtocol has no transport left to ask
        return lower.get_extra_info(name, default)

    def is_closing(self) -> bool:
        if _compat.TLS_CLOSING_WITH_SOCKET:
            return self._closed or (self._lower is not None and self._lower.is_closing())
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._start_shutdown()
        else:
            # Closed twice: stock's app transport drops its SSLProtocol here,
            # and with it the SSL context and object, which a protocol that
            # keeps its transport would keep alive.  This object still runs
            # the shutdown: it lets them go once the socket is gone.
            self._drop_ssl = True
            if self._lower is None:
                self._drop_engine()

    def abort(self) -> None:
        self._closed = True
        self._abort(None)

    def _force_close(self, exc: BaseException | None) -> None:
        """Stock's app transport's: what a TLS layer above calls to abort."""
        self._closed = True
        self._abort(exc)

    def is_reading(self) -> bool:
        return not self._app_reading_paused

    def pause_reading(self) -> None:
        self._app_reading_paused = True

    def resume_reading(self) -> None:
        if self._app_reading_paused:
            self._app_reading_paused = False
            self._loop.call_soon(self._step)

    def _step(self) -> None:
        """A resumed reader: the state's step (the engine's ON_CIPHERTEXT),
        except a handshake, which only new ciphertext steps (as stock's)."""
        state = self._engine.state
        if state in _STEPS and state is not DO_HANDSHAKE:
            getattr(self, _STEPS[state])()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._app_high, self._app_low = _compat.flow_control_defaults(
            high, low, _compat.FLOW_CONTROL_HIGH_WATER_SSL_WRITE)
        self._control_app_writing()

    def get_write_buffer_size(self) -> int:
        return self._outgoing.pending + self._backlog_size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (self._app_low, self._app_high)

    def get_read_buffer_size(self) -> int:
        return self._incoming.pending

    def set_read_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._in_high, self._in_low = _compat.flow_control_defaults(
            high, low, _compat.FLOW_CONTROL_HIGH_WATER_SSL_READ)
        self._control_ssl_reading()

    def get_read_buffer_limits(self) -> tuple[int, int]:
        return (self._in_low, self._in_high)

    def write(self, data: Any) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data: expecting a bytes-like instance, "
                            f"got {type(data).__name__}")
        if not data:
            return
        if self._engine.state is WRAPPED and not self._backlog:
            # The common case: encrypted now (the records go to the outgoing
            # BIO, so the caller may reuse a bytearray), then sent.
            try:
                written = self._ssl.write(data)
            except _SSL_AGAIN:
                written = 0
            except Exception as exc:
                self._tls_fatal(exc, "Fatal error on SSL protocol")
                return
            if written < len(data):
                self._backlog = [memoryview(data)[written:]]
                self._backlog_size = len(data) - written
            self._process_outgoing()
            return
        self._write_appdata((data,))

    def writelines(self, list_of_data: Any) -> None:
        self._write_appdata(list_of_data)

    def write_eof(self) -> None:
        raise NotImplementedError

    def can_write_eof(self) -> bool:
        return False

    def _test__append_write_backlog(self, data: bytes) -> None:
        """Stock's test hook (test_ssl fills the backlog with it)."""
        if self._backlog is _NO_BACKLOG:
            self._backlog = []
        self._backlog.append(data)
        self._backlog_size += len(data)

    # -- SSLProtocol: states and the handshake ------------------------------------

    def _drop_engine(self) -> None:
        self._engine.drop()
        self._ssl = self._sslcontext = None

    def _start_handshake(self) -> None:
        loop = self._loop
        if loop._debug:  # get_debug()'s answer, without its frame
            _compat.sslproto_logger().debug("%r starts SSL handshake", self)
            self._handshake_start = loop.time()
        else:
            self._handshake_start = None
        self._engine.to(START)
        self._handshake_timer = loop.call_later(self._handshake_timeout,
                                                self._check_handshake_timeout)
        if self._server_side and not self._incoming.pending:
            # A server's first step without the ClientHello reads nothing,
            # writes nothing and raises SSLWantReadError (stock takes it, at
            # the cost of an exception per connection): its first step is
            # the one the ClientHello's bytes make (buffer_updated).
            return
        self._do_handshake()

    def _check_handshake_timeout(self) -> None:
        if self._engine.state is DO_HANDSHAKE:
            msg = (f"SSL handshake is taking longer than {self._handshake_timeout} "
                   f"seconds: aborting the connection")
            self._tls_fatal(ConnectionAbortedError(msg))

    def _do_handshake(self) -> None:
        try:
            done = self._engine.handshake()
        except ssl.SSLError as exc:
            self._on_handshake_complete(exc)
            return
        if done:
            self._on_handshake_complete(None)
        else:
            self._process_outgoing()

    def _on_handshake_complete(self, handshake_exc: Any) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        try:
            if handshake_exc is not None:
                raise handshake_exc
            info = self._engine.peer_info()
        except Exception as exc:
            handshake_exc = None
            self._engine.to(END)
            if isinstance(exc, ssl.CertificateError):
                msg = "SSL handshake failed on verifying the certificate"
            else:
                msg = "SSL handshake failed"
            self._tls_fatal(exc, msg)
            self._wakeup_waiter(exc)
            return
        loop = self._loop
        if loop._debug:
            dt = loop.time() - self._handshake_start
            _compat.sslproto_logger().debug("%r: SSL handshake took %.1f ms", self, dt * 1e3)
        self._ssl_info = info
        if self._app_state is _App.STATE_INIT:
            self._app_state = _App.STATE_CON_MADE
            self._protocol.connection_made(self)
        self._wakeup_waiter()
        self._do_read()

    def _wakeup_waiter(self, exc: BaseException | None = None) -> None:
        waiter = self._waiter
        if waiter is None:
            return
        if not waiter.cancelled():
            if exc is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(None)
        self._waiter = None

    # -- SSLProtocol: shutdown ------------------------------------------------------

    def _start_shutdown(self) -> None:
        state = self._engine.state
        action = _CLOSE_WRAPPED if state is WRAPPED else ON_CLOSE.get(state)
        if action is None:
            return
        self._closed = True
        if action == "abort":
            self._abort(None)
        else:
            self._engine.to(CLOSE)
            self._shutdown_timer = self._loop.call_later(self._shutdown_timeout,
                                                         self._check_shutdown_timeout)
            self._do_flush()

    def _check_shutdown_timeout(self) -> None:
        if self._engine.state in (FLUSHING, SHUTDOWN) and self._lower is not None:
            self._lower._force_close(TimeoutError("SSL shutdown timed out"))

    def _do_flush(self) -> None:
        self._do_read()
        self._engine.to(FLUSHED)
        self._do_shutdown()

    def _do_shutdown(self) -> bool:
        """One close_notify step; True once the shutdown has ended (both
        close_notify exchanged, or failed), False while it waits for the peer's."""
        try:
            # After the byte stream's EOF no close_notify can come: done.
            done = self._eof_received or self._engine.unwrap()
        except ssl.SSLError as exc:
            self._on_shutdown_complete(exc)
            return True
        self._process_outgoing()
        if done:
            self._call_eof_received()
            self._on_shutdown_complete(None)
        return done

    def _on_shutdown_complete(self, shutdown_exc: Any) -> None:
        if not _compat.TLS_CLOSING_WITH_SOCKET:
            self._cancel_shutdown_timer()
        if shutdown_exc:
            self._cancel_shutdown_timer()
            self._tls_fatal(shutdown_exc)
            return
        if _compat.TLS_CLOSING_WITH_SOCKET and self._shutdown_timer is None:
            # The socket's close() flushes its buffer first, which a peer
            # that does not read can delay forever: the timeout runs until
            # connection_lost (3.14+; stock starts it for a peer-initiated
            # shutdown too).
            self._shutdown_timer = self._loop.call_later(self._shutdown_timeout,
                                                         self._check_shutdown_timeout)
        self._loop.call_soon(self._close_below)

    def _cancel_shutdown_timer(self) -> None:
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
            self._shutdown_timer = None

    def _close_below(self) -> None:
        """The byte stream's close (stock: the SSLProtocol's transport.close())."""
        if self._lower is not None:
            self._lower.close()

    def _abort(self, exc: BaseException | None) -> None:
        self._engine.to(END)
        lower = self._lower
        if lower is not None:
            # 3.11-3.12 abort the byte stream; 3.13+ pass the error.
            if _compat.TLS_ABORT_PASSES_EXC:
                lower._force_close(exc)
            else:
                lower.abort()

    # -- SSLProtocol: the outgoing flow ------------------------------------------

    def _write_appdata(self, list_of_data: Any) -> None:
        state = self._engine.state
        if state is not WRAPPED and state not in TAKES_APPDATA:
            if self._ssl_lost >= _compat.LOG_THRESHOLD_FOR_CONNLOST_WRITES:
                _compat.sslproto_logger().warning("SSL connection is closed")
            self._ssl_lost += 1
            return
        if self._backlog is _NO_BACKLOG:
            self._backlog = []
        for data in list_of_data:
            # Kept until the handshake: a bytearray the caller reuses is copied.
            self._backlog.append(data if isinstance(data, bytes) else bytes(data))
            self._backlog_size += len(data)
        try:
            if state is WRAPPED:
                self._do_write()
        except Exception as exc:
            self._tls_fatal(exc, "Fatal error on SSL protocol")

    def _do_write(self) -> None:
        backlog = self._backlog
        try:
            while backlog:
                data = backlog[0]
                count = self._ssl.write(data)
                size = len(data)
                if count < size:
                    backlog[0] = memoryview(data)[count:]
                    self._backlog_size -= count
                else:
                    del backlog[0]
                    self._backlog_size -= size
        except _SSL_AGAIN:
            pass
        self._process_outgoing()

    def _process_outgoing(self) -> None:
        """The records the SSLObject made, to the socket (unless the socket's
        buffer paused the TLS layer: they wait in the outgoing BIO)."""
        outgoing = self._outgoing
        if not self._ssl_writing_paused:
            records = outgoing.read()
            if records and self._lower is not None:
                self._lower.write(records)
        # _control_app_writing, called only where it can have work: paused,
        # or at the high-water mark.
        if self._protocol_paused or outgoing.pending + self._backlog_size >= self._app_high:
            self._control_app_writing()

    def _control_app_writing(self) -> None:
        size = self.get_write_buffer_size()
        if size >= self._app_high and not self._protocol_paused:
            self._protocol_paused = True
            self._call_flow_control("pause_writing", self._protocol)
        elif size <= self._app_low and self._protocol_paused:
            self._protocol_paused = False
            self._call_flow_control("resume_writing", self._protocol)

    def _call_flow_control(self, name: str, target: Any) -> None:
        """*target*'s pause_writing or resume_writing: the application's
        protocol, or this object as the socket's protocol; a failure goes to
        the exception handler in stock's words (SSLProtocol, either way)."""
        try:
            getattr(target, name)()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            self._loop.call_exception_handler({
                "message": f"protocol.{name}() failed",
                "exception": exc,
                "transport": self,
                "protocol": self,
            })

    # The byte stream's flow control: its buffer over its marks pauses this
    # layer (its records then wait in the outgoing BIO), not the application.

    def pause_writing(self) -> None:
        """SSLProtocol's: the byte stream's buffer passed its high-water mark."""
        assert not self._ssl_writing_paused
        self._ssl_writing_paused = True

    def resume_writing(self) -> None:
        """SSLProtocol's: the byte stream's buffer drained below its low-water mark."""
        assert self._ssl_writing_paused
        self._ssl_writing_paused = False
        self._process_outgoing()

    # -- SSLProtocol: the incoming flow --------------------------------------------

    def eof_received(self) -> bool | None:
        """SSLProtocol's: the peer half-closed the byte stream."""
        self._eof_received = True
        try:
            if self._loop.get_debug():
                _compat.sslproto_logger().debug("%r received EOF", self)
            action = ON_EOF.get(self._engine.state)
            if action == "fail":
                self._on_handshake_complete(ConnectionResetError)
            elif action == "flush":
                self._engine.to(CLOSE)
                if self._app_reading_paused:
                    return True
                self._do_flush()
            elif action == "write_then_shutdown":
                self._do_write()
                self._engine.to(FLUSHED)
                self._do_shutdown()
            elif action == "shutdown":
                self._do_shutdown()
        except Exception:
            self._lower.close()
            raise
        return None

    def _do_read(self) -> None:
        state = self._engine.state
        if state is not WRAPPED and state not in DELIVERS:
            return
        try:
            if not self._app_reading_paused:
                if self._app_buffered:
                    self._do_read__buffered()
                else:
                    self._do_read__copied()
                if self._backlog:
                    self._do_write()
                elif self._outgoing.pending or self._protocol_paused or self._app_high <= 0:
                    # Records the read made (a session ticket, a key update),
                    # a paused writer to look at, or a high-water mark of 0
                    # (an empty buffer is at it): else nothing changed.
                    self._process_outgoing()
            if self._ssl_reading_paused or self._incoming.pending >= self._in_high:
                self._control_ssl_reading()
        except Exception as exc:
            self._tls_fatal(exc, "Fatal error on SSL protocol")

    def _do_read__buffered(self) -> None:
        offset = 0
        count = 1
        buf = self._protocol.get_buffer(self.get_read_buffer_size())
        wants = len(buf)
        read = self._ssl.read
        try:
            count = read(wants, buf)
            if count > 0:
                offset = count
                while offset < wants:
                    count = read(wants - offset, buf[offset:])
                    if count > 0:
                        offset += count
                    else:
                        break
                else:
                    self._loop.call_soon(self._do_read)
        except _SSL_AGAIN:
            pass
        if offset > 0:
            self._protocol.buffer_updated(offset)
        if not count:
            self._close_notify_received()

    def _do_read__copied(self) -> None:
        """Everything the incoming BIO decrypts to, in one data_received (as
        stock's): read into the loop's buffer and copied out at its size,
        where stock allocates a 256 KiB ``bytes`` per record.  The reads
        stop when neither the BIO nor OpenSSL holds more, instead of at the
        SSLWantReadError a further read would raise (an exception per
        request, which stock pays); a partial record in the BIO still ends
        in one."""
        view = self._shared.read_view
        ssl_core = self._ssl
        try:
            count = ssl_core.read(len(view), view)
        except _SSL_AGAIN:
            return  # a partial record: the rest comes with the next read
        if count and not self._incoming.pending and not ssl_core.pending():
            # All there was, in one read: the common case.
            self._protocol.data_received(view[:count].tobytes())
            return
        self._read_more(view, count)

    def _read_more(self, view: Any, count: int) -> None:
        """_do_read__copied after a first read of *count* bytes into *view*
        that did not take all: until nothing is left, or the buffer fills."""
        size = len(view)
        read = self._ssl.read
        incoming = self._incoming
        offset = count
        chunks: list[bytes] | None = None
        try:
            while count:
                if offset == size:
                    if chunks is None:
                        chunks = []
                    chunks.append(view.tobytes())
                    offset = 0
                if not incoming.pending and not self._ssl.pending():
                    break
                count = read(size - offset, view[offset:] if offset else view)
                offset += count
        except _SSL_AGAIN:
            pass
        if chunks is not None:
            if offset:
                chunks.append(view[:offset].tobytes())
            self._protocol.data_received(b"".join(chunks))
        elif offset:
            self._protocol.data_received(view[:offset].tobytes())
        if not count:
            self._close_notify_received()

    def _close_notify_received(self) -> None:
        """The peer's close_notify was read: EOF to the application, then
        the shutdown (stock's _call_eof_received and _start_shutdown).

        Stock's shutdown of an open connection schedules the shutdown
        timer, reads what is left (nothing: the close_notify was the last
        record), answers with its close_notify, which completes the
        shutdown at once, and cancels the timer: no callback runs while
        that timer lives, and none of the application's code either when
        nothing waits on it (no backlog, no paused writer to resume, no
        high-water mark of 0, reading not paused below, a plain Protocol,
        whose reads ask it nothing, the incoming BIO under its mark; not in
        debug mode, where the timer would record its traceback).  Then this skips
        the read and the timer (a third of this layer's Python calls per
        connection), and schedules the timer only if the shutdown waits
        after all (stock's, a few microseconds later).  3.14+ keeps the
        timer until connection_lost: _on_shutdown_complete schedules it."""
        self._call_eof_received()
        if (self._engine.state is not WRAPPED or self._backlog or self._app_buffered
                or self._protocol_paused or self._ssl_writing_paused
                or self._ssl_reading_paused or self._app_high <= 0
                or self._incoming.pending >= self._in_high or self._loop._debug):
            self._start_shutdown()
            return
        self._closed = True
        engine = self._engine
        engine.to(CLOSE)
        engine.to(FLUSHED)
        if not self._do_shutdown():
            self._shutdown_timer = self._loop.call_later(self._shutdown_timeout,
                                                         self._check_shutdown_timeout)

    def _call_eof_received(self) -> None:
        try:
            if self._app_state is _App.STATE_CON_MADE:
                self._app_state = _App.STATE_EOF
                keep_open = self._protocol.eof_received()
                if keep_open:
                    _compat.sslproto_logger().warning(
                        "returning true from eof_received() has no effect when using ssl")
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            self._tls_fatal(exc, "Error calling eof_received()")

    def _control_ssl_reading(self) -> None:
        size = self._incoming.pending
        if size >= self._in_high and not self._ssl_reading_paused:
            self._ssl_reading_paused = True
            self._lower.pause_reading()
        elif size <= self._in_low and self._ssl_reading_paused:
            self._ssl_reading_paused = False
            self._lower.resume_reading()

    # -- the end ------------------------------------------------------------

    def _tls_fatal(self, exc: BaseException, message: str = "Fatal error on transport") -> None:
        """SSLProtocol._fatal_error: the byte stream goes at once, the error
        is logged (an OSError, in debug mode) or reported."""
        lower = self._lower
        if lower is not None:
            lower._force_close(exc)
        if isinstance(exc, OSError):
            if self._loop.get_debug():
                _compat.sslproto_logger().debug("%r: %s", self, message, exc_info=True)
        elif not isinstance(exc, asyncio.CancelledError):
            self._loop.call_exception_handler({
                "message": message,
                "exception": exc,
                "transport": lower,
                "protocol": self,
            })

    def connection_lost(self, exc: BaseException | None) -> None:
        """SSLProtocol's: the byte stream is gone.  The protocol's
        connection_lost is scheduled, as stock schedules it; the transport
        keeps its loop, as stock's SSLProtocol does (a call after the end,
        set_write_buffer_limits or resume_reading, reports to it)."""
        if self._backlog:
            self._backlog = _NO_BACKLOG
            self._backlog_size = 0
        self._outgoing.read()
        self._ssl_lost += 1
        self._closed = True
        if self._engine.state is not DO_HANDSHAKE and self._app_state in (
                _App.STATE_CON_MADE, _App.STATE_EOF):
            self._app_state = _App.STATE_CON_LOST
            self._loop.call_soon(self._protocol.connection_lost, exc)
        self._engine.to(END)
        self._wakeup_waiter(exc)
        self._cancel_shutdown_timer()
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self._lower = None
        if self._drop_ssl:
            self._drop_engine()
