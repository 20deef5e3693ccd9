"""The compiled build (asyncio_relaxed._speedups) against its reference.

Every behaviour test of the suite runs on both builds (the ``-pure`` loops
of tests/conftest.py); this file holds what is the compiled build's own:
what it overrides, its counters, the conditions under which it leaves its
fast paths to the pure methods (a patched socket class, a socket subclass,
data that is not bytes, objects in the ready queue that are not handles, a
slot never set), and how a process chooses its build.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import subprocess
import sys
from typing import Any

import pytest

import asyncio_relaxed
from asyncio_relaxed import _builds, _compat, _stats
from conftest import Echo, iterate, run

speedups = pytest.importorskip(
    "asyncio_relaxed._speedups",
    reason=f"no compiled build here: {_builds.WHY or 'the module does not import'}")

#: What the compiled build overrides, class by class: each name is a
#: decision (the reference is the pure class's method of that name).
OVERRIDES = {
    "Loop": {"__init__", "__setattr__", "__delattr__", "_core", "_build", "_Counters",
             "_SocketTransport", "_SSLTransport", "_DatagramTransport", "_TransportShared",
             "_Serving", "call_soon", "call_at", "call_later", "_timer_handle_cancelled",
             "create_task", "_asyncgen_firstiter_hook",
             "create_future", "get_debug", "is_running", "time", "_run_once", "_set_callback"},
    "SocketTransport": {"__init__", "__del__", "_connection_made", "_start_reading", "close",
                        "_read_ready__on_eof", "_call_connection_lost",
                        "_read_ready__data_received", "_read_ready__get_buffer", "write",
                        "_write_now", "is_closing"},
    "SSLTransport": {"get_buffer", "buffer_updated", "_do_read", "write", "_process_outgoing"},
    "DatagramTransport": {"_read_ready", "sendto"},
    "TransportShared": {"flush"},
    "Serving": {"__init__", "accepted"},
    "CompiledAccept": {"accept_one", "burst", "take_queued", "read_queue_length"},
    "BatchListener": {"ready"},
    "SingleListener": {"ready"},
    "RelaxedListener": set(),
    "BalancedListener": set(),
}


def own_names(cls: type) -> set[str]:
    return {name for name in vars(cls)
            if not name.startswith("__")
            or name in ("__init__", "__del__", "__setattr__", "__delattr__")}


def test_the_compiled_classes_override_only_their_hot_path() -> None:
    for name, names in OVERRIDES.items():
        cls = getattr(speedups, name)
        assert own_names(cls) == names, name
        if cls is speedups.CompiledAccept:
            assert cls.__bases__ == (object,) and cls.__slots__ == ()
            continue
        # The pure class of the same name, after the compiled mixin if any.
        pure = next(base for base in cls.__mro__[1:] if base is not speedups.CompiledAccept)
        assert pure.__module__.startswith("asyncio_relaxed._"), pure
        assert pure.__name__ == name
        if "__slots__" in vars(pure):
            # The pure class's layout: the offsets of its slots hold.
            assert vars(cls)["__slots__"] == ()
    # The loop's one slot, for its LoopCore (its base has an instance dict).
    assert speedups.Loop.__slots__ == ("_core",)


def test_the_package_chose_the_compiled_build() -> None:
    assert asyncio_relaxed.BUILD == "compiled"
    assert asyncio_relaxed.Loop is asyncio_relaxed.CLoop is speedups.Loop
    assert issubclass(asyncio_relaxed.CLoop, asyncio_relaxed.PyLoop)
    loop = asyncio_relaxed.new_event_loop()
    try:
        assert type(loop._shared.stats) is speedups.Counters
        assert type(loop._shared) is speedups.TransportShared
    finally:
        loop.close()


def test_counters_are_the_pure_counters_in_c() -> None:
    compiled, pure = speedups.Counters(), _stats.Counters()
    names = set(_stats.Counters.__slots__)
    fields = {name for name in dir(compiled)
              if not name.startswith("_") and isinstance(getattr(compiled, name), int)}
    assert fields == names
    for i, name in enumerate(sorted(names)):
        setattr(compiled, name, i + 1)
        setattr(pure, name, i + 1)
    assert compiled.snapshot("epoll") == pure.snapshot("epoll")
    compiled.reset()
    assert compiled.snapshot("epoll") == _stats.Counters().snapshot("epoll")
    compiled.recv += 2**40  # a long long, not a C int
    assert compiled.recv == 2**40


def _echo_pair(loop: asyncio.AbstractEventLoop) -> tuple[Any, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)

    async def attach() -> Any:
        transport, _ = await loop.connect_accepted_socket(Echo, a)
        return transport

    return run(loop, attach()), b


def _round_trip(loop: asyncio.AbstractEventLoop, peer: socket.socket, data: bytes) -> bytes:
    peer.sendall(data)
    got = b""
    peer.setblocking(False)
    while len(got) < len(data):
        iterate(loop, 1)
        try:
            got += peer.recv(65536)
        except BlockingIOError:
            pass
    peer.setblocking(True)
    return got


def test_a_patched_socket_class_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """The transport reads and writes by system call only while
    socket.socket is unchanged: a patch of its send is called, as stock's
    transport calls it, and once it is undone the system calls come back."""
    loop = asyncio_relaxed.new_event_loop()
    try:
        transport, peer = _echo_pair(loop)
        sends: list[bytes] = []
        stock_send = socket.socket.send

        def send(self: socket.socket, data: Any, *args: Any) -> int:
            sends.append(bytes(data))
            return stock_send(self, data, *args)

        monkeypatch.setattr(socket.socket, "send", send)
        assert _round_trip(loop, peer, b"patched") == b"patched"
        assert sends == [b"patched"]
        monkeypatch.undo()
        assert _round_trip(loop, peer, b"restored") == b"restored"
        assert sends == [b"patched"]
        assert speedups._plain_socket_now(transport._sock)
        transport.close()
        iterate(loop, 2)
        peer.close()
    finally:
        loop.close()


class _CountingSocket(socket.socket):
    """A socket subclass whose recv and send the transport must call."""

    calls: list[str] = []

    def recv(self, *args: Any) -> bytes:
        self.calls.append("recv")
        return super().recv(*args)

    def send(self, *args: Any) -> int:
        self.calls.append("send")
        return super().send(*args)


def test_a_socket_subclass_is_called() -> None:
    loop = asyncio_relaxed.new_event_loop()
    try:
        a, b = socket.socketpair()
        sub = _CountingSocket(a.family, a.type, fileno=a.detach())
        sub.setblocking(False)

        async def attach() -> Any:
            transport, _ = await loop.connect_accepted_socket(Echo, sub)
            return transport

        transport = run(loop, attach())
        assert _round_trip(loop, b, b"subclass") == b"subclass"
        assert "recv" in _CountingSocket.calls and "send" in _CountingSocket.calls
        transport.close()
        iterate(loop, 2)
        b.close()
    finally:
        loop.close()


@pytest.mark.parametrize("kind", [bytearray, memoryview, bytes])
@pytest.mark.parametrize("write", ["eager", "deferred"])
def test_every_buffer_kind_is_written(kind: Any, write: str) -> None:
    """bytes take the compiled write; the other kinds the pure one's copy."""
    loop = asyncio_relaxed.new_event_loop(write=write)
    try:
        a, b = socket.socketpair()
        a.setblocking(False)

        async def attach() -> Any:
            transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
            return transport

        transport = run(loop, attach())
        data = bytearray(b"0123456789")
        transport.write(kind(data))
        data[:] = b"x" * 10  # the caller may reuse its buffer once write() returns
        iterate(loop, 1)
        assert b.recv(100) == b"0123456789"
        transport.close()
        iterate(loop, 2)
        b.close()
    finally:
        loop.close()


