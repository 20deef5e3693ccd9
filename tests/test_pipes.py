"""Pipes on stock and on our loop in each preset, ours also with
``pipe=stock``: subprocess stdin/stdout, connect_read_pipe and
connect_write_pipe; EOF and close ordering, data written before close()
delivered through flow control, a read end that closes (with and without
data buffered), writes after close dropped and warned as stock warns, the
file kinds refused with stock's texts, pause/resume, a failing
data_received, the finaliser; and the counts of the loop's own transports
(a deferred iteration's writes in one ``write``, reads into the loop's
buffer).

Behaviour is compared with stock on the same Python; counts come from
``loop.statistics()`` (never timings).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import tempfile
import warnings
from asyncio import unix_events
from collections.abc import Iterator
from typing import Any

import pytest

import asyncio_relaxed
from asyncio_relaxed._pipes import ReadPipeTransport, WritePipeTransport
from conftest import (
    LOOP_FACTORIES,
    RELAXED_SETTINGS,
    LoopErrors,
    Recorder,
    _as_fixture,
    collect_garbage,
    run,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="Unix pipes")

#: Stock, each of our presets, and our default preset with stock's pipe transports.
PIPE_LOOPS = ["asyncio", *RELAXED_SETTINGS, "relaxed-pipe-stock"]
#: A pipe's capacity on Linux (pipe(7)): writes below it never block an empty pipe.
PIPE_CAPACITY = 65536


def _make_loop(name: str) -> asyncio.AbstractEventLoop:
    """A loop of PIPE_LOOPS by its name."""
    if name == "relaxed-pipe-stock":
        return asyncio_relaxed.Loop(pipe="stock")
    factory = LOOP_FACTORIES[name]
    assert factory is not None
    return factory()


@pytest.fixture(params=PIPE_LOOPS)
def ploop(request: pytest.FixtureRequest,
          loop_errors: LoopErrors) -> Iterator[asyncio.AbstractEventLoop]:
    yield from _as_fixture(_make_loop(request.param), loop_errors)


@pytest.fixture(params=list(RELAXED_SETTINGS))
def own_loop(request: pytest.FixtureRequest,
             loop_errors: LoopErrors) -> Iterator[asyncio_relaxed.Loop]:
    """Our loop with its own pipe transports, in each preset."""
    loop = asyncio_relaxed.Loop(**RELAXED_SETTINGS[request.param], pipe="own")
    yield from _as_fixture(loop, loop_errors)  # type: ignore[misc]


def own(loop: asyncio.AbstractEventLoop) -> bool:
    return (isinstance(loop, asyncio_relaxed.PyLoop)
            and loop.config.pipe is asyncio_relaxed.PipeMode.OWN)


def _pipe() -> tuple[Any, Any]:
    """A pipe's read and write ends as unbuffered file objects."""
    r, w = os.pipe()
    return open(r, "rb", buffering=0), open(w, "wb", buffering=0)


