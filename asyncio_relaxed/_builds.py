"""Which build of the loop a process runs: compiled or pure.

The pure-Python modules are the loop and its reference;
:mod:`asyncio_relaxed._speedups`, compiled where the package was installed
with a C compiler on CPython, is their accelerated twin (subclasses that
override the hot path; its docstring tells what and when).  This module
chooses once, when the package is imported, as CPython's ``asyncio.tasks``
chooses between ``_CTask`` and ``_PyTask`` and aiohttp between its Cython and
Python parsers: :data:`Loop` is the compiled loop unless
``ASYNCIO_RELAXED_NO_EXTENSIONS`` is on or the compiled module does not
import here (PyPy, a free-threaded Python, an install without a compiler);
:data:`BUILD` names the build and :data:`WHY` why it is the pure one.
Both classes stay reachable (:data:`PyLoop`, :data:`CLoop`), so that the
tests and benchmarks run each build in one process.

This module knows nothing of asyncio beyond the two classes.
"""

from __future__ import annotations

import sys
from typing import Any

from . import _loop
from ._config import NO_EXTENSIONS_VAR, no_extensions

__all__ = ["BUILD", "WHY", "CLoop", "Loop", "PyLoop"]

#: The pure-Python loop, the reference.
PyLoop: Any = _loop.Loop
#: The compiled loop, or None where it does not import (:data:`WHY` says why).
CLoop: Any = None
WHY = ""

try:
    from ._speedups import Loop as _CLoop
except ImportError as exc:
    if sys.implementation.name != "cpython":
        WHY = f"no compiled module for {sys.implementation.name}"
    elif hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled():
        WHY = "no compiled module for a free-threaded Python"
    else:
        WHY = f"the compiled module does not import: {exc}"
else:
    CLoop = _CLoop

try:
    _forced = no_extensions()
except ValueError:
    _forced = False  # resolve() raises it at each loop's creation
if _forced and CLoop is not None:
    WHY = f"{NO_EXTENSIONS_VAR} is on"

#: The loop class :func:`asyncio_relaxed.new_event_loop` makes.
Loop: Any = CLoop if CLoop is not None and not _forced else PyLoop
#: "compiled" or "pure".
BUILD = "compiled" if Loop is CLoop else "pure"