def test_a_slot_never_set_raises_as_its_descriptor_does() -> None:
    loop = asyncio_relaxed.new_event_loop()
    try:
        transport, peer = _echo_pair(loop)
        del transport._write_guard
        with pytest.raises(AttributeError, match="_write_guard"):
            transport.write(b"x")
        transport._write_guard = False
        transport.close()
        iterate(loop, 2)
        peer.close()
    finally:
        loop.close()


def test_unbound_calls_with_another_self_take_the_pure_method() -> None:
    """A compiled method called with an object of another class reads no
    slot by offset: the pure method runs, and fails as it would."""
    with pytest.raises(AttributeError):
        speedups.SocketTransport.write(object(), b"x")
    with pytest.raises(AttributeError):
        speedups.SocketTransport._write_now(object())
    with pytest.raises(AttributeError):
        speedups.TransportShared.flush(object(), True)


def test_the_ready_queue_runs_whatever_it_holds() -> None:
    """Handles, handle subclasses, cancelled ones and objects that only look
    like handles (tests append their own): each runs or is skipped as stock
    runs or skips it."""
    loop = asyncio_relaxed.new_event_loop()
    ran: list[str] = []

    class Sub(asyncio.Handle):
        pass

    class Lookalike:
        _cancelled = False

        def _run(self) -> None:
            ran.append("lookalike")

        def cancelled(self) -> bool:
            return False

    try:
        loop._ready.append(asyncio.Handle(ran.append, ("handle",), loop, None))
        loop._ready.append(Sub(ran.append, ("subclass",), loop, None))
        cancelled = asyncio.Handle(ran.append, ("cancelled",), loop, None)
        cancelled.cancel()
        loop._ready.append(cancelled)
        loop._ready.append(Lookalike())
        iterate(loop, 1)
        assert ran == ["handle", "subclass", "lookalike"]
    finally:
        loop.close()


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith("ASYNCIO_RELAXED_")}
    return subprocess.run([sys.executable, "-c", code], env={**environ, **env},
                          capture_output=True, text=True, timeout=60)


