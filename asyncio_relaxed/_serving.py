"""The loop's side of the accept path: listeners, and the connections they accept.

:mod:`asyncio_relaxed._accept` decides when to accept and knows nothing of
asyncio; this module is what its listeners ask of the loop (their *host*):
register and unregister their socket, schedule a rest or stock's back-off,
and serve what they accepted.  A plain TCP or Unix connection gets its
transport at once, without a Task: nothing is awaited before the protocol
owns the connection (stock's task only awaits the connection_made
callback).  Under ``tls=own`` neither does a TLS connection: its handshake
reports to a :class:`_Handshake`, which does what stock's task does after
``await waiter``.  ``tls=stock`` keeps stock's ``_accept_connection2`` task.

The loop keeps the hooks stock calls (``_start_serving``,
``_accept_connection``, ``_stop_serving``) and hands them to :class:`Serving`.
"""

from __future__ import annotations

import contextvars
import socket
from typing import Any

from . import _compat
from ._accept import Listener, listener_class
from ._config import Config, TlsMode
from ._shared import TransportShared
from ._sockets import ACCEPTED_INHERIT_TCP_OPTIONS, accepted_sockname, is_tcp, set_options
from ._stats import Counters

__all__ = ["Serving"]


class Serving:
    """The listening sockets a loop serves, by fd, and what their
    :class:`~asyncio_relaxed._accept.Listener` objects ask of the loop."""

    __slots__ = ("accept_batch", "exclusive", "handshakes", "listener_class", "listeners",
                 "loop", "own_tls", "shared", "stats")

    def __init__(self, loop: Any, config: Config, stats: Counters,
                 shared: TransportShared) -> None:
        self.loop = loop
        self.stats = stats
        self.shared = shared
        self.accept_batch = config.accept_batch
        self.exclusive = config.exclusive_accept
        self.listener_class = listener_class(config.accept)
        self.listeners: dict[int, Listener] = {}
        self.own_tls = config.tls is TlsMode.OWN
        self.handshakes: set[_Handshake] = set()  # accepted TLS connections' handshakes under way

    # -- the loop's hooks ----------------------------------------------------

    def start(self, protocol_factory: Any, sock: socket.socket, sslcontext: Any, server: Any,
              backlog: int, timeouts: tuple[Any, Any], context: Any) -> None:
        """Serve *sock* (stock's _start_serving): the Listener made for it
        the first time, its reader registered."""
        fd = sock.fileno()
        listener = self.listeners.get(fd)
        if listener is None or listener.sock is not sock:
            # TCP_NODELAY and the keepalive options once on the listener
            # instead of once per connection: Linux copies them to every
            # accepted socket.
            if ACCEPTED_INHERIT_TCP_OPTIONS and is_tcp(sock):
                set_options(sock, [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
                                   *self.shared.tcp_sockopts])
            if self.exclusive:
                self.loop._selector.exclusive(fd)
            listener = self.listeners[fd] = self.make(protocol_factory, sock, sslcontext, server,
                                                      backlog, timeouts, context)
        listener.resume()
        self.poll(listener)

    def accept_now(self, protocol_factory: Any, sock: socket.socket, sslcontext: Any,
                   server: Any, backlog: int, timeouts: tuple[Any, Any], context: Any) -> None:
        """One readiness event (stock's _accept_connection called directly):
        a socket not being served gets a Listener for this call only."""
        listener = self.listeners.get(sock.fileno())
        if listener is None or listener.sock is not sock:
            listener = self.make(protocol_factory, sock, sslcontext, server, backlog, timeouts,
                                 context)
        listener.ready()

    def stop(self, sock: socket.socket) -> None:
        """The server stopped serving *sock*: a rest or a back-off must not
        outlive its listener."""
        listener = self.listeners.pop(sock.fileno(), None)
        if listener is not None:
            listener.stop()

    def close(self) -> None:
        """The loop closes: no listener polls on, and no handshake of an
        accepted connection is left under way (see _Handshake.abandon)."""
        for listener in self.listeners.values():
            listener.stop()
        self.listeners.clear()
        for handshake in list(self.handshakes):
            handshake.abandon()

    def make(self, protocol_factory: Any, sock: socket.socket, sslcontext: Any, server: Any,
             backlog: int, timeouts: tuple[Any, Any], context: Any) -> Listener:
        listener = self.listener_class(self, protocol_factory, sock, sslcontext, server,
                                       backlog, timeouts, context if _compat.PY315 else None)
        listener.inherits = ACCEPTED_INHERIT_TCP_OPTIONS and is_tcp(sock)
        listener.sockname = accepted_sockname(sock)
        return listener

    # -- what a Listener asks ---------------------------------------------------

    def poll(self, listener: Listener) -> None:
        self.loop._add_reader(listener.sock.fileno(), listener.ready)

    def unpoll(self, listener: Listener) -> None:
        self.loop._remove_reader(listener.sock.fileno())

    def reregister(self, listener: Listener) -> None:
        self.loop._selector.reregister(listener.sock.fileno())

    def rest(self, listener: Any, seconds: float) -> Any:
        """accept=balanced: the timer that ends *listener*'s rest."""
        return self.loop.call_later(seconds, listener.rested)

    def open_count(self, listener: Listener) -> int:
        """Connections the listener's server holds (1 without a server)."""
        server = listener.server
        return _compat.server_active_count(server) if server is not None else 1

    def starved(self, listener: Listener, exc: OSError, report: bool) -> Any:
        """accept() ran out of a resource: report it (once per episode), then
        schedule stock's retry, with stock's arguments; the timer's handle."""
        loop = self.loop
        if report:
            loop.call_exception_handler(
                {
                    "message": "socket.accept() out of system resource",
                    "exception": exc,
                    "socket": _compat.TransportSocket(listener.sock),
                }
            )
        args = listener.stock_args
        if _compat.PY315:
            args += (listener.context,)
        return loop.call_later(_compat.ACCEPT_RETRY_DELAY, self.resume, *args)

    def resume(self, protocol_factory: Any, sock: socket.socket, sslcontext: Any, server: Any,
               backlog: int, *rest: Any) -> None:
        """The back-off is over: poll the listener again, unless it was closed
        meanwhile (stock retries on the closed socket and reports ValueError)."""
        if sock.fileno() < 0 or (server is not None and not server.is_serving()):
            return
        self.loop._start_serving(protocol_factory, sock, sslcontext, server, backlog, *rest)

    def accepted(self, listener: Listener, conn: socket.socket, addr: Any) -> None:
        """Serve a connection *listener* accepted.  On 3.15 it runs in a copy
        of the server's context (gh-140947), its transport's callbacks too."""
        loop = self.loop
        if loop._debug:
            _compat.loop_logger().debug(
                "%r got a new connection from %r: %r", listener.server, addr, conn
            )
        server_context = listener.context
        conn_context = server_context.copy() if server_context is not None else None
        if listener.sslcontext and not self.own_tls:
            coro = (
                loop._accept_connection2(listener.protocol_factory, conn, {"peername": addr},
                                         listener.sslcontext, listener.server,
                                         *listener.timeouts, context=conn_context)
                if _compat.PY315 else
                loop._accept_connection2(listener.protocol_factory, conn, {"peername": addr},
                                         listener.sslcontext, listener.server,
                                         *listener.timeouts)
            )
            loop.create_task(coro, context=conn_context)
        elif conn_context is None:
            # The context copy keeps stock's task's isolation of context
            # variables: the protocol factory runs in it, as in that task.
            contextvars.copy_context().run(self._serve, listener, conn, addr, None)
        else:
            conn_context.run(self._serve, listener, conn, addr, conn_context)

    def _serve(self, listener: Listener, conn: socket.socket, addr: Any,
               context: Any) -> None:
        """The protocol and its transport for *conn*, as stock's
        _accept_connection2 makes them; a TLS layer's handshake then reports
        to a _Handshake."""
        loop = self.loop
        protocol = transport = handshake = None
        try:
            protocol = listener.protocol_factory()
            if listener.sslcontext:
                # loop._make_ssl_transport's pair (under tls=own, over a plain
                # socket, as every accepted one is), made here as the plain
                # path makes its transport: the peer's address by position,
                # and the socket's options inherited from the listener (no
                # TCP_NODELAY setsockopt, nor its family and type read as
                # enums, per connection).
                handshake = _Handshake(loop, protocol, self.handshakes)
                if _compat.PY314:
                    loop._ensure_fd_no_transport(conn)
                transport = handshake.transport = loop._SSLTransport(
                    loop, protocol, listener.sslcontext, handshake, True, None,
                    ssl_handshake_timeout=listener.timeouts[0],
                    ssl_shutdown_timeout=listener.timeouts[1],
                )
                loop._SocketTransport(loop, conn, transport, None, None, listener.server,
                                      self.shared, listener.inherits, context, addr,
                                      listener.sockname)
            else:
                # The peer's address as accept() gave it, without stock's
                # extra dict: the transport keeps it in a slot.
                transport = loop._SocketTransport(loop, conn, protocol, None, None,
                                                  listener.server, self.shared,
                                                  listener.inherits, context, addr,
                                                  listener.sockname)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            if handshake is not None:
                self.handshakes.discard(handshake)
            if transport is not None:
                transport.close()
            else:
                conn.close()
            _report_accept_error(loop, exc, protocol, transport)


