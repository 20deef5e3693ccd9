"""Loop: binds config, statistics, poller, write queue, transport and accept path.

One iteration (``_run_once``) runs its phases in a fixed order, after libuv's
``uv_run``::

    flush writes queued outside the loop -> apply interest changes -> poll
    -> dispatch I/O -> move due timers -> run ready callbacks
    -> flush deferred writes and feed retries

The two flushes are the write queue's (:mod:`asyncio_relaxed._writes`); the
poller applies interest changes inside ``select()``, after the first.

Everything else is stock ``BaseEventLoop._run_once`` (the same in 3.11-3.15
but for 3.15's due-timer window, see ``_compat.end_time``): the timer-heap
housekeeping, the timeout computation, the debug-mode slow-callback warning.
The other methods here are the hooks stock calls (``call_soon``,
``_make_socket_transport``, ``_start_serving``, ``_accept_connection``,
``_stop_serving``...) and the hooks the accept path calls back.
"""

from __future__ import annotations

import contextvars
import heapq
import selectors
import socket
import sys
from typing import Any

from . import _compat
from ._accept import Listener, listener_class
from ._config import Config, resolve
from ._poller import DeferredSelector, default_backend
from ._stats import Counters, LoopStatistics
from ._transport import SocketTransport, TransportShared, is_tcp, set_options

__all__ = ["Loop"]

_STOCK_HANDLE_RUN = _compat.STOCK_HANDLE_RUN
_EVENT_READ = selectors.EVENT_READ  # module globals: one lookup less per event
_EVENT_WRITE = selectors.EVENT_WRITE
#: The due timers of an iteration without any (never appended to).
_NO_TIMERS: tuple[Any, ...] = ()

# Linux copies TCP_NODELAY (and the keepalive options) from a listening socket
# to the sockets accept() returns; checked with getsockopt in the tests.
_ACCEPTED_INHERIT_TCP_OPTIONS = sys.platform.startswith("linux")

# The poller's own select(): the loop polls through DeferredSelector.ready()
# only while this is what the selector's select is (see _run_once).
_POLLER_SELECT = DeferredSelector.select


