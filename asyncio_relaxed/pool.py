"""A pre-forked pool's workers, read from the snapshots their loops publish.

Each loop made with the ``stats_dir`` setting (``ASYNCIO_RELAXED_STATS_DIR``)
writes one file there once a second (asyncio_relaxed/_publish.py says how).
:func:`read` returns one :class:`Worker` per live process::

    for worker in asyncio_relaxed.pool.read("/run/myapp-loops"):
        print(worker.pid, worker.utilisation, worker.snapshot["gauges"]["connections"])

``python -m asyncio_relaxed top`` shows them live, and
:class:`asyncio_relaxed.metrics.PoolCollector` exports them in one scrape.
A file whose process has died is dropped (and deleted); a live process whose
file is older than :data:`STALE_AFTER` seconds is kept and marked stale: its
loop is blocked, or not running.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import Any

from ._publish import FORMAT, INTERVAL, alive, snapshot_paths

__all__ = ["STALE_AFTER", "Worker", "jain", "read"]

#: A snapshot older than this (seconds) marks its worker stale: five
#: intervals without a publish.
STALE_AFTER = 5 * INTERVAL


@dataclasses.dataclass(frozen=True)
class Worker:
    """One process's latest snapshot: ``snapshot`` is the published
    document (its ``statistics``, ``health``, ``gauges``, ``listeners``,
    ``settings``, ``window`` and ``history``), ``age`` its age in seconds."""

    pid: int
    age: float
    snapshot: dict[str, Any]

    @property
    def stale(self) -> bool:
        return self.age > STALE_AFTER

    @property
    def window(self) -> dict[str, float]:
        """The last interval's figures: utilisation, lag_p50, lag_p99 and
        accepts, reads and iterations per second."""
        return self.snapshot["window"]  # type: ignore[no-any-return]

    @property
    def utilisation(self) -> float:
        return self.window["utilisation"]

    @property
    def accepted(self) -> int:
        """Connections this worker's listeners accepted since its loop was made."""
        return sum(listener["accepted"] for listener in self.snapshot["listeners"])


def read(directory: str, *, now: float | None = None, drop_dead: bool = True) -> list[Worker]:
    """The workers whose snapshots are in *directory*, by pid.  With
    *drop_dead* (the default) the file of a process that no longer runs is
    deleted and left out; unreadable files and those of another format are
    left out.  Raises FileNotFoundError (or NotADirectoryError) for a
    directory that is not there."""
    if not os.path.isdir(directory):
        raise (NotADirectoryError if os.path.exists(directory) else FileNotFoundError)(
            f"no such directory: {directory!r} (the loops' stats_dir setting)")
    now = time.time() if now is None else now
    workers = []
    for pid, path in snapshot_paths(directory):
        try:
            with open(path, encoding="utf-8") as file:
                snapshot = json.load(file)
        except (OSError, ValueError):
            continue  # renamed away meanwhile, or not ours
        if not isinstance(snapshot, dict) or snapshot.get("format") != FORMAT:
            continue
        if drop_dead and not alive(pid, snapshot.get("process_start")):
            try:
                os.unlink(path)
            except OSError:
                pass
            continue
        workers.append(Worker(pid, max(now - snapshot["time"], 0.0), snapshot))
    return workers


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index, (sum x)^2 / (n * sum x^2): 1.0 when every
    value is the same, 1/n when one takes everything; 1.0 for no values or
    all zero (nothing was shared unevenly)."""
    squares = sum(v * v for v in values)
    if not values or not squares:
        return 1.0
    total = sum(values)
    return total * total / (len(values) * squares)
