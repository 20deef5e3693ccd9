"""The one table of loops the examples offer with --loop (shared by each script).

The examples run as scripts (``python examples/echo_server.py``), so this
module is imported as ``_loops`` from the scripts' own folder.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncio_relaxed

LOOPS = ("asyncio", "uvloop", "relaxed")


def make_loop_factory(
    name: str,
    write: str | None = None,
    partial_write: str | None = None,
    **more: str | None,
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A zero-argument loop factory for *name*; None if it is not installed.

    *write*, *partial_write* and *more* (e.g. ``accept``) are asyncio_relaxed
    settings; None leaves a setting to its environment variable or default.
    """
    if name == "asyncio":
        return asyncio.SelectorEventLoop
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:  # an optional peer
            return None
        return uvloop.new_event_loop  # type: ignore[no-any-return]
    options = {"write": write, "partial_write": partial_write, **more}
    options = {k: v for k, v in options.items() if v}
    return lambda: asyncio_relaxed.new_event_loop(**options)
