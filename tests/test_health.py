"""Loop health: the time account, lag, slow callbacks (asyncio_relaxed._health,
the loop's use of it and asyncio_relaxed._slow).

Coarse bounds only where time is measured; counts (clock reads, reports)
are exact.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import asyncio_relaxed
from asyncio_relaxed import _health
from conftest import run


@pytest.fixture
def timed() -> Iterator[asyncio_relaxed.Loop]:
    loop = asyncio_relaxed.new_event_loop(time_metrics=True)
    try:
        yield loop
    finally:
        loop.close()


# -- the histogram and the rate limit, without a loop --------------------------


def test_lag_histogram_buckets_by_bit_length() -> None:
    """A sample lands in the first bucket whose bound is above it; the sum and
    the largest sample are kept; a negative sample counts as 0."""
    lag = _health.LagHistogram()
    for seconds in (0.0, 5e-6, 20e-6, 1e-3, 10.0, -1.0):
        lag.record(seconds)
    bounds = _health.LAG_BOUNDS
    assert lag.counts[0] == 3  # 0, 5 us and -1 (as 0): below 16 us
    assert lag.counts[1] == 1 and bounds[1] == 32e-6  # 20 us
    index = next(i for i, b in enumerate(bounds) if 1e-3 < b)
    assert lag.counts[index] == 1  # 1 ms: below 1.024 ms
    assert lag.counts[-1] == 1 and bounds[-1] == float("inf")  # 10 s
    assert lag.largest == 10.0 and lag.total == pytest.approx(10.001025)


def test_snapshot_quantiles_and_differences() -> None:
    health = _health.Health(timed=True)
    for _ in range(99):
        health.lag.record(10e-6)
    health.lag.record(0.5)
    health.busy, health.idle = 3.0, 1.0
    before = health.snapshot(iterations=10)
    assert before.lag_p50 == 16e-6 and before.lag_p99 == 16e-6
    assert before.lag_quantile(1.0) == 0.5 and before.lag_max == 0.5
    assert before.utilisation() == 0.75
    health.busy, health.idle = 3.5, 2.5
    health.lag.record(1e-3)
    after = health.snapshot(iterations=30)
    interval = after - before
    assert (interval.iterations, interval.lag_count) == (20, 1)
    assert after.utilisation(before) == pytest.approx(0.5 / 2.0)
    assert after.iterations_per_second(before) > 0


def test_report_limit_one_a_second_counting_the_rest() -> None:
    limit = _health.ReportLimit(interval=1.0)
    assert limit.allow(100.0) == 0
    assert [limit.allow(100.0 + t) for t in (0.1, 0.5, 0.9)] == [None, None, None]
    assert limit.allow(101.0) == 3
    assert limit.allow(101.5) is None


# -- the loop's time account -----------------------------------------------------


def clock_reads(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Records every read of the time account's monotonic clock (not
    loop.time(), not the slow-callback timing's)."""
    reads: list[float] = []
    real = time.monotonic

    def counting() -> float:
        value = real()
        reads.append(value)
        return value

    monkeypatch.setattr(_health, "_monotonic", counting)
    return reads


def test_without_time_metrics_the_loop_reads_no_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = clock_reads(monkeypatch)
    loop = asyncio_relaxed.new_event_loop(time_metrics=False)
    try:
        for _ in range(5):
            loop.call_soon(lambda: None)
        loop.run_until_complete(asyncio.sleep(0))
        health = loop.health()
    finally:
        loop.close()
    assert reads == []
    assert (health.time_metrics, health.busy_time, health.idle_time, health.lag_count) == (
        False, 0.0, 0.0, 0)


def test_time_metrics_read_the_clock_around_waits_only(
    monkeypatch: pytest.MonkeyPatch, timed: asyncio_relaxed.Loop
) -> None:
    """A loop that never waits (each callback schedules the next) reads the
    clock once every 32nd iteration and once when it stops; one that waits,
    around each wait.  None per callback."""
    reads = clock_reads(monkeypatch)
    left = [200]

    def chain() -> None:
        left[0] -= 1
        if left[0]:
            timed.call_soon(chain)
        else:
            timed.stop()

    first = timed.statistics().iterations + 1
    timed.call_soon(chain)
    timed.run_forever()
    last = timed.statistics().iterations
    every_32nd = sum(1 for n in range(first, last + 1) if n % 32 == 0)
    assert len(reads) == every_32nd + 1
    reads.clear()
    waits = 5
    for _ in range(waits):
        timed.run_until_complete(asyncio.sleep(0.001))
    # Per run: two around the wait for the timer, one at the stop; the polls
    # that find work read nothing (unless a 32nd iteration's).
    assert 3 * waits <= len(reads) <= 3 * waits + 2


def test_utilisation_of_a_loop_that_sleeps_and_one_that_spins(
    timed: asyncio_relaxed.Loop,
) -> None:
    async def sleeps() -> None:
        await asyncio.sleep(0.2)

    async def spins() -> None:
        end = time.monotonic() + 0.2
        while time.monotonic() < end:
            await asyncio.sleep(0)  # each step runs and yields: no poll waits

    start = timed.health()
    run(timed, sleeps())
    slept = timed.health()
    run(timed, spins())
    spun = timed.health()
    assert slept.utilisation(start) < 0.5
    assert spun.utilisation(slept) > 0.5
    assert slept.idle_time - start.idle_time >= 0.15  # coarse: it waited in the poll


