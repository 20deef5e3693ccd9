"""What a loop says when it is made: which loop, with which settings, and
the ``ASYNCIO_RELAXED_*`` variables that name no setting.

The startup line is said once per process for each distinct set of settings
(a test suite that makes a loop per test says it once), at a level no
stock-asyncio program would notice (issue #47: the stock loop says nothing
at INFO when made or used; its "Using selector" line is DEBUG, and a test
runner that fails on any record at INFO or above must pass on our loop as on
stock's).  :func:`startup_destination` is the rule:

* the application set the ``asyncio_relaxed`` logger's own level (not one it
  inherits): INFO or lower asks to hear the line, so it is said at INFO,
  through :func:`server_logger`; a higher one is said at DEBUG on ours;
* else a server's error log (``gunicorn.error``, ``uvicorn.error``) that the
  server configured (a handler on it or on an ancestor below the root) and
  that takes INFO: the loop runs in that server's worker, and the
  line is said at INFO there, where gunicorn says "Booting worker" and
  uvicorn "Started server process", so ``uvicorn --log-level info`` and
  gunicorn's log show the loop each worker runs without configuring a logger
  they do not know of;
* else at DEBUG on ours, as stock's "Using selector".

An ``ASYNCIO_RELAXED_*`` variable that names no setting is bad input, which
only this loop can report: a warning once per variable, naming the closest
known one, through :func:`server_logger` (ours when the application's
logging hears it, else a server's error log, else logging's last resort,
stderr).

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

from ._config import ENV_PREFIX, NO_EXTENSIONS_VAR, Config
from ._version import __version__

__all__ = ["announce", "logger", "server_logger", "startup_destination", "startup_line",
           "unknown_variables"]

logger = logging.getLogger("asyncio_relaxed")

#: Loggers of the servers that run this loop in their workers: the startup
#: line goes to the first that the server configured and that takes INFO, the
#: warnings to the first that the server configured when ours reaches no
#: handler.
SERVER_LOGGERS = ("gunicorn.error", "uvicorn.error")

_announced: set[tuple[int, Config, str, str]] = set()
_warned: set[tuple[int, str]] = set()


def _server_logs() -> list[logging.Logger]:
    """The servers' error logs that the server configured, in SERVER_LOGGERS
    order: with a handler on the logger or on an ancestor below the root.
    Not the root's: any application's logging has those, and a server that
    is merely imported (a test suite that imports uvicorn) configured none."""
    found = []
    for name in SERVER_LOGGERS:
        if name not in logging.Logger.manager.loggerDict:  # never create one
            continue
        node: logging.Logger | None = logging.getLogger(name)
        while node is not None and node is not logging.root:
            if node.handlers:
                found.append(logging.getLogger(name))
                break
            node = node.parent if node.propagate else None
    return found


def server_logger() -> logging.Logger:
    """Ours when a handler hears it (the application configured logging);
    else the first server error log the server configured; else ours (whose
    warnings then reach logging's last resort, stderr)."""
    if logger.hasHandlers():
        return logger
    servers = _server_logs()
    return servers[0] if servers else logger


def startup_destination() -> tuple[logging.Logger, int]:
    """The logger and level of the startup line (the rule is the module's
    docstring): INFO where the application asked for our logger at INFO or
    where a server announces its workers, else DEBUG on ours."""
    own = logger.level  # NOTSET (0) unless the application set it
    if own:
        return (server_logger(), logging.INFO) if own <= logging.INFO else (logger, logging.DEBUG)
    for server in _server_logs():
        if server.isEnabledFor(logging.INFO):
            return server, logging.INFO
    return logger, logging.DEBUG


def token(value: Any) -> str:
    """A setting's value as the environment variable would spell it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def startup_line(config: Config, backend: str, build: str = "pure") -> str:
    """``asyncio_relaxed 0.2.0 (CPython 3.12.1, epoll, compiled) in process
    123: write=deferred accept=balanced`` (or ``default settings``); *build*
    is the loop's (asyncio_relaxed._builds)."""
    default = Config()
    changed = [f"{name}={token(value)}" for name, _var, value, _unit, _why in config.describe()
               if value != getattr(default, name)]
    return (f"asyncio_relaxed {__version__} ({platform.python_implementation()} "
            f"{platform.python_version()}, {backend}, {build}) in process {os.getpid()}: "
            + (" ".join(changed) or "default settings"))


def unknown_variables(config: Config, environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``ASYNCIO_RELAXED_*`` variables that name no setting (a typo, or a
    setting of another version), each with the closest known one (or None):
    the loop ignores them."""
    known = [var for _name, var, *_rest in config.describe()] + [NO_EXTENSIONS_VAR]
    # Matched without the prefix, which every name shares.
    tails = [var[len(ENV_PREFIX):] for var in known]
    out = []
    for var, raw in sorted(environ.items()):
        if var.startswith(ENV_PREFIX) and var not in known and raw.strip():
            close = difflib.get_close_matches(var[len(ENV_PREFIX):], tails, n=1, cutoff=0.6)
            out.append((var, ENV_PREFIX + close[0] if close else None))
    return out


def announce(config: Config, backend: str, environ: Mapping[str, str] | None = None,
             build: str = "pure") -> None:
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
    key = (pid, config, backend, build)
    if key not in _announced:
        _announced.add(key)
        target, level = startup_destination()
        if target.isEnabledFor(level):
            target.log(level, "%s", startup_line(config, backend, build))
