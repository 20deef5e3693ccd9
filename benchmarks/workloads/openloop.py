"""The open-loop load generator: ``python -m benchmarks.workloads.openloop``.

Theory of operation
===================

A closed-loop client (every other client of the suite, and wrk) sends a
connection's next request when the answer to the last one is back, so it
slows down with the server it measures: while a response is late, the
requests that would have been sent meanwhile are not, and their wait never
enters the figures (coordinated omission).  Here requests are due on a
schedule whatever the answers do (:class:`Schedule`): request 0 at the
window's start ``t0``, each next one a gap later, ``1 / rate`` under
``--arrivals constant`` or an exponential draw of mean ``1 / rate`` under
``--arrivals poisson`` (a Poisson process, as independent users make; the
draws come from a ``random.Random`` seeded with ``--seed``, so every loop
of a run gets the same gaps).  Request *i* goes out on connection
``i % C`` at its due time, behind whatever that connection still has in
flight (pipelined: every server answers a connection's requests in order,
so the answers are matched to their requests by counting them).  Its
latency runs from its due time to the last byte of its answer, as wrk2
measures, so a request the client sent late, or the server answered late,
still counts from when it was due: a stall of the server or of the client
is charged to every request due during it.  How late the client itself
sent (``lag``: send time minus due time) is reported beside the latencies:
where it is large, the figures are the client's, not the server's.

The pacer (:class:`Pacer`) sends every request that has come due, then
waits for the next one in one of two ways.  A timer of the event loop
cannot do it: asyncio rounds its poll timeout up to the millisecond, and
uvloop's libuv clock counts milliseconds, so requests would go out in
bursts.  Where no answer is owed and the next request is due more than a
lead ahead, the pacer arms a timerfd (:class:`TimerFd`:
``CLOCK_MONOTONIC``, the clock of ``time.perf_counter`` on Linux, at an
absolute time in nanoseconds, so nothing is rounded) to fire that lead
before the due time, and watches it with ``loop.add_reader``: the client
sleeps in the loop's poller.  Otherwise it spins: it queues itself again
with ``call_soon``, once per loop iteration, so a request goes out within
a loop iteration of its due time rather than a wake-up's latency late,
and an answer is read within an iteration of its arrival rather than
after the client wakes (which would add the client's own wake-up to
every latency measured).  The lead starts at :data:`WAKE_LEAD` and
follows the timer's lateness, which grows with the length of the sleep:
a late wake-up raises it, each request sent lowers it a little
(:meth:`Pacer.woke`, :meth:`Pacer.forget`).  The timerfd comes from
``os.timerfd_create`` (Python 3.13+) or from libc through ``ctypes``
(older Pythons, PyPy); where neither exists (not Linux), the pacer only
spins, and says so (:func:`timer_backend`; the ``pacer`` of the window's
figures, the client's name).

The client's CPU use (``client_cpu``: this process's user and system CPU
time over the window, ``getrusage``, in CPUs) then counts what it did and
what its spinning burnt.  The pacer measures the second part
(``pacer_wait``, in CPUs): the CPU time of its thread
(``time.thread_time``: a system call, about 0.5 µs, made only while it
spins) between its spinning passes (from the end of one to the start of
the next, or from the start of a pass that sent nothing) during which no
connection read, that is loop iterations that ran nothing but the poller
and the pacer.  CPU time, not wall time, so that a client preempted while
it spins is not counted as waiting.  An iteration in which an answer
arrived counts as work, whole.  ``client_headroom``,
``1 - (client_cpu - pacer_wait)`` and never below 0, is the share of its
CPU the client had left: near 0, the client, not the server, may be what limits.  It is an
estimate in both modes, the same way (an iteration that ran other
callbacks but read nothing counts as waiting); the timer only makes the
spinning, and so the estimate's part, small at low rates.  The runner pins the
client to a CPU of its own.  Its clock is a parameter
(``time.perf_counter`` by default), and so is each connection's, and the
pacer's timer and ``call_soon``, so that tests drive them by hand.

What a request is (``--protocol``): ``echo``, ``--request`` bytes answered
by ``--response`` bytes; ``http``, a keep-alive HTTP/1.1 ``GET --path``;
``http-post-json``, a ``POST --path`` of the JSON ``--body``; ``redis``, a
RESP command (``--body``, its words split on spaces; ``GET key`` by
default).  ``--pipeline N`` makes a request N of these in one write,
answered when all N answers are back.  Each protocol's answers are
delimited by a framer (:class:`EchoFramer`, :class:`HttpFramer`,
:class:`RespFramer`): a small class fed the bytes as they come, which
returns how many answers they complete and raises ``ValueError`` on an
answer it cannot delimit or that is no success (a chunked HTTP body, a
status other than 2xx, a RESP error), which fails the window.  ``--tls``
makes every connection TLS 1.3 with the CA of benchmarks.harness.tls, as
benchmarks.workloads.client does.

Latencies, and the lags, are recorded in an HdrHistogram (1 µs to 60 s, 3
significant digits: a percentile is within 0.1 % of the recorded value)
when the ``hdrhistogram`` distribution is installed, else kept in a list
whose percentiles are exact (benchmarks.harness.maths.percentiles); the
client's name in the results says which (:class:`Recorder`).

One process drives every window of a run, over the same connections: the
runner writes a port, then per window a command, ``closed`` (one request in
flight per connection: the capacity) or ``open RATE`` (requests per
second); the client runs the load through ``--warmup`` seconds, prints
``{"ready": true}``, and when the runner writes ``go`` (after marking the
server) counts the requests due in the next ``--duration`` seconds, stops
sending at its end, waits for every answer and prints the window's figures:
requests (those due in the window), elapsed, p50/p99/p99.9/max latency
(µs), ``achieved_rate`` (answers that arrived within the window, per
second: under overload it falls below the rate asked for), ``client_cpu``
and ``client_headroom`` (above) and, open, ``pacer_wait``, ``pacer``
(``timerfd`` or ``spin``) and the lag's p99 and maximum.  The end of input
closes the connections.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import ctypes.util
import json
import math
import os
import random
import resource
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from benchmarks.harness import loops, maths
from benchmarks.workloads.client import _tls_options

try:
    with warnings.catch_warnings():
        # hdrh's codec declares a packed ctypes Structure without _layout_,
        # which Python 3.14+ warns of at import (DeprecationWarning): the
        # histogram does not use the codec.
        warnings.filterwarnings("ignore", "Due to '_pack_'", DeprecationWarning)
        from hdrh.histogram import HdrHistogram
except ImportError:  # the bench extra leaves it out where it has no wheel
    HdrHistogram = None

#: Seconds the client waits for the answers to a window's last requests.
DRAIN_TIMEOUT = 30.0
ARRIVALS = ("constant", "poisson")
PROTOCOLS = ("echo", "http", "http-post-json", "redis")
#: The HdrHistogram's range, in µs (1 µs to 60 s), and its precision: 3
#: significant digits, so a value it reports is within 0.1 % of the one
#: recorded.  A latency outside the range is recorded at its bound.
LOWEST_US = 1
HIGHEST_US = 60_000_000
DIGITS = 3
#: The longest HTTP response head the framer buffers before it gives up.
MAX_HEAD = 64 * 1024
#: Seconds before a request's due time that the pacer's timerfd fires at
#: first (the pacer spins through the rest), and the bounds between which
#: it then follows the wake-ups' lateness (:meth:`Pacer.woke`).  A timerfd
#: armed at an absolute time and waited for in epoll, 120 to 1,000 times
#: in a row on the suite's 2-CPU Firecracker VM (Linux 6.18, Python 3.13,
#: the machine otherwise idle), woke late by 33 µs at the median and 69 µs
#: at p99 when armed 300 µs ahead, 42 and 109 µs 1 ms ahead, 146 and
#: 204 µs 5 ms ahead (a longer sleep, a deeper idle state), whatever the
#: timer slack (50 µs or 1 ns): no one lead fits every rate, so the lead
#: is learnt.  The bounds: at least a median wake-up; at most what covers
#: p99 after a long sleep with room to spare.
WAKE_LEAD = 200e-6
MIN_LEAD = 50e-6
MAX_LEAD = 500e-6
#: Added to a wake-up's lateness to make the lead; and the share of the
#: lead forgotten per request sent (a late wake-up's lead lasts about 64
#: requests, whether or not the pacer slept meanwhile).
LEAD_MARGIN = 50e-6
LEAD_DECAY = 1 / 64

Clock = Callable[[], float]


class Framer(Protocol):
    def feed(self, data: bytes) -> int:
        """How many answers *data*, the next bytes of the connection, completes."""


# -- when requests are due ------------------------------------------------------


class Schedule:
    """The due times of requests 0, 1, 2, ... (an iterator of seconds on the
    clock *t0* is read from): request 0 at *t0*, each next one a gap later,
    ``1 / rate`` (constant) or drawn from an exponential distribution of
    mean ``1 / rate`` (poisson) by a ``random.Random(seed)``."""

    def __init__(self, rate: float, t0: float, arrivals: str = "constant",
                 seed: int = 0) -> None:
        if not rate > 0:
            raise ValueError(f"rate {rate!r}: must be above 0")
        if arrivals not in ARRIVALS:
            raise ValueError(f"arrivals {arrivals!r}: {', '.join(ARRIVALS)}")
        self.rate = rate
        self.t0 = t0
        self.arrivals = arrivals
        self.random = random.Random(seed)
        self.index = 0
        self.last = t0

    def __iter__(self) -> Iterator[float]:
        return self

    def __next__(self) -> float:
        i = self.index
        self.index += 1
        if self.arrivals == "constant":
            # From the index, not by adding gaps: no rounding error accumulates.
            return self.t0 + i / self.rate
        if i:
            self.last += self.random.expovariate(self.rate)
        return self.last


# -- what was measured ----------------------------------------------------------


#: The percentiles of a window's latency distribution in its figures
#: (``spectrum_us``), as HdrHistogram's percentile distributions step them.
SPECTRUM = (50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.999)


class Recorder:
    """Durations in seconds: their count, exact maximum and percentiles.

    In an HdrHistogram of whole µs (:data:`LOWEST_US` to :data:`HIGHEST_US`,
    :data:`DIGITS` significant digits) when *hdr* (by default when
    ``hdrhistogram`` is installed): constant memory and time per value; its
    percentile is the highest value equivalent to the recorded one at that
    rank.  Else every value in a list, and the percentiles interpolated
    between ranks (benchmarks.harness.maths.percentiles).  ``kind`` says
    which."""

    def __init__(self, hdr: bool | None = None) -> None:
        if hdr is None:
            hdr = HdrHistogram is not None
        elif hdr and HdrHistogram is None:
            raise RuntimeError("hdrhistogram is not installed (pip install hdrhistogram)")
        self.kind = "HdrHistogram" if hdr else "exact"
        self.count = 0
        self.max = 0.0
        self.values: list[float] = []
        self.histogram = HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS) if hdr else None

    def record(self, seconds: float) -> None:
        self.count += 1
        if seconds > self.max:
            self.max = seconds
        if self.histogram is None:
            self.values.append(seconds)
        else:
            us = min(max(round(seconds * 1e6), LOWEST_US), HIGHEST_US)
            self.histogram.record_value(us)

    def percentiles(self, *qs: float) -> list[float]:
        """The *qs*-th percentiles (above 0, below 100), in seconds."""
        if not self.count:
            raise ValueError("percentiles of no values")
        if self.histogram is None:
            return maths.percentiles(self.values, *qs)
        if any(not 0 < q < 100 for q in qs):
            raise ValueError(f"percentiles {qs!r}: each must be above 0 and below 100")
        # A bucket's highest equivalent value can pass the largest recorded.
        return [min(self.histogram.get_value_at_percentile(q) / 1e6, self.max) for q in qs]

    def figures(self, prefix: str = "") -> dict[str, Any]:
        """p50, p99, p99.9 and the maximum in µs, keys ``{prefix}p50_us``...,
        and ``{prefix}spectrum_us``: [percentile, µs] at each of
        :data:`SPECTRUM` that the count resolves (a rank of at least one
        value above it), then [100, the maximum]: the distribution the
        report's latency chart draws."""
        p50, p99, p999 = self.percentiles(50, 99, 99.9)
        # (rounded: 100 - 99.9 is 0.0999... in binary floating point)
        qs = [q for q in SPECTRUM if round(self.count * (100 - q), 6) >= 100]
        spectrum = [[q, v * 1e6] for q, v in zip(qs, self.percentiles(*qs), strict=True)]
        spectrum.append([100.0, self.max * 1e6])
        return {f"{prefix}p50_us": p50 * 1e6, f"{prefix}p99_us": p99 * 1e6,
                f"{prefix}p999_us": p999 * 1e6, f"{prefix}max_us": self.max * 1e6,
                f"{prefix}spectrum_us": spectrum}


