"""Transport behaviour, written once and run on every loop (see conftest.py)."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import traceback
from typing import Any

import pytest

import asyncio_relaxed
from conftest import Echo, run, stalled_pair


class Recorder(asyncio.Protocol):
    """Collects what the transport tells its protocol."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.data = bytearray()
        self.calls: list[str] = []
        self.lost: asyncio.Future[BaseException | None] = (
            asyncio.get_event_loop().create_future()
        )
        self.got_data = asyncio.Event()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.calls.append("connection_made")

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.got_data.set()

    def eof_received(self) -> bool | None:
        self.calls.append("eof_received")
        return None

    def pause_writing(self) -> None:
        self.calls.append("pause_writing")

    def resume_writing(self) -> None:
        self.calls.append("resume_writing")

    def connection_lost(self, exc: BaseException | None) -> None:
        self.calls.append("connection_lost")
        if not self.lost.done():
            self.lost.set_result(exc)


class BufferedRecorder(asyncio.BufferedProtocol):
    """Collects what a BufferedProtocol is given (a small buffer: many reads)."""

    def __init__(self) -> None:
        self.buf = bytearray(100)
        self.received = bytearray()
        self.got_data = asyncio.Event()
        self.done: asyncio.Future[bytes] = asyncio.get_event_loop().create_future()

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.received += self.buf[:nbytes]
        self.got_data.set()

    def eof_received(self) -> None:
        self.done.set_result(bytes(self.received))

    def connection_lost(self, exc: BaseException | None) -> None:
        pass


async def drain_socket(sock: socket.socket, nbytes: int) -> bytes:
    loop = asyncio.get_running_loop()
    sock.setblocking(False)  # loop.sock_* insist in debug mode
    out = bytearray()
    while len(out) < nbytes:
        chunk = await loop.sock_recv(sock, 1 << 20)
        if not chunk:
            break
        out += chunk
    return bytes(out)


async def read_to_eof(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    out = bytearray()
    while chunk := await loop.sock_recv(sock, 1 << 20):
        out += chunk
    return bytes(out)


async def attach(sock: socket.socket, protocol: asyncio.BaseProtocol) -> Any:
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock)
    return transport


