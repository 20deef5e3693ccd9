"""Slow callbacks, reported without debug mode.

With ``slow_callback`` set (seconds), the loop times every callback and
reports one that ran longer: what it was and, for a step of a Task, the
task's name and coroutine, and on 3.14+ the task's call graph
(``asyncio.format_call_graph``) as it stands after the step, where it now
awaits.  Stock asyncio warns about slow callbacks only in debug mode and
names no task.  Reports go to the ``asyncio_relaxed`` logger, or to the
handler set with ``loop.set_slow_callback_handler()``, at most once a second
(see ``_health.ReportLimit``); each counts the reports held back before it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from . import _compat

__all__ = ["SlowCallback", "describe", "logger", "report"]

logger = logging.getLogger("asyncio_relaxed")


@dataclasses.dataclass(frozen=True)
class SlowCallback:
    """One slow callback, as a report hands it to a handler."""

    #: How long it ran, seconds.
    seconds: float
    #: The callback as stock's "Executing ..." warning names it.
    callback: str
    #: The Task the callback stepped, or None.
    task: Any
    task_name: str | None
    coroutine: str | None
    #: The task's call graph after the step (3.14+), or None.
    call_graph: str | None
    #: Slow callbacks not reported since the last report (the rate limit).
    skipped: int

    def message(self) -> str:
        text = f"slow callback: {self.callback} took {self.seconds:.3f} seconds"
        if self.task is not None:
            text += f" (task {self.task_name!r}, coroutine {self.coroutine})"
        if self.skipped:
            text += f"; {self.skipped} more since the last report"
        if self.call_graph:
            text += "\n" + self.call_graph.rstrip()
        return text


def describe(handle: Any, seconds: float, skipped: int) -> SlowCallback:
    """The report of *handle*'s callback, which ran *seconds*."""
    callback = handle._callback
    source = _compat.format_handle(handle) if callback is not None else repr(handle)
    owner = getattr(callback, "__self__", None)
    task = owner if isinstance(owner, asyncio.Task) else None
    name = coroutine = graph = None
    if task is not None:
        name = task.get_name()
        coroutine = _coroutine_name(task.get_coro())
        graph = _compat.format_call_graph(task)
    return SlowCallback(seconds, source, task, name, coroutine, graph, skipped)


def _coroutine_name(coro: Any) -> str:
    qualname = getattr(coro, "__qualname__", None)
    return f"{qualname}()" if qualname else repr(coro)


def report(loop: Any, handle: Any, seconds: float, now: float) -> None:
    """*handle*'s callback ran *seconds* (monotonic *now* when it returned),
    past the loop's slow_callback threshold: count it, and report it unless
    the rate limit holds it back."""
    health = loop._health
    health.slow_callbacks += 1
    skipped = health.limit.allow(now)
    if skipped is None:
        return
    slow = describe(handle, seconds, skipped)
    handler = health.handler
    if handler is None:
        logger.warning("%s", slow.message())
        return
    try:
        handler(loop, slow)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        loop.call_exception_handler(
            {"message": "Unhandled error in the slow callback handler", "exception": exc,
             "handle": handle}
        )
