"""The open-loop load generator (benchmarks.workloads.openloop) without
sockets: its schedule of due times, the pacer and connections on a clock
driven by hand (coordinated omission), the latency recorder, each
protocol's answer framer, and the runner's plan for loads set from another
loop's capacity; then one smoke run through the command line.  No timing
assertions."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.workloads import catalog, openloop, runner
from benchmarks.workloads.catalog import WORKLOADS

ROOT = Path(__file__).resolve().parent.parent

# -- the schedule -------------------------------------------------------------------


def test_constant_arrivals_are_due_at_exact_times() -> None:
    due = list(itertools.islice(openloop.Schedule(4.0, 10.0), 6))
    assert due == [10.0, 10.25, 10.5, 10.75, 11.0, 11.25]
    # From the index, not summed gaps: request 10**6 is where it should be.
    schedule = openloop.Schedule(3.0, 0.0)
    far = list(itertools.islice(schedule, 3_000_001))[-1]
    assert far == 1_000_000.0


def test_the_schedule_refuses_what_it_cannot_pace() -> None:
    with pytest.raises(ValueError, match="above 0"):
        openloop.Schedule(0.0, 0.0)
    with pytest.raises(ValueError, match="constant, poisson"):
        openloop.Schedule(1.0, 0.0, "bursty")


def test_poisson_arrivals_are_seeded_with_mean_gap_one_over_rate() -> None:
    rate, n = 2000.0, 20_000
    due = list(itertools.islice(openloop.Schedule(rate, 5.0, "poisson", seed=7), n + 1))
    assert due[0] == 5.0
    gaps = [b - a for a, b in itertools.pairwise(due)]
    assert all(g >= 0 for g in gaps)
    # Exponential gaps: the standard deviation equals the mean 1/rate, so the
    # mean of n gaps is within 5 standard errors (1/rate/sqrt(n)) of it, and
    # their standard deviation (standard error about sqrt(2/n)/rate) too;
    # constant gaps would have none.
    mean = 1 / rate
    assert statistics.fmean(gaps) == pytest.approx(mean, abs=5 * mean / math.sqrt(n))
    assert statistics.stdev(gaps) == pytest.approx(mean, abs=5 * mean * math.sqrt(2 / n))
    # The same seed, the same gaps (every loop of a run gets them); another, others.
    again = list(itertools.islice(openloop.Schedule(rate, 5.0, "poisson", seed=7), n + 1))
    assert again == due
    other = list(itertools.islice(openloop.Schedule(rate, 5.0, "poisson", seed=8), 10))
    assert other != due[:10]


# -- coordinated omission -----------------------------------------------------------


class _Clock:
    """A clock the test sets."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True


def _connections(meter: openloop.Meter, clock: _Clock, n: int) -> list[openloop.Connection]:
    conns = []
    for _ in range(n):
        conn = openloop.Connection(meter, b"q", openloop.EchoFramer(1), clock)
        conn.connection_made(_Transport())
        conns.append(conn)
    return conns


def _answer_all(conns: list[openloop.Connection]) -> None:
    """The server answers everything in flight, now."""
    for conn in conns:
        if conn.due:
            conn.data_received(b"a" * len(conn.due))


@pytest.mark.parametrize("stalled", ["client", "server"])
def test_a_stall_is_charged_to_every_request_due_during_it(stalled: str) -> None:
    """1,000 requests/s; for 100 ms either the client does not run (its
    pacer sends the requests due meanwhile late, at once) or the server does
    not answer.  Either way each request due during the stall counts from
    its due time: the one due at 0 waited the whole stall, and the median
    request half of it, not the few µs a closed loop would see."""
    clock = _Clock()
    meter = openloop.Meter(hdr=False)
    meter.start, meter.end, meter.sending = 0.0, 1.0, True
    conns = _connections(meter, clock, 3)
    pacer = openloop.Pacer(meter, conns, openloop.Schedule(1000.0, 0.0), clock)
    if stalled == "client":
        assert pacer.pump()
        clock.now = 0.1  # the client's next pass comes 100 ms late
        assert pacer.pump()
    else:
        for ms in range(101):  # the client sends on time, nothing is answered
            clock.now = ms / 1000
            assert pacer.pump()
    assert pacer.sent == 101 and meter.outstanding == 101
    _answer_all(conns)
    assert meter.outstanding == 0
    latencies = sorted(meter.latencies.values)
    assert latencies == pytest.approx(sorted(0.1 - i / 1000 for i in range(101)))
    assert meter.latencies.max == pytest.approx(0.1)
    assert meter.latencies.percentiles(50) == [pytest.approx(0.05)]
    # The lag says whose stall it was: the client's own lateness in sending
    # (the request due at 0.001 went out at 0.1).
    lag_max = meter.lags.max
    assert lag_max == (pytest.approx(0.099) if stalled == "client" else 0.0)