def test_lag_records_a_timer_held_up_by_a_blocking_callback(
    timed: asyncio_relaxed.Loop,
) -> None:
    """A timer due during a 50 ms blocking callback runs late; the
    histogram's largest sample says so (coarse: at least 40 ms)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        fired = loop.create_future()
        loop.call_later(0.001, fired.set_result, None)
        time.sleep(0.05)
        await fired

    run(timed, main())
    health = timed.health()
    assert health.lag_count > 0 and health.lag_max >= 0.04
    assert 0.04 <= health.lag_quantile(1.0)


# -- slow callbacks ----------------------------------------------------------------


def blocking_task(loop: asyncio.AbstractEventLoop, seconds: float = 0.03) -> None:
    async def worker_step() -> None:
        time.sleep(seconds)
        await asyncio.sleep(0.01)

    async def main() -> None:
        await asyncio.create_task(worker_step(), name="the-blocker")

    run(loop, main())


def test_slow_callback_reported_once_with_its_task(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio_relaxed.new_event_loop(slow_callback=0.02)
    try:
        with caplog.at_level(logging.WARNING, logger="asyncio_relaxed"):
            blocking_task(loop)
        assert loop.health().slow_callbacks == 1
    finally:
        loop.close()
    [record] = [r for r in caplog.records if r.name == "asyncio_relaxed"]
    message = record.getMessage()
    assert "took 0.0" in message and "'the-blocker'" in message
    assert "worker_step()" in message
    if sys.version_info >= (3, 14):  # the task's call graph, where it awaits now
        assert "Task(name='the-blocker'" in message and "worker_step" in message


def test_slow_callback_handler_gets_the_report() -> None:
    loop = asyncio_relaxed.new_event_loop(slow_callback=0.02)
    reports: list[Any] = []
    loop.set_slow_callback_handler(lambda lp, report: reports.append((lp, report)))
    try:
        blocking_task(loop)
    finally:
        loop.close()
    [(seen_loop, report)] = reports
    assert seen_loop is loop
    assert report.task_name == "the-blocker" and report.seconds >= 0.02
    assert isinstance(report.task, asyncio.Task) and report.skipped == 0
    assert (report.call_graph is not None) == (sys.version_info >= (3, 14))
    with pytest.raises(TypeError):
        loop.set_slow_callback_handler(42)


def test_slow_callbacks_are_rate_limited() -> None:
    """Five slow callbacks in one iteration: all counted, one reported."""
    loop = asyncio_relaxed.new_event_loop(slow_callback=0.005)
    reports: list[Any] = []
    loop.set_slow_callback_handler(lambda lp, report: reports.append(report))
    try:
        for _ in range(5):
            loop.call_soon(time.sleep, 0.006)
        loop.run_until_complete(asyncio.sleep(0))
        assert loop.health().slow_callbacks == 5
    finally:
        loop.close()
    assert len(reports) == 1 and reports[0].task is None
    assert "time.sleep" in reports[0].callback or "sleep" in reports[0].callback


def test_slow_callback_off_by_default_and_a_bad_threshold_fails_at_creation() -> None:
    loop = asyncio_relaxed.new_event_loop()
    try:
        assert loop.config.slow_callback == 0.0
        blocking_task(loop)
        assert loop.health().slow_callbacks == 0
    finally:
        loop.close()
    with pytest.raises(ValueError, match=r"slow_callback=-1 .*seconds from 0 to 3600"):
        asyncio_relaxed.new_event_loop(slow_callback=-1)


def test_io_callbacks_are_timed_too() -> None:
    """With slow_callback set, I/O callbacks go through the timed path."""
    loop = asyncio_relaxed.new_event_loop(slow_callback=0.02)
    reports: list[Any] = []
    loop.set_slow_callback_handler(lambda lp, report: reports.append(report))
    a, b = socket.socketpair()
    try:
        def on_read() -> None:
            a.recv(10)
            time.sleep(0.03)

        loop.add_reader(a.fileno(), on_read)
        b.send(b"x")
        loop.run_until_complete(asyncio.sleep(0.1))
        loop.remove_reader(a.fileno())
    finally:
        a.close()
        b.close()
        loop.close()
    assert len(reports) == 1 and "on_read" in reports[0].callback


def test_a_snapshot_from_the_wait_counts_the_stretch_no_further() -> None:
    """Between stretch_end() and waited() the loop is in its wait (a publish
    runs there, from Publisher.due), whose time waited() counts as idle: a
    snapshot taken there counts no busy time past the stretch's end, so a
    later snapshot never has less busy time than it had."""
    from asyncio_relaxed._health import Health

    health = Health(timed=True)
    health.stretch_end()
    time.sleep(0.005)
    start = health.stretch_end()  # a stretch ends; the wait begins
    busy = health.busy
    assert busy > 0
    time.sleep(0.02)  # a slow publish in the wait
    in_wait = health.snapshot(0, waiting=True)
    assert in_wait.busy_time == busy
    assert health.snapshot(0).busy_time >= busy + 0.02  # elsewhere: the stretch under way
    health.waited(start)
    health.stretch_end()  # the next stretch, at once
    after = health.snapshot(0, waiting=True)
    assert after.busy_time >= in_wait.busy_time
    assert after.idle_time >= 0.02
    assert 0.0 <= after.utilisation(in_wait) <= 1.0