# -- what an answer is ----------------------------------------------------------


class EchoFramer:
    """Answers of *size* bytes each."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"answers of {size} bytes")
        self.size = size
        self.left = size  # bytes still to come of the oldest answer

    def feed(self, data: bytes) -> int:
        """How many answers *data* completes."""
        size = len(data)
        if size < self.left:
            self.left -= size
            return 0
        size -= self.left
        self.left = self.size - size % self.size
        return 1 + size // self.size


class HttpFramer:
    """HTTP/1.1 responses, each a head and a ``Content-Length`` body.

    Only the head is buffered (up to :data:`MAX_HEAD` bytes); the body's
    bytes are counted.  A head with ``Transfer-Encoding: chunked`` or
    without ``Content-Length``, or a status other than 2xx, raises
    ``ValueError``: the answers could no longer be told apart, or are not
    the ones the benchmark means to measure."""

    def __init__(self) -> None:
        self.head = b""  # the start of a head whose end has not come yet
        self.body_left = 0  # bytes still to come of the current body

    def feed(self, data: bytes) -> int:
        done = 0
        pos = 0
        if self.head:
            data = self.head + data
            self.head = b""
        size = len(data)
        while pos < size:
            if self.body_left:
                take = min(self.body_left, size - pos)
                pos += take
                self.body_left -= take
                if not self.body_left:
                    done += 1
                continue
            end = data.find(b"\r\n\r\n", pos)
            if end < 0:
                if size - pos > MAX_HEAD:
                    raise ValueError(f"an HTTP response head longer than {MAX_HEAD} bytes")
                self.head = data[pos:]
                break
            self.body_left = self.content_length(data[pos:end])
            pos = end + 4
            if not self.body_left:
                done += 1
        return done

    @staticmethod
    def content_length(head: bytes) -> int:
        """The body's length from a response *head* (without its blank line)."""
        status, *fields = head.split(b"\r\n")
        if not status.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")) or status[9:10] != b"2":
            raise ValueError(f"HTTP status line {status[:80]!r}: expected a 2xx response")
        length = None
        for field in fields:
            name, _, value = field.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                raise ValueError("a chunked HTTP response: the open-loop client delimits "
                                 "answers by Content-Length only")
            if name == b"content-length":
                length = int(value)
        if length is None:
            raise ValueError(f"an HTTP response without Content-Length: {status[:80]!r}")
        return length