def test_no_extensions_chooses_the_pure_build() -> None:
    out = _python("import asyncio_relaxed as a, asyncio_relaxed._builds as b; "
                  "print(a.BUILD, a.Loop is a.PyLoop, a.CLoop is not None, b.WHY)",
                  ASYNCIO_RELAXED_NO_EXTENSIONS="1")
    assert out.stdout.split(None, 3) == [
        "pure", "True", "True", "ASYNCIO_RELAXED_NO_EXTENSIONS is on\n"], out.stderr
    out = _python("import asyncio_relaxed as a; print(a.BUILD)",
                  ASYNCIO_RELAXED_NO_EXTENSIONS="off")
    assert out.stdout == "compiled\n", out.stderr


def test_a_bad_no_extensions_value_fails_each_loop() -> None:
    out = _python("import asyncio_relaxed as a; a.new_event_loop()",
                  ASYNCIO_RELAXED_NO_EXTENSIONS="maybe")
    assert out.returncode != 0
    assert "ASYNCIO_RELAXED_NO_EXTENSIONS='maybe' is not a valid setting; allowed:" in out.stderr


def test_the_loop_core_follows_every_assignment() -> None:
    """The compiled code reads _closed, _debug, _stopping and the rest from
    the loop's LoopCore, which __setattr__ and __delattr__ keep equal to the
    loop's attributes: what stock's code assigns, the compiled code sees."""
    loop = asyncio_relaxed.new_event_loop()
    try:
        loop.set_debug(False)  # (PYTHONASYNCIODEBUG may have set it)
        assert loop.call_soon(print)._source_traceback is None
        loop.set_debug(True)  # stock's set_debug: self._debug = enabled
        assert loop.call_soon(print)._source_traceback  # debug mode's handle
        loop._debug = False
        assert loop.call_soon(print)._source_traceback is None
        loop.call_soon(loop.stop)
        loop.run_forever()  # _stopping set and cleared by stock's run_forever
        ran: list[int] = []
        loop.call_soon(ran.append, 1)
        iterate(loop, 1)
        assert ran == [1]
    finally:
        loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_soon(print)


