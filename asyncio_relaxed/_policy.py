"""EventLoopPolicy and install(): the pre-3.12 way to switch loops.

Prefer ``asyncio_relaxed.run(main())`` or a loop factory.  Like CPython's own
policies, these warn with DeprecationWarning from Python 3.14 (the package's
``__getattr__`` issues it, at the caller's line) and are absent where asyncio
has no policy system (3.16).
"""

from __future__ import annotations

from typing import Any

from . import _compat
from ._builds import Loop
from ._config import resolve

__all__ = ["EventLoopPolicy", "install"]


class EventLoopPolicy(_compat.base_default_policy()):  # type: ignore[misc]
    """A policy whose loops are :class:`Loop`, made with the given options."""

    def __init__(self, **options: Any) -> None:
        resolve(options)  # fail now, naming the bad option, not at first use
        super().__init__()
        self._options = options

    def new_event_loop(self) -> Loop:
        return Loop(**self._options)

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.{type(self).__qualname__} {self._options!r}>"


def install(**options: Any) -> None:
    """Make :class:`Loop` the loop of ``asyncio.new_event_loop()`` and friends."""
    _compat.set_event_loop_policy(EventLoopPolicy(**options))
