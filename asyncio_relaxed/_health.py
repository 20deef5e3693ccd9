"""Loop health: where the loop's time goes, how late its work runs, and the
rate limit of slow-callback reports.

Theory of operation
===================

With ``time_metrics`` on, the loop first polls without waiting; only when
that finds nothing and the loop may wait does it read the monotonic clock,
right before and right after the wait (and every 32nd iteration of a loop
that never waits, once); never per callback.  A loop that has work to do
reads no clock, and one that waits pays for the reads while it is idle
anyway, with one more epoll_wait (counted in ``poll_waits``).  A *stretch*
is the time between two such reads that end a wait or 32 iterations:

* *idle* time is the time blocked in the waits;
* *busy* time is the sum of the stretches: everything the loop did between
  waits (callbacks, writes, timers); a snapshot adds the stretch under way;
* utilisation over any interval is Δbusy / (Δbusy + Δidle) between two
  snapshots (:meth:`HealthSnapshot.utilisation`), Node's
  ``eventLoopUtilization()`` and libuv's ``uv_metrics_idle_time``.

Loop *lag* is how late work runs, recorded in a histogram of seconds:

* one sample per stretch, its length: whatever became ready in it waited at
  most that long (a bound: a stretch of a busy loop spans many iterations);
* for a due timer, the loop's time when it is taken off the heap minus the
  time it was due (the loop reads that clock anyway when it has timers).

Why so few clock reads: a read costs about 900 instructions under callgrind
(python -m benchmarks instructions), a tenth of what the loop adds to a 1 KiB
echo request.

Time spent while the loop is not running (between run_until_complete calls)
counts as neither.  Slow callbacks (``slow_callback``, a threshold in
seconds) are timed one by one, which costs two clock reads per callback; a
report goes out at most once per :data:`REPORT_INTERVAL`, counting those
skipped since the last.

This module knows nothing of asyncio.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

__all__ = [
    "LAG_BOUNDS",
    "REPORT_INTERVAL",
    "Health",
    "HealthSnapshot",
    "LagHistogram",
    "ReportLimit",
]

#: Upper bounds (seconds) of the lag histogram's buckets, after Prometheus'
#: convention of cumulative ``le`` buckets: powers of two from 16 µs to
#: ~2.1 s, then +Inf.  A bucket index is a bit length, so recording costs one
#: multiplication and no search.
LAG_BOUNDS: tuple[float, ...] = (*(2**i * 1e-6 for i in range(4, 22)), float("inf"))
_FIRST_SHIFT = 4  # 2**4 µs is the first bound

#: Seconds between two slow-callback reports at the most.
REPORT_INTERVAL = 1.0


class LagHistogram:
    """Counts of lag samples per bucket of :data:`LAG_BOUNDS`, their sum,
    and the largest one."""

    __slots__ = ("counts", "largest", "total")

    def __init__(self) -> None:
        self.counts = [0] * len(LAG_BOUNDS)
        self.total = 0.0
        self.largest = 0.0

    def record(self, seconds: float) -> None:
        if seconds < 0:
            seconds = 0.0
        index = int(seconds * 1e6).bit_length() - _FIRST_SHIFT
        # (the sample is below 2**bit_length µs, so below LAG_BOUNDS[index])
        if index < 0:
            index = 0
        elif index >= len(LAG_BOUNDS):
            index = len(LAG_BOUNDS) - 1
        self.counts[index] += 1
        self.total += seconds
        if seconds > self.largest:
            self.largest = seconds


_monotonic = time.monotonic


class Health:
    """The mutable time account of one loop (see the theory of operation),
    its two settings, and the slow-callback reports' limit and handler."""

    __slots__ = ("busy", "handler", "idle", "lag", "last", "limit", "publisher", "slow",
                 "slow_callbacks", "timed")

    def __init__(self, timed: bool = False, slow: float = 0.0) -> None:
        self.timed = timed  # the time_metrics setting
        self.slow = slow  # the slow_callback setting, seconds (0: off)
        self.limit = ReportLimit()
        self.handler: Any = None  # called with each slow-callback report, else logging
        self.busy = 0.0  # seconds between a poll's return and the next poll
        self.idle = 0.0  # seconds blocked in the poll
        self.last: float | None = None  # when the last timed poll returned, while running
        self.lag = LagHistogram()
        self.slow_callbacks = 0  # callbacks over the slow_callback threshold
        self.publisher: Any = None  # with stats_dir: the loop's _publish.Publisher

    def stretch_end(self) -> float:
        """time_metrics: a stretch ends (a poll that did not wait found
        nothing and the loop may wait, or the 32nd iteration in a row that
        did not wait): its length is busy time and a lag sample.  The clock
        reading, for :meth:`waited`."""
        now = _monotonic()
        last = self.last
        if last is not None:
            self.busy += now - last
            self.lag.record(now - last)
        self.last = now
        return now

    def waited(self, since: float) -> None:
        """The loop waited in its poll from *since* (a :meth:`stretch_end`
        reading) until now: idle time; the next stretch starts now."""
        now = _monotonic()
        self.idle += now - since
        self.last = now

    def stopped(self) -> None:
        """The loop stops running: the stretch under way ends; the time until
        it runs again is neither busy nor idle."""
        last = self.last
        if last is not None:
            now = _monotonic()
            self.busy += now - last
            self.lag.record(now - last)
            self.last = None

    def snapshot(self, iterations: int, waiting: bool = False) -> HealthSnapshot:
        """The accounts now.  The stretch under way counts as busy up to now,
        unless the loop is *waiting*: between :meth:`stretch_end` and
        :meth:`waited` (a publish from the wait), whose time :meth:`waited`
        counts as idle."""
        lag = self.lag
        now = time.monotonic()
        last = self.last  # read once: the loop's thread may move it meanwhile
        return HealthSnapshot(
            time=now,
            time_metrics=self.timed,
            iterations=iterations,
            busy_time=self.busy + (now - last if last is not None and not waiting else 0.0),
            idle_time=self.idle,
            lag_buckets=tuple(lag.counts),
            lag_count=sum(lag.counts),
            lag_sum=lag.total,
            lag_max=lag.largest,
            slow_callbacks=self.slow_callbacks,
        )