def test_the_pacer_stops_at_the_window_end_and_counts_only_its_requests() -> None:
    clock = _Clock()
    meter = openloop.Meter(hdr=False)
    meter.start, meter.end, meter.sending = 0.01, 0.02, True
    conns = _connections(meter, clock, 2)
    pacer = openloop.Pacer(meter, conns, openloop.Schedule(1000.0, 0.0), clock)
    clock.now = 0.05
    assert not pacer.pump() and not meter.sending
    assert pacer.sent == 20  # due 0 .. 0.019; the one due at 0.02 is the window's end
    assert [len(c.transport.writes) for c in conns] == [10, 10]  # round robin
    assert meter.lags.count == 10  # due in [0.01, 0.02)
    _answer_all(conns)
    assert meter.latencies.count == 10
    assert meter.arrived == 0  # answered after the window: not in the achieved rate


def test_a_connection_matches_pipelined_answers_to_their_due_times() -> None:
    clock = _Clock()
    meter = openloop.Meter(hdr=False)
    meter.start, meter.end = 10.0, 20.0
    conn = openloop.Connection(meter, b"r" * 4, openloop.EchoFramer(4), clock)
    conn.connection_made(_Transport())
    for due in (9.0, 10.0, 11.0):  # the first was due before the window
        conn.send(due)
    clock.now = 12.0
    conn.data_received(b"rr")  # half an answer: nothing is done
    assert meter.outstanding == 3
    conn.data_received(b"rrrrrr")  # the rest of the first, all of the second
    clock.now = 12.5
    conn.data_received(b"rrrr")
    assert meter.outstanding == 0 and not conn.due
    assert meter.latencies.values == [2.0, 1.5]  # only those due in the window
    assert meter.arrived == 3


def test_an_answer_the_framer_refuses_fails_the_window() -> None:
    meter = openloop.Meter(hdr=False)
    conn = openloop.Connection(meter, b"GET", openloop.HttpFramer())
    transport = _Transport()
    conn.connection_made(transport)
    conn.send(0.0)
    conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert isinstance(meter.error, ValueError) and transport.closed
    assert not meter.sending
    # More answers than requests is no server this client can measure.
    meter = openloop.Meter(hdr=False)
    conn = openloop.Connection(meter, b"r", openloop.EchoFramer(1))
    conn.connection_made(_Transport())
    conn.send(0.0)
    conn.data_received(b"rr")
    assert isinstance(meter.error, ValueError)


# -- the pacer's wait: a timer while nothing is owed, else spinning --------------------


class _Timer:
    """A timer that records what it was armed for; the test fires it."""

    def __init__(self) -> None:
        self.armed: list[float] = []
        self.callback: Callable[[], None] | None = None

    def arm(self, deadline: float, callback: Callable[[], None]) -> None:
        self.armed.append(deadline)
        self.callback = callback

    def close(self) -> None:
        self.callback = None


def _pacer(rate: float, timer: _Timer | None) -> tuple[openloop.Pacer, _Clock, list[Any]]:
    """A pacer of *rate* requests/s from time 0 in an open window, on a
    clock, a timer and a call_soon driven by hand; the callbacks queued."""
    clock = _Clock()
    meter = openloop.Meter(hdr=False)
    meter.start, meter.end, meter.sending = 0.0, 10.0, True
    queued: list[Any] = []
    # (its CPU clock is the same clock: the process runs through the test)
    pacer = openloop.Pacer(meter, _connections(meter, clock, 2),
                           openloop.Schedule(rate, 0.0), clock, timer, queued.append,
                           cpu_clock=clock)
    return pacer, clock, queued


