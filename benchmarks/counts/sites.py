"""Where code lives: the groups the count tools sort functions and lines into.

``asyncio_relaxed``, ``asyncio`` (stock's Python, which our loop inherits in
part), ``floor`` (the floors' echo functions, benchmarks.counts.driver),
``driver`` (the rest of benchmarks/: the same code on every loop) and
``other`` (aiohttp, the rest of the standard library: stock's ``selectors``
is there).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from types import CodeType

from benchmarks.counts.driver import FLOOR_FUNCTIONS

GROUPS = ("asyncio_relaxed", "asyncio", "floor", "driver", "other")
_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def group(filename: str, name: str = "") -> str:
    """Which of GROUPS the code of function *name* (function_name) in
    *filename* belongs to."""
    if name in FLOOR_FUNCTIONS:
        return "floor"
    path = Path(filename)
    parts = path.parts
    if "asyncio_relaxed" in parts:
        return "asyncio_relaxed"
    if "benchmarks" in parts:
        return "driver"
    try:
        inside = path.resolve().relative_to(_STDLIB).parts
    except ValueError:
        return "other"
    return "asyncio" if inside[:1] == ("asyncio",) else "other"


def function_name(code: CodeType) -> str:
    """``module-file:qualname`` of a code object (qualname from 3.11)."""
    return f"{Path(code.co_filename).stem}:{code.co_qualname}"
