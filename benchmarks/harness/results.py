"""The one writer of results: every file the suite leaves in ``results/``.

A run (``python -m benchmarks run`` or ``fairness``) leaves
``<start>.json`` (every sample), ``<start>.md`` (its tables) and, with
matplotlib, a chart per figure (``<start>-cpu.png``, ``<start>-jain.png``);
a count tool ``<start>-<tool>.json`` and ``.md``.  ``<start>`` is the
start time in UTC, ``20261201T174245Z``.  results/ is git-ignored: a file
the docs quote is added with ``git add -f`` (results/README.md).
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The format of a start time in a file name.
STAMP = "%Y%m%dT%H%M%SZ"


def now() -> datetime.datetime:
    """The current time in UTC, to the second (a run's ``started``)."""
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def stamp(started: datetime.datetime | str) -> str:
    """The file-name form of a start time (a datetime, or its isoformat)."""
    when = datetime.datetime.fromisoformat(started) if isinstance(started, str) else started
    return when.astimezone(datetime.UTC).strftime(STAMP)


def chart_name(name: str, figure: str) -> str:
    """The file name of chart *figure* of the results called *name*."""
    return f"{name}-{figure}.png"


def _finite(value: Any) -> Any:
    """Standard JSON has no infinity: an infinite figure (max/min when a
    worker got nothing) is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def save(directory: Path, name: str, doc: dict[str, Any], markdown: str | None = None,
         charts: Mapping[str, Any] | None = None) -> Path:
    """Write *doc* as ``name.json`` in *directory*, *markdown* as ``name.md``
    and each of *charts* (a matplotlib figure by its figure name) as
    :func:`chart_name`; return the JSON's path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(_finite(doc), indent=1, allow_nan=False) + "\n")
    if markdown is not None:
        path.with_suffix(".md").write_text(markdown)
    for figure, chart in (charts or {}).items():
        chart.savefig(directory / chart_name(name, figure), dpi=90)
    return path