def test_the_pacer_sleeps_on_the_timer_until_the_lead_before_the_next_request() -> None:
    timer = _Timer()
    pacer, clock, queued = _pacer(100.0, timer)  # one every 10 ms
    assert pacer.mode == "timerfd" and pacer.lead == openloop.WAKE_LEAD
    pacer()  # request 0 goes out; its answer is owed: spin, to read it at once
    assert pacer.sent == 1 and queued == [pacer] and timer.armed == []
    clock.now = 0.0001
    _answer_all(pacer.conns)
    queued.clear()
    pacer()  # nothing owed, the next due in 9.9 ms: the timer, armed the lead before it
    assert queued == [] and timer.armed == [pytest.approx(0.01 - pacer.lead)]
    assert pacer.sent == 1 and not pacer.spinning
    # The timer fires on time: the rest of the lead is spun through, and the
    # request goes out at its due time, not a wake-up's latency after it.
    clock.now = timer.armed[-1]
    assert timer.callback is pacer
    pacer()
    assert queued == [pacer] and pacer.sent == 1
    clock.now = 0.01
    pacer()
    assert pacer.sent == 2 and pacer.meter.lags.values[-1] == 0.0
    assert len(timer.armed) == 1  # and its answer is owed: spinning


def test_the_pacer_spins_to_a_request_due_within_the_lead() -> None:
    timer = _Timer()
    pacer, clock, queued = _pacer(10_000.0, timer)  # one every 100 µs, less than the lead
    for step in range(1, 6):
        pacer()
        _answer_all(pacer.conns)  # nothing owed: only the next request's nearness decides
        clock.now = step * 50e-6
    assert timer.armed == [] and queued == [pacer] * 5 and pacer.sent == 3


def test_without_a_timer_the_pacer_spins() -> None:
    pacer, clock, queued = _pacer(100.0, None)
    assert pacer.mode == "spin"
    pacer()
    _answer_all(pacer.conns)
    clock.now = 0.001  # nothing owed, the next request 9 ms ahead: a timer would sleep
    assert pacer.wait() == "spin" and pacer.spinning and queued == [pacer, pacer]


def test_the_lead_follows_the_timers_lateness() -> None:
    timer = _Timer()
    pacer, clock, _ = _pacer(100.0, timer)
    pacer()
    _answer_all(pacer.conns)
    pacer()
    # (the lead lost 1/64 of itself for request 0)
    assert timer.armed == [pytest.approx(0.01 - openloop.WAKE_LEAD * (1 - openloop.LEAD_DECAY))]
    clock.now = timer.armed[-1] + 300e-6  # it woke 300 µs late, after the due time
    pacer()
    assert pacer.sent == 2 and pacer.meter.lags.values[-1] == pytest.approx(clock.now - 0.01)
    # The lead became that lateness and a margin, less 1/64 of it for the
    # request sent.
    assert pacer.lead == pytest.approx((300e-6 + openloop.LEAD_MARGIN)
                                       * (1 - openloop.LEAD_DECAY))
    _answer_all(pacer.conns)
    pacer()
    assert timer.armed[-1] == pytest.approx(0.02 - pacer.lead)
    pacer.forget(10_000)
    assert pacer.lead == openloop.MIN_LEAD
    pacer.woke(1.0)  # a host's stall of a second: no second of spinning per request
    assert pacer.lead == openloop.MAX_LEAD


def test_the_pacer_counts_as_waiting_only_spinning_iterations_without_reads() -> None:
    timer = _Timer()
    pacer, clock, _ = _pacer(1000.0, timer)
    clock.now = 0.0
    pacer()  # sends request 0 (its work is not waiting), spins while it is owed
    assert pacer.waited == 0.0
    clock.now = 0.0002
    pacer()  # an iteration of nothing but polling: 200 µs of waiting
    assert pacer.waited == pytest.approx(0.0002)
    clock.now = 0.0003
    _answer_all(pacer.conns)  # the answer is read in this iteration: work
    clock.now = 0.0004
    pacer()
    assert pacer.waited == pytest.approx(0.0002)
    # Nothing owed, the next due in 600 µs: asleep on the timer, not waiting.
    assert timer.armed and not pacer.spinning
    clock.now = timer.armed[-1]
    pacer()  # woken: spins through the lead, counted from the wake-up
    clock.now = 0.001
    pacer()
    assert pacer.waited == pytest.approx(0.0002 + (0.001 - timer.armed[-1]))


