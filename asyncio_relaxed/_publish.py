"""A loop's snapshot for its pool: one small file per process, once a second.

Theory of operation
===================

With the ``stats_dir`` setting, the loop's :class:`Publisher` writes
``relaxed-<pid>.json`` in that directory when the loop is made and then every
:data:`INTERVAL` seconds while the loop runs: the loop's
``statistics()``, ``health()``, ``gauges()`` and ``listener_statistics()``,
its settings, and what the last interval alone saw (utilisation, lag p50 and
p99, accepts, reads and iterations per second), with the last
:data:`HISTORY` intervals' utilisation and accepts for a sparkline.  Readers
(:mod:`asyncio_relaxed.pool`: ``python -m asyncio_relaxed top`` and
:class:`asyncio_relaxed.metrics.PoolCollector`) read the directory; the
workers share nothing else, as prometheus_client's multiprocess mode shares
one file per process.

* A file is written whole to a temporary name and renamed over the old one,
  so a reader sees the previous snapshot or the new one, never a part.
* ``loop.close()`` removes the file.  A process that died without closing
  its loop leaves its file behind: readers drop (and delete) the file of a
  process that no longer exists, or whose process id now belongs to a
  process started later (the start time is in the file, from
  ``/proc/<pid>/stat``), as ``prometheus_client.multiprocess.mark_process_dead``
  does for its files; a new publisher sweeps the directory once the same way.
* With ``time_metrics`` on (the default) the loop reads the clock before it
  waits anyway (asyncio_relaxed/_health.py): there it asks :meth:`Publisher.due`,
  which publishes when the interval is over and shortens the wait to the
  next publish, so an idle loop publishes too, and the setting costs no
  clock read and no timer of its own.  Without ``time_metrics`` a timer of the
  loop's publishes (``call_later``), and any timer in the loop's heap costs
  the clock reads of stock's iteration.
* The snapshot is taken on the loop's thread, between callbacks.  The
  loop's counters are plain integers and cost nothing to read; the gauges
  walk the loop's transports (a cost per connection, measured in
  docs/design.md), once a second; the
  write is one small file, best on a memory file system (``/dev/shm``,
  ``/run``).  Nothing runs when ``stats_dir`` is empty.
* One loop per process publishes: a second loop made with the same setting
  while the first is open publishes nothing and says so once in the log.
* A failed write (the directory removed, the disk full) is logged once and
  retried at the next interval; it never reaches the application.
"""

from __future__ import annotations

import collections
import json
import os
import platform
import time
import weakref
from collections.abc import Iterator
from typing import Any

from ._startup import server_logger, token
from ._stats import COUNTERS, GAUGES
from ._version import __version__

__all__ = ["FORMAT", "HISTORY", "INTERVAL", "Publisher", "alive", "document", "format_address",
           "process_start", "snapshot_path", "snapshot_paths", "sweep"]

#: Seconds between two snapshots of a loop.
INTERVAL = 1.0
#: Intervals of utilisation and accepts a snapshot keeps: a minute.
HISTORY = 60
#: The snapshot's layout; a reader skips files of another.
FORMAT = 1
_PREFIX, _SUFFIX = "relaxed-", ".json"

# The publisher of this process's file: (pid, publisher's loop) while open.
_owner: tuple[int, weakref.ref[Any]] | None = None


def snapshot_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{_PREFIX}{pid}{_SUFFIX}")


