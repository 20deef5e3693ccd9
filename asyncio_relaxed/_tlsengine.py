"""A TLS connection without I/O: an SSLObject, its memory BIOs, its states.

Theory of operation
===================

:class:`TLSEngine` is what OpenSSL does to bytes in memory: ciphertext fed
in (:meth:`~TLSEngine.feed`), records taken out (:meth:`~TLSEngine.records`),
the handshake stepped (:meth:`~TLSEngine.handshake`), application data
encrypted (:meth:`~TLSEngine.encrypt`) and decrypted (``core.read``), the
close_notify exchange stepped (:meth:`~TLSEngine.unwrap`).  It owns no
socket, loop, timer or protocol: the layer (``_tls.SSLTransport``) moves
the bytes and calls the application, and two engines wired back to back in
memory make a connection (tests/test_tls_engine.py).

Everything that decides the connection's state is in this module (h11's
rule for its ``_state.py``): the states, the one table of transitions, and
what each state makes of the events the layer sees.  The states are stock's
``SSLProtocolState``, so a state reads as stock's does in reprs and errors:

================  ===============  ================  =================================
from              event            to                what happens
================  ===============  ================  =================================
UNWRAPPED         ``START``        DO_HANDSHAKE      the byte stream is connected
DO_HANDSHAKE      ``HANDSHAKEN``   WRAPPED           :meth:`handshake` completed
WRAPPED           ``CLOSE``        FLUSHING          close(), or the peer's EOF
FLUSHING          ``FLUSHED``      SHUTDOWN          what was read is delivered
any               ``END``          UNWRAPPED         failure, abort, or the stream lost
================  ===============  ================  =================================

Any other move raises stock's ``RuntimeError("cannot switch state from X to
Y")`` (``SSLProtocol._set_state``'s words).  The per-state decisions:

* :data:`ON_CIPHERTEXT`: what new ciphertext (or a resumed reader) steps:
  the handshake, a read, the flush or the shutdown; nothing when UNWRAPPED.
* :data:`TAKES_APPDATA`: application writes are kept (DO_HANDSHAKE: in the
  layer's backlog until WRAPPED); in any other state they are dropped and
  counted, as stock drops them.
* :data:`DELIVERS`: decrypted data goes to the application (WRAPPED, and
  FLUSHING: what arrived before the close is still delivered).
* :data:`ON_CLOSE`: what the application's close() does: WRAPPED starts the
  flush; DO_HANDSHAKE aborts (no close_notify before a handshake); the
  others are closing or closed already.
* :data:`ON_EOF`: what the peer's EOF on the byte stream does per state.

No flag duplicates a state: "handshake done" is ``state is WRAPPED`` or
later, "closing" is FLUSHING or SHUTDOWN.  The layer's own flags are the
application's (closed, reading paused) and the flow control's.
"""

from __future__ import annotations

import ssl
from typing import Any

from . import _compat

__all__ = [
    "CLOSE",
    "DELIVERS",
    "END",
    "FLUSHED",
    "HANDSHAKEN",
    "ON_CIPHERTEXT",
    "ON_CLOSE",
    "ON_EOF",
    "START",
    "TAKES_APPDATA",
    "TLSEngine",
]

State = _compat.SSLProtocolState
UNWRAPPED = State.UNWRAPPED
DO_HANDSHAKE = State.DO_HANDSHAKE
WRAPPED = State.WRAPPED
FLUSHING = State.FLUSHING
SHUTDOWN = State.SHUTDOWN

#: The SSL errors that mean "more bytes first" (want read, want write).
SSL_AGAIN = _compat.SSL_AGAIN_ERRORS
_SSLObject = ssl.SSLObject

# -- the events and the one table of transitions ----------------------------

START = "start"
HANDSHAKEN = "handshaken"
CLOSE = "close"
FLUSHED = "flushed"
END = "end"

#: event -> (the state it leaves, the state it enters); END leaves any state.
TRANSITIONS: dict[str, tuple[Any, Any]] = {
    START: (UNWRAPPED, DO_HANDSHAKE),
    HANDSHAKEN: (DO_HANDSHAKE, WRAPPED),
    CLOSE: (WRAPPED, FLUSHING),
    FLUSHED: (FLUSHING, SHUTDOWN),
    END: (None, UNWRAPPED),
}

# -- what each state makes of what the layer sees ---------------------------