class _FakeApi:
    """A timerfd backend that records its calls."""

    def __init__(self) -> None:
        self.settimes: list[tuple[int, bool, int]] = []

    def create(self, clockid: int, flags: int) -> int:
        assert clockid == openloop.time.CLOCK_MONOTONIC
        return openloop.os.open(openloop.os.devnull, openloop.os.O_RDONLY)

    def settime(self, fd: int, absolute: bool, ns: int) -> None:
        self.settimes.append((fd, absolute, ns))


def test_the_timerfd_is_armed_at_the_deadline_on_perf_counters_clock() -> None:
    # perf_counter is CLOCK_MONOTONIC (CPython on Linux): the deadline is
    # the timerfd's absolute time as it is, in nanoseconds.
    if sys.platform == "linux" and sys.implementation.name == "cpython":
        assert openloop.PERF_COUNTER_IS_MONOTONIC
    api = _FakeApi()

    class Loop:
        def __init__(self) -> None:
            self.readers: dict[int, Any] = {}

        def add_reader(self, fd: int, callback: Any) -> None:
            self.readers[fd] = callback

        def remove_reader(self, fd: int) -> None:
            del self.readers[fd]

    loop = Loop()
    timer = openloop.TimerFd(loop, (api.create, api.settime))  # type: ignore[arg-type]
    fd = timer.fd
    assert loop.readers == {fd: timer._fired}
    timer.arm(12345.000678901, lambda: None)
    assert api.settimes == [(fd, openloop.PERF_COUNTER_IS_MONOTONIC,
                             12345_000678901 if openloop.PERF_COUNTER_IS_MONOTONIC else 1)]
    timer.close()
    assert loop.readers == {} and timer.fd == -1
    # Another clock: armed with the time left on it.
    clock = _Clock()
    clock.now = 5.0
    relative = openloop.TimerFd(Loop(), (api.create, api.settime), clock)  # type: ignore[arg-type]
    relative.arm(5.25, lambda: None)
    assert api.settimes[-1][1:] == (False, 250_000_000)
    relative.close()


@pytest.mark.skipif(sys.platform != "linux", reason="timerfd is Linux's")
@pytest.mark.parametrize("backend", ["os", "libc"])
@pytest.mark.timeout(10)
def test_a_real_timerfd_wakes_the_loop_at_its_deadline(backend: str) -> None:
    """Each backend's timerfd, watched by the stock loop, calls back once
    its deadline has passed (on perf_counter's clock), and not before."""
    if backend == "os" and not hasattr(openloop.os, "timerfd_create"):
        pytest.skip("os.timerfd_create is Python 3.13+'s")
    api = openloop._os_timerfd() if backend == "os" else openloop._libc_timerfd()

    async def main() -> float:
        loop = asyncio.get_running_loop()
        timer = openloop.TimerFd(loop, api)
        fired: asyncio.Future[float] = loop.create_future()
        deadline = time.perf_counter() + 0.002
        timer.arm(deadline, lambda: fired.set_result(time.perf_counter()))
        try:
            return await asyncio.wait_for(fired, 5) - deadline
        finally:
            timer.close()

    assert asyncio.run(main()) >= 0


def test_the_timer_backend_says_which_or_why_none() -> None:
    api, how = openloop.timer_backend()
    if sys.platform != "linux":
        assert api is None and how
    elif hasattr(openloop.os, "timerfd_create"):
        assert api is not None and how == "os.timerfd_create"
    else:
        assert api is not None and how == "libc timerfd_create via ctypes"


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