class RespFramer:
    """Redis (RESP) replies: simple strings, integers, bulk strings (``$-1``
    too); an error reply raises ``ValueError`` with its text, and so does
    any other type (arrays among them)."""

    def __init__(self) -> None:
        self.line = b""  # the start of a reply line whose CRLF has not come yet
        self.bulk_left = 0  # bytes still to come of a bulk string and its CRLF

    def feed(self, data: bytes) -> int:
        done = 0
        pos = 0
        if self.line:
            data = self.line + data
            self.line = b""
        size = len(data)
        while pos < size:
            if self.bulk_left:
                take = min(self.bulk_left, size - pos)
                pos += take
                self.bulk_left -= take
                if not self.bulk_left:
                    done += 1
                continue
            end = data.find(b"\r\n", pos)
            if end < 0:
                if size - pos > MAX_HEAD:
                    raise ValueError(f"a RESP reply line longer than {MAX_HEAD} bytes")
                self.line = data[pos:]
                break
            kind, line = data[pos:pos + 1], data[pos + 1:end]
            pos = end + 2
            if kind in (b"+", b":"):
                done += 1
            elif kind == b"$":
                length = int(line)
                if length < 0:
                    done += 1  # the null bulk string
                else:
                    self.bulk_left = length + 2
            elif kind == b"-":
                raise ValueError(f"the server answered a RESP error: "
                                 f"{line.decode('utf-8', 'replace')}")
            else:
                raise ValueError(f"a RESP reply of type {kind!r}: the open-loop client reads "
                                 "simple strings, integers, bulk strings and errors")
        return done