async def _ping_and_close(server: asyncio.AbstractServer) -> None:
    """One connection to *server* (an Echo): a ping echoed, then closed."""
    address = server.sockets[0].getsockname()[:2]  # type: ignore[attr-defined]
    client = socket.create_connection(address)
    client.sendall(b"ping")
    client.setblocking(False)
    while True:
        try:
            assert client.recv(10) == b"ping"
            break
        except BlockingIOError:
            await asyncio.sleep(0.001)
    client.close()


def test_a_loop_method_replaced_on_the_instance_is_called() -> None:
    """The compiled transport runs its loop's call_soon and _set_callback
    bodies itself only while nobody replaced them: a test's wrapper on the
    instance sees every call of an accepted connection's life, as on the
    pure build."""
    loop = asyncio_relaxed.new_event_loop()
    seen: list[str] = []
    stock_call_soon = loop.call_soon
    stock_set_callback = loop._set_callback

    def call_soon(callback: Any, *args: Any, context: Any = None) -> Any:
        seen.append(getattr(callback, "__name__", ""))
        return stock_call_soon(callback, *args, context=context)

    def set_callback(*args: Any) -> Any:
        seen.append("_set_callback")
        return stock_set_callback(*args)

    async def main() -> None:
        server = await loop.create_server(Echo, "127.0.0.1", 0)
        loop.call_soon = call_soon  # type: ignore[method-assign]
        loop._set_callback = set_callback  # type: ignore[method-assign]
        await _ping_and_close(server)
        while "call_connection_lost" not in seen:
            await asyncio.sleep(0.001)
        server.close()
        await server.wait_closed()

    try:
        run(loop, main())
        # The accept path's connection_made and reader, then the end.
        assert {"connection_made", "_set_callback", "call_connection_lost"} <= set(seen), seen
    finally:
        loop.close()


#: The poller's methods whose bodies the compiled loop runs itself for an
#: accepted connection (its fd owned, its reader added and released); and
#: select, whose identity decides how the loop polls (replaced, the loop
#: polls through it, and a transport's close takes the two calls of
#: _unwatch_for_good instead of release_reader).
POLLER_METHODS = {"life": ("own", "set_callback", "release_reader"), "select": ("select",)}