def _report_accept_error(loop: Any, exc: BaseException, protocol: Any,
                         transport: Any) -> None:
    """A connection that failed before its protocol owned it: reported in
    debug mode only, as stock's _accept_connection2 does."""
    if loop._debug:
        report = {
            "message": "Error on transport creation for incoming connection",
            "exception": exc,
        }
        if protocol is not None:
            report["protocol"] = protocol
        if transport is not None:
            report["transport"] = transport
        loop.call_exception_handler(report)


class _Handshake:
    """The waiter of an accepted connection's TLS handshake, in place of
    stock's task that awaits a future: the layer calls ``cancelled()``, then
    ``set_result(None)`` or ``set_exception(exc)`` once.  A success needs
    nothing (the protocol owns the connection).  A failure is reported in
    the next callback, where stock's task would wake up; the task's
    ``transport.close()`` has nothing left to do here, since the layer wakes
    its waiter with an error only once its byte stream is closed (a failed
    or timed-out handshake is fatal; a lost one is lost)."""

    __slots__ = ("loop", "pending", "protocol", "transport")

    def __init__(self, loop: Any, protocol: Any, pending: set[_Handshake]) -> None:
        self.loop = loop
        self.protocol = protocol
        self.transport: Any = None
        self.pending = pending  # the Serving's handshakes under way, this one among them
        pending.add(self)

    def cancelled(self) -> bool:
        return False

    def set_result(self, result: None) -> None:
        self.pending.discard(self)
        self.protocol = self.transport = None

    def set_exception(self, exc: BaseException) -> None:
        self.pending.discard(self)
        self.loop.call_soon(self._failed, exc)

    def abandon(self) -> None:
        """The loop closes with this handshake under way: the connection
        ends as stock's accept task, cancelled by asyncio.run() before the
        loop closes, ends it (its transport closed and the socket with it),
        here at once, since no callback runs after close: the layer and the
        socket's transport are aborted and the socket closed."""
        self.pending.discard(self)
        transport = self.transport
        self.protocol = self.transport = None
        if transport is None:
            return
        lower = transport._lower
        transport.abort()
        if lower is not None and lower._sock is not None:
            lower._socket_lost()  # what its scheduled connection_lost would do

    def _failed(self, exc: BaseException) -> None:
        transport, protocol = self.transport, self.protocol
        self.protocol = self.transport = None
        _report_accept_error(self.loop, exc, protocol, transport)