class Batches:
    """Groups of *n* answers of *framer*, as one: the answers to a request
    that is *n* pipelined ones."""

    def __init__(self, framer: Framer, n: int) -> None:
        if n < 1:
            raise ValueError(f"batches of {n}")
        self.framer = framer
        self.n = n
        self.pending = 0  # answers of the current batch already in

    def feed(self, data: bytes) -> int:
        batches, self.pending = divmod(self.pending + self.framer.feed(data), self.n)
        return batches


def request_bytes(protocol: str, *, request: int = 1024, path: str = "/", body: str = "",
                  pipeline: int = 1) -> bytes:
    """What one request writes: *pipeline* of the protocol's requests."""
    if protocol == "echo":
        one = b"r" * request
    elif protocol == "http":
        one = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    elif protocol == "http-post-json":
        payload = (body or '{"hello": "world"}').encode()
        json.loads(payload)  # a body that is no JSON is a mistake of the command line
        one = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
               ).encode() + payload
    elif protocol == "redis":
        words = [w.encode() for w in (body or "GET key").split()]
        one = f"*{len(words)}\r\n".encode() + b"".join(
            b"$%d\r\n%s\r\n" % (len(w), w) for w in words)
    else:
        raise ValueError(f"protocol {protocol!r}: {', '.join(PROTOCOLS)}")
    return one * pipeline


