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

import heapq
import selectors
import socket
from typing import Any

from . import _compat, _slow
from ._accept import ListenerStatistics
from ._config import Config, resolve
from ._health import Health, HealthSnapshot
from ._poller import DeferredSelector, default_backend
from ._serving import Serving
from ._stats import Counters, LoopStatistics
from ._transport import SocketTransport, TransportShared

__all__ = ["Loop"]

_STOCK_HANDLE_RUN = _compat.STOCK_HANDLE_RUN
_Handle = _compat.Handle
_TimerHandle = _compat.TimerHandle
_EVENT_READ = selectors.EVENT_READ  # module globals: one lookup less per event
_EVENT_WRITE = selectors.EVENT_WRITE
#: The due timers of an iteration without any (never appended to).
_NO_TIMERS: tuple[Any, ...] = ()

# The poller's own select(): the loop polls through DeferredSelector.ready()
# only while this is what the selector's select is (see _run_once).
_POLLER_SELECT = DeferredSelector.select
#: time_metrics: a loop that never waits still ends a stretch every 32nd
#: iteration (see _health).
_STRETCH_MASK = 31


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
        stats = Counters()
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
        # settings, the counters, the write queue), and the listeners.
        self._shared = shared = TransportShared(config, stats, poller)
        shared.on_error = self._flush_failed
        shared.serving = Serving(self, config, stats, shared)
        # Time and lag accounts (with time_metrics), slow-callback reports.
        self._health = Health(config.time_metrics, config.slow_callback)
        super().__init__(poller)

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
        return [listener.statistics() for listener in self._shared.serving.listeners.values()]

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
            self._shared.serving.close()
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

    # -- accept: the hooks stock calls (see _serving) ---------------------------

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
        """Serve *sock*; ``context`` is 3.15's (the server's, gh-140947)."""
        self._shared.serving.start(protocol_factory, sock, sslcontext, server, backlog,
                            (ssl_handshake_timeout, ssl_shutdown_timeout), context)

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
        """One readiness event of a listener, by the accept strategy (the
        loop's own reader is its Listener's ready(); this is for callers)."""
        self._shared.serving.accept_now(protocol_factory, sock, sslcontext, server, backlog,
                                 (ssl_handshake_timeout, ssl_shutdown_timeout), context)

    def _stop_serving(self, sock: socket.socket) -> None:
        self._shared.serving.stop(sock)
        super()._stop_serving(sock)

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
        # Every event runs its reader, unless counted off below.
        ran = len(event_list)
        # Handle._run without its frame for handles of stock's class while
        # its _run is stock's (see _compat.STOCK_HANDLE_RUN); None matches
        # no handle's type.
        inline_type = _Handle if _Handle._run is _STOCK_HANDLE_RUN else None
        for event in event_list:
            fd, (reader, writer), mask = event
            if mask & _EVENT_READ and reader is not None:
                if reader._cancelled:
                    ran -= 1
                    self._remove_cancelled(fd, reader, 0)
                else:
                    try:
                        if type(reader) is not inline_type:
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
            else:
                ran -= 1
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
        """Run *handle* as Handle._run does, without its frame where that is
        stock's; the hot paths (readers, the ready queue) repeat this."""
        if type(handle) is not _Handle or _Handle._run is not _STOCK_HANDLE_RUN:
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
        writes = self._shared
        stats = writes.stats
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
        health = self._health
        if health.timed:
            # time_metrics: first without waiting; the clock only when that
            # finds nothing and the loop may wait, or every 32nd iteration.
            event_list = selector.ready(0) if own_select else self._poll_wrapped(0)
            if (not event_list and timeout != 0) or not stats.iterations & _STRETCH_MASK:
                poll = selector.ready if own_select else self._poll_wrapped
                event_list = health.timed_poll(poll, timeout, event_list)
        elif own_select:
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
        direct = not ready and not self._debug and not health.slow
        if not direct:
            self._schedule_events(event_list)

        # Handle 'later' callbacks that are ready (no clock read without
        # timers: stock reads it every iteration, for nothing then).
        due: Any = _NO_TIMERS  # read only in the direct case
        if scheduled:
            loop_now = self.time()
            end_time = _compat.end_time(loop_now, self._clock_resolution)
            due = [] if direct else ready
            lag = health.lag if health.timed else None
            while scheduled:
                handle = scheduled[0]
                if handle._when >= end_time:
                    break
                handle = heapq.heappop(scheduled)
                handle._scheduled = False
                due.append(handle)
                if lag is not None:
                    lag.record(loop_now - handle._when)  # how late it runs

        ran = added = 0
        if direct:
            try:
                ran = self._dispatch_events(event_list)
            finally:
                # What the I/O callbacks scheduled (or, after SystemExit /
                # KeyboardInterrupt, the rest of the batch) stays behind the
                # due timers' turn.
                added = len(ready)
                if due:
                    ready.extendleft(reversed(due))
        # Needed to break cycles when an exception occurs.
        event_list = None

        # Phase: run the callbacks that are ready now, not those they add:
        # those run next time, after another poll.  The popleft idiom is
        # thread-safe without locks (call_soon_threadsafe appends).
        ntodo = len(ready) - added
        if self._debug or health.slow:
            ran += _slow.run_ready_timed(self, ntodo)
            ntodo = 0
        ran += ntodo  # less the cancelled, below
        # Handle._run inlined, as in _dispatch_events, for handles of stock's
        # classes while their _run is stock's.
        inline = (_Handle._run is _STOCK_HANDLE_RUN
                  and _TimerHandle._run is _STOCK_HANDLE_RUN)
        for _ in range(ntodo):
            handle = ready.popleft()
            if handle._cancelled:
                ran -= 1
                continue
            if inline and (type(handle) is _Handle or type(handle) is _TimerHandle):
                try:
                    if handle._args:
                        handle._context.run(handle._callback, *handle._args)
                    else:  # a task's step: no *args (and no tuple made for them)
                        handle._context.run(handle._callback)
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
            writes.flush(True)  # include_feeds, positional: the cheaper call
        if self._stopping and health.timed:
            health.stopped()  # run_forever returns after this iteration