@pytest.mark.timeout(20)
def test_an_open_window_at_a_low_rate_leaves_the_client_idle() -> None:
    """0.6 s at 200 requests/s, after 0.3 s of warm-up, against an echo
    server on the same stock loop: the client sleeps between requests, so
    the pacer's idle spinning is a small part of a CPU, not the spinning
    pacer's nearly all of one (0.97 with no timer), and so is the client's
    CPU use, the server's included.  Behaviour, not speed: a fifth of a CPU
    of spinning, half of one in all, for 120 echoes of 1 KiB.  (What the
    bounds leave: CPython's client at 0.08-0.09 of a CPU, spinning 0.02-0.03;
    a fresh PyPy's, compiling as it goes, at 0.20-0.31, spinning 0.07-0.08.)"""
    api, how = openloop.timer_backend()
    if api is None:
        pytest.skip(f"no timerfd here ({how}): the pacer spins")

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conns = []
        for _ in range(4):
            _, conn = await loop.create_connection(
                lambda: openloop.Connection(openloop.Meter(), b"r" * 1024,
                                            openloop.EchoFramer(1024)), "127.0.0.1", port)
            conns.append(conn)
        commands: asyncio.Queue[str] = asyncio.Queue()
        commands.put_nowait("go")
        try:
            return await openloop.run_window(conns, "open 200", 0.3, 0.6, commands,
                                              timerfd=api)
        finally:
            for conn in conns:
                conn.transport.close()
            server.close()

    result = asyncio.run(main())
    assert result["pacer"] == "timerfd" and result["requests"] == 120
    assert 0 <= result["pacer_wait"] < 0.2
    assert result["pacer_wait"] <= result["client_cpu"] < 0.5
    assert result["client_headroom"] == pytest.approx(
        1 - (result["client_cpu"] - result["pacer_wait"]))


# -- the recorder -------------------------------------------------------------------


def _us(values: list[float]) -> list[float]:
    return [v * 1e6 for v in values]


def test_exact_percentiles_without_the_histogram() -> None:
    rec = openloop.Recorder(hdr=False)
    assert rec.kind == "exact"
    for us in range(1000, 0, -1):  # 1..1000 µs, unsorted
        rec.record(us / 1e6)
    assert _us(rec.percentiles(50, 99, 99.9)) == [pytest.approx(500.5), pytest.approx(990.01),
                                                   pytest.approx(999.001)]
    figures = rec.figures("lag_")
    spectrum = figures.pop("lag_spectrum_us")
    assert figures == {"lag_p50_us": pytest.approx(500.5), "lag_p99_us": pytest.approx(990.01),
                       "lag_p999_us": pytest.approx(999.001), "lag_max_us": pytest.approx(1000)}
    # The distribution: each percentile 1,000 values resolve (99.9 %: one
    # value above it; not 99.95 %), then the maximum.
    assert [q for q, _ in spectrum] == [50, 75, 90, 95, 99, 99.5, 99.9, 100]
    assert spectrum[0][1] == pytest.approx(500.5) and spectrum[-1][1] == pytest.approx(1000)
    assert [v for _, v in spectrum] == sorted(v for _, v in spectrum)
    with pytest.raises(ValueError):
        openloop.Recorder(hdr=False).percentiles(50)


def test_hdr_histogram_percentiles_within_its_precision() -> None:
    if openloop.HdrHistogram is None:
        pytest.skip("hdrhistogram is not installed (the bench extra has it on CPython)")
    rec = openloop.Recorder()
    assert rec.kind == "HdrHistogram"
    for us in range(1, 100_001):  # 1 µs .. 100 ms
        rec.record(us / 1e6)
    # 3 significant digits: within 0.1 % of the value at that rank.
    p50, p99, p999 = _us(rec.percentiles(50, 99, 99.9))
    assert p50 == pytest.approx(50_000, rel=1e-3)
    assert p99 == pytest.approx(99_000, rel=1e-3)
    assert p999 == pytest.approx(99_900, rel=1e-3)
    assert rec.max == pytest.approx(0.1) and rec.count == 100_000
    # Outside 1 µs .. 60 s: recorded at the bound; the maximum stays exact.
    rec.record(0.0)
    rec.record(100.0)
    assert rec.count == 100_002 and rec.max == 100.0
    assert rec.histogram is not None and rec.histogram.get_max_value() >= 59_000_000
    # A bucket's highest equivalent value (about 100,031 µs here) is no
    # percentile beyond the largest value recorded.
    one = openloop.Recorder()
    one.record(0.1000004)
    assert one.percentiles(50, 99.9) == [0.1000004, 0.1000004]


def test_the_recorder_says_which_it_used() -> None:
    assert openloop.Recorder().kind == ("HdrHistogram" if openloop.HdrHistogram else "exact")
    if openloop.HdrHistogram is None:
        with pytest.raises(RuntimeError, match="pip install hdrhistogram"):
            openloop.Recorder(hdr=True)


# -- the framers --------------------------------------------------------------------