def framer(protocol: str, *, response: int = 1024, pipeline: int = 1) -> Framer:
    """A new framer of one connection's answers to *protocol*'s requests."""
    one: Framer
    if protocol == "echo":
        one = EchoFramer(response)
    elif protocol in ("http", "http-post-json"):
        one = HttpFramer()
    elif protocol == "redis":
        one = RespFramer()
    else:
        raise ValueError(f"protocol {protocol!r}: {', '.join(PROTOCOLS)}")
    return one if pipeline == 1 else Batches(one, pipeline)


# -- the connections and the pacer ----------------------------------------------


class Meter:
    """The window and what was answered in it, shared by every connection."""

    def __init__(self, hdr: bool | None = None) -> None:
        self.start = math.inf  # the window: requests due in [start, end) count
        self.end = math.inf
        self.closed = False  # closed loop: a connection sends again on each answer
        self.sending = False
        self.outstanding = 0
        self.arrived = 0  # answers that arrived within the window, whenever due
        self.latencies = Recorder(hdr)
        self.lags = Recorder(hdr)
        self.error: BaseException | None = None
        self.drained: asyncio.Future[None] | None = None
        #: Reads of every connection so far: a loop iteration in which it
        #: did not change did no work for the pacer's count of its waiting.
        self.reads = 0

    def answered(self, conn: Connection, due: float, now: float) -> None:
        self.outstanding -= 1
        if self.start <= due < self.end:
            self.latencies.record(now - due)
        if self.start <= now < self.end:
            self.arrived += 1
        if self.closed and self.sending:
            if now < self.end:
                conn.send(now)
            else:
                self.sending = False
        if not self.outstanding and self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """End the window with *exc*: run_window raises it."""
        self.sending = False
        if self.error is None:
            self.error = exc
        if self.drained is not None and not self.drained.done():
            self.drained.set_exception(exc)


class Connection(asyncio.Protocol):
    """One connection: requests in flight in order, each with its due time;
    *framer* says how many answers each read completes."""

    def __init__(self, meter: Meter, request: bytes, framer: Framer,
                 clock: Clock = time.perf_counter) -> None:
        self.meter = meter
        self.request = request
        self.framer = framer
        self.clock = clock
        self.due: collections.deque[float] = collections.deque()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def send(self, due: float) -> None:
        self.due.append(due)
        self.meter.outstanding += 1
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.meter.reads += 1
        try:
            answers = self.framer.feed(data)
        except ValueError as exc:
            self.meter.fail(exc)
            self.transport.close()
            return
        if not answers:
            return
        if answers > len(self.due):
            self.meter.fail(ValueError(f"{answers} answers to {len(self.due)} requests"))
            self.transport.close()
            return
        now = self.clock()
        meter = self.meter
        for _ in range(answers):
            meter.answered(self, self.due.popleft(), now)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.due:
            self.meter.fail(ConnectionError(
                f"the server closed a connection with {len(self.due)} answers owed"))


class Timer(Protocol):
    """What the pacer sleeps on: one deadline at a time, on its clock."""

    def arm(self, deadline: float, callback: Callable[[], None]) -> None:
        """Call *callback* from the loop at *deadline* (at once if it has
        passed), instead of any deadline armed before."""

    def close(self) -> None:
        """Disarm, for good."""


#: The timerfd flags (linux/timerfd.h): TFD_NONBLOCK and TFD_CLOEXEC are
#: O_NONBLOCK and O_CLOEXEC; TFD_TIMER_ABSTIME makes the time absolute.
TFD_TIMER_ABSTIME = 1
TFD_FLAGS = os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
#: ``time.perf_counter`` reads CLOCK_MONOTONIC (CPython on Linux): a
#: deadline on it is a timerfd's absolute time as it is.  Elsewhere the
#: timer is armed with the time left (read from the pacer's clock).
PERF_COUNTER_IS_MONOTONIC = (time.get_clock_info("perf_counter").implementation
                             == "clock_gettime(CLOCK_MONOTONIC)")


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


#: timerfd_create(clockid, flags) -> fd and settime(fd, absolute, ns): a
#: backend of :class:`TimerFd`.
TimerFdApi = tuple[Callable[[int, int], int], Callable[[int, bool, int], None]]


def _os_timerfd() -> TimerFdApi:
    """The timerfd of the os module (Python 3.13+ on Linux)."""
    if not hasattr(os, "timerfd_create"):
        raise AttributeError("not in this Python's os module (3.13+ on Linux)")

    def settime(fd: int, absolute: bool, ns: int) -> None:
        os.timerfd_settime_ns(fd, flags=TFD_TIMER_ABSTIME if absolute else 0, initial=ns)

    def create(clockid: int, flags: int) -> int:
        return os.timerfd_create(clockid, flags=flags)

    return create, settime