@pytest.mark.parametrize("where", ["instance", "class"])
@pytest.mark.parametrize("methods", list(POLLER_METHODS))
def test_a_poller_method_replaced_is_called(methods: str, where: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled loop reads its poller's fields by offset and runs a few
    of its methods' bodies itself only while none of them is replaced: a
    wrapper on the poller or on its class sees every call of an accepted
    connection's life, as on the pure build."""
    names = POLLER_METHODS[methods]
    from asyncio_relaxed._poller import DeferredSelector

    loop = asyncio_relaxed.new_event_loop()
    seen: list[str] = []

    def spy(name: str, method: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen.append(name)
            return method(*args, **kwargs)
        return wrapper

    async def main() -> None:
        server = await loop.create_server(Echo, "127.0.0.1", 0)
        for name in names:
            if where == "instance":
                setattr(loop._selector, name, spy(name, getattr(loop._selector, name)))
            else:
                monkeypatch.setattr(DeferredSelector, name,
                                    spy(name, getattr(DeferredSelector, name)))
        await _ping_and_close(server)
        while not set(names) <= set(seen):
            await asyncio.sleep(0.001)
        server.close()
        await server.wait_closed()

    try:
        run(loop, main())
        assert set(names) <= set(seen), seen
    finally:
        loop.close()


@pytest.mark.parametrize("how", ["loop's class attribute", "class __init__"])
def test_an_accepted_transport_is_made_as_replaced(how: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled accept path allocates its transport and runs its
    __init__'s body itself only while the loop's _SocketTransport and that
    class's __init__ are as they are: a subclass set on the loop, or an
    __init__ wrapped on the class, makes every accepted connection's
    transport, as on the pure build."""
    loop = asyncio_relaxed.new_event_loop()
    made: list[Any] = []
    base = loop._SocketTransport  # type: ignore[attr-defined]

    class Recorded(base):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(self)
            super().__init__(*args, **kwargs)

    if how == "loop's class attribute":
        loop._SocketTransport = Recorded  # type: ignore[attr-defined]
    else:
        stock_init = base.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            made.append(self)
            stock_init(self, *args, **kwargs)

        monkeypatch.setattr(base, "__init__", init)

    async def main() -> None:
        server = await loop.create_server(Echo, "127.0.0.1", 0)
        await _ping_and_close(server)
        server.close()
        await server.wait_closed()

    try:
        run(loop, main())
        assert len(made) == 1
        assert type(made[0]) is (Recorded if how == "loop's class attribute" else base)
    finally:
        loop.close()


@pytest.mark.skipif(not _compat._ATTACH_TAKES_TRANSPORT,
                    reason="before 3.13 stock's Server counts its connections, keeping no set")
@pytest.mark.parametrize("detach", ["stock", "replaced on the class", "replaced on the server"])
def test_a_servers_clients_are_kept_as_stocks(detach: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled transport runs stock's Server._attach and _detach (and
    their WeakSet's add and discard) itself: the server's _clients holds
    each connection's transport while it lives, close_clients() reaches
    it, wait_closed() returns once the last one is gone; a _detach
    replaced on the class or on the server is called instead."""
    loop = asyncio_relaxed.new_event_loop()
    detached: list[Any] = []
    stock_detach = asyncio.base_events.Server._detach

    def spy(self: Any, transport: Any) -> None:
        detached.append(transport)
        stock_detach(self, transport)

    if detach == "replaced on the class":
        monkeypatch.setattr(asyncio.base_events.Server, "_detach", spy)
    made: list[asyncio.BaseTransport] = []

    class Kept(Echo):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            made.append(transport)
            super().connection_made(transport)

    async def main() -> None:
        server = await loop.create_server(Kept, "127.0.0.1", 0)
        if detach == "replaced on the server":
            server._detach = functools.partial(spy, server)  # type: ignore[method-assign]
        clients = [socket.create_connection(server.sockets[0].getsockname()[:2])
                   for _ in range(2)]
        while len(made) < 2:
            await asyncio.sleep(0.001)
        assert set(server._clients) == set(made)  # type: ignore[attr-defined]
        clients[0].close()
        while len(server._clients) > 1:  # type: ignore[attr-defined]
            await asyncio.sleep(0.001)
        assert set(server._clients) == {made[1]}  # type: ignore[attr-defined]
        server.close()
        closing = asyncio.ensure_future(server.wait_closed())
        await asyncio.sleep(0.01)
        assert not closing.done()  # a connection is left
        server.close_clients()
        await asyncio.wait_for(closing, 5)
        assert len(server._clients) == 0  # type: ignore[attr-defined]
        assert made[1].is_closing()
        clients[1].close()

    try:
        run(loop, main())
        assert detached == (made if detach != "stock" else [])
    finally:
        loop.close()


@pytest.mark.parametrize("resolution", [1e-09, 0.0, 0.001])
def test_the_due_timer_window_ends_where_stocks_does(resolution: float) -> None:
    """The compiled run loop's due-timer window ends where _compat.end_time
    (the reference: now plus the clock's resolution, 3.15's at least
    math.ulp(now)) ends it, to the bit, for clock readings small and
    large, where the float spacing passes the resolution, and at the
    float's extremes."""
    import math

    for now in [0.0, 5e-324, 1e-09, 1.0, 12345.678, 2.0**40, 2.0**52, 2.0**53 + 2, 1e300,
                sys.float_info.max, math.inf, -1.0, -math.inf, math.nan]:
        want = _compat.end_time(now, resolution)
        got = speedups._window_end_now(now, resolution)
        assert got == want or (math.isnan(got) and math.isnan(want)), (now, got, want)


def test_loops_in_two_threads_wait_at_once() -> None:
    """Each loop waits in epoll_wait into an array of its own, without the
    GIL: a loop in another thread that registers more sockets meanwhile
    (and so needs a larger array) must not touch the one being waited in
    (a shared array crashed test_subprocess' pidfd test, whose loops run in
    two threads)."""
    import threading

    waiting = threading.Event()
    woken = threading.Event()
    a, b = socket.socketpair()
    results: list[bytes] = []

    def first() -> None:
        loop = asyncio_relaxed.new_event_loop()
        try:
            transport, peer = _echo_pair(loop)  # registered: a small array
            reader = asyncio.Event()

            def readable() -> None:
                results.append(a.recv(10))
                reader.set()

            loop.add_reader(a.fileno(), readable)
            waiting.set()
            loop.run_until_complete(asyncio.wait_for(reader.wait(), 10))  # waits in epoll_wait
            loop.remove_reader(a.fileno())
            transport.close()
            iterate(loop, 2)
            peer.close()
        finally:
            woken.set()
            loop.close()

    thread = threading.Thread(target=first)
    thread.start()
    assert waiting.wait(10)
    other = asyncio_relaxed.new_event_loop()
    pairs = [socket.socketpair() for _ in range(64)]
    try:
        for left, _right in pairs:
            other.add_reader(left.fileno(), lambda: None)
        iterate(other, 3)  # its wait grows its array to 64 events
        b.send(b"wake")
        assert woken.wait(10)
        thread.join(10)
        assert results == [b"wake"]
    finally:
        for left, right in pairs:
            other.remove_reader(left.fileno())
            left.close()
            right.close()
        other.close()
        a.close()
        b.close()


def test_timers_run_in_order_of_when_as_stock_schedules_them() -> None:
    """call_at/call_later (compiled, with their own heap) against stock's
    loop: the same timers, some cancelled, fire in the same order, and the
    heap holds stock TimerHandles marked as stock marks them."""
    import random
    import time

    def fire(loop: asyncio.AbstractEventLoop, wait: float) -> tuple[list[int], Any, int]:
        rng = random.Random(7)
        out: list[int] = []
        base = loop.time() + 0.02
        handles = []
        for i in range(300):
            when = base + rng.choice((0, 0.001, 0.002, 0.003)) + rng.random() * 0.01
            if i % 2:
                handles.append(loop.call_at(when, out.append, i))
            else:
                handles.append(loop.call_later(when - loop.time(), out.append, i))
        assert all(type(h) is asyncio.TimerHandle and h._scheduled for h in handles)
        whens = [h.when() for h in handles]
        for h in handles[::3]:
            h.cancel()
        time.sleep(wait)
        loop.run_until_complete(asyncio.sleep(0.05))
        assert not loop._scheduled
        return out, whens, loop._timer_cancelled_count

    def left_counted(whens: list[float]) -> int:
        """All due at the first iteration: it drops the cancelled timers at
        the heap's head (every third made), the rest leave it as due, still
        counted."""
        by_when = sorted(range(300), key=whens.__getitem__)
        return 100 - next(n for n, i in enumerate(by_when) if i % 3)

    live = [i for i in range(300) if i % 3]
    # wait 0: the timers fall due over several iterations, as the clock
    # goes; 0.04: all at the first, so that what is left of the cancelled
    # count (the cancelled timers that left the heap as due, not from its
    # head) does not depend on how fast the host runs, and is stock's.
    for wait in (0, 0.04):
        loop = asyncio_relaxed.new_event_loop()
        try:
            assert type(loop) is speedups.Loop
            ours, whens, cancelled = fire(loop, wait)
        finally:
            loop.close()
        assert sorted(ours) == live
        # Each fired no earlier than any timer before it in the order of when.
        assert [whens[i] for i in ours] == sorted(whens[i] for i in ours)
        if wait:
            stock = asyncio.new_event_loop()
            try:
                _, stock_whens, stock_cancelled = fire(stock, wait)
            finally:
                stock.close()
            assert (cancelled, stock_cancelled) == (left_counted(whens), left_counted(stock_whens))


def test_timer_arguments_and_errors_are_stocks() -> None:
    loop = asyncio_relaxed.new_event_loop()
    loop.set_debug(False)  # (the compiled path; debug mode is stock's, tested last)
    try:
        with pytest.raises(TypeError, match="when cannot be None"):
            loop.call_at(None, print)
        with pytest.raises(TypeError, match="delay must not be None"):
            loop.call_later(None, print)
        context = __import__("contextvars").copy_context()
        handle = loop.call_later(10, print, 1, 2, context=context)
        assert handle._args == (1, 2) and handle._context is context
        assert handle._source_traceback is None and handle._repr is None
        assert not handle._cancelled and handle._loop is loop
        assert loop._scheduled == [handle]
        handle.cancel()
        assert loop._timer_cancelled_count == 1
        loop._scheduled[:] = [3]  # not a TimerHandle: compared as heapq compares
        with pytest.raises(TypeError):
            loop.call_at(loop.time(), print)
        loop._scheduled.clear()
        loop._timer_cancelled_count = 0
        loop.set_debug(True)  # stock's, which records where the timer was made
        assert loop.call_later(10, print)._source_traceback
    finally:
        loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_later(1, print)
    coro = asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="closed"):
        loop.create_task(coro)
    coro.close()


def test_create_task_is_stocks_outside_its_fast_path() -> None:
    loop = asyncio_relaxed.new_event_loop()
    try:
        async def main() -> Any:
            task = loop.create_task(asyncio.sleep(0, "x"), name="named")
            assert task.get_name() == "named" and await task == "x"
            made = []
            loop.set_task_factory(lambda lp, coro, **kw: made.append(kw) or
                                  asyncio.Task(coro, loop=lp, **kw))
            await loop.create_task(asyncio.sleep(0), name="f")
            loop.set_task_factory(None)
            assert made
            coro = asyncio.sleep(0)
            with pytest.raises(TypeError):
                loop.create_task(coro, bogus=1)
            coro.close()
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_call_later_goes_through_a_patched_call_at() -> None:
    """call_later calls self.call_at, as stock's does: a call_at replaced on
    the instance or in a subclass sees every timer."""
    seen: list[float] = []

    class Sub(speedups.Loop):
        def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:
            seen.append(when)
            return super().call_at(when, callback, *args, context=context)

    for loop in (asyncio_relaxed.new_event_loop(), Sub()):
        try:
            if type(loop) is speedups.Loop:
                original = loop.call_at

                def call_at(when: float, callback: Any, *args: Any, context: Any = None,
                            original: Any = original) -> Any:
                    seen.append(when)
                    return original(when, callback, *args, context=context)

                loop.call_at = call_at  # type: ignore[method-assign]
            before = len(seen)
            handle = loop.call_later(10, print)
            assert len(seen) == before + 1 and seen[-1] == handle.when()
            handle.cancel()
        finally:
            loop.close()


def test_a_replaced_timer_order_is_the_heaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """TimerHandle.__lt__ replaced (here: latest first) orders the heap, as
    on stock: the compiled heap compares on _when only while it is stock's."""
    monkeypatch.setattr(asyncio.TimerHandle, "__lt__",
                        lambda self, other: self._when > other._when)
    loop = asyncio_relaxed.new_event_loop()
    try:
        assert type(loop) is speedups.Loop
        now = loop.time()
        handles = [loop.call_at(now + delay, print) for delay in (30, 10, 20, 50, 40)]
        assert loop._scheduled[0] is handles[3]
        for handle in handles:
            handle.cancel()
    finally:
        loop.close()
