"""The socket transport (asyncio_relaxed._transport, _basetransport, _sockets).

Every write path meets every send fault: the one fast path (write() sending
at once), the send primitive from the queue's flush, from writelines, past
the high-water mark, on EPOLLOUT and on a feed retry, each with the first
send of the path failing as test_faults' plans make sends fail.  Transient
faults (EINTR, EAGAIN, a short send) must lose nothing; fatal ones end the
connection once, with their error, and reach no exception handler.  The
counters tell which path was taken, so a path that stops being taken fails
here rather than passing untested.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import _differential as diff
import pytest

import asyncio_relaxed
from asyncio_relaxed import _sockets
from conftest import LoopErrors, Recorder, run

PAYLOAD = bytes(range(256)) * 64  # 16 KiB

#: path -> (loop settings, which send of the connection fails (0: the
#: first), the counter that shows the path was taken)
PATHS: dict[str, tuple[dict[str, Any], int, str]] = {
    "write-at-once": ({"write": "eager"}, 0, "send"),
    "flush": ({"write": "deferred"}, 0, "writes_deferred"),
    "writelines": ({"write": "eager"}, 0, "sendmsg"),
    "past-high-water": ({"write": "deferred"}, 0, "writes_deferred"),
    "epollout": ({"write": "eager", "partial_write": "poll"}, 1, "partial_writes"),
    "feed-retry": ({"write": "eager", "partial_write": "feed"}, 1, "write_feeds"),
}
FAULTS = ["EINTR", "EAGAIN", "short", "ECONNRESET", "EPIPE", "ENOBUFS"]


def _start(transport: Any, path: str) -> None:
    """What the protocol writes, in one callback, to take *path*."""
    if path in ("write-at-once", "flush"):
        transport.write(PAYLOAD)
    elif path == "writelines":
        transport.writelines([PAYLOAD[:100], PAYLOAD[100:]])
    elif path == "past-high-water":
        transport.set_write_buffer_limits(high=4096)
        transport.write(PAYLOAD[:100])  # queued for the flush
        transport.write(PAYLOAD[100:])  # past the mark: sent now
    else:
        # The first send comes up short (made so below), the rest waits for
        # EPOLLOUT or a feed retry: the second send is the faulty one.
        transport.write(PAYLOAD)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("path", list(PATHS))
def test_every_write_path_through_every_send_fault(path: str, fault: str,
                                                   loop_errors: LoopErrors) -> None:
    settings, faulty, counter = PATHS[path]
    plan = {faulty: fault}
    if faulty:
        plan[0] = "short"
    faults = diff.FaultPlan({"send": plan})
    loop = asyncio_relaxed.new_event_loop(**settings)
    loop.set_exception_handler(loop_errors.handler)
    ours, peer = socket.socketpair()
    ours = diff.FaultySocket.adopt(ours, faults)
    peer.setblocking(False)

    async def main() -> tuple[bytes, Recorder]:
        before = loop.statistics()
        recorder = Recorder(loop)
        transport, _ = await loop.connect_accepted_socket(lambda: recorder, ours)
        _start(transport, path)
        received = bytearray()
        while len(received) < len(PAYLOAD) and not recorder.lost.done():
            await asyncio.sleep(0.001)
            try:
                received += peer.recv(1 << 20)
            except BlockingIOError:
                pass
        assert getattr(loop.statistics() - before, counter) > 0, f"{path} not taken"
        if not recorder.lost.done():
            transport.close()
        await recorder.lost
        return bytes(received), recorder

    try:
        received, recorder = run(loop, main(), timeout=10)
    finally:
        loop.close()
        peer.close()
    assert faults.fired == sorted((("send", n, f) for n, f in plan.items()),
                                  key=lambda fired: fired[1])
    lost = recorder.lost.result()
    if fault in diff.TRANSIENT:
        assert received == PAYLOAD
        assert lost is None
    else:
        assert PAYLOAD.startswith(received)
        assert isinstance(lost, OSError) and lost.errno == diff.FAULT_ERRNOS[fault]
    assert recorder.calls.count("connection_lost") == 1
    loop_errors.check()  # no OSError of a transport reaches the handler


class _Counting:
    """A socket whose recv/recv_into record how much they were asked for."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.asked: list[int] = []

    def recv(self, size: int) -> bytes:
        self.asked.append(size)
        return self.sock.recv(size)

    def recv_into(self, buffer: Any) -> int:
        self.asked.append(len(buffer))
        return self.sock.recv_into(buffer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


@pytest.mark.parametrize("read_size", [1024, 64 * 1024, 256 * 1024])
def test_a_read_asks_for_at_most_read_size(read_size: int) -> None:
    """Small reads, buffer mode and streaming each read read_size at most
    (README, Security notes), whatever it is set to."""
    loop = asyncio_relaxed.new_event_loop(read_size=read_size)
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.setblocking(False)

    async def main() -> None:
        recorder = Recorder(loop)
        transport, _ = await loop.connect_accepted_socket(lambda: recorder, ours)
        counting = _Counting(ours)
        transport._sock = counting
        total = 0
        for size in (10, 300_000, 10, 10, 70_000, 10):
            await loop.sock_sendall(peer, b"x" * size)
            total += size
            await recorder.received(total)
        assert counting.asked and max(counting.asked) <= read_size, counting.asked
        transport._sock = ours
        transport.close()
        await recorder.lost

    try:
        run(loop, main())
    finally:
        loop.close()
        peer.close()


def test_is_tcp_reads_wrapped_listeners() -> None:
    """gunicorn hands the loop wrapper objects that pass attributes on."""

    class Wrapper:
        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    with socket.socket() as tcp, socket.socket(socket.AF_UNIX) as unix, \
            socket.socket(type=socket.SOCK_DGRAM) as udp:
        assert _sockets.is_tcp(tcp) and _sockets.is_tcp(Wrapper(tcp))
        assert not _sockets.is_tcp(unix) and not _sockets.is_tcp(Wrapper(unix))
        assert not _sockets.is_tcp(udp)