def _libc_timerfd() -> TimerFdApi:
    """libc's timerfd_create and timerfd_settime through ctypes (Linux,
    Pythons before 3.13, PyPy).  ``struct timespec`` as two longs: time_t
    is a long on the 64-bit ABIs, and the 32-bit ones' classic symbols
    take a 32-bit time_t."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    c_create, c_settime = libc.timerfd_create, libc.timerfd_settime
    c_create.argtypes, c_create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    c_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                          ctypes.c_void_p]
    c_settime.restype = ctypes.c_int
    spec = _Itimerspec()

    def create(clockid: int, flags: int) -> int:
        fd = c_create(clockid, flags)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        return int(fd)

    def settime(fd: int, absolute: bool, ns: int) -> None:
        spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(ns, 1_000_000_000)
        if c_settime(fd, TFD_TIMER_ABSTIME if absolute else 0, ctypes.byref(spec), None) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    return create, settime


def timer_backend() -> tuple[TimerFdApi | None, str]:
    """The timerfd this process can use and its name (``os.timerfd_create``,
    ``libc timerfd_create via ctypes``), or None and why not: the pacer
    then spins."""
    reasons = []
    for name, make in (("os.timerfd_create", _os_timerfd),
                       ("libc timerfd_create via ctypes", _libc_timerfd)):
        try:
            api = make()
            os.close(api[0](time.CLOCK_MONOTONIC, TFD_FLAGS))  # it works here
        except (OSError, AttributeError, TypeError) as exc:
            reasons.append(f"{name}: {exc}")
            continue
        return api, name
    return None, "; ".join(reasons)


class TimerFd:
    """A :class:`Timer` on a timerfd of CLOCK_MONOTONIC, watched by
    *loop*'s ``add_reader``: the loop sleeps in its poller until the
    deadline, to the nanosecond (the loop's own timers round to the
    millisecond).  *clock* is the deadlines' clock: ``time.perf_counter``
    where it reads CLOCK_MONOTONIC, armed at the absolute time; any other,
    armed with the time left on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, api: TimerFdApi,
                 clock: Clock = time.perf_counter) -> None:
        create, self.settime = api
        self.loop = loop
        self.clock = clock
        self.absolute = clock is time.perf_counter and PERF_COUNTER_IS_MONOTONIC
        self.callback: Callable[[], None] | None = None
        self.fd = create(time.CLOCK_MONOTONIC, TFD_FLAGS)
        loop.add_reader(self.fd, self._fired)

    def arm(self, deadline: float, callback: Callable[[], None]) -> None:
        self.callback = callback
        at = deadline if self.absolute else deadline - self.clock()
        # 0 would disarm it: a deadline passed fires at once at 1 ns.
        self.settime(self.fd, self.absolute, max(1, round(at * 1e9)))

    def _fired(self) -> None:
        try:
            os.read(self.fd, 8)  # the expirations: reading them clears the fd
        except BlockingIOError:
            return  # re-armed since it became readable
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
        self.callback = None