def _every_split(make: Callable[[], openloop.Framer], stream: bytes, answers: int) -> None:
    """*stream* gives *answers* answers in one read, in two reads split at
    every byte boundary, and a byte at a time."""
    assert make().feed(stream) == answers
    for cut in range(len(stream) + 1):
        framer = make()
        got = framer.feed(stream[:cut])
        assert got + framer.feed(stream[cut:]) == answers, cut
    framer = make()
    assert sum(framer.feed(stream[i:i + 1]) for i in range(len(stream))) == answers


def test_echo_framer_counts_fixed_size_answers() -> None:
    _every_split(lambda: openloop.EchoFramer(4), b"abcd" * 3, 3)
    framer = openloop.EchoFramer(4)
    assert framer.feed(b"abcdab") == 1 and framer.feed(b"cd") == 1


HTTP_OK = (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"
           b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
           # A body that looks like the end of a head is counted, not searched.
           b"HTTP/1.1 204 OK\r\nServer: x\r\nContent-Length:8\r\n\r\n\r\n\r\n\r\n\r\n")


def test_http_framer_delimits_responses_by_content_length() -> None:
    _every_split(openloop.HttpFramer, HTTP_OK, 3)
    framer = openloop.HttpFramer()
    assert framer.feed(HTTP_OK[:-1]) == 2 and framer.body_left == 1
    assert framer.feed(HTTP_OK[-1:]) == 1 and not framer.head and not framer.body_left


@pytest.mark.parametrize(("head", "match"), [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
     "chunked"),
    (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", "2xx"),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", "without Content-Length"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "2xx"),
])
def test_http_framer_fails_loudly_on_what_it_cannot_delimit(head: bytes, match: str) -> None:
    for cut in range(len(head) + 1):
        framer = openloop.HttpFramer()
        with pytest.raises(ValueError, match=match):
            framer.feed(HTTP_OK + head[:cut])
            framer.feed(head[cut:])


RESP = b"+OK\r\n$5\r\nhello\r\n$-1\r\n:42\r\n$0\r\n\r\n$4\r\n\r\n\r\n\r\n:-1\r\n"


def test_resp_framer_counts_replies_of_each_type() -> None:
    _every_split(openloop.RespFramer, RESP, 7)


@pytest.mark.parametrize(("reply", "match"), [
    (b"-ERR unknown command 'GTE'\r\n", "ERR unknown command 'GTE'"),
    (b"*1\r\n$1\r\na\r\n", "type b'\\*'"),
])
def test_resp_framer_fails_loudly_on_errors_and_arrays(reply: bytes, match: str) -> None:
    for cut in range(len(reply) + 1):
        framer = openloop.RespFramer()
        with pytest.raises(ValueError, match=match):
            framer.feed(RESP + reply[:cut])
            framer.feed(reply[cut:])


def test_pipelined_requests_are_answered_as_one() -> None:
    _every_split(lambda: openloop.framer("redis", pipeline=7), RESP * 3, 3)
    _every_split(lambda: openloop.framer("http", pipeline=3), HTTP_OK * 2, 2)
    _every_split(lambda: openloop.framer("echo", response=2, pipeline=2), b"ab" * 6, 3)
    assert isinstance(openloop.framer("http-post-json"), openloop.HttpFramer)
    with pytest.raises(ValueError, match="protocol"):
        openloop.framer("smtp")


