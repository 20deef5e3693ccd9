"""asyncio_relaxed: a drop-in asyncio event loop that counts what it costs.

Switch with one line::

    asyncio_relaxed.run(main())                       # like asyncio.run
    asyncio.run(main(), loop_factory=asyncio_relaxed.new_event_loop)  # 3.12+
    asyncio_relaxed.install()                         # policy, before 3.14

Settings are keyword arguments or ``ASYNCIO_RELAXED_*`` environment
variables (see :class:`Config`); ``loop.statistics()`` returns the counters.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Coroutine
from typing import Any, TypeVar

from . import _compat
from ._accept import ListenerStatistics
from ._builds import BUILD, CLoop, Loop, PyLoop
from ._config import (
    AcceptStrategy,
    Config,
    DatagramMode,
    PartialWrite,
    PipeMode,
    Poller,
    TlsMode,
    Transports,
    WriteMode,
    resolve,
)
from ._health import HealthSnapshot
from ._slow import SlowCallback
from ._stats import COUNTERS, GAUGES, LoopGauges, LoopStatistics
from ._version import __version__ as __version__

__all__ = [
    "BUILD",
    "COUNTERS",
    "GAUGES",
    "AcceptStrategy",
    "CLoop",
    "Config",
    "DatagramMode",
    "EventLoopPolicy",
    "HealthSnapshot",
    "ListenerStatistics",
    "Loop",
    "LoopGauges",
    "LoopStatistics",
    "PartialWrite",
    "PipeMode",
    "Poller",
    "PyLoop",
    "SlowCallback",
    "TlsMode",
    "Transports",
    "WriteMode",
    "install",
    "new_event_loop",
    "resolve",
    "run",
]

_T = TypeVar("_T")
# Public submodules loaded on first attribute access (PEP 562).
_SUBMODULES = frozenset({"metrics", "pool"})


def new_event_loop(**options: Any) -> Loop:
    """A new :class:`Loop`; with no arguments, a loop factory for any tool."""
    return Loop(**options)


def run(main: Coroutine[Any, Any, _T], *, debug: bool | None = None, **options: Any) -> _T:
    """``asyncio.run(main)`` on a new :class:`Loop` made with *options*."""
    resolve(options)  # a bad setting fails before the coroutine is touched

    def factory() -> Loop:
        return Loop(**options)

    return _compat.run(main, debug, factory)  # type: ignore[no-any-return]


def __getattr__(name: str) -> Any:
    # Policies are loaded lazily and deprecated from 3.14, like CPython's.
    if name in ("EventLoopPolicy", "install"):
        if _compat.PY316 or _compat.base_default_policy() is None:
            raise AttributeError(
                f"asyncio_relaxed.{name} needs asyncio's policy system, which this Python "
                "does not have (CPython 3.16 removed it); use asyncio_relaxed.run(main()) "
                "or loop_factory=asyncio_relaxed.new_event_loop"
            )
        if _compat.PY314:
            warnings.warn(
                f"asyncio_relaxed.{name} is deprecated, as asyncio's policies are since "
                "Python 3.14; use asyncio_relaxed.run() or "
                "loop_factory=asyncio_relaxed.new_event_loop",
                DeprecationWarning,
                stacklevel=2,
            )
        from . import _policy

        return getattr(_policy, name)
    if name in _SUBMODULES:
        # Reachable after `import asyncio_relaxed`; importing them imports
        # none of their optional peers (prometheus_client, opentelemetry, rich).
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
