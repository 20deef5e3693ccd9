"""The loop itself, run on every loop (see conftest.py): how callbacks are
scheduled and run, and what instrumentation that replaces stock's pieces
(Handle._run, asyncio.events.Handle, the selector's select, _process_events)
still sees.  Ours schedules and runs handles without stock's frames where
stock's pieces are in place (_compat's predicates); these tests hold it to
stock's behaviour when they are not.
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import ssl
import sys
import threading
import time
import traceback
from typing import Any

import pytest

import asyncio_relaxed
from conftest import run, stalled_pair


@pytest.mark.parametrize("direction", ["reader", "writer"])
def test_io_callback_exception_reaches_the_handler_as_stock_reports_it(
    loop: asyncio.AbstractEventLoop, loop_name: str, loop_errors: Any, direction: str
) -> None:
    """An add_reader or add_writer callback that raises: the handler gets
    the message, exception and handle Handle._run gives it (ours runs I/O
    callbacks without Handle._run's frame when nothing else is ready), and
    the loop goes on."""
    a, b = socket.socketpair()
    a.setblocking(False)
    loop_errors.expect("Exception in callback")
    calls: list[int] = []

    def failing() -> None:
        calls.append(1)
        if direction == "reader":
            a.recv(100)
        elif len(calls) > 1:
            return  # always writable: called until main() removes it, raising once
        raise ZeroDivisionError(f"from the {direction}")

    async def main() -> None:
        if direction == "reader":
            loop.add_reader(a.fileno(), failing)
            b.send(b"x")
        else:
            loop.add_writer(a.fileno(), failing)
        for _ in range(100):
            await asyncio.sleep(0.001)
            if calls:
                break
        await asyncio.sleep(0.01)
        loop.remove_reader(a.fileno())
        loop.remove_writer(a.fileno())

    try:
        run(loop, main())
    finally:
        a.close()
        b.close()
    assert calls == [1] if direction == "reader" else calls
    [context] = loop_errors.contexts
    assert isinstance(context["exception"], ZeroDivisionError)
    if loop_name != "uvloop":  # uvloop's text and keys are its own
        assert context["message"].startswith("Exception in callback ")
        assert "failing" in context["message"]
        assert isinstance(context["handle"], asyncio.Handle)  # cancelled by now
        # Whoever keeps the exception keeps its traceback's frames: like
        # Handle._run's "self = None", they must not hold the handle.
        frames = [frame for frame, _ in traceback.walk_tb(context["exception"].__traceback__)]
        held = [v for f in frames for v in f.f_locals.values() if isinstance(v, asyncio.Handle)]
        assert held == []


def test_a_replaced_handle_run_sees_io_callbacks(
    loop: asyncio.AbstractEventLoop, loop_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow-callback loggers (aiodebug) replace Handle._run; the callbacks of
    I/O events must still go through it (ours inlines it only while it is
    stock's)."""
    if loop_name == "uvloop":
        pytest.skip("uvloop's handles are its own")
    seen: list[Any] = []
    stock_run = asyncio.Handle._run

    def run_and_record(self: Any) -> None:
        seen.append(self._callback)
        stock_run(self)

    monkeypatch.setattr(asyncio.Handle, "_run", run_and_record)
    a, b = socket.socketpair()
    a.setblocking(False)
    got = loop.create_future()

    def on_read() -> None:
        if not got.done():
            got.set_result(a.recv(10))

    async def main() -> bytes:
        await asyncio.sleep(0.01)  # nothing ready when the event comes
        loop.add_reader(a.fileno(), on_read)
        b.send(b"ping")
        data: bytes = await got
        loop.remove_reader(a.fileno())
        return data

    try:
        assert run(loop, main()) == b"ping"
    finally:
        a.close()
        b.close()
    assert on_read in seen


def test_a_replaced_timer_handle_run_sees_due_timers(
    loop: asyncio.AbstractEventLoop, loop_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A _run replaced on TimerHandle alone (Handle's stays stock's) runs
    each due timer's callback, in an iteration with I/O callbacks too (ours
    inlines TimerHandle._run only while it is stock's)."""
    if loop_name == "uvloop":
        pytest.skip("uvloop's handles are its own")
    seen: list[Any] = []
    stock_run = asyncio.TimerHandle._run

    def run_and_record(self: Any) -> None:
        seen.append(self._callback)
        stock_run(self)

    ran: list[str] = []

    def on_timer() -> None:
        ran.append("timer")

    async def main() -> None:
        loop.call_later(0, on_timer)
        loop.call_soon(ran.append, "soon")
        await asyncio.sleep(0.01)

    run(loop, main())  # warm: stock's TimerHandle._run inlined
    assert ran == ["soon", "timer"]
    monkeypatch.setattr(asyncio.TimerHandle, "_run", run_and_record)
    ran.clear()
    run(loop, main())
    assert ran == ["soon", "timer"]
    assert on_timer in seen
    assert ran.append not in seen  # a call_soon handle is no TimerHandle


LOOP_CLASSES = {"asyncio": asyncio.SelectorEventLoop, "relaxed": asyncio_relaxed.Loop}


@pytest.mark.parametrize("kind", list(LOOP_CLASSES))
def test_wrapped_selector_select_sees_every_poll(kind: str) -> None:
    """Code in the wild wraps loop._selector.select (time freezers in tests,
    I/O-time meters): the loop must poll through the wrapper, as stock does
    (found in review: the poller's ready() bypassed it)."""
    loop = LOOP_CLASSES[kind]()
    try:
        real = loop._selector.select  # type: ignore[attr-defined]
        timeouts: list[Any] = []

        def spy(timeout: Any = None) -> Any:
            timeouts.append(timeout)
            return real(timeout)

        loop._selector.select = spy  # type: ignore[attr-defined]
        a, b = socket.socketpair()
        got: list[bytes] = []
        loop.add_reader(a.fileno(), lambda: got.append(a.recv(10)))
        b.send(b"x")
        loop.run_until_complete(asyncio.sleep(0.01))
        loop.remove_reader(a.fileno())
        a.close()
        b.close()
        assert timeouts
        assert got == [b"x"]
    finally:
        loop.close()


@pytest.mark.parametrize("kind", list(LOOP_CLASSES))
def test_subclass_process_events_gets_key_mask_pairs(kind: str) -> None:
    """A subclass overriding _process_events gets stock's (key, mask) pairs
    and can hand them on to super() (found in review)."""
    seen: list[tuple[int, int]] = []

    class Counting(LOOP_CLASSES[kind]):  # type: ignore[misc, valid-type]
        def _process_events(self, event_list: Any) -> None:
            for key, mask in event_list:
                seen.append((key.fd, mask))
                assert key.fileobj is a
            super()._process_events(event_list)

    loop = Counting()
    a, b = socket.socketpair()
    try:
        got: list[bytes] = []
        loop.add_reader(a, lambda: got.append(a.recv(10)))
        loop.call_soon(lambda: None)  # the ready queue is not empty: queued dispatch
        b.send(b"x")
        loop.run_until_complete(asyncio.sleep(0.01))
        loop.remove_reader(a)
        assert got == [b"x"]
        assert (a.fileno(), 1) in seen
    finally:
        a.close()
        b.close()
        loop.close()


@pytest.mark.parametrize("kind", list(LOOP_CLASSES))
@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_interrupt_in_a_reader_leaves_the_rest_of_the_batch_queued(
    kind: str, raised: type[BaseException]
) -> None:
    """KeyboardInterrupt or SystemExit from one I/O callback of a poll's batch
    leaves the batch's other callbacks queued, as stock's ready queue does:
    they run when the loop runs again even if their fds went quiet meanwhile
    (ours runs a batch straight from the poll and must queue the rest)."""
    loop = LOOP_CLASSES[kind]()
    pairs = [socket.socketpair() for _ in range(3)]
    calls: list[int] = []

    def reader(index: int) -> None:
        calls.append(index)
        try:
            pairs[index][0].recv(10)
        except BlockingIOError:
            pass
        if len(calls) == 1:
            raise raised()

    try:
        for index, (a, _) in enumerate(pairs):
            a.setblocking(False)
            loop.add_reader(a.fileno(), reader, index)

        def send_all() -> None:  # from a timer: the poll that follows has nothing else ready
            for _, b in pairs:
                b.send(b"x")

        loop.call_later(0.01, send_all)
        with pytest.raises(raised):
            loop.run_until_complete(asyncio.sleep(0.05))
        assert len(calls) == 1
        for index, (a, _) in enumerate(pairs):  # the others' data goes away
            if index != calls[0]:
                assert a.recv(10) == b"x"
        loop.run_until_complete(asyncio.sleep(0))
        assert sorted(calls[1:]) == sorted(set(range(3)) - {calls[0]})
        for a, _ in pairs:
            loop.remove_reader(a.fileno())
    finally:
        for a, b in pairs:
            a.close()
            b.close()
        loop.close()


def test_call_soon_handles_match_stock(loop: asyncio.AbstractEventLoop, loop_name: str) -> None:
    """call_soon's handle, arguments, context and cancel (ours makes the
    handle without Handle.__init__ outside debug mode)."""
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[tuple[Any, ...]] = []
    context = contextvars.copy_context()
    context.run(var.set, "from the context")
    first = loop.call_soon(lambda *args: seen.append((*args, var.get())), 1, 2)
    loop.call_soon(lambda: seen.append(("second", var.get())), context=context)
    cancelled = loop.call_soon(seen.append, "cancelled")
    cancelled.cancel()
    assert not first.cancelled() and cancelled.cancelled()
    if loop_name != "uvloop":  # uvloop's handles are its own
        assert type(first) is asyncio.Handle
        assert repr(first).startswith("<Handle ") and "<lambda>" in repr(first)
        if loop.get_debug():  # the suite's PYTHONASYNCIODEBUG=1 pass
            assert repr(cancelled).startswith("<Handle cancelled list.append('cancelled')")
            assert first._source_traceback  # type: ignore[attr-defined]
        else:
            assert repr(cancelled) == "<Handle cancelled>"
            assert first._source_traceback is None  # type: ignore[attr-defined]
    loop.run_until_complete(asyncio.sleep(0))
    assert seen == [(1, 2, "unset"), ("second", "from the context")]


def test_call_soon_on_a_closed_loop_raises_as_stock(loop_name: str) -> None:
    from conftest import LOOP_FACTORIES

    factory = LOOP_FACTORIES[loop_name]
    assert factory is not None
    closed = factory()
    closed.close()
    with pytest.raises(RuntimeError, match=r"^Event loop is closed$"):
        closed.call_soon(print)


def test_call_soon_in_debug_mode_records_where(loop: asyncio.AbstractEventLoop,
                                               loop_name: str) -> None:
    if loop_name == "uvloop":
        pytest.skip("uvloop's handles are its own")
    debug = loop.get_debug()
    loop.set_debug(True)
    handle = loop.call_soon(print)
    handle.cancel()
    frame = handle._source_traceback[-1]  # type: ignore[attr-defined]
    assert frame.name == "test_call_soon_in_debug_mode_records_where"
    assert "loop.call_soon(print)" in frame.line
    loop.set_debug(debug)


@pytest.mark.parametrize("kind", list(LOOP_CLASSES))
def test_call_soon_uses_a_replaced_handle_class(kind: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Instrumentation that replaces asyncio.events.Handle sees call_soon's
    handles made by its class, as with stock."""
    made: list[Any] = []

    class Recording(asyncio.Handle):
        __slots__ = ()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(asyncio.events, "Handle", Recording)
    loop = LOOP_CLASSES[kind]()
    try:
        handle = loop.call_soon(print)
        assert made[-1] is handle and type(handle) is Recording
        handle.cancel()
    finally:
        loop.close()


def test_call_soon_exception_reaches_the_handler_as_stock_reports_it(
    loop: asyncio.AbstractEventLoop, loop_name: str, loop_errors: Any
) -> None:
    """A ready callback that raises (ours runs it without Handle._run's
    frame): stock's message, exception and handle; no frame holds the handle."""
    loop_errors.expect("Exception in callback")

    def failing() -> None:
        raise ZeroDivisionError("from call_soon")

    handle = loop.call_soon(failing)
    loop.run_until_complete(asyncio.sleep(0))
    [context] = loop_errors.contexts
    assert isinstance(context["exception"], ZeroDivisionError)
    if loop_name != "uvloop":
        assert context["message"].startswith("Exception in callback ")
        assert "failing" in context["message"]
        assert context["handle"] is handle
        del handle
        frames = [frame for frame, _ in traceback.walk_tb(context["exception"].__traceback__)]
        held = [v for f in frames for v in f.f_locals.values() if isinstance(v, asyncio.Handle)]
        assert held == []


@pytest.mark.skipif(sys.version_info < (3, 14), reason="3.14's call_soon_threadsafe handle")
def test_threadsafe_cancel_waits_for_the_running_callback(
    loop: asyncio.AbstractEventLoop, loop_name: str
) -> None:
    """3.14: a call_soon_threadsafe handle's cancel() from another thread
    waits while its callback runs (the handle's lock, held by its _run), so
    cancel() returning means the callback is not running.  Ours runs ready
    handles without Handle._run's frame only where their type runs stock's."""
    if loop_name == "uvloop":
        pytest.skip("uvloop's handles are their own")
    entered = threading.Event()
    cancelling = threading.Event()
    finished: list[bool] = []
    seen_by_cancel: list[bool] = []

    def callback() -> None:
        entered.set()
        cancelling.wait(5)
        time.sleep(0.2)  # cancel() is waiting by now, if it waits at all
        finished.append(True)

    handle = loop.call_soon_threadsafe(callback)

    def cancel() -> None:
        entered.wait(5)
        cancelling.set()
        handle.cancel()
        seen_by_cancel.append(bool(finished))

    thread = threading.Thread(target=cancel)
    thread.start()
    loop.run_until_complete(asyncio.sleep(0))
    thread.join(5)
    assert finished == [True]
    assert seen_by_cancel == [True], "cancel() returned while the callback ran"


def test_a_handle_subclass_with_its_own_run_is_run_through_it(
    loop: asyncio.AbstractEventLoop, loop_name: str
) -> None:
    """A handle whose class overrides _run (3.14's _ThreadSafeHandle does) is
    run through that _run, in the ready queue and as an I/O callback."""
    if loop_name == "uvloop":
        pytest.skip("uvloop's handles are their own")
    ran: list[str] = []

    class Own(asyncio.Handle):
        __slots__ = ()

        def _run(self) -> None:
            ran.append("own _run")
            super()._run()

    handle = Own(ran.append, ("callback",), loop, None)
    loop._ready.append(handle)  # type: ignore[attr-defined]
    loop.run_until_complete(asyncio.sleep(0))
    assert ran == ["own _run", "callback"]


def test_handle_runs_in_its_context(loop: asyncio.AbstractEventLoop) -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    context = contextvars.copy_context()
    context.run(var.set, "set")
    seen: list[str] = []
    loop.call_soon(lambda: seen.append(var.get()), context=context)
    loop.call_soon_threadsafe(lambda: seen.append(var.get()), context=context)
    loop.run_until_complete(asyncio.sleep(0))
    assert seen == ["set", "set"]


def test_a_handle_runs_with_its_args_whatever_their_number(
    loop: asyncio.AbstractEventLoop, loop_name: str
) -> None:
    """None, one (a done callback's future) and several arguments reach the
    callback as call_soon was given them, and so do those of a handle whose
    args are a list (stock unpacks any iterable)."""
    seen: list[tuple[Any, ...]] = []

    def record(*args: Any) -> None:
        seen.append(args)

    loop.call_soon(record)
    loop.call_soon(record, "one")
    loop.call_soon(record, ("a tuple",))
    loop.call_soon(record, "one", "two")
    loop.call_soon(record, "one", "two", "three")
    expected = [(), ("one",), (("a tuple",),), ("one", "two"), ("one", "two", "three")]
    if loop_name != "uvloop":  # uvloop's ready queue is its own
        listed = asyncio.Handle(record, ["from", "a list"], loop, None)  # type: ignore[arg-type]
        loop._ready.append(listed)  # type: ignore[attr-defined]
        expected.append(("from", "a list"))
    loop.run_until_complete(asyncio.sleep(0))
    assert seen == expected


def _count_handle_inits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on each Handle.__init__ call appends to the list returned."""
    calls: list[int] = []
    stock_init = asyncio.Handle.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        stock_init(self, *args, **kwargs)

    monkeypatch.setattr(asyncio.Handle, "__init__", counting)
    return calls


def test_call_soon_makes_its_handle_without_handle_init(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside debug mode ours sets the handle's fields itself (three Python
    calls less per handle than stock's Handle.__init__ and get_debug)."""
    loop = asyncio_relaxed.new_event_loop()
    calls = _count_handle_inits(monkeypatch)
    try:
        loop.set_debug(False)
        loop.call_soon(print).cancel()
        assert calls == []
        loop.set_debug(True)
        loop.call_soon(print).cancel()
        assert calls == [1]  # debug mode: stock's way, which records where
    finally:
        loop.close()


def _fields(handle: Any) -> dict[str, Any]:
    return {name: getattr(handle, name) for name in
            ("_callback", "_args", "_cancelled", "_loop", "_source_traceback", "_repr")}


def test_a_readers_handle_is_the_one_handle_init_makes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """_add_reader and _add_writer make their handles as call_soon does
    (_compat.new_handle: Handle.__init__'s fields, without its frame and
    get_debug's) outside debug mode: each field as stock's Handle(...) sets
    it, the context the one given or a fresh copy; in debug mode, or with
    events.Handle replaced, Handle.__init__ itself runs."""
    loop = asyncio_relaxed.new_event_loop()
    loop.set_debug(False)  # (PYTHONASYNCIODEBUG=1 would start it in debug mode)
    a, b = socket.socketpair()
    try:
        context = contextvars.copy_context()
        loop._add_reader(a.fileno(), print, 1, 2)  # type: ignore[attr-defined]
        if sys.version_info >= (3, 15):  # the context argument is 3.15's
            loop._add_writer(a.fileno(), print, context=context)  # type: ignore[attr-defined]
        else:
            loop._add_writer(a.fileno(), print)  # type: ignore[attr-defined]
        reader, writer = loop._selector.get_key(a.fileno()).data  # type: ignore[attr-defined]
        assert type(reader) is asyncio.Handle and type(writer) is asyncio.Handle
        assert _fields(reader) == _fields(asyncio.Handle(print, (1, 2), loop, None))
        assert _fields(writer) == _fields(asyncio.Handle(print, (), loop, context))
        assert type(reader._context) is contextvars.Context  # type: ignore[attr-defined]
        if sys.version_info >= (3, 15):
            assert writer._context is context  # type: ignore[attr-defined]
        else:
            assert writer._context is not reader._context  # type: ignore[attr-defined]
        calls = _count_handle_inits(monkeypatch)
        loop._add_reader(a.fileno(), print)  # type: ignore[attr-defined]
        assert calls == []
        loop.set_debug(True)
        loop._add_reader(a.fileno(), print)  # type: ignore[attr-defined]
        assert calls == [1]  # debug mode: stock's way, which records where
        reader = loop._selector.get_key(a.fileno()).data[0]  # type: ignore[attr-defined]
        assert reader._source_traceback  # type: ignore[attr-defined]
        loop._remove_reader(a.fileno())  # type: ignore[attr-defined]
        loop._remove_writer(a.fileno())  # type: ignore[attr-defined]
    finally:
        a.close()
        b.close()
        loop.close()


def test_the_loop_keeps_within_cpythons_shared_keys() -> None:
    """CPython shares the keys of a class's instance dicts up to 30 names;
    an instance past that gets a dict of its own, and every attribute read of
    the loop takes the slower path (+290 instructions per 1 KiB echo request,
    python -m benchmarks instructions).  Stock's attributes and ours together
    stay within it, after the loop has served, run an executor and closed."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        await loop.run_in_executor(None, lambda: None)
        server.close()
        await server.wait_closed()

    loop = asyncio_relaxed.new_event_loop(time_metrics=True, slow_callback=1)
    try:
        run(loop, main())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()
    assert len(vars(loop)) <= 30, sorted(vars(loop))


@pytest.mark.parametrize("tls_mode", ["own", "stock"])
def test_gauges_count_what_the_loop_holds(tls_mode: str,
                                          tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """loop.gauges(): open connections (TLS among them, either tls setting),
    paused readers and writers, bytes held for writing, listeners and the
    connections waiting in their accept queues."""
    server_context, client_context = tls
    loop = asyncio_relaxed.new_event_loop(tls=tls_mode)
    transports: list[asyncio.Transport] = []

    class Keep(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            transports.append(transport)  # type: ignore[arg-type]

    async def main() -> None:
        plain = await loop.create_server(Keep, "127.0.0.1", 0, backlog=16)
        secure = await loop.create_server(Keep, "127.0.0.1", 0, ssl=server_context)
        assert loop.gauges() == asyncio_relaxed.LoopGauges(listeners=2)
        stalled, peer = stalled_pair()
        writer, _ = await loop.connect_accepted_socket(Keep, stalled)
        writer.set_write_buffer_limits(high=1024)
        writer.write(b"x" * 1_000_000)
        _r, tls_writer = await asyncio.open_connection(
            "127.0.0.1", secure.sockets[0].getsockname()[1], ssl=client_context,
            server_hostname="localhost")
        reader_paused, _ = await loop.create_connection(
            asyncio.Protocol, "127.0.0.1", plain.sockets[0].getsockname()[1])
        reader_paused.pause_reading()
        while len(transports) < 3:  # the stalled end, the TLS and the plain server sides
            await asyncio.sleep(0.01)
        gauges = loop.gauges()
        buffered = writer.get_write_buffer_size()
        assert buffered > 0
        expected = asyncio_relaxed.LoopGauges(
            connections=5,  # the stalled end; TLS client and server; plain client and server
            tls_connections=2, reading_paused=1, writing_paused=1,
            write_buffer_bytes=buffered, listeners=2)  # the others hold nothing
        assert gauges == expected
        # Connections waiting in the plain listener's accept queue while
        # the loop does not run to accept them.
        waiting = [socket.create_connection(plain.sockets[0].getsockname()) for _ in range(3)]
        if sys.platform.startswith("linux"):
            assert loop.gauges().pending_accepts == 3
        for transport in (writer, reader_paused, *transports):
            transport.abort()
        tls_writer.transport.abort()
        for sock in (peer, *waiting):
            sock.close()
        plain.close()
        secure.close()
        await asyncio.sleep(0.05)
        await plain.wait_closed()
        await secure.wait_closed()

    try:
        run(loop, main())
        assert loop.gauges().connections == 0
    finally:
        loop.close()


@pytest.mark.skipif(sys.implementation.name == "pypy",
                    reason="PyPy's collector is not CPython's: it finds cycles and the rest alike")
@pytest.mark.parametrize("serve", [False, True], ids=["run-once", "serve"])
@pytest.mark.parametrize("settings", [None, {}, {"write": "deferred", "accept": "balanced"},
                                      {"stats_dir": "tmp"}])
def test_a_closed_loop_leaves_no_reference_cycle(settings: dict[str, str] | None, serve: bool,
                                                 tmp_path: Any) -> None:
    """A loop made, run once (or: a server, a connection, an executor),
    closed and dropped leaves nothing for the cycle collector.  Stock's
    (None) leaves nothing after one run; after serving, its transports do
    (they are not ours to hold to it).  tornado's circlerefs test asserts
    it of a whole program."""
    import gc

    if settings is None and serve:
        pytest.skip("stock's transports leave cycles of their own")
    if settings is not None and "stats_dir" in settings:
        settings = {"stats_dir": str(tmp_path)}

    async def main() -> None:
        if not serve:
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        transport, _ = await loop.create_connection(
            asyncio.Protocol, "127.0.0.1", server.sockets[0].getsockname()[1])
        transport.close()
        await loop.run_in_executor(None, lambda: None)
        server.close()
        await server.wait_closed()

    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        loop = (asyncio.SelectorEventLoop() if settings is None
                else asyncio_relaxed.new_event_loop(**settings))
        loop.run_until_complete(main())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        del loop
        gc.collect()
        garbage = sorted(type(thing).__name__ for thing in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert garbage == []


def test_gauges_from_an_exporters_thread_while_connections_come_and_go() -> None:
    """A metrics exporter's thread (prometheus_client's HTTP server) asks
    for gauges while the loop's thread adds and drops transports: never an
    error (iterating the transports' weak dictionary there raised
    'dictionary changed size during iteration' within a second here)."""
    loop = asyncio_relaxed.new_event_loop()
    errors: list[BaseException] = []
    done = threading.Event()

    def exporter() -> None:
        while not done.is_set():
            try:
                loop.gauges()
            except Exception as exc:  # what the test looks for
                errors.append(exc)

    async def churn() -> None:
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        thread = threading.Thread(target=exporter)
        thread.start()
        try:
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and not errors:
                transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
                transport.close()
                await asyncio.sleep(0)
        finally:
            done.set()
            thread.join()
        server.close()
        await server.wait_closed()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        run(loop, churn())
    finally:
        sys.setswitchinterval(interval)
        loop.close()
    assert errors == []