def test_each_protocol_writes_its_request() -> None:
    assert openloop.request_bytes("echo", request=3) == b"rrr"
    assert openloop.request_bytes("http", path="/x") == (
        b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    post = openloop.request_bytes("http-post-json", path="/j", body='{"a": [1, 2]}')
    head, _, body = post.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /j HTTP/1.1\r\n") and body == b'{"a": [1, 2]}'
    assert b"Content-Length: 13" in head and b"Content-Type: application/json" in head
    with pytest.raises(ValueError):
        openloop.request_bytes("http-post-json", body="{not json")
    get = b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n"
    assert openloop.request_bytes("redis") == get
    assert openloop.request_bytes("redis", pipeline=3) == get * 3
    assert openloop.request_bytes("redis", body="SET k vv") == (
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nvv\r\n")


# -- the runner: loads per cent of another loop's capacity ----------------------------


def test_the_open_loop_workloads_and_their_parameters() -> None:
    assert WORKLOADS["openloop-1k"].loads == (50, 80, 95)
    uv80 = WORKLOADS["openloop-http-0b-uvloop80"]
    assert (uv80.rate_of, uv80.loads, uv80.protocol) == ("uvloop", (80,), "http")
    assert WORKLOADS["openloop-1k-poisson"].arrivals == "poisson"
    # The other workloads' parameters in the JSON are what they were.
    for w in WORKLOADS.values():
        assert set(w.params()).isdisjoint(catalog.OPEN_ONLY) == (w.client != "open"), w.name
    # The client gets every option of the workload.
    command = runner.client_command(WORKLOADS["openloop-tls-1k"], 0.1, 0.2)
    assert "--tls" in command and command[command.index("--protocol") + 1] == "echo"
    command = runner.client_command(WORKLOADS["openloop-http-0b"], 0.1, 0.2)
    assert command[command.index("--protocol") + 1] == "http"
    assert command[command.index("--arrivals") + 1] == "constant"
    assert command[command.index("--path") + 1] == "/" and "--tls" not in command
    posted = catalog.Workload("x", "", "http", "open", protocol="http-post-json",
                              body='{"a": 1}', pipeline=4, arrivals="poisson")
    command = runner.client_command(posted, 0.1, 0.2)
    assert command[command.index("--body") + 1] == '{"a": 1}'
    assert command[command.index("--pipeline") + 1] == "4"
    assert command[command.index("--arrivals") + 1] == "poisson"


def test_the_reference_loop_runs_first_named_or_not() -> None:
    w = WORKLOADS["openloop-http-0b-uvloop80"]
    all_loops, [(_, names)] = runner.plan([w], ["asyncio", "relaxed"], None)
    assert names == ["uvloop", "asyncio", "relaxed"] and "uvloop" in all_loops
    _, [(_, names)] = runner.plan([w], None, None)
    assert names[0] == "uvloop" and names.count("uvloop") == 1
    _, [(_, names)] = runner.plan([w], ["relaxed", "uvloop"], None)
    assert names == ["uvloop", "relaxed"]
    # Without its reference the workload cannot run: skipped with the reason.
    assert "uvloop is skipped: not installed" in (
        runner._reference_missing(w, {"uvloop": "not installed"}) or "")
    assert runner._reference_missing(WORKLOADS["openloop-1k"], {"uvloop": "x"}) is None


def test_every_loop_gets_the_reference_loops_rate() -> None:
    w = WORKLOADS["openloop-http-0b-uvloop80"]
    assert runner._rate_base(WORKLOADS["openloop-1k"], "asyncio", {}) is None
    samples: dict[str, list[dict[str, Any]]] = {"uvloop": [], "asyncio": []}
    with pytest.raises(RuntimeError, match="no capacity of uvloop"):
        runner._rate_base(w, "asyncio", samples)
    first = runner._rate_base(w, "uvloop", samples)
    assert first is not None and first(500.0) == 500.0  # its own, just measured
    samples["uvloop"] = [{"rate": 100.0}, {"rate": 300.0}]
    base = runner._rate_base(w, "asyncio", samples)
    assert base is not None and base(1e9) == 200.0  # the median so far, not its own
    again = runner._rate_base(w, "uvloop", samples)
    assert again is not None and again(500.0) == 300.0  # with this repeat's


class _Peer:
    """A server or client process: what it was told, what it answers."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.said: list[str] = []
        self.answers = answers

    def say(self, line: str) -> None:
        self.said.append(line)

    def read(self, timeout: float | None = None) -> dict[str, Any]:
        return self.answers.pop(0)

    def close(self) -> None:
        self.said.append("<end>")


def test_the_open_windows_target_per_cent_of_the_base() -> None:
    w = WORKLOADS["openloop-http-0b-uvloop80"]
    window = {"requests": 1000, "elapsed": 1.0, "p50_us": 10.0, "achieved_rate": 990.0,
              "client_cpu": 0.5, "client_headroom": 0.9, "pacer": "timerfd",
              "pacer_wait": 0.4}
    client = _Peer([{"client": "c"}, {"ready": True}, window, {"ready": True}, window])
    server = _Peer([{"cpu": 1.0 * i} for i in range(4)])
    sample = runner._open_loop(w, "asyncio", server, client, 1234,  # type: ignore[arg-type]
                               1.0, lambda own: 5000.0)
    assert client.said == ["1234", "closed", "go", "open 4000.0", "go", "<end>"]
    assert sample["rate"] == 1000.0 and sample["target_base"] == 5000.0
    assert sample["target_80"] == 4000.0
    assert sample["achieved_rate_80"] == 990.0 and sample["client_cpu_80"] == 0.5
    # The client's headroom and how it paced travel with its CPU use.
    assert (sample["client_headroom_80"], sample["pacer_80"], sample["pacer_wait_80"]) == (
        0.9, "timerfd", 0.4)
    from benchmarks.workloads import report

    entry = {"name": w.name, "unit": "request", "params": w.params(),
             "loops": {"asyncio": {"samples": [sample],
                                   "median": runner.summarize([sample])[0]}}}
    header, [row] = report.rows(entry)
    at = "@80% of uvloop"
    assert row[header.index(f"client CPU {at}")] == "0.50"
    assert row[header.index(f"client headroom {at}")] == "0.90"


# -- the smoke run -------------------------------------------------------------------


@pytest.mark.bench
@pytest.mark.timeout(120)
def test_smoke_openloop_http_through_the_command_line(tmp_path: Path) -> None:
    """``python -m benchmarks run`` with the shortest windows: aiohttp under
    the open loop's HTTP protocol, every load's p99 and client CPU in the
    JSON."""
    w = WORKLOADS["openloop-http-0b"]
    why = catalog.missing(w)
    if why:
        pytest.skip(why)
    subprocess.run([sys.executable, "-m", "benchmarks", "run", "--workloads", w.name,
                    "--loops", "asyncio", "--warmup", "0", "--duration", "0.2",
                    "--repeat", "1", "--no-syscalls", "--no-charts", "--results",
                    str(tmp_path)], cwd=ROOT, check=True, capture_output=True, timeout=100)
    (path,) = tmp_path.glob("*.json")
    (entry,) = json.loads(path.read_text())["workloads"]
    assert entry["errors"] == {} and entry["params"]["protocol"] == "http"
    data = entry["loops"]["asyncio"]
    assert data["client"].startswith("builtin open loop, one process")
    assert "http, constant arrivals, latencies in" in data["client"]
    med = data["median"]
    assert med["rate"] > 0 and 0 < med["client_cpu"]
    for load in (50, 80, 95):
        assert 0 < med[f"p50_us_{load}"] <= med[f"p99_us_{load}"] <= med[f"max_us_{load}"]
        assert med[f"client_cpu_{load}"] > 0 and med[f"achieved_rate_{load}"] > 0
        assert med[f"client_headroom_{load}"] > 0 and med[f"pacer_wait_{load}"] >= 0
        assert data["samples"][0][f"pacer_{load}"] in ("timerfd", "spin")
        assert med[f"target_{load}"] == pytest.approx(med["rate"] * load / 100)
    assert ", pacer " in data["client"]


# -- the latency chart --------------------------------------------------------------


def _open_entry(p99s: dict[str, list[float]]) -> dict[str, Any]:
    """A run's open-loop entry at load 80, each loop's repeats with these
    p99s, each repeat's distribution tagged by its p99."""
    return {"name": "openloop-x", "unit": "request",
            "params": {"server": "echo-protocol", "client": "open", "loads": [80],
                       "rate_of": "uvloop"},
            "loops": {name: {"samples": [{"p99_us_80": p, "spectrum_us_80": [[50, p / 2], [100, p]]}
                                         for p in values], "median": {}}
                      for name, values in p99s.items()}}


def test_the_chart_draws_each_loops_median_repeat() -> None:
    from benchmarks.workloads import report

    [(title, per_loop)] = report.spectra(_open_entry({"uvloop": [30, 10, 20],
                                                      "relaxed-eager": [5, 9, 7, 8]}))
    assert title == "openloop-x @80% of uvloop's capacity"
    assert per_loop == {"uvloop": [[50, 10], [100, 20]],  # the median of 10, 20, 30
                        "relaxed-eager": [[50, 3.5], [100, 7]]}  # the lower middle of four
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = {"started": "now", "workloads": [_open_entry({"uvloop": [10]})]}
    figure = report.latency_chart(doc, plt)
    assert figure is not None and len(figure.axes[0].lines) == 1
    plt.close(figure)
    assert report.latency_chart({"started": "now", "workloads": []}, plt) is None