class Sub(asyncio.SubprocessProtocol):
    """What a subprocess transport tells its protocol, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.events: list[str] = []
        self.out = bytearray()
        self.done: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        assert isinstance(data, bytes)
        self.out += data

    def pipe_connection_lost(self, fd: int, exc: BaseException | None) -> None:
        self.events.append(f"pipe_connection_lost {fd} {exc!r}")

    def process_exited(self) -> None:
        self.events.append("process_exited")

    def connection_lost(self, exc: BaseException | None) -> None:
        self.events.append(f"connection_lost {exc!r}")
        self.done.set_result(None)


CAT = [sys.executable, "-c",
       "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()); sys.stdout.flush()"]


def test_the_loop_makes_its_own_pipe_transports_by_the_setting(
        ploop: asyncio.AbstractEventLoop) -> None:
    async def main() -> tuple[type, type]:
        transport, protocol = await ploop.subprocess_exec(lambda: Sub(ploop), *CAT)
        kinds = (type(transport.get_pipe_transport(0)), type(transport.get_pipe_transport(1)))
        transport.get_pipe_transport(0).close()
        await protocol.done
        transport.close()
        return kinds

    write, read = run(ploop, main())
    if own(ploop):
        assert (write, read) == (WritePipeTransport, ReadPipeTransport)
    else:
        assert (write, read) == (unix_events._UnixWritePipeTransport,
                                 unix_events._UnixReadPipeTransport)


def test_subprocess_round_trip_and_its_end_in_stocks_order(
        ploop: asyncio.AbstractEventLoop) -> None:
    """What goes into a child's stdin comes back on its stdout; the
    subprocess transport's connection_lost comes last, after every pipe's
    and the exit."""
    payload = os.urandom(300_000)  # several pipe capacities: flow control on both sides

    async def main() -> Sub:
        transport, protocol = await ploop.subprocess_exec(lambda: Sub(ploop), *CAT)
        stdin = transport.get_pipe_transport(0)
        for i in range(0, len(payload), 1000):
            stdin.write(payload[i:i + 1000])
        stdin.close()
        await protocol.done
        assert transport.get_returncode() == 0
        transport.close()
        return protocol

    protocol = run(ploop, main())
    assert bytes(protocol.out) == payload
    assert protocol.events[-1] == "connection_lost None"
    assert sorted(protocol.events[:-1]) == ["pipe_connection_lost 0 None",
                                            "pipe_connection_lost 1 None",
                                            "pipe_connection_lost 2 None",
                                            "process_exited"]


def test_streams_api_communicate(ploop: asyncio.AbstractEventLoop) -> None:
    async def main() -> tuple[bytes, int]:
        proc = await asyncio.create_subprocess_exec(
            *CAT, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        out, _ = await proc.communicate(b"hello " * 10_000)
        return out, proc.returncode or 0

    assert run(ploop, main()) == (b"hello " * 10_000, 0)


def test_read_pipe_data_then_eof_then_lost(ploop: asyncio.AbstractEventLoop) -> None:
    r, w = _pipe()

    async def main() -> Recorder:
        transport, protocol = await ploop.connect_read_pipe(lambda: Recorder(ploop), r)
        assert transport.get_extra_info("pipe") is r
        assert transport.is_reading()
        w.write(b"abc")
        w.write(b"def")
        w.close()
        assert await protocol.lost is None
        assert transport.is_closing()
        return protocol

    protocol = run(ploop, main())
    assert bytes(protocol.data) == b"abcdef"
    assert protocol.calls == ["connection_made", "eof_received", "connection_lost"]
    assert r.closed


def test_pause_reading_holds_the_data_in_the_pipe(ploop: asyncio.AbstractEventLoop) -> None:
    r, w = _pipe()

    async def main() -> None:
        transport, protocol = await ploop.connect_read_pipe(lambda: Recorder(ploop), r)
        transport.pause_reading()
        assert not transport.is_reading()
        w.write(b"held")
        for _ in range(5):
            await asyncio.sleep(0)
        assert protocol.data == b""
        transport.resume_reading()
        assert await protocol.received(4) == b"held"
        w.close()
        await protocol.lost

    run(ploop, main())


def test_write_pipe_delivers_everything_before_close(ploop: asyncio.AbstractEventLoop) -> None:
    """1 MiB into a pipe nobody reads yet: the protocol is paused, then
    resumed once the reader drains it; close() waits for the buffer, and
    the read end sees every byte, then EOF."""
    r, w = _pipe()
    payload = os.urandom(1 << 20)

    async def main() -> tuple[Recorder, Recorder]:
        wt, writer = await ploop.connect_write_pipe(lambda: Recorder(ploop), w)
        for i in range(0, len(payload), 4096):
            wt.write(payload[i:i + 4096])
        assert wt.get_write_buffer_size() > 0
        assert writer.calls == ["connection_made", "pause_writing"]
        wt.close()
        assert wt.is_closing()
        wt.write(b"dropped")  # after close(): dropped, as on stock
        _, reader = await ploop.connect_read_pipe(lambda: Recorder(ploop), r)
        assert await writer.lost is None
        assert await reader.lost is None
        return writer, reader

    writer, reader = run(ploop, main())
    assert bytes(reader.data) == payload
    assert writer.calls == ["connection_made", "pause_writing", "resume_writing",
                            "connection_lost"]
    assert w.closed


def test_a_read_end_that_closes_ends_an_idle_write_end(ploop: asyncio.AbstractEventLoop) -> None:
    r, w = _pipe()

    async def main() -> BaseException | None:
        wt, writer = await ploop.connect_write_pipe(lambda: Recorder(ploop), w)
        wt.write(b"x" * 100)
        await asyncio.sleep(0)
        r.close()
        return await writer.lost

    assert run(ploop, main()) is None


def test_a_read_end_that_closes_with_data_buffered_is_a_broken_pipe(
        ploop: asyncio.AbstractEventLoop) -> None:
    r, w = _pipe()

    async def main() -> BaseException | None:
        wt, writer = await ploop.connect_write_pipe(lambda: Recorder(ploop), w)
        wt.write(b"x" * (PIPE_CAPACITY + 10_000))
        for _ in range(3):
            await asyncio.sleep(0)
        assert wt.get_write_buffer_size() > 0
        r.close()
        return await writer.lost

    assert isinstance(run(ploop, main()), BrokenPipeError)


def test_writes_after_close_are_dropped_and_warned_as_stock_warns(
        ploop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture) -> None:
    r, w = _pipe()

    async def main() -> None:
        wt, writer = await ploop.connect_write_pipe(lambda: Recorder(ploop), w)
        wt.close()
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            for _ in range(7):
                wt.write(b"late")
        await writer.lost

    run(ploop, main())
    texts = [rec.getMessage() for rec in caplog.records if rec.name == "asyncio"]
    assert texts == ["pipe closed by peer or os.write(pipe, data) raised exception."] * 2
    assert r.read() == b""
    r.close()


def test_a_file_is_refused_with_stocks_texts(ploop: asyncio.AbstractEventLoop) -> None:
    with tempfile.TemporaryFile() as f:
        async def main() -> None:
            with pytest.raises(ValueError, match=r"^Pipe transport is for pipes/sockets only\.$"):
                await ploop.connect_read_pipe(lambda: Recorder(ploop), f)
            with pytest.raises(ValueError, match=r"^Pipe transport is only for pipes, sockets "
                                                 r"and character devices$"):
                await ploop.connect_write_pipe(lambda: Recorder(ploop), f)

        run(ploop, main())


class _Raises(Recorder):
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        raise ZeroDivisionError


def test_a_failing_data_received_is_the_readers_error(ploop: asyncio.AbstractEventLoop,
                                                      loop_errors: LoopErrors) -> None:
    """As on stock: the reader's callback raised, the loop's exception
    handler hears of it, and the pipe reads on."""
    loop_errors.expect("Exception in callback")
    r, w = _pipe()

    async def main() -> bytes:
        _, protocol = await ploop.connect_read_pipe(lambda: _Raises(ploop), r)
        w.write(b"one")
        await protocol.received(3)
        await asyncio.sleep(0)
        w.write(b"two")
        data = await protocol.received(6)
        w.close()
        await protocol.lost
        return data

    assert run(ploop, main()) == b"onetwo"
    assert [type(c.get("exception")) for c in loop_errors.contexts] == [ZeroDivisionError] * 2


@pytest.mark.parametrize("name", PIPE_LOOPS)
def test_an_unclosed_pipe_transport_warns(name: str) -> None:
    """A write end left open when its loop closes warns once collected,
    and its pipe is closed."""
    loop = _make_loop(name)
    ours = own(loop)
    r, w = _pipe()

    async def main() -> None:
        await loop.connect_write_pipe(asyncio.Protocol, w)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run(loop, main())
        finally:
            loop.close()  # drops the reader's handle: the transport may go now
        collect_garbage()
    unclosed = [str(c.message) for c in caught if issubclass(c.category, ResourceWarning)]
    kind = "WritePipeTransport" if ours else "_UnixWritePipeTransport"
    assert [text.split(" fd=")[0] for text in unclosed] == [f"unclosed transport <{kind}"]
    assert w.closed
    r.close()


# -- counts of the loop's own transports -------------------------------------------


def test_a_deferred_iterations_writes_leave_in_one_write(own_loop: asyncio_relaxed.Loop) -> None:
    """10,000 small writes in one callback: one write(2) under
    write=deferred (they fit the pipe), one each in eager mode (stock's)."""
    r, w = _pipe()
    pieces = 10_000
    piece = b"12345"
    assert pieces * len(piece) < PIPE_CAPACITY

    async def main() -> None:
        wt, writer = await own_loop.connect_write_pipe(lambda: Recorder(own_loop), w)
        before = own_loop.statistics()
        for _ in range(pieces):
            wt.write(piece)
        iterate_once = own_loop.create_future()
        own_loop.call_soon(iterate_once.set_result, None)
        await iterate_once
        counted = own_loop.statistics() - before
        deferred = own_loop.config.write is asyncio_relaxed.WriteMode.DEFERRED
        assert counted.pipe_write == (1 if deferred else pieces)
        assert counted.pipe_bytes_written == pieces * len(piece)
        assert counted.pipe_write_eagain == 0
        wt.close()
        await writer.lost

    run(own_loop, main())
    assert r.read() == piece * pieces
    r.close()


def test_a_write_while_the_loop_is_not_running_goes_at_once(
        own_loop: asyncio_relaxed.Loop) -> None:
    """In every mode, as stock: the caller may block on the read end before
    the loop runs again (test_events' pty tests do)."""
    r, w = _pipe()
    wt, writer = run(own_loop, own_loop.connect_write_pipe(lambda: Recorder(own_loop), w))
    wt.write(b"now")
    os.set_blocking(r.fileno(), False)
    assert r.read() == b"now"
    wt.close()
    run(own_loop, writer.lost)
    r.close()


def test_a_write_past_the_high_water_mark_goes_at_once(own_loop: asyncio_relaxed.Loop) -> None:
    """In every mode a write that takes the buffer past the high-water mark
    is written from write() itself, so the protocol pauses only if the pipe
    did not take enough: here it takes a capacity, and nothing pauses."""
    r, w = _pipe()

    async def main() -> None:
        wt, writer = await own_loop.connect_write_pipe(lambda: Recorder(own_loop), w)
        before = own_loop.statistics()
        wt.write(b"a" * 10)
        wt.write(b"b" * 70_000)
        written = (own_loop.statistics() - before).pipe_bytes_written
        assert written > 70_010 - wt.get_write_buffer_size() - 1 > 0
        assert writer.calls == ["connection_made"]
        assert r.read(written) == b"a" * 10 + b"b" * (written - 10)
        wt.close()
        await writer.lost

    run(own_loop, main())
    r.close()


def test_a_subprocess_fed_in_small_pieces_costs_a_write_per_iteration_at_most(
        loop_errors: LoopErrors) -> None:
    """write=deferred: 10,000 pieces to a child's stdin, 100 per iteration,
    more than the pipe holds, cost no more write(2) calls than the
    iterations they took (eager mode: one per piece the pipe takes)."""
    loop = asyncio_relaxed.Loop(write="deferred", pipe="own")
    for fixture in _as_fixture(loop, loop_errors):
        async def main() -> None:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "import sys; print(len(sys.stdin.buffer.read()))",
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert proc.stdin is not None
            before = loop.statistics()
            for _ in range(100):  # 100 pieces per iteration
                for _ in range(100):
                    proc.stdin.write(b"0123456789")
                await proc.stdin.drain()
                await asyncio.sleep(0)
            proc.stdin.close()
            out, _ = await proc.communicate()
            counted = loop.statistics() - before
            assert out == b"100000\n"
            assert counted.pipe_bytes_written == 100_000
            assert 0 < counted.pipe_write <= counted.iterations

        run(fixture, main())


def test_reads_are_counted_into_the_loops_buffer(own_loop: asyncio_relaxed.Loop) -> None:
    r, w = _pipe()

    async def main() -> None:
        before = own_loop.statistics()
        _, protocol = await own_loop.connect_read_pipe(lambda: Recorder(own_loop), r)
        w.write(b"a" * 1000)
        await protocol.received(1000)
        w.close()
        await protocol.lost
        counted = own_loop.statistics() - before
        assert counted.pipe_bytes_read == 1000
        assert counted.pipe_read == 2  # the data, then EOF
        assert counted.pipe_read_eagain == 0

    run(own_loop, main())


def test_repr_names_the_state(own_loop: asyncio_relaxed.Loop) -> None:
    r, w = _pipe()

    async def main() -> None:
        wt, writer = await own_loop.connect_write_pipe(lambda: Recorder(own_loop), w)
        rt, reader = await own_loop.connect_read_pipe(lambda: Recorder(own_loop), r)
        assert repr(wt) == f"<WritePipeTransport fd={w.fileno()} idle bufsize=0>"
        assert repr(rt) == f"<ReadPipeTransport fd={r.fileno()} polling>"
        fd = w.fileno()
        wt.close()
        assert repr(wt) == f"<WritePipeTransport closing fd={fd} idle bufsize=0>"
        await writer.lost
        await reader.lost
        assert repr(wt) == f"<WritePipeTransport closed fd={fd} closed>"

    run(own_loop, main())