#: New ciphertext, or the application resuming reading: the step to run
#: (the layer's method of that name); a resumed reader runs no handshake.
ON_CIPHERTEXT: dict[Any, str] = {
    DO_HANDSHAKE: "handshake",
    WRAPPED: "read",
    FLUSHING: "flush",
    SHUTDOWN: "shutdown",
}
#: The states in which application data is kept (sent once WRAPPED).
TAKES_APPDATA = frozenset({DO_HANDSHAKE, WRAPPED})
#: The states in which decrypted data reaches the application.
DELIVERS = frozenset({WRAPPED, FLUSHING})
#: The application's close(): "flush" (then close_notify) or "abort".
ON_CLOSE: dict[Any, str] = {WRAPPED: "flush", DO_HANDSHAKE: "abort"}
#: The peer's EOF on the byte stream: "fail" the handshake
#: (ConnectionResetError), "flush" what was read then shut down, "shutdown"
#: after writing the backlog, or "shutdown" alone.
ON_EOF: dict[Any, str] = {
    DO_HANDSHAKE: "fail",
    WRAPPED: "flush",
    FLUSHING: "write_then_shutdown",
    SHUTDOWN: "shutdown",
}


class TLSEngine:
    """An SSLObject over two memory BIOs, and the connection's state."""

    __slots__ = ("core", "direct", "incoming", "outgoing", "sslobj", "state")

    def __init__(self, context: ssl.SSLContext, server_side: bool,
                 server_hostname: str | None) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.sslobj: Any = context.wrap_bio(self.incoming, self.outgoing,
                                            server_side=server_side,
                                            server_hostname=server_hostname)
        # What reads, writes and pending() call per request: the SSLObject's
        # own C object where there is one (ssl.SSLObject's methods only pass
        # their arguments on), else the SSLObject.
        self.core: Any = _compat.ssl_object_core(self.sslobj)
        # What the handshake and peer_info call (do_handshake, getpeercert,
        # cipher, compression): that C object too under a plain
        # ssl.SSLObject, whose methods of those names only pass the call on
        # (four frames a connection); a subclass (SSLContext.sslobject_class)
        # may override them: its own.
        self.direct: Any = self.core if type(self.sslobj) is _SSLObject else self.sslobj
        self.state: Any = UNWRAPPED

    def to(self, event: str) -> None:
        """Move by *event*, as the table allows."""
        leaves, enters = TRANSITIONS[event]
        if leaves is not None and self.state is not leaves:
            raise RuntimeError(f"cannot switch state from {self.state} to {enters}")
        self.state = enters

    # -- bytes in and out ---------------------------------------------------------

    def feed(self, data: Any) -> None:
        """Ciphertext from the peer."""
        self.incoming.write(data)

    def records(self) -> bytes:
        """The records made so far, taken (b"" if none)."""
        return self.outgoing.read()

    # -- the SSL steps ----------------------------------------------------------------

    def handshake(self) -> bool:
        """One handshake step: True once done (then WRAPPED), False when it
        needs the peer's records (its own wait in :meth:`records`).  An
        SSLError fails it (then UNWRAPPED) and is raised."""
        try:
            self.direct.do_handshake()
        except SSL_AGAIN:
            return False
        except ssl.SSLError:
            self.to(END)
            raise
        self.to(HANDSHAKEN)
        return True

    def peer_info(self) -> tuple[Any, Any, Any]:
        """The handshake's results get_extra_info serves: peercert, cipher,
        compression (getpeercert may raise, as stock's handshake reports)."""
        direct = self.direct
        return (direct.getpeercert(False), direct.cipher(), direct.compression())

    def encrypt(self, data: Any) -> int:
        """Application data into records: how much of *data* went (0 when
        OpenSSL wants the peer first, as during a renegotiation)."""
        try:
            return self.core.write(data)  # type: ignore[no-any-return]
        except SSL_AGAIN:
            return 0

    def unwrap(self) -> bool:
        """One close_notify step: True once both sides' are exchanged, False
        when it waits for the peer's.  An SSLError is raised."""
        try:
            self.sslobj.unwrap()
        except SSL_AGAIN:
            return False
        return True

    def drop(self) -> None:
        """Let the SSL objects go (the state stays): stock's app transport
        drops its SSLProtocol when closed twice."""
        self.sslobj = self.core = self.direct = None
