"""``python -m asyncio_relaxed top [DIR]``: a pool's workers, live.

One row per worker whose loop publishes to DIR (the ``stats_dir`` setting;
asyncio_relaxed/_publish.py): its utilisation over the last interval and a
sparkline of the last minute's, lag p50 and p99, open connections (TLS among
them), accepts and reads per second, bytes buffered for writing, the accept
strategy and its rests; under the table, Jain's index of the workers'
accepts over the last minute and since they started.  The terminal is
``rich``'s (``rich.live.Live``), an optional dependency; ``--json`` needs
nothing but the standard library.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from . import pool
from ._publish import HISTORY

__all__ = ["SPARKS", "main", "render", "rows", "spark_width", "sparkline", "summary"]

#: Sparkline levels, from 0 to 1 of utilisation.
SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int) -> str:
    """The last *width* of *values* (each 0 to 1) as block characters,
    right-aligned (the newest on the right), blanks where none was taken."""
    recent = list(values)[-width:]
    top = len(SPARKS) - 1
    marks = "".join(SPARKS[min(max(round(v * top), 0), top)] for v in recent)
    return marks.rjust(width)


def rows(workers: Sequence[pool.Worker]) -> list[dict[str, Any]]:
    """What the table shows of each worker, as plain values."""
    out = []
    for worker in workers:
        snapshot = worker.snapshot
        window = worker.window
        gauges = snapshot["gauges"]
        listeners = snapshot["listeners"]
        strategies = sorted({listener["strategy"] for listener in listeners})
        out.append({
            "pid": worker.pid,
            "age": worker.age,
            "stale": worker.stale,
            "utilisation": window["utilisation"],
            "utilisation_history": snapshot["history"]["utilisation"],
            "lag_p50": window["lag_p50"],
            "lag_p99": window["lag_p99"],
            "connections": gauges["connections"],
            "tls_connections": gauges["tls_connections"],
            "accepts_per_second": window["accepts_per_second"],
            "reads_per_second": window["reads_per_second"],
            "write_buffer_bytes": gauges["write_buffer_bytes"],
            "accepted": worker.accepted,
            "accepts_last_minute": sum(snapshot["history"]["accepts"]),
            "accept": "/".join(strategies) or snapshot["settings"]["accept"],
            "rests": sum(listener["rests"] for listener in listeners),
            "time_metrics": snapshot["health"]["time_metrics"],
            "build": snapshot.get("build", "pure"),  # (a loop older than the field: pure)
        })
    return out


def summary(table: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The pool's line: workers, totals and Jain's index of accepts."""
    return {
        "workers": len(table),
        "stale_workers": sum(row["stale"] for row in table),
        "connections": sum(row["connections"] for row in table),
        "accepts_per_second": sum(row["accepts_per_second"] for row in table),
        "reads_per_second": sum(row["reads_per_second"] for row in table),
        "accepted": sum(row["accepted"] for row in table),
        "jain_accepts_last_minute": pool.jain([row["accepts_last_minute"] for row in table]),
        "jain_accepts": pool.jain([row["accepted"] for row in table]),
    }


def _duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds:.2f}s"


def _size(count: float) -> str:
    for unit in ("", "K", "M", "G"):
        if abs(count) < 1024 or unit == "G":
            return f"{count:.0f}{unit}" if unit == "" else f"{count:.1f}{unit}"
        count /= 1024
    return str(count)  # not reached


def render(directory: str, table: Sequence[dict[str, Any]], spark_width: int = 30) -> Any:
    """A rich renderable: the workers' table and the pool's line under it."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    builds = "/".join(sorted({row["build"] for row in table})) or "no"
    grid = Table(title=f"asyncio_relaxed workers in {directory} ({builds} build)",
                 title_justify="left",
                 expand=False, header_style="bold")
    for name, justify in (("pid", "right"), ("util", "right"),
                          (f"util, last {spark_width} s", "left"), ("lag p50", "right"),
                          ("lag p99", "right"), ("conns", "right"), ("tls", "right"),
                          ("accepts/s", "right"), ("reads/s", "right"), ("wbuf", "right"),
                          ("accepted", "right"), ("accept", "left"), ("rests", "right"),
                          ("age", "right")):
        grid.add_column(name, justify=justify, no_wrap=True,  # type: ignore[arg-type]
                        min_width=len(name))
    for row in table:
        timed = row["time_metrics"]
        grid.add_row(
            str(row["pid"]),
            f"{row['utilisation']:.0%}" if timed else "-",
            sparkline(row["utilisation_history"], spark_width) if timed else "",
            _duration(row["lag_p50"]) if timed else "-",
            _duration(row["lag_p99"]) if timed else "-",
            str(row["connections"]),
            str(row["tls_connections"]),
            f"{row['accepts_per_second']:.0f}",
            f"{row['reads_per_second']:.0f}",
            _size(row["write_buffer_bytes"]),
            str(row["accepted"]),
            row["accept"],
            str(row["rests"]),
            Text(f"{row['age']:.0f}s stale", style="bold red") if row["stale"]
            else f"{row['age']:.1f}s",
        )
    pool_line = summary(table)
    footer = Text(
        f"{pool_line['workers']} workers ({pool_line['stale_workers']} stale), "
        f"{pool_line['connections']} connections, "
        f"{pool_line['accepts_per_second']:.0f} accepts/s; Jain's index of accepts: "
        f"{pool_line['jain_accepts_last_minute']:.3f} over the last minute, "
        f"{pool_line['jain_accepts']:.3f} since start ({pool_line['accepted']} accepted)")
    return Group(grid, footer)


def snapshot(directory: str) -> list[dict[str, Any]]:
    return rows(pool.read(directory))


def spark_width(console_width: int) -> int:
    """The sparkline's columns: what the terminal leaves beside the other
    columns (about 120), from 10 to :data:`asyncio_relaxed._publish.HISTORY`."""
    return min(max(console_width - 125, 10), HISTORY)


def main(directory: str, *, once: bool, as_json: bool, interval: float) -> int:
    if as_json:
        table = snapshot(directory)
        print(json.dumps({"directory": directory, "workers": table, "pool": summary(table)},
                         indent=2))
        return 0
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError:
        raise SystemExit(
            "python -m asyncio_relaxed top draws with rich, which is not installed; install "
            "it with: pip install rich (or use --json, which needs nothing)") from None
    console = Console()
    if once:
        console.print(render(directory, snapshot(directory), spark_width(console.width)))
        return 0
    try:
        with Live(render(directory, snapshot(directory), spark_width(console.width)),
                  console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(render(directory, snapshot(directory), spark_width(console.width)),
                            refresh=True)
    except KeyboardInterrupt:
        return 0
