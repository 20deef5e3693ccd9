"""asyncio_relaxed: a drop-in asyncio event loop that counts what it costs.

Switch with one line::

    asyncio_relaxed.run(main())                       # like asyncio.run
    asyncio.run(main(), loop_factory=asyncio_relaxed.new_event_loop)  # 3.12+
    asyncio_relaxed.install()                         # policy, before 3.14

Settings are keyword arguments or ``ASYNCIO_RELAXED_*`` environment
variables (see :class:`Config`); ``loop.statistics()`` returns the counters.
"""

from __future__ import annotations

import asyncio
import sys
import warnings
from collections.abc import Coroutine
from typing import Any, TypeVar

from ._config import AcceptStrategy, Config, PartialWrite, Poller, WriteMode, resolve
from ._loop import Loop
from ._stats import COUNTERS, LoopStatistics

__version__ = "0.1.0"

__all__ = [
    "COUNTERS",
    "AcceptStrategy",
    "Config",
    "EventLoopPolicy",
    "Loop",
    "LoopStatistics",
    "PartialWrite",
    "Poller",
    "WriteMode",
    "install",
    "new_event_loop",
    "resolve",
    "run",
]

_T = TypeVar("_T")


def new_event_loop(**options: Any) -> Loop:
    """A new :class:`Loop`; with no arguments, a loop factory for any tool."""
    return Loop(**options)


def run(main: Coroutine[Any, Any, _T], *, debug: bool | None = None, **options: Any) -> _T:
    """``asyncio.run(main)`` on a new :class:`Loop` made with *options*."""
    resolve(options)  # a bad setting fails before the coroutine is touched

    def factory() -> Loop:
        return Loop(**options)

    if sys.version_info >= (3, 12):
        return asyncio.run(main, debug=debug, loop_factory=factory)  # type: ignore[no-any-return]
    if sys.version_info >= (3, 11):
        with asyncio.Runner(debug=debug, loop_factory=factory) as runner:
            return runner.run(main)  # type: ignore[no-any-return]
    return _run_310(main, debug, factory)  # type: ignore[no-any-return]


def _run_310(main: Any, debug: bool | None, factory: Any) -> Any:
    """asyncio.run of 3.10, with a loop factory."""
    from asyncio import coroutines, events

    from . import _compat

    if events._get_running_loop() is not None:
        raise RuntimeError("asyncio.run() cannot be called from a running event loop")
    if not coroutines.iscoroutine(main):
        raise ValueError(f"a coroutine was expected, got {main!r}")
    loop = factory()
    try:
        events.set_event_loop(loop)
        if debug is not None:
            loop.set_debug(debug)
        return loop.run_until_complete(main)
    finally:
        try:
            _compat.cancel_all_tasks(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            events.set_event_loop(None)
            loop.close()


def __getattr__(name: str) -> Any:
    # Policies are loaded lazily and deprecated from 3.14, like CPython's.
    if name in ("EventLoopPolicy", "install"):
        if sys.version_info >= (3, 16):
            raise AttributeError(
                f"asyncio_relaxed.{name} is gone on Python 3.16+, as asyncio's policies "
                "are; use asyncio_relaxed.run() or loop_factory=asyncio_relaxed.new_event_loop"
            )
        if sys.version_info >= (3, 14):
            warnings.warn(
                f"asyncio_relaxed.{name} is deprecated, as asyncio's policies are since "
                "Python 3.14; use asyncio_relaxed.run() or "
                "loop_factory=asyncio_relaxed.new_event_loop",
                DeprecationWarning,
                stacklevel=2,
            )
        from . import _policy

        return getattr(_policy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