def snapshot_paths(directory: str) -> Iterator[tuple[int, str]]:
    """(pid, path) of every snapshot file in *directory*."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in sorted(names):
        if name.startswith(_PREFIX) and name.endswith(_SUFFIX):
            digits = name[len(_PREFIX):-len(_SUFFIX)]
            if digits.isdigit():
                yield int(digits), os.path.join(directory, name)


def process_start(pid: int) -> int | None:
    """When process *pid* started (clock ticks since boot, /proc/<pid>/stat's
    22nd field); None where unknown (no /proc, or no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return None
    try:
        return int(fields[19])  # fields after the command: state is field 3
    except (IndexError, ValueError):
        return None


def alive(pid: int, started: int | None) -> bool:
    """Whether the process that wrote a snapshot still runs: *pid* exists
    and, where both are known, started when the snapshot says."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's: it exists
    if started is None:
        return True
    now = process_start(pid)
    return now is None or now == started


def sweep(directory: str) -> list[int]:
    """Delete the snapshots of processes that no longer run; their pids."""
    dead = []
    for pid, path in snapshot_paths(directory):
        try:
            with open(path, encoding="utf-8") as file:
                started = json.load(file).get("process_start")
        except (OSError, ValueError, AttributeError):
            continue  # unreadable: a reader reports it, it is not ours to delete
        if not alive(pid, started):
            dead.append(pid)
            try:
                os.unlink(path)
            except OSError:
                pass
    return dead


def format_address(address: Any) -> str:
    """A listener's address as a label: ``127.0.0.1:8080``, ``[::1]:8080``, a path."""
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = address[0], address[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    if isinstance(address, bytes):
        return address.decode(errors="replace")
    return str(address)


def facts(loop: Any) -> dict[str, Any]:
    """What stays true of a loop while it lives: version, Python, backend,
    build, settings."""
    return {
        "version": __version__,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "backend": loop.statistics().backend,
        "build": getattr(loop, "_build", "pure"),
        "settings": {name: token(value)
                     for name, _var, value, _unit, _why in loop.config.describe()},
    }


def document(loop: Any, known: dict[str, Any] | None = None, stats: Any = None,
             health: Any = None) -> dict[str, Any]:
    """What a loop's snapshot says of it now (the figures since it was made;
    the publisher adds the last interval's): the exporters' one source.
    *known* is the loop's :func:`facts`, when the caller keeps them."""
    stats = loop.statistics() if stats is None else stats
    health = loop.health() if health is None else health
    counters = {name: getattr(stats, name) for name in COUNTERS}
    gauges = loop.gauges()
    times = {name: getattr(health, name) for name in _HEALTH_FIELDS}
    return {
        **(facts(loop) if known is None else known),
        "time": time.time(),
        "statistics": counters,
        "health": times,
        "gauges": {name: getattr(gauges, name) for name in GAUGES},
        "listeners": [
            {"address": format_address(listener.address), "strategy": listener.strategy,
             "state": listener.state, "accepted": listener.accepted,
             "queue_length": listener.queue_length,
             "queue_length_max": listener.queue_length_max, "rests": listener.rests,
             "rest_seconds": listener.rest_seconds}
            for listener in loop.listener_statistics()
        ],
    }


# HealthSnapshot's fields a snapshot carries (its monotonic time is the
# process's own: a snapshot says the wall-clock time instead).
_HEALTH_FIELDS = ("time_metrics", "iterations", "busy_time", "idle_time", "lag_buckets",
                  "lag_count", "lag_sum", "lag_max", "slow_callbacks")


class Publisher:
    """Writes one loop's snapshot to its directory (theory of operation above)."""

    __slots__ = ("accepted", "active", "directory", "facts", "failed", "history_accepts",
                 "history_utilisation", "loop", "next_at", "pid", "previous", "started",
                 "timed", "timer", "waiting", "wall_started")

    def __init__(self, loop: Any, directory: str) -> None:
        global _owner
        self.loop = loop
        self.directory = directory
        self.pid = os.getpid()
        self.started = process_start(self.pid)
        self.wall_started = time.time()
        self.facts = facts(loop)
        # With time_metrics the loop calls due() where it reads the clock;
        # without, a timer of the loop's calls tick().
        self.timed = loop.config.time_metrics
        self.next_at = 0.0  # the loop's monotonic time of the next publish
        self.timer: Any = None
        self.waiting = False  # due() is publishing from the loop's wait
        self.failed = False  # the last write failed (logged once until one succeeds)
        self.previous: Any = None  # (health snapshot, recv count) at the last publish
        self.accepted = 0  # the listeners' accepts at the last publish
        self.history_utilisation: collections.deque[float] = collections.deque(maxlen=HISTORY)
        self.history_accepts: collections.deque[int] = collections.deque(maxlen=HISTORY)
        other = _owner[1]() if _owner is not None and _owner[0] == self.pid else None
        self.active = other is None or other.is_closed()
        if not self.active:
            server_logger().warning(
                "asyncio_relaxed: another loop of process %d publishes to %s; this one "
                "(stats_dir) publishes nothing", self.pid, directory)
            return
        _owner = (self.pid, weakref.ref(loop))
        sweep(directory)
        self.tick()

    def due(self, now: float, timeout: float | None) -> float | None:
        """The loop is about to wait *timeout* seconds (None: until an
        event) at monotonic time *now*: publish if the interval is over;
        the wait, shortened to end at the next publish."""
        if now >= self.next_at:
            self.waiting = True
            try:
                self.tick()
            finally:
                self.waiting = False
        remaining = self.next_at - now
        return remaining if timeout is None or timeout > remaining else timeout

    def tick(self) -> None:
        """Publish, then again in :data:`INTERVAL` seconds."""
        self.timer = None
        self.next_at = time.monotonic() + INTERVAL
        try:
            self.publish()
        except OSError as exc:
            if not self.failed:
                server_logger().warning("asyncio_relaxed: cannot publish statistics to %s: %s",
                                        self.directory, exc)
            self.failed = True
        else:
            self.failed = False
        if self.active and not self.timed:
            self.timer = self.loop.call_later(INTERVAL, self.tick)

    def snapshot(self) -> dict[str, Any]:
        """The document a publish writes (and the window it closes)."""
        loop = self.loop
        stats = loop.statistics()
        # From due() the loop is in its wait, whose time is idle: the stretch
        # that ended there is not busy up to now (a busy span counted here
        # and then as idle made an idle interval's utilisation negative).
        health = loop._health.snapshot(stats.iterations, waiting=True) if self.waiting \
            else loop.health()
        document_now = document(loop, self.facts, stats, health)
        accepted = sum(listener["accepted"] for listener in document_now["listeners"])
        previous = self.previous
        if previous is None:
            window = {"seconds": 0.0, "utilisation": health.utilisation(), "lag_p50": 0.0,
                      "lag_p99": 0.0, "accepts_per_second": 0.0, "reads_per_second": 0.0,
                      "iterations_per_second": 0.0}
            taken = 0
        else:
            since, recv_before = previous
            seconds = health.time - since.time
            interval = health - since
            taken = max(accepted - self.accepted, 0)  # a stopped listener takes its count
            window = {
                "seconds": seconds,
                "utilisation": health.utilisation(since),
                "lag_p50": interval.lag_p50,
                "lag_p99": interval.lag_p99,
                "accepts_per_second": taken / seconds if seconds > 0 else 0.0,
                "reads_per_second": (stats.recv - recv_before) / seconds if seconds > 0 else 0.0,
                "iterations_per_second": health.iterations_per_second(since),
            }
            self.history_utilisation.append(window["utilisation"])
            self.history_accepts.append(taken)
        self.previous = (health, stats.recv)
        self.accepted = accepted
        return {"format": FORMAT, "pid": self.pid, "process_start": self.started,
                "started": self.wall_started, "interval": INTERVAL, **document_now,
                "window": window,
                "history": {"utilisation": list(self.history_utilisation),
                            "accepts": list(self.history_accepts)}}

    def publish(self) -> None:
        """Write the snapshot whole under a temporary name, then rename it."""
        if os.getpid() != self.pid:
            return  # a forked child's copy of this loop: the file is the parent's
        data = json.dumps(self.snapshot(), separators=(",", ":")).encode()
        path = snapshot_path(self.directory, self.pid)
        temporary = f"{path}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)  # one write: a few KiB
        finally:
            os.close(fd)
        os.replace(temporary, path)

    def close(self) -> None:
        """The loop closes: no more snapshots, and the file goes."""
        global _owner
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.active:
            return
        self.active = False
        if _owner is not None and _owner[0] == self.pid and _owner[1]() is self.loop:
            _owner = None
        if os.getpid() == self.pid:
            for path in (snapshot_path(self.directory, self.pid),
                         f"{snapshot_path(self.directory, self.pid)}.tmp"):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    server_logger().warning("asyncio_relaxed: cannot remove %s: %s", path, exc)