class ReportLimit:
    """At most one report per *interval* seconds; counts what it held back."""

    __slots__ = ("interval", "next_at", "skipped")

    def __init__(self, interval: float = REPORT_INTERVAL) -> None:
        self.interval = interval
        self.next_at = 0.0
        self.skipped = 0

    def allow(self, now: float) -> int | None:
        """None to hold this report back; else how many were held back
        since the last one that went out."""
        if now < self.next_at:
            self.skipped += 1
            return None
        self.next_at = now + self.interval
        skipped, self.skipped = self.skipped, 0
        return skipped


@dataclasses.dataclass(frozen=True)
class HealthSnapshot:
    """A loop's health at one moment (``loop.health()``).

    Times are seconds.  ``busy_time`` and ``idle_time`` stay 0 and no lag is
    recorded unless the loop was made with ``time_metrics`` on.  Subtract two
    snapshots for an interval: ``after - before`` gives the differences (and
    the interval's largest lag is not known, so ``lag_max`` is the later's).
    """

    time: float
    time_metrics: bool
    iterations: int
    busy_time: float
    idle_time: float
    lag_buckets: tuple[int, ...]
    lag_count: int
    lag_sum: float
    lag_max: float
    slow_callbacks: int

    def utilisation(self, since: HealthSnapshot | None = None) -> float:
        """Busy share of the loop's running time since *since* (or since the
        loop was made): 0 for a loop that only waited, 1 for one that never did."""
        busy, idle = self.busy_time, self.idle_time
        if since is not None:
            busy -= since.busy_time
            idle -= since.idle_time
        running = busy + idle
        return busy / running if running > 0 else 0.0

    def iterations_per_second(self, since: HealthSnapshot) -> float:
        elapsed = self.time - since.time
        return (self.iterations - since.iterations) / elapsed if elapsed > 0 else 0.0

    def lag_quantile(self, q: float) -> float:
        """The upper bound of the bucket that holds the *q* quantile of the
        lag samples (0 without samples); never above the largest sample."""
        if not self.lag_count:
            return 0.0
        rank = q * self.lag_count
        seen = 0
        for bound, count in zip(LAG_BOUNDS, self.lag_buckets, strict=True):
            seen += count
            if seen >= rank and count:
                return min(bound, self.lag_max)
        return self.lag_max

    @property
    def lag_p50(self) -> float:
        return self.lag_quantile(0.5)

    @property
    def lag_p99(self) -> float:
        return self.lag_quantile(0.99)

    def __sub__(self, other: HealthSnapshot) -> HealthSnapshot:
        if not isinstance(other, HealthSnapshot):
            return NotImplemented
        return dataclasses.replace(
            self,
            iterations=self.iterations - other.iterations,
            busy_time=self.busy_time - other.busy_time,
            idle_time=self.idle_time - other.idle_time,
            lag_buckets=tuple(a - b for a, b in zip(self.lag_buckets, other.lag_buckets,
                                                     strict=True)),
            lag_count=self.lag_count - other.lag_count,
            lag_sum=self.lag_sum - other.lag_sum,
            slow_callbacks=self.slow_callbacks - other.slow_callbacks,
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