class Loop(_compat.SelectorEventLoop):  # type: ignore[misc]
    """A drop-in asyncio event loop; see the package docs for the options.

    *selector* may be a :class:`~asyncio_relaxed._poller.DeferredSelector` or
    any stdlib selector, which is then driven through its deferred
    bookkeeping.  Keyword *options* are the fields of
    :class:`~asyncio_relaxed.Config`; each beats its ``ASYNCIO_RELAXED_*``
    environment variable.
    """

    # Read by BaseEventLoop.__del__: true until the base __init__ has run, so
    # a loop whose settings were rejected is not reported as unclosed.
    _closed = True
    # Set by BaseEventLoop.__init__; declared for the type checker.
    _scheduled: list[Any]
    _timer_cancelled_count: int

    def __init__(self, selector: selectors.BaseSelector | None = None, **options: Any) -> None:
        # Resolve the settings first: a bad value fails before any fd exists.
        config = resolve(options)
        self._config: Config = config
        self._stats = Counters()
        if selector is None:
            poller = DeferredSelector(default_backend(config.poller.value), stats=self._stats)
        elif isinstance(selector, DeferredSelector):
            poller = selector
            poller.stats = self._stats
        else:
            poller = DeferredSelector(selector, stats=self._stats)
        poller.on_error = self._poller_error
        self._backend_name = poller.backend_name  # statistics() works after close()
        # Everything the transports need of this loop beyond stock's API,
        # the write queue among it.
        self._shared = TransportShared(config, self._stats, poller)
        self._shared.on_error = self._flush_failed
        # Listening sockets being served, by fd (see _accept).
        self._listeners: dict[int, Listener] = {}
        self._listener_class = listener_class(config.accept)
        super().__init__(poller)

    @property
    def config(self) -> Config:
        """The settings this loop was created with."""
        return self._config

    def statistics(self) -> LoopStatistics:
        """A frozen snapshot of this loop's counters."""
        return self._stats.snapshot(self._backend_name)

    def call_soon(self, callback: Any, *args: Any, context: Any = None) -> Any:
        """Stock's call_soon without its four Python calls per handle
        (_check_closed, _call_soon, Handle.__init__, get_debug): Tasks and
        Futures schedule every step and done-callback through here, three
        times per request in an aiohttp server.

        Fast path, safe only outside debug mode (stock then checks the
        thread and the callback and records where the handle was made: it
        runs as is) and while ``asyncio.events.Handle`` is stock's, whose
        fields ``_compat.new_handle`` sets; a replaced Handle class is used
        as stock uses it.
        """
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle: Any
        if self._debug or _compat.events.Handle is not _compat.Handle:
            handle = super().call_soon(callback, *args, context=context)
            if handle._source_traceback:
                del handle._source_traceback[-1]  # this frame: the caller's is last
            return handle
        handle = _compat.new_handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def _flush_failed(self, transport: Any, exc: BaseException) -> None:
        """A queued transport's send let an exception through: reported as
        Handle._run reports a callback's (stock sends from a handle)."""
        source = _compat.format_callback_source(transport._write_now, (), self._debug)
        self.call_exception_handler(
            {"message": f"Exception in callback {source}", "exception": exc,
             "transport": transport}
        )

    def _poller_error(self, fd: int, exc: BaseException) -> None:
        self.call_exception_handler(
            {
                "message": f"the kernel refused the interest change for fd {fd}; "
                "it is not polled until its registration changes again",
                "exception": exc,
            }
        )

    def close(self) -> None:
        # Writes queued by code that ran outside the loop must still go out:
        # stock asyncio would have sent them from write() itself.
        if not self.is_running() and not self.is_closed():
            if self._shared:
                self._shared.flush(include_feeds=True)
            for listener in self._listeners.values():
                listener.stop()
            self._listeners.clear()
        super().close()

    # -- transports ---------------------------------------------------------

    def _make_socket_transport(
        self,
        sock: socket.socket,
        protocol: Any,
        waiter: Any = None,
        *,
        extra: dict[str, Any] | None = None,
        server: Any = None,
        context: Any = None,
    ) -> SocketTransport:
        if _compat.PY314:
            self._ensure_fd_no_transport(sock)
        return SocketTransport(self, sock, protocol, waiter, extra, server,
                               shared=self._shared, context=context)

    def _make_ssl_transport(
        self,
        rawsock: socket.socket,
        protocol: Any,
        sslcontext: Any,
        waiter: Any = None,
        *,
        server_side: bool = False,
        server_hostname: str | None = None,
        extra: dict[str, Any] | None = None,
        server: Any = None,
        context: Any = None,
        **timeouts: Any,  # ssl_handshake_timeout, ssl_shutdown_timeout
    ) -> Any:
        if _compat.PY314:
            self._ensure_fd_no_transport(rawsock)
        ssl_protocol = _compat.SSLProtocol(
            self, protocol, sslcontext, waiter, server_side, server_hostname, **timeouts
        )
        SocketTransport(self, rawsock, ssl_protocol, extra=extra, server=server,
                        shared=self._shared, context=context)
        return ssl_protocol._app_transport

    # -- accept: the hooks stock calls ----------------------------------------

    def _start_serving(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any = None,
        server: Any = None,
        backlog: int = 100,
        ssl_handshake_timeout: Any = _compat.DEFAULT_SSL_TIMEOUTS[0],
        ssl_shutdown_timeout: Any = _compat.DEFAULT_SSL_TIMEOUTS[1],
        context: Any = None,
    ) -> None:
        """Serve *sock*: its Listener's ready() becomes the socket's reader.
        (``context`` is 3.15's: the server's context, gh-140947.)"""
        fd = sock.fileno()
        listener = self._listeners.get(fd)
        if listener is None or listener.sock is not sock:
            # TCP_NODELAY and the keepalive options once on the listener
            # instead of once per connection: Linux copies them to every
            # accepted socket.
            if _ACCEPTED_INHERIT_TCP_OPTIONS and is_tcp(sock):
                set_options(sock, [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
                                   *self._shared.tcp_sockopts])
            if self._config.exclusive_accept:
                self._selector.exclusive(fd)
            listener = self._new_listener(protocol_factory, sock, sslcontext, server, backlog,
                                          ssl_handshake_timeout, ssl_shutdown_timeout, context)
            self._listeners[fd] = listener
        listener.resume()
        self._add_reader(fd, listener.ready)

    def _accept_connection(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any = None,
        server: Any = None,
        backlog: int = 100,
        ssl_handshake_timeout: Any = _compat.DEFAULT_SSL_TIMEOUTS[0],
        ssl_shutdown_timeout: Any = _compat.DEFAULT_SSL_TIMEOUTS[1],
        context: Any = None,
    ) -> None:
        """One readiness event of a listener, by the accept strategy.  The
        loop's own reader is the Listener's ready(); this is stock's entry
        point for code that calls it directly (a socket not being served
        gets a Listener for this call only)."""
        listener = self._listeners.get(sock.fileno())
        if listener is None or listener.sock is not sock:
            listener = self._new_listener(protocol_factory, sock, sslcontext, server, backlog,
                                          ssl_handshake_timeout, ssl_shutdown_timeout, context)
        listener.ready()

    def _stop_serving(self, sock: socket.socket) -> None:
        listener = self._listeners.pop(sock.fileno(), None)
        if listener is not None:
            listener.stop()  # a balanced rest or a back-off must not outlive it
        super()._stop_serving(sock)

    def _new_listener(self, protocol_factory: Any, sock: socket.socket, sslcontext: Any,
                      server: Any, backlog: int, *timeouts_and_context: Any) -> Listener:
        *timeouts, context = timeouts_and_context
        return self._listener_class(self, protocol_factory, sock, sslcontext, server, backlog,
                                    tuple(timeouts), context if _compat.PY315 else None)

    # -- accept: the hooks the Listener calls -----------------------------------

    def _accepted(self, listener: Listener, conn: socket.socket, addr: Any) -> None:
        """Serve a connection *listener* accepted.  On 3.15 it runs in a copy
        of the server's context (gh-140947), its transport's callbacks too."""
        if self._debug:
            _compat.loop_logger().debug(
                "%r got a new connection from %r: %r", listener.server, addr, conn
            )
        extra = {"peername": addr}
        server_context = listener.context
        conn_context = server_context.copy() if server_context is not None else None
        if listener.sslcontext:
            coro = (
                self._accept_connection2(listener.protocol_factory, conn, extra,
                                         listener.sslcontext, listener.server,
                                         *listener.timeouts, context=conn_context)
                if _compat.PY315 else
                self._accept_connection2(listener.protocol_factory, conn, extra,
                                         listener.sslcontext, listener.server,
                                         *listener.timeouts)
            )
            self.create_task(coro, context=conn_context)
            return
        # Plain TCP needs no Task: nothing is awaited before the protocol owns
        # the connection (stock's task only awaits the connection_made
        # callback).  The context copy keeps the task's isolation of context
        # variables: the protocol factory runs in it, as in stock's task.
        if conn_context is None:
            contextvars.copy_context().run(self._accept_plain, listener, conn, extra, None)
        else:
            conn_context.run(self._accept_plain, listener, conn, extra, conn_context)

    def _accept_plain(
        self, listener: Listener, conn: socket.socket, extra: dict[str, Any], context: Any
    ) -> None:
        protocol = transport = None
        try:
            protocol = listener.protocol_factory()
            transport = SocketTransport(
                self, conn, protocol, None, extra, listener.server, shared=self._shared,
                inherited_options=_ACCEPTED_INHERIT_TCP_OPTIONS and is_tcp(conn),
                context=context,
            )
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            if transport is not None:
                transport.close()
            else:
                conn.close()
            # Reported in debug mode only, as stock _accept_connection2 does.
            if self._debug:
                report = {
                    "message": "Error on transport creation for incoming connection",
                    "exception": exc,
                }
                if protocol is not None:
                    report["protocol"] = protocol
                if transport is not None:
                    report["transport"] = transport
                self.call_exception_handler(report)

    def _accept_starved(self, listener: Listener, exc: OSError, report: bool) -> Any:
        """accept() ran out of a resource: report it (once per episode), then
        schedule stock's retry, with stock's arguments; the timer's handle."""
        if report:
            self.call_exception_handler(
                {
                    "message": "socket.accept() out of system resource",
                    "exception": exc,
                    "socket": _compat.TransportSocket(listener.sock),
                }
            )
        args = (listener.protocol_factory, listener.sock, listener.sslcontext,
                listener.server, listener.backlog, *listener.timeouts)
        if _compat.PY315:
            args += (listener.context,)
        return self.call_later(_compat.ACCEPT_RETRY_DELAY, self._resume_serving, *args)

    def _resume_serving(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any,
        server: Any,
        backlog: int,
        *rest: Any,  # the SSL timeouts; the context on 3.15
    ) -> None:
        """The back-off is over: poll the listener again, unless it was closed
        meanwhile (stock retries on the closed socket and reports ValueError)."""
        if sock.fileno() < 0 or (server is not None and not server.is_serving()):
            return
        self._start_serving(protocol_factory, sock, sslcontext, server, backlog, *rest)

    def _accept_rest(self, listener: Any, seconds: float) -> Any:
        """accept=balanced: the timer that ends *listener*'s rest."""
        return self.call_later(seconds, listener.rested)

    def _server_open_count(self, server: Any) -> int:
        return _compat.server_active_count(server)

    # -- the iteration ------------------------------------------------------

    def _poll_wrapped(self, timeout: float | None) -> list[tuple[int, Any, int]]:
        """The poll through a select() someone wrapped or overrode (time
        freezers in tests, I/O-time meters): called as stock calls it."""
        return [(key.fd, key.data, mask) for key, mask in self._selector.select(timeout)]

    def _schedule_events(self, event_list: list[tuple[int, Any, int]]) -> None:
        """Stock's _process_events, for (fd, data, mask) triples: the I/O
        handles join the ready queue.  A _process_events replaced by a
        subclass or a patch gets what stock passes it, (key, mask) pairs."""
        # Through the bound method, not self.__dict__: reading an instance's
        # __dict__ makes CPython build it, which slows every attribute of the
        # object from then on (+650 instructions per 1 KiB echo, callgrind).
        try:
            stock = self._process_events.__func__ is _compat.STOCK_PROCESS_EVENTS
        except AttributeError:  # replaced by a function or a mock
            stock = False
        if not stock:
            self._process_events(self._as_keys(event_list))
            return
        for fd, (reader, writer), mask in event_list:
            if mask & _EVENT_READ and reader is not None:
                if reader._cancelled:
                    self._remove_reader(fd)
                else:
                    self._add_callback(reader)
            if mask & _EVENT_WRITE and writer is not None:
                if writer._cancelled:
                    self._remove_writer(fd)
                else:
                    self._add_callback(writer)

    def _dispatch_events(self, event_list: list[tuple[int, Any, int]]) -> int:
        """Run the I/O callbacks of *event_list* at once; return how many ran.

        Safe only when the ready queue was empty before the poll (the
        caller checks): stock ``_process_events`` would queue these handles
        and ``_run_once`` would run them first, in this order, with nothing
        in between but themselves.  Each runs as ``Handle._run`` would run
        it (its context; an exception to the handler with the ``handle`` key).
        A handle cancelled by an earlier callback of this batch is skipped,
        as stock skips it in the ready queue; stock's removal of a reader
        cancelled before the poll applies only while it is still the fd's
        reader (an earlier callback may have registered a new one).
        """
        ran = 0
        for event in event_list:
            fd, (reader, writer), mask = event
            if mask & _EVENT_READ and reader is not None:
                if reader._cancelled:
                    self._remove_cancelled(fd, reader, 0)
                else:
                    ran += 1
                    try:
                        # Handle._run without its frame, while the handle's
                        # type runs stock's (see _compat.STOCK_HANDLE_RUN).
                        if type(reader)._run is not _STOCK_HANDLE_RUN:
                            reader._run()
                        elif reader._args:
                            reader._context.run(reader._callback, *reader._args)
                        else:  # a transport's or a listener's reader: no *args
                            reader._context.run(reader._callback)
                    except (SystemExit, KeyboardInterrupt):
                        if not mask & _EVENT_WRITE:
                            writer = None
                        self._schedule_rest(event_list, event, writer)
                        raise
                    except BaseException as exc:
                        self._callback_failed(reader, exc)
            if mask & _EVENT_WRITE and writer is not None:
                if writer._cancelled:
                    self._remove_cancelled(fd, writer, 1)
                else:
                    ran += 1
                    try:
                        self._run_handle(writer)  # EPOLLOUT: rare, a frame is fine
                    except (SystemExit, KeyboardInterrupt):
                        self._schedule_rest(event_list, event, None)
                        raise
        # As Handle._run's "self = None": a traceback kept by whoever got an
        # exception holds this frame; it must not hold the batch too.
        event_list = event = reader = writer = None  # type: ignore[assignment]
        return ran

    def _run_handle(self, handle: Any) -> None:
        """Run *handle* as Handle._run does, without its frame while its type
        runs stock's; the hot paths (readers, the ready queue) repeat this."""
        if type(handle)._run is not _STOCK_HANDLE_RUN:
            handle._run()
            return
        try:
            handle._context.run(handle._callback, *handle._args)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self._callback_failed(handle, exc)
        handle = None  # as Handle._run's "self = None" (a kept traceback)

    def _callback_failed(self, handle: Any, exc: BaseException) -> None:
        """Report a callback's exception as Handle._run does."""
        source = _compat.format_callback_source(handle._callback, handle._args, self._debug)
        context = {"message": f"Exception in callback {source}", "exception": exc,
                   "handle": handle}
        if handle._source_traceback:
            context["source_traceback"] = handle._source_traceback
        self.call_exception_handler(context)

    def _as_keys(
        self, event_list: list[tuple[int, Any, int]]
    ) -> list[tuple[selectors.SelectorKey, int]]:
        """(key, mask) pairs for the poll's triples (the key as registered)."""
        pairs = []
        for fd, data, mask in event_list:
            try:
                key = self._selector.get_key(fd)
            except (KeyError, ValueError):
                key = selectors.SelectorKey(fd, fd, mask, data)
            if key.data is not data:
                key = key._replace(data=data)
            pairs.append((key, mask))
        return pairs

    def _schedule_rest(self, event_list: list[tuple[int, Any, int]],
                       event: tuple[int, Any, int], writer: Any) -> None:
        """SystemExit or KeyboardInterrupt left a batch half run at *event*
        (Handle._run reports everything else): schedule what stock would have
        queued.  *event* is found by identity (the loop above keeps no index)."""
        if writer is not None and not writer._cancelled:
            self._ready.append(writer)
        index = next(i for i, item in enumerate(event_list) if item is event)
        self._schedule_events(event_list[index + 1:])

    def _remove_cancelled(self, fd: int, handle: Any, which: int) -> None:
        """Stock drops a cancelled reader/writer that the poll reported."""
        try:
            current = self._selector.get_key(fd).data[which]
        except KeyError:
            return
        if current is handle:
            if which:
                self._remove_writer(fd)
            else:
                self._remove_reader(fd)

    def _run_once(self) -> None:
        """Run one full iteration of the event loop (see the module docstring)."""
        stats = self._stats
        stats.iterations += 1
        scheduled = self._scheduled
        sched_count = len(scheduled)
        if (
            sched_count > _compat.MIN_SCHEDULED_TIMER_HANDLES
            and self._timer_cancelled_count / sched_count
            > _compat.MIN_CANCELLED_TIMER_HANDLES_FRACTION
        ):
            # Remove delayed calls that were cancelled if their number is too high.
            new_scheduled = []
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
                else:
                    new_scheduled.append(handle)
            heapq.heapify(new_scheduled)
            self._scheduled = scheduled = new_scheduled
            self._timer_cancelled_count = 0
        else:
            # Remove delayed calls that were cancelled from head of queue.
            while scheduled and scheduled[0]._cancelled:
                self._timer_cancelled_count -= 1
                handle = heapq.heappop(scheduled)
                handle._scheduled = False

        # Phase: writes made while the loop was not running.
        writes = self._shared
        if writes.pending:
            writes.flush(include_feeds=False)

        # The flush above can queue writes again (a resume_writing() that
        # writes): they must not wait for an unrelated event, so no blocking.
        timeout: float | None = None
        if self._ready or self._stopping or writes.pending or writes.feeding:
            timeout = 0
        elif scheduled:
            # Compute the desired timeout.
            timeout = scheduled[0]._when - self.time()
            if timeout > _compat.MAXIMUM_SELECT_TIMEOUT:
                timeout = _compat.MAXIMUM_SELECT_TIMEOUT
            elif timeout < 0:
                timeout = 0

        # Phase: apply interest changes, then poll (both inside select()).
        # DeferredSelector.ready(): select() without a SelectorKey per event,
        # unless select() was wrapped or overridden (then that is called).
        selector = self._selector
        try:
            own_select = selector.select.__func__ is _POLLER_SELECT
        except AttributeError:  # replaced by a function or a callable object
            own_select = False
        if own_select:
            event_list = selector.ready(timeout)
        else:
            event_list = self._poll_wrapped(timeout)
        ready = self._ready
        # Fast path, safe only when nothing was ready before the poll (and
        # not in debug mode, which times each callback): stock would queue
        # the I/O handles, then the due timers, and run exactly those, in
        # that order, before anything they schedule.  The same happens here
        # without the queue round trip: the due timers are collected first
        # (before any callback can add or cancel one, as in stock), the I/O
        # callbacks run straight from the poll's results, then the timers;
        # what the callbacks scheduled waits for the next iteration.
        direct = not ready and not self._debug
        if not direct:
            self._schedule_events(event_list)

        # Handle 'later' callbacks that are ready (no clock read without
        # timers: stock reads it every iteration, for nothing then).
        due: Any = _NO_TIMERS  # read only in the direct case
        if scheduled:
            end_time = _compat.end_time(self.time(), self._clock_resolution)
            due = [] if direct else ready
            while scheduled:
                handle = scheduled[0]
                if handle._when >= end_time:
                    break
                handle = heapq.heappop(scheduled)
                handle._scheduled = False
                due.append(handle)

        ran = added = 0
        if direct:
            try:
                ran = self._dispatch_events(event_list)
            finally:
                # What the I/O callbacks scheduled (or, after SystemExit /
                # KeyboardInterrupt, the rest of the batch) stays behind the
                # due timers' turn.
                added = len(ready)
                ready.extendleft(reversed(due))
        # Needed to break cycles when an exception occurs.
        event_list = None

        # Phase: run the callbacks that are ready now, not those they add:
        # those run next time, after another poll.  The popleft idiom is
        # thread-safe without locks (call_soon_threadsafe appends).
        ntodo = len(ready) - added
        for _ in range(ntodo):
            handle = ready.popleft()
            if handle._cancelled:
                continue
            ran += 1
            if self._debug:
                try:
                    self._current_handle = handle
                    t0 = self.time()
                    handle._run()
                    dt = self.time() - t0
                    if dt >= self.slow_callback_duration:
                        # Looked up per call: tests patch _compat.loop_logger().
                        _compat.loop_logger().warning(
                            "Executing %s took %.3f seconds", _compat.format_handle(handle), dt
                        )
                finally:
                    self._current_handle = None
            elif type(handle)._run is _STOCK_HANDLE_RUN:
                # Handle._run inlined, as in _dispatch_events.
                try:
                    handle._context.run(handle._callback, *handle._args)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._callback_failed(handle, exc)
            else:
                handle._run()
        handle = None  # Needed to break cycles when an exception occurs.
        stats.callbacks += ran

        # Phase: everything the callbacks wrote, and last iteration's feeds.
        if writes.pending or writes.feeding:
            writes.flush(include_feeds=True)
