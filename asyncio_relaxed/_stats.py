"""Always-on counters and the frozen snapshot ``loop.statistics()`` returns.

Counting is a plain integer increment on a ``__slots__`` object, cheap enough
to stay on in production (no locks: the loop is single-threaded, and the
snapshot is taken on the loop's thread or tolerates a torn read).

This module knows nothing of asyncio.
"""

from __future__ import annotations

import dataclasses

__all__ = ["COUNTERS", "GAUGES", "Counters", "LoopGauges", "LoopStatistics"]

#: Counter name -> what it counts.  The order is the order of the snapshot.
COUNTERS: dict[str, str] = {
    "iterations": "loop iterations (_run_once calls)",
    "events": "ready (fd, mask) pairs returned by the poller",
    "callbacks": "callbacks (handles) run",
    "poll_waits": (
        "calls into the kernel poller (epoll_wait, poll, select); above iterations with "
        "time_metrics on, whose iterations that may wait poll once without waiting first "
        "and read the clock only if that found nothing"
    ),
    "epoll_ctl_add": "interest registrations sent to the kernel (EPOLL_CTL_ADD or equivalent)",
    "epoll_ctl_mod": "interest changes sent to the kernel (EPOLL_CTL_MOD or equivalent)",
    "epoll_ctl_del": "interest removals sent to the kernel (EPOLL_CTL_DEL or equivalent)",
    "recv": "recv/recv_into calls on transport sockets",
    "recv_eagain": "recv calls that found nothing to read",
    "send": "send calls on transport sockets",
    "sendmsg": "sendmsg calls on transport sockets",
    "send_eagain": "send/sendmsg calls that found the socket buffer full",
    "accept": "accept calls on listening sockets",
    "accept_eagain": "accept calls that found no pending connection",
    "writes": "transport.write/writelines calls with data",
    "writes_deferred": "writes queued for the per-iteration flush instead of sent at once",
    "writes_coalesced": "buffers that went out in a sendmsg together with another buffer",
    "partial_writes": "sends the kernel took only part of",
    "write_feeds": "short writes retried on the next iteration without waiting (feed policy)",
    "always_ready_fds": "registrations the kernel poller refused (EPERM), served as always ready",
    "datagram_read_events": (
        "readiness events served on datagram sockets (datagram=own), and the turns "
        "that deliver datagrams held past a pause or an exception"
    ),
    "datagram_recv": (
        "read system calls on datagram sockets: recvfrom/recv a datagram each, or one "
        "recvmmsg a batch (the compiled build)"
    ),
    "datagram_recv_eagain": "datagram reads that found nothing to read (a batch's end)",
    "datagrams_received": "datagrams handed to datagram_received",
    "datagram_bytes_received": "bytes of the datagrams handed to datagram_received",
    "datagram_send": "sendto/send calls on datagram sockets",
    "datagram_send_eagain": "datagram sends that found the socket buffer full (the datagram waits)",
    "datagrams_sent": "datagrams the kernel took",
    "datagram_bytes_sent": "bytes of the datagrams the kernel took",
    "datagram_errors": (
        "datagram reads and sends that failed with an OSError (ICMP errors such as "
        "ConnectionRefusedError, a refused send): each went to error_received"
    ),
    "pipe_read": "readv calls on pipes (pipe=own: subprocesses, connect_read_pipe)",
    "pipe_read_eagain": "pipe reads that found nothing to read",
    "pipe_bytes_read": "bytes read from pipes",
    "pipe_write": "write calls on pipes (pipe=own: subprocesses, connect_write_pipe)",
    "pipe_write_eagain": "pipe writes that found the pipe full",
    "pipe_bytes_written": "bytes the pipes took",
}


class Counters:
    """Mutable counters, one attribute per entry of :data:`COUNTERS`.

    Plus three that the transports' hot paths count with one increment where
    two counters move (what the second increment would cost: docs/design.md,
    "Statistics"); :meth:`snapshot` adds each to
    both: ``sent_at_once`` (a write() sent at once: a write and a send),
    ``queued_at_once`` (a write() that queued its transport: a write and a
    deferred write) and ``datagram_sent_ok`` (a datagram send the kernel
    took: a send and a datagram sent).
    """

    __slots__ = (*COUNTERS, "sent_at_once", "queued_at_once", "datagram_sent_ok")

    iterations: int
    events: int
    callbacks: int
    poll_waits: int
    epoll_ctl_add: int
    epoll_ctl_mod: int
    epoll_ctl_del: int
    recv: int
    recv_eagain: int
    send: int
    sendmsg: int
    send_eagain: int
    accept: int
    accept_eagain: int
    writes: int
    writes_deferred: int
    writes_coalesced: int
    partial_writes: int
    write_feeds: int
    always_ready_fds: int
    datagram_read_events: int
    datagram_recv: int
    datagram_recv_eagain: int
    datagrams_received: int
    datagram_bytes_received: int
    datagram_send: int
    datagram_send_eagain: int
    datagrams_sent: int
    datagram_bytes_sent: int
    datagram_errors: int
    pipe_read: int
    pipe_read_eagain: int
    pipe_bytes_read: int
    pipe_write: int
    pipe_write_eagain: int
    pipe_bytes_written: int
    sent_at_once: int
    queued_at_once: int
    datagram_sent_ok: int

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def snapshot(self, backend: str) -> LoopStatistics:
        counts = {name: getattr(self, name) for name in COUNTERS}
        counts["writes"] += self.sent_at_once + self.queued_at_once
        counts["send"] += self.sent_at_once
        counts["writes_deferred"] += self.queued_at_once
        counts["datagram_send"] += self.datagram_sent_ok
        counts["datagrams_sent"] += self.datagram_sent_ok
        return LoopStatistics(backend, **counts)


