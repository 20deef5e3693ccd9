"""Exact system-call and callback counts, from loop.statistics().

These are the deterministic half of the performance claims: the benchmarks
show what the counts are worth in time, these tests pin the counts.
"""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import socket
from typing import Any

import pytest

import asyncio_relaxed
from conftest import Echo, collect_garbage, compiled, iterate, run, stalled_pair


class Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.lost: list[BaseException | None] = []

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost.append(exc)


def attach(loop: asyncio_relaxed.Loop, sock: socket.socket, proto: Any = None) -> Any:
    proto = proto if proto is not None else Sink()
    transport, _ = run(loop, loop.connect_accepted_socket(lambda: proto, sock))
    iterate(loop, 2)  # connection_made and the reader registration have run
    return transport


def drain_between_iterations(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    """Read *n* bytes from non-blocking *sock*, running the loop while it waits."""
    out = bytearray()
    for _ in range(100_000):
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            iterate(loop, 1)
            continue
        assert chunk, "unexpected EOF"
        out += chunk
        if len(out) >= n:
            return bytes(out)
    raise AssertionError(f"only {len(out)} of {n} bytes arrived")


def test_pause_resume_in_one_callback_costs_no_epoll_ctl(
    relaxed_loop: asyncio_relaxed.Loop,
) -> None:
    a, b = socket.socketpair()
    transport = attach(relaxed_loop, a)
    before = relaxed_loop.statistics()

    def dance() -> None:
        transport.pause_reading()
        transport.resume_reading()

    relaxed_loop.call_soon(dance)
    iterate(relaxed_loop, 3)
    delta = relaxed_loop.statistics() - before
    assert delta.epoll_ctl == 0
    # And the reader still works.
    b.send(b"still reading")
    iterate(relaxed_loop, 2)
    assert transport.get_protocol().data == b"still reading"
    transport.close()
    iterate(relaxed_loop, 2)
    b.close()


def test_pause_then_resume_later_costs_no_epoll_ctl(
    relaxed_loop: asyncio_relaxed.Loop,
) -> None:
    """Across iterations too, while the peer is quiet: the reading interest is
    removed lazily (HAProxy), so the kernel is never told.  This was one DEL
    and one ADD before lazy removal (issue #5)."""
    a, b = socket.socketpair()
    transport = attach(relaxed_loop, a)
    before = relaxed_loop.statistics()
    transport.pause_reading()
    iterate(relaxed_loop, 2)
    transport.resume_reading()
    iterate(relaxed_loop, 2)
    delta = relaxed_loop.statistics() - before
    assert delta.epoll_ctl == 0
    assert delta.events == 0
    b.send(b"still reading")
    iterate(relaxed_loop, 2)
    assert transport.get_protocol().data == b"still reading"
    transport.close()
    iterate(relaxed_loop, 2)
    b.close()


def test_data_while_paused_applies_the_removal_once(
    relaxed_loop: asyncio_relaxed.Loop,
) -> None:
    """The peer sends while reading is paused: the one event nobody wants
    sends the DEL (the protocol sees nothing), resuming is one ADD."""
    a, b = socket.socketpair()
    transport = attach(relaxed_loop, a)
    before = relaxed_loop.statistics()
    transport.pause_reading()
    iterate(relaxed_loop, 1)
    b.send(b"held back")
    iterate(relaxed_loop, 3)
    delta = relaxed_loop.statistics() - before
    assert (delta.epoll_ctl_del, delta.epoll_ctl_add, delta.epoll_ctl_mod) == (1, 0, 0)
    assert (delta.events, delta.recv) == (0, 0)
    assert transport.get_protocol().data == b""
    transport.resume_reading()
    iterate(relaxed_loop, 2)
    delta = relaxed_loop.statistics() - before
    assert (delta.epoll_ctl_del, delta.epoll_ctl_add, delta.epoll_ctl_mod) == (1, 1, 0)
    assert transport.get_protocol().data == b"held back"
    transport.close()
    iterate(relaxed_loop, 2)
    b.close()


def test_three_writes_in_one_callback(relaxed_loop: asyncio_relaxed.Loop) -> None:
    """deferred: one sendmsg for all three; eager: three sends."""
    a, b = socket.socketpair()
    transport = attach(relaxed_loop, a)
    before = relaxed_loop.statistics()

    def three_writes() -> None:
        transport.write(b"one ")
        transport.write(b"two ")
        transport.write(b"three")

    relaxed_loop.call_soon(three_writes)
    iterate(relaxed_loop, 1)
    delta = relaxed_loop.statistics() - before
    assert b.recv(100) == b"one two three"
    if relaxed_loop.config.write is asyncio_relaxed.WriteMode.DEFERRED:
        assert (delta.sendmsg, delta.send) == (1, 0)
        assert (delta.writes_deferred, delta.writes_coalesced) == (1, 3)
    else:
        assert (delta.sendmsg, delta.send) == (0, 3)
        assert delta.writes_deferred == 0
    assert delta.writes == 3
    assert delta.epoll_ctl == 0
    transport.close()
    iterate(relaxed_loop, 2)
    b.close()


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_a_lone_deferred_write_is_queued_then_sent_with_one_send(kind: Any) -> None:
    """The first write since the buffer emptied (bytes: the short path in
    write(); the others are copied first): buffered and queued, nothing sent
    until the flush, which sends it with one send."""
    loop = asyncio_relaxed.new_event_loop(write="deferred")
    try:
        a, b = socket.socketpair()
        transport = attach(loop, a)
        for round_ in range(2):  # the second after the buffer emptied again
            payload = kind(b"lone write %d" % round_)
            before = loop.statistics()
            transport.write(payload)
            delta = loop.statistics() - before
            assert (delta.writes, delta.writes_deferred, delta.send, delta.sendmsg) == (1, 1, 0, 0)
            assert transport.get_write_buffer_size() == len(payload)
            iterate(loop, 1)
            delta = loop.statistics() - before
            assert (delta.writes, delta.writes_deferred, delta.send, delta.sendmsg) == (1, 1, 1, 0)
            assert transport.get_write_buffer_size() == 0
            assert b.recv(100) == bytes(payload)
        transport.close()
        iterate(loop, 2)
        b.close()
    finally:
        loop.close()


@pytest.mark.parametrize("partial_write", ["poll", "feed"])
@pytest.mark.parametrize("full", [False, True], ids=["short", "eagain"])
@pytest.mark.parametrize("pieces", [1, 3])
def test_deferred_writes_that_the_kernel_takes_in_part(partial_write: str, full: bool,
                                                       pieces: int) -> None:
    """The flush's one send (one write) or sendmsg (three) takes part of what
    was written under the high-water mark (or nothing: the socket buffer is
    full already): the rest waits by policy, and all of it arrives in order."""
    loop = asyncio_relaxed.new_event_loop(write="deferred", partial_write=partial_write)
    try:
        a, b = stalled_pair()
        transport = attach(loop, a)
        filled = 0  # bytes sent around the transport until the socket took no more
        while full:
            try:
                filled += a.send(b"f" * 1024)
            except BlockingIOError:
                break
        payload = bytes(range(256)) * 120  # 30 KiB: under the mark, over the buffers
        before = loop.statistics()
        step = len(payload) // pieces
        for start in range(0, len(payload), step):
            loop.call_soon(transport.write, payload[start:start + step])
        iterate(loop, 1)
        delta = loop.statistics() - before
        assert (delta.writes, delta.writes_deferred) == (pieces, 1)
        if pieces == 1:
            assert (delta.send, delta.sendmsg, delta.writes_coalesced) == (1, 0, 0)
        else:
            assert (delta.send, delta.sendmsg, delta.writes_coalesced) == (0, 1, pieces)
        assert delta.partial_writes == 1
        assert delta.send_eagain == (1 if full else 0)
        assert 0 < transport.get_write_buffer_size() <= len(payload)
        if partial_write == "feed":
            assert delta.write_feeds == 1  # retried at the end of the next iteration
        else:
            assert delta.write_feeds == 0
            iterate(loop, 1)  # the poll applies the interest change: EPOLLOUT
            delta = loop.statistics() - before
            assert (delta.send + delta.sendmsg, delta.epoll_ctl_mod) == (1, 1)
        got = drain_between_iterations(loop, b, filled + len(payload))
        assert got == b"f" * filled + payload
        iterate(loop, 2)
        assert transport.get_write_buffer_size() == 0
        transport.close()
        iterate(loop, 2)
        b.close()
    finally:
        loop.close()


def test_short_write_policy(relaxed_loop: asyncio_relaxed.Loop) -> None:
    """poll waits for EPOLLOUT at once; feed retries feed_limit times first."""
    a, b = stalled_pair()
    transport = attach(relaxed_loop, a)
    before = relaxed_loop.statistics()
    payload = b"p" * (2 * 1024 * 1024)  # far more than the socket buffers hold
    relaxed_loop.call_soon(transport.write, payload)
    limit = relaxed_loop.config.feed_limit
    iterate(relaxed_loop, limit + 3)
    delta = relaxed_loop.statistics() - before
    assert delta.partial_writes >= 1
    if relaxed_loop.config.partial_write is asyncio_relaxed.PartialWrite.FEED:
        assert delta.write_feeds == limit
    else:
        assert delta.write_feeds == 0
    # Either way the transport ends up waiting for EPOLLOUT: one MOD adds it.
    assert (delta.epoll_ctl_mod, delta.epoll_ctl_add, delta.epoll_ctl_del) == (1, 0, 0)
    assert transport.get_write_buffer_size() > 0

    # Read outside the loop: loop.sock_recv would add its own epoll_ctl.
    assert drain_between_iterations(relaxed_loop, b, len(payload)) == payload
    iterate(relaxed_loop, 2)
    assert transport.get_write_buffer_size() == 0
    # Drained: the writer was removed again (a second MOD), nothing else.
    delta = relaxed_loop.statistics() - before
    assert (delta.epoll_ctl_mod, delta.epoll_ctl_add, delta.epoll_ctl_del) == (2, 0, 0)
    transport.close()
    iterate(relaxed_loop, 2)
    b.close()


def test_one_recv_per_readiness_event(relaxed_loop: asyncio_relaxed.Loop) -> None:
    a, b = socket.socketpair()
    transport = attach(relaxed_loop, a)
    before = relaxed_loop.statistics()
    b.send(b"x" * 1000)
    iterate(relaxed_loop, 1)
    delta = relaxed_loop.statistics() - before
    assert (delta.recv, delta.recv_eagain) == (1, 0)
    assert delta.events == 1
    transport.close()
    iterate(relaxed_loop, 2)
    b.close()


def test_messages_over_64k_take_one_read_each(relaxed_loop: asyncio_relaxed.Loop) -> None:
    """A read that fills 64 KiB switches the transport to the loop's buffer;
    it switches back only after two short reads in a row, so 100 KiB messages
    cost one recv each once the first has shown the traffic is bulk (it was
    two recv and two data_received per message, the second for the 36 KiB
    tail, when one short read switched back)."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    transport = attach(relaxed_loop, a)
    message = b"m" * (100 * 1024)
    reads = []
    for _ in range(4):
        before = relaxed_loop.statistics()
        b.sendall(message)  # all of it in the socket before the loop reads
        got = len(transport.get_protocol().data)
        while len(transport.get_protocol().data) < got + len(message):
            iterate(relaxed_loop, 1)
        reads.append((relaxed_loop.statistics() - before).recv)
    if compiled(relaxed_loop):
        assert reads == [1, 1, 1, 1]  # every read into the receive buffer
    else:
        assert reads == [2, 1, 1, 1]  # 64 KiB + 36 KiB, then one read per message
    assert len(transport.get_protocol().data) == 4 * len(message)
    transport.close()
    iterate(relaxed_loop, 2)
    b.close()


@pytest.mark.parametrize("write", ["eager", "deferred"])
def test_100k_echo_costs_one_recv_and_one_send_per_message(write: str) -> None:
    """One 100 KiB write per callback makes the same system calls in both
    write modes: in deferred mode the write is past the high-water mark, so
    it leaves at once from write(), as in eager mode (no sendmsg, no short
    write, no wait for EPOLLOUT, and no round trip through the loop's write
    queue, which cost 5 % more instructions per request)."""
    loop = asyncio_relaxed.new_event_loop(write=write)
    try:
        a, b = socket.socketpair()
        for sock in (a, b):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        transport = attach(loop, a, Echo())
        message = b"e" * (100 * 1024)

        def echo() -> bytes:
            b.setblocking(True)
            b.sendall(message)  # fits in the socket buffer: the loop is not needed
            b.setblocking(False)
            return drain_between_iterations(loop, b, len(message))

        echo()  # the first message: 64 KiB + 36 KiB (see above)
        before = loop.statistics()
        for _ in range(4):
            assert echo() == message
        delta = loop.statistics() - before
        counts = (delta.recv, delta.send, delta.sendmsg, delta.partial_writes,
                  delta.send_eagain, delta.epoll_ctl_mod, delta.writes_deferred)
        assert counts == (4, 4, 0, 0, 0, 0, 0)
        transport.close()
        iterate(loop, 2)
        b.close()
    finally:
        loop.close()


@pytest.mark.skipif(not hasattr(mmap, "MAP_ANONYMOUS"), reason="no anonymous mmap")
def test_read_buffer_starts_on_a_page(relaxed_loop: asyncio_relaxed.Loop) -> None:
    """The kernel's copy into the loop's buffer cost 2-2.5x the system time
    at page offset 16, where glibc puts a 256 KiB bytearray (see
    _loop.read_buffer); the buffer must not depend on the heap's history."""
    address = ctypes.addressof(ctypes.c_char.from_buffer(relaxed_loop._shared.read_view))
    assert address % mmap.PAGESIZE == 0


def test_every_read_mode_delivers_the_bytes_in_order(relaxed_loop: asyncio_relaxed.Loop) -> None:
    """Small reads, the loop's buffer, streaming full-size reads, and back:
    a 3 MiB transfer then a small message arrive whole and in order."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    transport = attach(relaxed_loop, a)
    payload = bytes(range(256)) * (3 * 4096) + b"tail"
    # White box: which read modes ran (the pure build's; the compiled one
    # has none: conftest.NO_READ_MODES).
    modes = {transport._recv_size}
    b.setblocking(False)
    sent = 0
    while sent < len(payload):
        try:
            sent += b.send(payload[sent:sent + (1 << 20)])
        except BlockingIOError:
            pass
        iterate(relaxed_loop, 1)
        modes.add(transport._recv_size)
    while len(transport.get_protocol().data) < len(payload):
        iterate(relaxed_loop, 1)
        modes.add(transport._recv_size)
    if not compiled(relaxed_loop):
        assert {64 * 1024, 0, relaxed_loop.config.read_size} <= modes  # small, buffer, streaming
    b.send(b"small")
    while len(transport.get_protocol().data) < len(payload) + 5:
        iterate(relaxed_loop, 1)
    assert transport.get_protocol().data == payload + b"small"
    # Two short reads in a row in the loop's buffer: small reads again.
    b.send(b"again")
    while len(transport.get_protocol().data) < len(payload) + 10:
        iterate(relaxed_loop, 1)
    if not compiled(relaxed_loop):
        assert transport._recv_size == relaxed_loop._shared.small_read
    transport.close()
    iterate(relaxed_loop, 2)
    b.close()


def test_messages_just_over_a_small_read_take_one_read_each(
        relaxed_loop: asyncio_relaxed.Loop) -> None:
    """100 KiB messages, each sent whole before the loop reads: after the
    first, each is one recv_into the loop's buffer (one short read there
    does not switch back to small reads, which would take two per message:
    a 64 KiB recv that fills, then the rest)."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    transport = attach(relaxed_loop, a)
    stats = relaxed_loop._shared.stats
    message = bytes(100 * 1024)
    received = 0
    reads = []
    for _ in range(6):
        before = stats.recv
        b.sendall(message)
        received += len(message)
        while len(transport.get_protocol().data) < received:
            iterate(relaxed_loop, 1)
        reads.append(stats.recv - before)
    assert reads[1:] == [1] * 5, reads
    transport.close()
    iterate(relaxed_loop, 2)
    b.close()