class Pacer:
    """Sends each request of *schedule* at its due time, round robin over
    *conns*, and records each one's lag (only those due in the window).

    Called, it makes a pass: it sends what is due, then, when no answer is
    owed and the next due time less the lead (:data:`WAKE_LEAD` at first,
    then learnt: :meth:`woke`, :meth:`forget`) is still ahead, arms *timer* for then; else
    it queues itself again with *call_soon* (it spins).  Without a timer
    it always spins.  ``waited`` sums the CPU time (*cpu_clock*, this
    thread's) it spun through loop iterations in which no connection read
    (the module's theory of operation)."""

    def __init__(self, meter: Meter, conns: list[Connection], schedule: Schedule,
                 clock: Clock = time.perf_counter, timer: Timer | None = None,
                 call_soon: Callable[[Callable[[], None]], object] | None = None,
                 lead: float = WAKE_LEAD, cpu_clock: Clock = time.thread_time) -> None:
        self.meter = meter
        self.conns = conns
        self.schedule = schedule
        self.clock = clock
        self.cpu_clock = cpu_clock
        self.timer = timer
        self.call_soon = call_soon
        self.lead = lead
        self.sent = 0
        self.next_due = next(schedule)
        self.armed: float | None = None  # the timer's deadline while it is armed
        self.spinning = False  # set when the last pass queued the next with call_soon
        self.waited = 0.0  # CPU seconds, on cpu_clock
        self.idle_since = 0.0  # cpu_clock when the last spinning pass's own work ended
        self.reads_seen = 0  # meter.reads then

    @property
    def mode(self) -> str:
        """``timerfd`` (sleeps on a timer while nothing is owed and the
        next request is far) or ``spin`` (queues itself every iteration)."""
        return "spin" if self.timer is None else "timerfd"

    def pump(self) -> bool:
        """Send every request due by now; False once sending is over (the
        window's end reached, or the meter stopped)."""
        meter = self.meter
        if not meter.sending:
            return False
        clock = self.clock
        conns = self.conns
        while self.next_due <= clock():
            due = self.next_due
            if due >= meter.end:
                meter.sending = False
                return False
            conns[self.sent % len(conns)].send(due)
            if due >= meter.start:
                meter.lags.record(clock() - due)
            self.sent += 1
            self.next_due = next(self.schedule)
        return True

    def wait(self) -> str:
        """Wake for the next request: arm the timer at its due time less
        the lead where that is ahead and no answer is owed (``timer``),
        else queue the next pass (``spin``); which it did.  While answers
        are owed it spins, so that it reads each as soon as it is in, as
        the pacer that only spins does: a client asleep would add its own
        wake-up (the lateness above) to every latency it measures."""
        wake = self.next_due - self.lead
        if self.timer is not None and not self.meter.outstanding and wake > self.clock():
            self.timer.arm(wake, self)
            self.armed = wake
            self.spinning = False
            return "timer"
        call_soon = self.call_soon or asyncio.get_running_loop().call_soon
        call_soon(self)
        self.spinning = True
        return "spin"

    def woke(self, late: float) -> None:
        """The timer fired *late* seconds after its deadline: the lead is
        at least that and :data:`LEAD_MARGIN` more, up to :data:`MAX_LEAD`
        (a wake-up later than that, a host's stall, is the lag's to show,
        not a reason to spin for a millisecond per request)."""
        self.lead = min(max(self.lead, late + LEAD_MARGIN), MAX_LEAD)

    def forget(self, sent: int) -> None:
        """*sent* requests went out: the lead loses :data:`LEAD_DECAY` of
        itself per request, down to :data:`MIN_LEAD`."""
        self.lead = max(self.lead * (1 - LEAD_DECAY) ** sent, MIN_LEAD)

    def __call__(self) -> None:
        spun = self.spinning
        if spun:
            cpu = self.cpu_clock()
            if self.meter.reads == self.reads_seen:
                self.waited += cpu - self.idle_since  # an iteration of nothing but spinning
        if self.armed is not None:
            self.woke(self.clock() - self.armed)
            self.armed = None
        sent = self.sent
        more = self.pump()
        if self.sent != sent:
            self.forget(self.sent - sent)
        if more:
            self.wait()
        else:
            self.spinning = False
        if self.spinning:
            self.reads_seen = self.meter.reads
            # A spinning pass that sent nothing was waiting too.
            self.idle_since = cpu if spun and self.sent == sent else self.cpu_clock()