@dataclasses.dataclass(frozen=True)
class LoopStatistics:
    """A snapshot of a loop's counters; see :data:`COUNTERS` for each field.

    ``backend`` names the kernel interface in use (``epoll``, ``poll``,
    ``select``, ``kqueue``...).  Subtract two snapshots to count an interval:
    ``after - before`` gives a snapshot of the differences.
    """

    backend: str
    iterations: int = 0
    events: int = 0
    callbacks: int = 0
    poll_waits: int = 0
    epoll_ctl_add: int = 0
    epoll_ctl_mod: int = 0
    epoll_ctl_del: int = 0
    recv: int = 0
    recv_eagain: int = 0
    send: int = 0
    sendmsg: int = 0
    send_eagain: int = 0
    accept: int = 0
    accept_eagain: int = 0
    writes: int = 0
    writes_deferred: int = 0
    writes_coalesced: int = 0
    partial_writes: int = 0
    write_feeds: int = 0
    always_ready_fds: int = 0
    datagram_read_events: int = 0
    datagram_recv: int = 0
    datagram_recv_eagain: int = 0
    datagrams_received: int = 0
    datagram_bytes_received: int = 0
    datagram_send: int = 0
    datagram_send_eagain: int = 0
    datagrams_sent: int = 0
    datagram_bytes_sent: int = 0
    datagram_errors: int = 0
    pipe_read: int = 0
    pipe_read_eagain: int = 0
    pipe_bytes_read: int = 0
    pipe_write: int = 0
    pipe_write_eagain: int = 0
    pipe_bytes_written: int = 0

    @property
    def epoll_ctl(self) -> int:
        """All interest changes sent to the kernel."""
        return self.epoll_ctl_add + self.epoll_ctl_mod + self.epoll_ctl_del

    @property
    def syscalls(self) -> int:
        """Poller, socket I/O (stream and datagram), pipe I/O and accept
        system calls counted by the loop."""
        return (
            self.poll_waits
            + self.epoll_ctl
            + self.recv
            + self.send
            + self.sendmsg
            + self.accept
            + self.datagram_recv
            + self.datagram_send
            + self.pipe_read
            + self.pipe_write
        )

    def as_dict(self) -> dict[str, int | str]:
        return dataclasses.asdict(self)

    def __sub__(self, other: LoopStatistics) -> LoopStatistics:
        if not isinstance(other, LoopStatistics):
            return NotImplemented
        return LoopStatistics(
            self.backend,
            *(getattr(self, name) - getattr(other, name) for name in COUNTERS),
        )


assert [f.name for f in dataclasses.fields(LoopStatistics)][1:] == list(COUNTERS)


#: Gauge name -> what it measures now.  The order is the order of the snapshot.
GAUGES: dict[str, str] = {
    "connections": "open stream connections (TCP and Unix, TLS included)",
    "tls_connections": "open connections that carry TLS (either tls setting)",
    "reading_paused": "open connections whose reading is paused (pause_reading)",
    "writing_paused": "open connections whose protocol was told to pause writing",
    "write_buffer_bytes": "bytes the open connections hold for writing",
    "listeners": "listening sockets the loop serves",
    "pending_accepts": (
        "connections waiting in the listeners' accept queues (Linux TCP), read now"
    ),
}


@dataclasses.dataclass(frozen=True)
class LoopGauges:
    """What a loop holds at one moment (``loop.gauges()``); see
    :data:`GAUGES` for each field.  Counted when asked, from the loop's
    transports and listeners: nothing is kept up to date per connection."""

    connections: int = 0
    tls_connections: int = 0
    reading_paused: int = 0
    writing_paused: int = 0
    write_buffer_bytes: int = 0
    listeners: int = 0
    pending_accepts: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


assert [f.name for f in dataclasses.fields(LoopGauges)] == list(GAUGES)
