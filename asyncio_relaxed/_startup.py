"""What a loop says when it is made: which loop, with which settings, and
the ``ASYNCIO_RELAXED_*`` variables that name no setting.

Both go to the ``asyncio_relaxed`` logger: the startup line at INFO, once per
process for each distinct set of settings (a test suite that makes a loop
per test says it once), and a warning once per unknown variable, naming the
closest known one.  Where the application configured no handler that our
logger reaches, a server's error log takes them instead, if one is set up
(``gunicorn.error``, ``uvicorn.error``): so ``uvicorn --log-level info`` and
gunicorn's log show the loop each worker runs, without either configuring a
logger they do not know of.

This module knows nothing of asyncio.
"""

from __future__ import annotations

import difflib
import logging
import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

from ._config import ENV_PREFIX, Config
from ._version import __version__

__all__ = ["announce", "logger", "server_logger", "startup_line", "unknown_variables"]

logger = logging.getLogger("asyncio_relaxed")

#: Loggers of the servers that run this loop in their workers, whose handlers
#: the startup line and the warnings use when ours reach none.
SERVER_LOGGERS = ("gunicorn.error", "uvicorn.error")

_announced: set[tuple[int, Config, str]] = set()
_warned: set[tuple[int, str]] = set()


def server_logger() -> logging.Logger:
    """Ours when a handler hears it (the application configured logging);
    else the first server error log that has one; else ours (whose warnings
    then reach logging's last resort, stderr)."""
    if logger.hasHandlers():
        return logger
    for name in SERVER_LOGGERS:
        if name in logging.Logger.manager.loggerDict:  # never create one
            other = logging.getLogger(name)
            if other.hasHandlers():
                return other
    return logger


def token(value: Any) -> str:
    """A setting's value as the environment variable would spell it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def startup_line(config: Config, backend: str) -> str:
    """``asyncio_relaxed 0.2.0 (CPython 3.12.1, epoll) in process 123:
    write=deferred accept=balanced`` (or ``default settings``)."""
    default = Config()
    changed = [f"{name}={token(value)}" for name, _var, value, _unit, _why in config.describe()
               if value != getattr(default, name)]
    return (f"asyncio_relaxed {__version__} ({platform.python_implementation()} "
            f"{platform.python_version()}, {backend}) in process {os.getpid()}: "
            + (" ".join(changed) or "default settings"))


def unknown_variables(config: Config, environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``ASYNCIO_RELAXED_*`` variables that name no setting (a typo, or a
    setting of another version), each with the closest known one (or None):
    the loop ignores them."""
    known = [var for _name, var, *_rest in config.describe()]
    # Matched without the prefix, which every name shares.
    tails = [var[len(ENV_PREFIX):] for var in known]
    out = []
    for var, raw in sorted(environ.items()):
        if var.startswith(ENV_PREFIX) and var not in known and raw.strip():
            close = difflib.get_close_matches(var[len(ENV_PREFIX):], tails, n=1, cutoff=0.6)
            out.append((var, ENV_PREFIX + close[0] if close else None))
    return out


def announce(config: Config, backend: str, environ: Mapping[str, str] | None = None) -> None:
    """A new loop's startup line and warnings (each said once per process)."""
    if environ is None:
        environ = {} if sys.flags.ignore_environment else os.environ
    pid = os.getpid()
    for var, closest in unknown_variables(config, environ):
        if (pid, var) not in _warned:
            _warned.add((pid, var))
            hint = f"; did you mean {closest}?" if closest else ""
            server_logger().warning(
                "%s is not a setting of asyncio_relaxed %s and is ignored%s",
                var, __version__, hint)
    key = (pid, config, backend)
    if key not in _announced:
        _announced.add(key)
        target = server_logger()
        if target.isEnabledFor(logging.INFO):
            target.info("%s", startup_line(config, backend))