def test_mutable_buffers_are_copied(relaxed_loop: asyncio_relaxed.Loop) -> None:
    a, b = stalled_pair()
    transport = attach(relaxed_loop, a)
    big = bytearray(b"a" * (1024 * 1024))
    view_source = bytearray(b"b" * 1000)
    transport.write(big)
    transport.write(memoryview(view_source))
    transport.writelines([bytearray(b"c" * 10)])
    big[:] = b"X" * len(big)
    view_source[:] = b"Y" * 1000

    data = drain_between_iterations(relaxed_loop, b, len(big) + 1010)
    assert data == b"a" * len(big) + b"b" * 1000 + b"c" * 10
    transport.close()
    iterate(relaxed_loop, 2)
    b.close()


def test_high_water_write_is_sent_at_once_in_deferred_mode() -> None:
    loop = asyncio_relaxed.new_event_loop(write="deferred")
    try:
        a, b = socket.socketpair()
        transport = attach(loop, a)
        transport.set_write_buffer_limits(high=1024)
        before = loop.statistics()
        transport.write(b"s" * 100)  # below the mark: queued
        assert (loop.statistics() - before).send == 0
        transport.write(b"t" * 2000)  # past the mark: sent now, coalesced
        delta = loop.statistics() - before
        assert delta.sendmsg == 1
        assert transport.get_write_buffer_size() == 0
        assert b.recv(4096) == b"s" * 100 + b"t" * 2000
        transport.close()
        iterate(loop, 2)
        b.close()
    finally:
        loop.close()


