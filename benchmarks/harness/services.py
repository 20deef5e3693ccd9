"""The throwaway servers some workloads talk to: ``.ci/services``' PostgreSQL and Redis.

``.ci/services up`` starts them on loopback and writes how to reach them to
``.services.json`` at the checkout's root (tests/test_clients.py reads the
same file); ``.ci/services down`` stops them and deletes it.  A workload
that needs one names it in ``Workload.services``; where the file or its
entry is missing, :func:`missing` says so and the runner skips the
workload with that reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.harness.processes import ROOT

#: Written by ``.ci/services up``, deleted by ``.ci/services down``.
FILE = ROOT / ".services.json"


def missing(name: str, file: Path | None = None) -> str | None:
    """Why service *name* ("postgres", "redis") cannot be reached through
    *file* (:data:`FILE`), or None when the file names it."""
    file = file or FILE
    if not file.is_file():
        return (f"no {file.name} at {file.parent}: no throwaway {name} here; start "
                "PostgreSQL and Redis with `.ci/services up` (root, Debian)")
    with file.open() as f:
        if name not in json.load(f):
            return f"{file} names no {name!r} service; run `.ci/services up` again"
    return None


def read(name: str, file: Path | None = None) -> dict[str, Any]:
    """How to reach service *name*: its entry of *file* (:data:`FILE`:
    host, port, ...); LookupError, saying why, when there is none."""
    file = file or FILE
    why = missing(name, file)
    if why:
        raise LookupError(why)
    with file.open() as f:
        about: dict[str, Any] = json.load(f)[name]
    return about