def cpu_seconds() -> float:
    """This process's user and system CPU time so far, every thread's."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_window(conns: list[Connection], command: str, warmup: float, duration: float,
                     commands: asyncio.Queue[str], arrivals: str = "constant",
                     seed: int = 0, timerfd: TimerFdApi | None = None) -> dict[str, Any]:
    """One window of *command* (``closed`` or ``open RATE``) on *conns*, which
    have nothing in flight: warm-up, ready, ``go``, the measured window,
    every answer back; the window's figures.  The open window's pacer
    sleeps on a :class:`TimerFd` of *timerfd* (:func:`timer_backend`), or
    spins without one."""
    loop = asyncio.get_running_loop()
    meter = Meter()
    for conn in conns:
        conn.meter = meter
    meter.sending = True
    pacer = None
    kind, _, rate = command.partition(" ")
    if kind == "closed":
        meter.closed = True
        now = time.perf_counter()
        for conn in conns:
            conn.send(now)
    elif kind == "open" and float(rate) > 0:
        schedule = Schedule(float(rate), time.perf_counter(), arrivals, seed)
        timer = TimerFd(loop, timerfd) if timerfd is not None else None
        pacer = Pacer(meter, conns, schedule, timer=timer, call_soon=loop.call_soon)
        loop.call_soon(pacer)
    else:
        raise ValueError(f"unknown command {command!r}: closed, or open RATE")
    try:
        return await _measure(meter, pacer, command, warmup, duration, commands)
    finally:
        if pacer is not None and pacer.timer is not None:
            pacer.timer.close()


async def _measure(meter: Meter, pacer: Pacer | None, command: str, warmup: float,
                   duration: float, commands: asyncio.Queue[str]) -> dict[str, Any]:
    """run_window's warm-up, measured window and drain, its load under way."""
    await asyncio.sleep(warmup)
    if meter.error is not None:
        raise meter.error
    print(json.dumps({"ready": True}), flush=True)
    if (await commands.get()) != "go":
        raise ValueError("expected go")
    cpu = cpu_seconds()
    waited = pacer.waited if pacer is not None else 0.0
    meter.start = time.perf_counter()
    meter.end = meter.start + duration
    await asyncio.sleep(duration)
    elapsed = time.perf_counter() - meter.start
    client_cpu = (cpu_seconds() - cpu) / elapsed
    pacer_wait = (pacer.waited - waited) / elapsed if pacer is not None else 0.0
    meter.sending = False
    meter.drained = asyncio.get_running_loop().create_future()
    if meter.error is not None:
        raise meter.error
    if meter.outstanding:
        await asyncio.wait_for(meter.drained, DRAIN_TIMEOUT)
    if not meter.latencies.count:
        raise RuntimeError(f"{command}: no request answered in the measured window")
    out: dict[str, Any] = {"requests": meter.latencies.count, "elapsed": duration,
                           **meter.latencies.figures(),
                           "achieved_rate": meter.arrived / duration, "client_cpu": client_cpu,
                           # (getrusage's CPU time can pass the window's wall time
                           # by microseconds: a client busy throughout has none left)
                           "client_headroom": max(0.0, 1 - (client_cpu - pacer_wait))}
    if pacer is not None:
        out["pacer"] = pacer.mode
        out["pacer_wait"] = pacer_wait
    if meter.lags.count:
        lag = meter.lags.figures("lag_")
        out["lag_p99_us"] = lag["lag_p99_us"]
        out["lag_max_us"] = lag["lag_max_us"]
    return out


async def run(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[str] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(commands.put_nowait, line.strip())
        loop.call_soon_threadsafe(commands.put_nowait, "")

    threading.Thread(target=read, daemon=True).start()
    port = int(await commands.get())
    request = request_bytes(args.protocol, request=args.request, path=args.path,
                            body=args.body, pipeline=args.pipeline)
    options = _tls_options(args.tls)
    conns = []
    for _ in range(args.concurrency):
        _, conn = await loop.create_connection(
            lambda: Connection(Meter(), request, framer(args.protocol, response=args.response,
                                                        pipeline=args.pipeline)),
            "127.0.0.1", port, **options)
        conns.append(conn)
    what = args.protocol + (f" x{args.pipeline}" if args.pipeline > 1 else "")
    timerfd, how = timer_backend()
    pacer = (f"pacer on a timerfd ({how})" if timerfd is not None
             else f"pacer spinning (no timerfd: {how})")
    print(json.dumps({"client": f"builtin open loop, one process ({loops.client_loop()[0]}), "
                      f"{what}{', TLS 1.3' if args.tls else ''}, {args.arrivals} arrivals, "
                      f"latencies in {Recorder().kind}, {pacer}",
                      "connections": len(conns)}), flush=True)
    while command := await commands.get():
        result = await run_window(conns, command, args.warmup, args.duration, commands,
                                  args.arrivals, args.seed, timerfd)
        print(json.dumps(result), flush=True)
    for conn in conns:
        conn.transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="the open-loop load generator")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--protocol", choices=PROTOCOLS, default="echo")
    parser.add_argument("--request", type=int, default=1024, help="echo: bytes per request")
    parser.add_argument("--response", type=int, default=1024, help="echo: bytes per answer")
    parser.add_argument("--path", default="/", help="http, http-post-json: the request's path")
    parser.add_argument("--body", default="",
                        help='http-post-json: the JSON body ({"hello": "world"}); redis: the '
                             "command, words split on spaces (GET key)")
    parser.add_argument("--pipeline", type=int, default=1,
                        help="requests of the protocol written as one, answered as one (1)")
    parser.add_argument("--arrivals", choices=ARRIVALS, default="constant")
    parser.add_argument("--seed", type=int, default=1, help="poisson: the gaps' seed (1)")
    parser.add_argument("--tls", action="store_true", help="over TLS 1.3")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=1.0)
    args = parser.parse_args()
    if args.pipeline < 1:
        parser.error("--pipeline must be 1 or more")
    loop = loops.client_loop()[1]()
    try:
        loop.run_until_complete(run(args))
    finally:
        loop.close()


if __name__ == "__main__":
    main()