@pytest.mark.parametrize("size", [1024, 10 * 1024, 100 * 1024])
def test_tcp_echo_protocol(loop: asyncio.AbstractEventLoop, size: int) -> None:
    async def main() -> None:
        server = await loop.create_server(Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        payload = bytes(range(256)) * (size // 256)
        for _ in range(20):
            writer.write(payload)
            await writer.drain()
            assert await reader.readexactly(len(payload)) == payload
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()

    run(loop, main())


def test_buffered_protocol_gets_recv_into(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        proto = BufferedRecorder()
        transport = await attach(a, proto)
        payload = b"0123456789" * 1000
        b.sendall(payload)
        b.shutdown(socket.SHUT_WR)
        assert await proto.done == payload
        transport.close()
        b.close()

    run(loop, main())


def test_set_protocol_switches_the_kind_of_read(loop: asyncio.AbstractEventLoop) -> None:
    """Protocol -> BufferedProtocol -> Protocol on a reading transport (as
    start_tls does): each protocol gets what arrives while it is set, by its
    own kind of callback."""

    async def main() -> None:
        a, b = socket.socketpair()
        first = Recorder()
        transport = await attach(a, first)
        b.sendall(b"one")
        await asyncio.wait_for(first.got_data.wait(), 5)
        second = BufferedRecorder()
        transport.set_protocol(second)
        b.sendall(b"two")
        await asyncio.wait_for(second.got_data.wait(), 5)
        third = Recorder()
        transport.set_protocol(third)
        b.sendall(b"three")
        await asyncio.wait_for(third.got_data.wait(), 5)
        assert (bytes(first.data), bytes(second.received), bytes(third.data)) == (
            b"one", b"two", b"three")
        assert transport.get_protocol() is third
        transport.close()
        await third.lost
        b.close()

    run(loop, main())


def test_streams_echo_unix(loop: asyncio.AbstractEventLoop, tmp_path: Any) -> None:
    path = str(tmp_path / "echo.sock")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def main() -> None:
        server = await asyncio.start_unix_server(handle, path)
        reader, writer = await asyncio.open_unix_connection(path)
        for i in range(50):
            writer.write(b"line %d\n" % i)
            assert await reader.readline() == b"line %d\n" % i
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()

    run(loop, main())


def test_close_delivers_everything_buffered(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = stalled_pair()
        proto = Recorder()
        transport = await attach(a, proto)
        payload = b"x" * (3 * 1024 * 1024 + 17)
        transport.write(payload)
        transport.close()
        assert transport.is_closing()
        received = await read_to_eof(b)
        assert len(received) == len(payload)
        assert await proto.lost is None
        b.close()

    run(loop, main())


def test_abort_drops_buffer(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = stalled_pair()
        proto = Recorder()
        transport = await attach(a, proto)
        transport.write(b"x" * (4 * 1024 * 1024))
        transport.abort()
        assert await proto.lost is None
        assert proto.calls.count("connection_lost") == 1
        received = await read_to_eof(b)
        assert len(received) < 4 * 1024 * 1024
        b.close()

    run(loop, main())


def test_flow_control_pause_and_resume(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = stalled_pair()
        proto = Recorder()
        transport = await attach(a, proto)
        transport.set_write_buffer_limits(high=64 * 1024, low=16 * 1024)
        chunk = b"y" * 8192
        written = 0
        while "pause_writing" not in proto.calls:
            transport.write(chunk)
            written += len(chunk)
            assert written < 16 * 1024 * 1024, "pause_writing never came"
            await asyncio.sleep(0)
        assert transport.get_write_buffer_size() > 0
        received = await drain_socket(b, written)
        assert len(received) == written
        while "resume_writing" not in proto.calls:
            await asyncio.sleep(0)
        assert proto.calls.count("pause_writing") == 1
        transport.close()
        await proto.lost
        b.close()

    run(loop, main())


def test_writelines_applies_flow_control(loop: asyncio.AbstractEventLoop, loop_name: str) -> None:
    version = sys.version_info[:3]
    if loop_name == "asyncio" and (
        (3, 12, 0) <= version <= (3, 12, 8) or (3, 13, 0) <= version <= (3, 13, 1)
    ):
        pytest.xfail("stock 3.12.0-3.12.8 and 3.13.0-3.13.1 writelines skip flow control "
                     "(gh-127655)")

    async def main() -> None:
        a, b = stalled_pair()
        proto = Recorder()
        transport = await attach(a, proto)
        transport.set_write_buffer_limits(high=64 * 1024)
        chunks = [b"z" * 4096] * 256  # 1 MiB, far past the high-water mark
        transport.writelines(chunks)
        assert "pause_writing" in proto.calls
        received = await drain_socket(b, 1024 * 1024)
        assert received == b"".join(chunks)
        transport.close()
        await proto.lost
        b.close()

    run(loop, main())


def test_write_eof_half_close(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        b.setblocking(False)
        proto = Recorder()
        transport = await attach(a, proto)
        assert transport.can_write_eof()
        transport.write(b"request")
        transport.write_eof()
        with pytest.raises(RuntimeError, match=r"write\(\) after write_eof"):
            transport.write(b"more")
        assert await read_to_eof(b) == b"request"
        # The other direction still works after our EOF.
        await asyncio.get_running_loop().sock_sendall(b, b"reply")
        await asyncio.wait_for(proto.got_data.wait(), 5)
        assert bytes(proto.data) == b"reply"
        transport.close()
        await proto.lost
        b.close()

    run(loop, main())


def test_write_after_close_is_dropped(loop: asyncio.AbstractEventLoop) -> None:
    """Once close() has scheduled connection_lost (nothing left to send),
    stock drops later writes: the peer gets what came before, then EOF."""

    async def main() -> None:
        a, b = socket.socketpair()
        proto = Recorder()
        transport = await attach(a, proto)
        transport.write(b"before")
        for _ in range(3):  # a deferred write's flush has run
            await asyncio.sleep(0)
        transport.close()
        transport.write(b"after")
        assert await read_to_eof(b) == b"before"
        assert await proto.lost is None
        b.close()

    run(loop, main())


def test_peer_reset_reports_once(loop: asyncio.AbstractEventLoop, loop_name: str) -> None:
    async def main() -> None:
        a, b = stalled_pair()
        proto = Recorder()
        transport = await attach(a, proto)
        transport.write(b"x" * (1024 * 1024))
        b.close()  # unread data pending: the kernel answers with a reset
        exc = await proto.lost
        assert isinstance(exc, OSError)
        assert proto.calls.count("connection_lost") == 1
        if loop_name != "uvloop":  # uvloop raises RuntimeError here instead
            transport.write(b"after")  # dropped silently, as stock does
        transport.close()

    run(loop, main())


def test_write_type_errors_match_stock(loop: asyncio.AbstractEventLoop, loop_name: str) -> None:
    # uvloop raises TypeError with its own text.
    text = None if loop_name == "uvloop" else "data argument must be a bytes-like object, not 'str'"

    async def main() -> None:
        a, b = socket.socketpair()
        proto = Recorder()
        transport = await attach(a, proto)
        with pytest.raises(TypeError, match=text):
            transport.write("text")
        transport.close()
        await proto.lost
        b.close()

    run(loop, main())


def test_writes_before_the_loop_runs_go_out(loop: asyncio.AbstractEventLoop) -> None:
    a, b = socket.socketpair()
    proto = Recorder()
    transport = run(loop, attach(a, proto))
    # The loop is not running now.
    transport.write(b"hello ")
    transport.write(b"world")
    assert run(loop, drain_socket(b, 11)) == b"hello world"
    transport.close()
    run(loop, proto.lost)
    b.close()


def test_write_then_stop_then_blocking_recv(loop: asyncio.AbstractEventLoop) -> None:
    """uvloop #631: a write made just before the loop stops must not wait."""
    a, b = socket.socketpair()
    proto = Recorder()
    transport = run(loop, attach(a, proto))

    async def write_and_return() -> None:
        transport.write(b"ping")

    run(loop, write_and_return())
    b.settimeout(5)
    assert b.recv(100) == b"ping"
    transport.close()
    run(loop, proto.lost)
    b.close()


def test_call_soon_threadsafe_write_goes_out(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        b.setblocking(False)
        proto = Recorder()
        transport = await attach(a, proto)
        thread = threading.Thread(
            target=lambda: loop.call_soon_threadsafe(transport.write, b"from thread")
        )
        thread.start()
        assert await drain_socket(b, 11) == b"from thread"
        thread.join()
        transport.close()
        await proto.lost
        b.close()

    run(loop, main())


def test_pause_resume_reading_flags(loop: asyncio.AbstractEventLoop) -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        proto = Recorder()
        transport = await attach(a, proto)
        assert transport.is_reading()
        transport.pause_reading()
        assert not transport.is_reading()
        b.send(b"queued while paused")
        await asyncio.sleep(0.05)
        assert proto.data == b""
        transport.resume_reading()
        assert transport.is_reading()
        await asyncio.wait_for(proto.got_data.wait(), 5)
        assert bytes(proto.data) == b"queued while paused"
        transport.close()
        assert not transport.is_reading()
        await proto.lost
        b.close()

    run(loop, main())


def test_write_after_close_is_delivered_while_buffered(loop: asyncio.AbstractEventLoop) -> None:
    """As stock and uvloop: close() keeps the connection until the buffer is out,
    and a write() made before that is delivered before the FIN."""

    async def main() -> None:
        a, b = stalled_pair()
        proto = Recorder()
        transport = await attach(a, proto)
        transport.write(b"x" * (1024 * 1024))
        transport.close()
        transport.write(b"LATE")
        received = await read_to_eof(b)
        assert len(received) == 1024 * 1024 + 4
        assert received.endswith(b"LATE")
        await proto.lost
        b.close()

    run(loop, main())


def test_extra_info_matches_the_socket(loop: asyncio.AbstractEventLoop, loop_name: str) -> None:
    """peername, sockname and socket on both ends, before and after close
    (ours keeps them in slots and wraps the socket on first request)."""

    async def main() -> None:
        accepted: asyncio.Future[Any] = loop.create_future()

        class Keep(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                accepted.set_result(transport)

        server = await loop.create_server(Keep, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        theirs = await accepted
        for transport, other in ((theirs, client), (client, theirs)):
            sock = transport.get_extra_info("socket")
            assert sock is transport.get_extra_info("socket")  # one wrapper
            assert sock.fileno() >= 0
            assert transport.get_extra_info("sockname") == sock.getsockname()
            assert transport.get_extra_info("peername") == sock.getpeername()
            assert transport.get_extra_info("peername") == other.get_extra_info("sockname")
            assert transport.get_extra_info("no-such-key") is None
            assert transport.get_extra_info("no-such-key", 7) == 7
        # Answered after close too, from what was known while open.
        names = (client.get_extra_info("sockname"), client.get_extra_info("peername"))
        client.close()
        theirs.close()
        server.close()
        await server.wait_closed()
        await asyncio.sleep(0.05)
        assert (client.get_extra_info("sockname"), client.get_extra_info("peername")) == names
        if loop_name != "uvloop":  # uvloop returns None for a closed socket
            assert client.get_extra_info("socket").fileno() == -1

    run(loop, main())


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


def test_private_extra_dict_reads_and_writes_as_in_stock(
    loop: asyncio.AbstractEventLoop, loop_name: str
) -> None:
    """Code in the wild reads and writes ``transport._extra`` (asyncio's
    private dict): it holds socket, sockname and peername, and what is
    written there is what get_extra_info answers."""
    if loop_name == "uvloop":
        pytest.skip("uvloop's transports have no _extra")

    async def main() -> None:
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
        extra = transport._extra
        assert extra["peername"] == transport.get_extra_info("peername") == ("127.0.0.1", port)
        assert extra["sockname"] == transport.get_extra_info("sockname")
        assert extra["socket"] is transport.get_extra_info("socket")
        extra["peername"] = ("192.0.2.1", 7)
        extra["mine"] = 1
        assert transport.get_extra_info("peername") == ("192.0.2.1", 7)
        assert transport.get_extra_info("mine") == 1
        transport.close()
        server.close()
        await server.wait_closed()

    run(loop, main())


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
