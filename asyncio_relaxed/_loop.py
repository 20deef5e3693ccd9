"""Loop: binds config, statistics, poller, write queue, transport and serving.

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
import functools
import heapq
import selectors
import socket
import ssl
import time
from typing import Any

from . import _compat, _slow, _startup
from ._accept import ListenerStatistics, accept_queue_length
from ._config import Config, DatagramMode, PipeMode, TlsMode, resolve
from ._datagram import DatagramTransport
from ._health import Health, HealthSnapshot
from ._pipes import ReadPipeTransport, WritePipeTransport
from ._poller import MISSING, DeferredSelector, default_backend
from ._publish import Publisher
from ._serving import Serving
from ._shared import TransportShared
from ._stats import Counters, LoopGauges, LoopStatistics
from ._tls import SSLTransport
from ._transport import SocketTransport

__all__ = ["Loop"]

_STOCK_HANDLE_RUN = _compat.STOCK_HANDLE_RUN
_STOCK_PROCESS_EVENTS = _compat.STOCK_PROCESS_EVENTS
_STOCK_ADD_READER = _compat.SelectorEventLoop._add_reader
_STOCK_ADD_WRITER = _compat.SelectorEventLoop._add_writer
_STOCK_REMOVE_READER = _compat.SelectorEventLoop._remove_reader
_STOCK_REMOVE_WRITER = _compat.SelectorEventLoop._remove_writer
# Attributes whose replacement on a loop may change how it polls (_route_changed).
_ROUTE_NAMES = frozenset({"_process_events", "_selector"})
_monotonic = time.monotonic
_Handle = _compat.Handle
_new_handle = _compat.new_handle
_TimerHandle = _compat.TimerHandle
# The handle classes the run loop runs without Handle._run's frame, by which
# of them still have stock's _run (TimerHandle inherits Handle's).
_INLINE = (_Handle, _TimerHandle)
_INLINE_HANDLE = (_Handle,)
_INLINE_NONE: tuple[type, ...] = ()
_EVENT_READ = selectors.EVENT_READ  # module globals: one lookup less per event
_EVENT_WRITE = selectors.EVENT_WRITE
# What loop.gauges() counts as a connection, and as one carrying TLS.
_STREAMS = (SocketTransport, _compat.StockSocketTransport)
_TLS_LAYERS = (SSLTransport, _compat.SSLProtocol)

# The poller's own select(): the loop polls through DeferredSelector.ready()
# only while this is what the selector's select is (see _run_once).
_POLLER_SELECT = DeferredSelector.select
#: time_metrics: a loop that never waits still ends a stretch every 32nd
#: iteration (see _health).
_STRETCH_MASK = 31


def _plain_socket(sock: Any) -> bool:
    """A socket the loop's own TLS transport can carry: not one that already
    speaks TLS (an ssl.SSLSocket)."""
    return isinstance(sock, socket.socket) and not isinstance(sock, ssl.SSLSocket)


def _serving_arguments(
    protocol_factory: Any,
    sock: socket.socket,
    sslcontext: Any = None,
    server: Any = None,
    backlog: int = 100,
    ssl_handshake_timeout: Any = _compat.DEFAULT_SSL_TIMEOUTS[0],
    ssl_shutdown_timeout: Any = _compat.DEFAULT_SSL_TIMEOUTS[1],
    context: Any = None,
) -> tuple[Any, ...]:
    """Stock's _start_serving and _accept_connection arguments as Serving
    takes them."""
    return (protocol_factory, sock, sslcontext, server, backlog,
            (ssl_handshake_timeout, ssl_shutdown_timeout), context)


class Loop(_compat.SelectorEventLoop):  # type: ignore[misc]
    """A drop-in asyncio event loop; see the package docs for the options.

    *selector* may be a :class:`~asyncio_relaxed._poller.DeferredSelector` or
    any stdlib selector, which is then driven through its deferred
    bookkeeping.  Keyword *options* are the fields of
    :class:`~asyncio_relaxed.Config`; each beats its ``ASYNCIO_RELAXED_*``
    environment variable.
    """

    #: Which build this class is of (asyncio_relaxed._builds); the startup
    #: line, the published facts and ``python -m asyncio_relaxed`` name it.
    _build = "pure"
    # The classes of what the loop makes: the compiled twin's loop
    # (asyncio_relaxed._speedups) names its own.
    _Counters: type[Counters] = Counters
    _SocketTransport: type[SocketTransport] = SocketTransport
    _SSLTransport: type[SSLTransport] = SSLTransport
    _DatagramTransport: type[DatagramTransport] = DatagramTransport
    _TransportShared: type[TransportShared] = TransportShared
    _Serving: type[Serving] = Serving

    # Read by BaseEventLoop.__del__: true until the base __init__ has run, so
    # a loop whose settings were rejected is not reported as unclosed.
    _closed = True
    # Set by BaseEventLoop.__init__; declared for the type checker.
    _scheduled: list[Any]
    _timer_cancelled_count: int

    def __init__(self, selector: selectors.BaseSelector | None = None, **options: Any) -> None:
        # Resolve the settings first: a bad value fails before any fd exists.
        config = resolve(options)
        stats = self._Counters()
        if selector is None:
            poller = DeferredSelector(default_backend(config.poller.value), stats=stats)
        elif isinstance(selector, DeferredSelector):
            poller = selector
            poller.stats = stats
        else:
            poller = DeferredSelector(selector, stats=stats)
        poller.on_error = self._poller_error
        # Few attributes of our own: CPython shares the keys of instance dicts
        # up to 30 names, stock's loop has up to 27 (3.14), and a loop past
        # 30 reads every attribute slower (tests/test_loop.py checks it).
        # Everything the transports need of this loop beyond stock's API (the
        # settings, the counters, the write queue): one attribute.
        self._shared = shared = self._TransportShared(config, stats, poller)
        shared.on_error = self._flush_failed
        # The listening sockets this loop serves (_serving, _accept).
        self._serving = self._Serving(self, config, stats, shared)
        # Time and lag accounts (with time_metrics), slow-callback reports.
        self._health = health = Health(config.time_metrics, config.slow_callback)
        super().__init__(poller)
        _startup.announce(config, poller.backend_name, build=self._build)
        if config.stats_dir:
            publisher = Publisher(self, config.stats_dir)
            if publisher.active:  # (not when another loop of the process publishes)
                health.publisher = publisher

    @property
    def config(self) -> Config:
        """The settings this loop was created with."""
        return self._shared.config

    def statistics(self) -> LoopStatistics:
        """A frozen snapshot of this loop's counters."""
        return self._shared.stats.snapshot(self._shared.poller.backend_name)  # after close() too

    def health(self) -> HealthSnapshot:
        """A frozen snapshot of where this loop's time went and how late its
        work ran (busy, idle and lag need ``time_metrics``), and its slow
        callbacks."""
        return self._health.snapshot(self._shared.stats.iterations)

    def listener_statistics(self) -> list[ListenerStatistics]:
        """The counts of each listening socket this loop serves."""
        return [listener.statistics() for listener in self._serving.listeners.values()]

    def gauges(self) -> LoopGauges:
        """What this loop holds now (open connections, TLS among them, paused
        readers and writers, bytes buffered for writing, listeners and their
        pending accepts), counted from its transports and listeners when asked."""
        connections = tls = reading_paused = writing_paused = buffered = 0
        # An exporter's thread may ask while the loop's thread adds and
        # drops transports: list() of the weak dictionary's own dict of
        # references is one C call, which no other thread interleaves.
        for reference in list(self._transports.data.values()):
            transport = reference()
            if not isinstance(transport, _STREAMS) or transport._sock is None:
                continue
            connections += 1
            if isinstance(transport._protocol, _TLS_LAYERS):
                tls += 1
            if not transport.is_reading():
                reading_paused += 1
            if transport._protocol_paused:
                writing_paused += 1
            buffered += transport.get_write_buffer_size()
        listeners = list(self._serving.listeners.values())
        pending = sum(accept_queue_length(listener.sock) or 0 for listener in listeners)
        return LoopGauges(connections, tls, reading_paused, writing_paused, buffered,
                          len(listeners), pending)

    def set_slow_callback_handler(self, handler: Any) -> None:
        """Call ``handler(loop, report)`` for each slow callback report (a
        :class:`~asyncio_relaxed.SlowCallback`) instead of logging it; None
        restores the logging.  Needs the ``slow_callback`` setting."""
        if handler is not None and not callable(handler):
            raise TypeError(f"A callable object or None is expected, got {handler!r}")
        self._health.handler = handler

    def get_slow_callback_handler(self) -> Any:
        return self._health.handler

    # Stock's call_soon without its frames (see _compat.call_soon).
    call_soon = _compat.call_soon

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in _ROUTE_NAMES:
            self._route_changed()

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name)
        if name in _ROUTE_NAMES:
            self._route_changed()

    def _route_changed(self) -> None:
        """A _process_events replaced on the instance (tests do) takes the
        iteration off the poller's route, as a wrapped select() does: the
        poller keeps the name (DeferredSelector.replaced), so the iteration
        checks it without reading this object's __dict__ (which would make
        CPython build it, slowing every attribute read)."""
        selector = getattr(self, "_selector", None)
        if not isinstance(selector, DeferredSelector):
            return  # replaced: the iteration takes stock's route anyway
        method = getattr(self, "_process_events", None)
        if getattr(method, "__func__", None) is type(self)._process_events:
            selector.replaced -= {"_process_events"}
        else:
            selector.replaced |= {"_process_events"}

    # -- readers and writers: stock's, on the poller without SelectorKeys ------

    if _compat.PY315:
        def _add_reader(self, fd: Any, callback: Any, *args: Any, context: Any = None) -> Any:
            return self._set_callback(fd, 0, callback, args, context)

        def _add_writer(self, fd: Any, callback: Any, *args: Any, context: Any = None) -> Any:
            return self._set_callback(fd, 1, callback, args, context)
    else:
        def _add_reader(self, fd: Any, callback: Any, *args: Any) -> Any:  # type: ignore[misc]
            return self._set_callback(fd, 0, callback, args, None)

        def _add_writer(self, fd: Any, callback: Any, *args: Any) -> Any:  # type: ignore[misc]
            return self._set_callback(fd, 1, callback, args, None)

    def _remove_reader(self, fd: Any) -> bool:
        return self._clear_callback(fd, 0)

    def _remove_writer(self, fd: Any) -> bool:
        return self._clear_callback(fd, 1)

    def _set_callback(self, fd: Any, which: int, callback: Any, args: tuple[Any, ...],
                      context: Any) -> Any:
        """Stock's _add_reader (*which* 0) or _add_writer (1): a new handle
        in that slot of the fd's (reader, writer), the one it replaces
        cancelled.  A selector that is not our poller, or one whose methods
        were replaced on the instance, gets stock's calls."""
        selector = self._selector
        if type(selector) is not DeferredSelector or selector.replaced:
            stock = _STOCK_ADD_WRITER if which else _STOCK_ADD_READER
            if _compat.PY315:
                return stock(self, fd, callback, *args, context=context)
            return stock(self, fd, callback, *args)
        if self._closed:  # _check_closed()
            raise RuntimeError("Event loop is closed")
        if self._debug or _compat.events.Handle is not _Handle:
            handle = _compat.events.Handle(callback, args, self, context)
        else:
            handle = _new_handle(callback, args, self, context)
        replaced = selector.set_callback(fd, which, handle)
        if replaced is not None:
            replaced.cancel()
        return handle

    def _clear_callback(self, fd: Any, which: int) -> bool:
        """Stock's _remove_reader (*which* 0) or _remove_writer (1): whether
        there was a handle to remove (it is cancelled)."""
        selector = self._selector
        if type(selector) is not DeferredSelector or selector.replaced:
            return bool((_STOCK_REMOVE_WRITER if which else _STOCK_REMOVE_READER)(self, fd))
        if self.is_closed():
            return False
        removed = selector.clear_callback(fd, which)
        if removed is None or removed is MISSING:
            return False
        removed.cancel()
        return True

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
            self._serving.close()
        publisher = self._health.publisher
        if publisher is not None and not self.is_running():
            publisher.close()
        super().close()
        # A closed loop leaves no reference cycle for the collector, as
        # stock's does not (its selector's close drops the selector's map):
        # the poller's and the write queue's error callbacks are this loop's
        # bound methods, and Serving and the publisher hold the loop.
        shared = self._shared
        shared.on_error = None
        shared.poller.on_error = None
        self._serving.loop = None
        self._health.publisher = None

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
        return self._SocketTransport(self, sock, protocol, waiter, extra, server,
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
        if self._shared.config.tls is TlsMode.OWN and _plain_socket(rawsock):
            layer = self._SSLTransport(self, protocol, sslcontext, waiter, server_side,
                                 server_hostname, **timeouts)
            self._SocketTransport(self, rawsock, layer, extra=extra, server=server,
                                  shared=self._shared, context=context)
            return layer
        ssl_protocol = _compat.SSLProtocol(
            self, protocol, sslcontext, waiter, server_side, server_hostname, **timeouts
        )
        self._SocketTransport(self, rawsock, ssl_protocol, extra=extra, server=server,
                              shared=self._shared, context=context)
        return ssl_protocol._app_transport

    def _make_datagram_transport(
        self,
        sock: socket.socket,
        protocol: Any,
        address: Any = None,
        waiter: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> Any:
        if self._shared.config.datagram is not DatagramMode.OWN:
            return super()._make_datagram_transport(sock, protocol, address, waiter, extra)
        if _compat.DATAGRAM_CHECKS_FD:
            self._ensure_fd_no_transport(sock)
        return self._DatagramTransport(self, sock, protocol, address, waiter, extra,
                                       shared=self._shared)

    def _make_read_pipe_transport(self, pipe: Any, protocol: Any, waiter: Any = None,
                                  extra: dict[str, Any] | None = None) -> Any:
        if self._shared.config.pipe is not PipeMode.OWN:
            return super()._make_read_pipe_transport(pipe, protocol, waiter, extra)
        return ReadPipeTransport(self, pipe, protocol, waiter, extra, shared=self._shared)

    def _make_write_pipe_transport(self, pipe: Any, protocol: Any, waiter: Any = None,
                                   extra: dict[str, Any] | None = None) -> Any:
        if self._shared.config.pipe is not PipeMode.OWN:
            return super()._make_write_pipe_transport(pipe, protocol, waiter, extra)
        return WritePipeTransport(self, pipe, protocol, waiter, extra, shared=self._shared)

    @property
    def _child_watcher_callback(self) -> Any:
        """What stock's _make_subprocess_transport gives its child watcher,
        read there in the context that makes the subprocess: stock's
        callback, run in a copy of that context.  A pidfd watcher (3.12+)
        reports the exit from a reader registered in that context; a
        threaded one (3.11's, or any where the kernel has no pidfd_open)
        from a thread, in the thread's empty context.  So process_exited,
        and the connection_lost after it, see the maker's context whatever
        the watcher."""
        return functools.partial(contextvars.copy_context().run, super()._child_watcher_callback)

    async def start_tls(
        self,
        transport: Any,
        protocol: Any,
        sslcontext: Any,
        *,
        server_side: bool = False,
        server_hostname: str | None = None,
        ssl_handshake_timeout: float | None = None,
        ssl_shutdown_timeout: float | None = None,
    ) -> Any:
        """Upgrade *transport* to TLS: under ``tls=own`` the loop's TLS layer
        becomes its protocol (over one of the loop's socket transports, or
        over a TLS layer: TLS over TLS), as stock's SSLProtocol does in
        base_events.start_tls, step for step."""
        timeouts = {"ssl_handshake_timeout": ssl_handshake_timeout,
                    "ssl_shutdown_timeout": ssl_shutdown_timeout}
        if self._shared.config.tls is not TlsMode.OWN:
            return await super().start_tls(transport, protocol, sslcontext,
                                           server_side=server_side,
                                           server_hostname=server_hostname, **timeouts)
        if not isinstance(sslcontext, ssl.SSLContext):
            raise TypeError(f"sslcontext is expected to be an instance of ssl.SSLContext, "
                            f"got {sslcontext!r}")
        if not getattr(transport, "_start_tls_compatible", False):
            raise TypeError(f"transport {transport!r} is not supported by start_tls()")
        waiter = self.create_future()
        layer = self._SSLTransport(self, protocol, sslcontext, waiter, server_side, server_hostname,
                             call_connection_made=False, **timeouts)
        # Paused first, so that no data reaches the layer before connection_made.
        transport.pause_reading()
        if server_side and _compat.START_TLS_TAKES_STREAM_BUFFER:
            _compat.move_stream_buffer(protocol, layer._incoming)
        transport.set_protocol(layer)
        connection_made = self.call_soon(layer.connection_made, transport)
        resume = self.call_soon(transport.resume_reading)
        try:
            await waiter
        except BaseException:
            transport.close()
            connection_made.cancel()
            resume.cancel()
            waiter = None
            raise
        return layer

    # -- accept: the hooks stock calls (see _serving) ---------------------------

    def _start_serving(self, *args: Any, **kwargs: Any) -> None:
        """Serve *sock* (stock's arguments; ``context`` is 3.15's, the
        server's: gh-140947)."""
        self._serving.start(*_serving_arguments(*args, **kwargs))

    def _accept_connection(self, *args: Any, **kwargs: Any) -> None:
        """One readiness event of a listener, by the accept strategy (the
        loop's own reader is its Listener's ready(); this is for callers),
        called with _start_serving's arguments."""
        self._serving.accept_now(*_serving_arguments(*args, **kwargs))

    def _stop_serving(self, sock: socket.socket) -> None:
        self._serving.stop(sock)
        super()._stop_serving(sock)

    # -- the iteration ------------------------------------------------------

    def _poll_stock(self, timeout: float | None) -> None:
        """The poll through a select() someone wrapped or overrode (time
        freezers in tests, I/O-time meters) or into a _process_events a
        subclass or a patch replaced: called as stock calls them."""
        selector = self._selector
        health = self._health
        if not health.timed:
            self._process_events(selector.select(timeout))
            return
        found = selector.select(0)
        if (not found and timeout != 0) or not self._shared.stats.iterations & _STRETCH_MASK:
            waited = health.stretch_end()
            if health.publisher is not None:
                timeout = health.publisher.due(waited, timeout)
            if not found and timeout != 0:
                found = selector.select(timeout)
                health.waited(waited)
        self._process_events(found)

    def _timed_wait(self, timeout: float | None) -> Any:
        """time_metrics: the stretch ends, then the wait, timed as idle (see _health)."""
        health = self._health
        waited = health.stretch_end()
        if health.publisher is not None:
            timeout = health.publisher.due(waited, timeout)
        rest = self._selector.ready_readers(timeout, self._ready)
        health.waited(waited)
        return rest

    def _process_rest(self, event_list: list[tuple[int, Any, int]]) -> None:
        """Stock's _process_events for the poller's (fd, data, mask) triples."""
        ready = self._ready
        for fd, (reader, writer), mask in event_list:
            if mask & _EVENT_READ and reader is not None:
                if reader._cancelled:
                    self._remove_reader(fd)
                else:
                    ready.append(reader)
            if mask & _EVENT_WRITE and writer is not None:
                if writer._cancelled:
                    self._remove_writer(fd)
                else:
                    ready.append(writer)

    def _callback_failed(self, handle: Any, exc: BaseException) -> None:
        """Report a callback's exception as Handle._run does."""
        source = _compat.format_callback_source(handle._callback, handle._args, self._debug)
        context = {"message": f"Exception in callback {source}", "exception": exc,
                   "handle": handle}
        if handle._source_traceback:
            context["source_traceback"] = handle._source_traceback
        self.call_exception_handler(context)

    def _run_once(self) -> None:
        """Run one full iteration of the event loop (see the module docstring)."""
        writes = self._shared
        stats = writes.stats
        stats.iterations += 1
        scheduled = self._scheduled
        if scheduled:  # (nothing to clean up without timers)
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
        if writes.pending:
            writes.flush(include_feeds=False)

        # The flush above can queue writes again (a resume_writing() that
        # writes): they must not wait for an unrelated event, so no blocking.
        timeout: float | None = None
        ready = self._ready
        if ready or self._stopping or writes.pending or writes.feeding:
            timeout = 0
        elif scheduled:
            # Compute the desired timeout.
            timeout = scheduled[0]._when - self.time()
            if timeout > _compat.MAXIMUM_SELECT_TIMEOUT:
                timeout = _compat.MAXIMUM_SELECT_TIMEOUT
            elif timeout < 0:
                timeout = 0

        # Phase: apply interest changes, then poll; the I/O handles join the
        # ready queue as stock's _process_events adds them, in the kernel's
        # order, except that the poller's wait puts the reader of each input
        # event on a transport's socket straight into the queue
        # (ready_readers) and returns the other events as (fd, data, mask),
        # queued after those readers.  With time_metrics the poll first does
        # not wait, and the clock is read only when that finds nothing and
        # the loop may wait, or every 32nd iteration.
        selector = self._selector
        health = self._health
        if (type(selector).select is _POLLER_SELECT and not selector.replaced
                and type(self)._process_events is _STOCK_PROCESS_EVENTS):
            if timeout == 0 or not health.timed:
                rest = selector.ready_readers(timeout, ready)
                if health.timed and not stats.iterations & _STRETCH_MASK:
                    now = health.stretch_end()  # a loop that never waits
                    if health.publisher is not None:
                        health.publisher.due(now, 0)
            else:
                # time_metrics and the loop may wait (so nothing is ready
                # yet): a poll that does not wait first, then the timed wait
                # only if it found nothing.
                rest = selector.ready_readers(0, ready)
                if not rest and not ready:
                    rest = self._timed_wait(timeout)
            if rest:
                self._process_rest(rest)
        else:
            self._poll_stock(timeout)

        # Phase: due timers join the queue (no clock read without timers:
        # stock reads it every iteration, for nothing then).  ``due``: one
        # joined (timers join the queue only here).
        due = False
        if scheduled:
            loop_now = self.time()
            end_time = _compat.end_time(loop_now, self._clock_resolution)
            lag = health.lag if health.timed else None
            while scheduled:
                handle = scheduled[0]
                if handle._when >= end_time:
                    break
                handle = heapq.heappop(scheduled)
                handle._scheduled = False
                ready.append(handle)
                due = True
                if lag is not None:
                    lag.record(loop_now - handle._when)  # how late it runs

        # Phase: run the callbacks that are ready now, not those they add:
        # those run next time, after another poll.  The popleft idiom is
        # thread-safe without locks (call_soon_threadsafe appends).  The one
        # place a handle runs: Handle._run inlined for handles of stock's
        # classes while their _run is stock's (_compat.STOCK_HANDLE_RUN),
        # each timed where debug mode or slow_callback asks (_run_timed).
        # TimerHandle's _run is looked up only when a timer joined: a handle
        # of a class not inlined runs through its own _run, stock's or not.
        ntodo = len(ready)
        ran = ntodo  # less the cancelled, below
        timed = self._debug or health.slow
        if timed or _Handle._run is not _STOCK_HANDLE_RUN:
            inline = _INLINE_NONE
        elif due and _TimerHandle._run is _STOCK_HANDLE_RUN:
            inline = _INLINE
        else:
            inline = _INLINE_HANDLE
        # ready.popleft() is called as a method: CPython specializes that
        # call (3.11: a method descriptor without arguments), not a call of
        # a bound builtin method kept in a local.
        for _ in range(ntodo):
            handle = ready.popleft()
            if handle._cancelled:
                ran -= 1
                continue
            if type(handle) in inline:
                # Handle._run's context.run(callback, *args), called without
                # the list and tuple that unpacking *args builds where args
                # holds none (a reader, a task's step) or one (a done
                # callback, a task's wake-up: the future).
                try:
                    if args := handle._args:
                        if len(args) == 1:
                            handle._context.run(handle._callback, args[0])
                        else:
                            handle._context.run(handle._callback, *args)
                    else:
                        handle._context.run(handle._callback)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self._callback_failed(handle, exc)
            elif timed:
                self._run_timed(handle)
            else:
                handle._run()
        handle = None  # Needed to break cycles when an exception occurs.
        stats.callbacks += ran

        # Phase: everything the callbacks wrote, and last iteration's feeds.
        if writes.pending or writes.feeding:
            writes.flush(True)  # include_feeds, positional: the cheaper call
        if self._stopping and health.timed:
            health.stopped()  # run_forever returns after this iteration

    def _run_timed(self, handle: Any) -> None:
        """Run *handle* timed: debug mode warns about a callback slower than
        slow_callback_duration (stock, with loop.time()), the slow_callback
        setting reports one (_slow, with the monotonic clock)."""
        debug = self._debug
        slow = self._health.slow
        try:
            self._current_handle = handle
            t0 = self.time() if debug else 0.0
            start = _monotonic() if slow else 0.0
            handle._run()
            if slow:
                end = _monotonic()
                if end - start >= slow:
                    _slow.report(self, handle, end - start, end)
            if debug:
                dt = self.time() - t0
                if dt >= self.slow_callback_duration:
                    # Looked up per call: tests patch _compat.loop_logger().
                    _compat.loop_logger().warning(
                        "Executing %s took %.3f seconds", _compat.format_handle(handle), dt
                    )
        finally:
            self._current_handle = None