@pytest.mark.parametrize("then_close", [False, True], ids=["write", "write-close"])
def test_writes_queued_when_the_loop_closes_are_sent(then_close: bool) -> None:
    """A deferred write made while the loop does not run goes out when the
    loop closes; one followed by close() goes out at the close(), as stock's
    write() had sent it."""
    loop = asyncio_relaxed.new_event_loop(write="deferred")
    a, b = socket.socketpair()
    b.setblocking(False)  # what was sent is there: nothing to wait for
    transport = attach(loop, a)
    transport.write(b"last words")
    if then_close:
        transport.close()
        assert b.recv(100) == b"last words"
    loop.close()
    if not then_close:
        assert b.recv(100) == b"last words"
    a.close()  # (no connection_lost runs on a closed loop, as on stock)
    b.close()
    if not then_close:
        with pytest.warns(ResourceWarning, match="unclosed transport"):
            del transport
            collect_garbage()


@pytest.mark.parametrize("write", ["eager", "deferred"])
def test_statistics_snapshot_is_frozen(write: str) -> None:
    loop = asyncio_relaxed.new_event_loop(write=write)
    try:
        stats = loop.statistics()
        assert stats.backend == "epoll"
        with pytest.raises(AttributeError):
            stats.iterations = 5  # type: ignore[misc]
        iterate(loop, 3)
        after = loop.statistics()
        assert after.iterations - stats.iterations == 3
        assert after.poll_waits - stats.poll_waits == 3
        assert after.callbacks - stats.callbacks == 3  # the three loop.stop calls
    finally:
        loop.close()
    assert loop.statistics().iterations == after.iterations  # readable after close()
