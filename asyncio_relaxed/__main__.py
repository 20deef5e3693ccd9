"""``python -m asyncio_relaxed``: version, every setting, platform facts.

Run it where the server runs, with the server's environment: it lists every
setting a loop created there would use, with its keyword, its environment
variable and whether the environment set it, then the platform facts that
decide what the settings can do.  Exit status 2 when a variable holds a
value the loop would refuse (the message names it, as the loop's would).
"""

from __future__ import annotations

import os
import platform
import select
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from . import __version__
from ._config import ENV_PREFIX, Config, resolve


def columns(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """*rows* as lines of left-aligned columns, each as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        (indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        .rstrip()
        for row in rows
    ]


def token(value: Any) -> str:
    """A setting's value as the environment variable would spell it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def settings_rows(config: Config, environ: Mapping[str, str]) -> list[tuple[str, ...]]:
    """A header and one row per setting: keyword, variable, value, unit, source."""
    rows: list[tuple[str, ...]] = [("keyword", "environment variable", "value", "unit", "set by")]
    for name, var, value, unit, _why in config.describe():
        source = "environment" if environ.get(var, "").strip() else "default"
        rows.append((name, var, token(value), unit, source))
    return rows


def unknown_variables(config: Config, environ: Mapping[str, str]) -> list[str]:
    """``ASYNCIO_RELAXED_*`` variables that name no setting (a typo, or a
    setting of another version): the loop ignores them."""
    known = {var for _name, var, *_rest in config.describe()}
    return sorted(var for var, raw in environ.items()
                  if var.startswith(ENV_PREFIX) and var not in known and raw.strip())


def platform_rows() -> list[tuple[str, str]]:
    try:
        iov_max = os.sysconf("SC_IOV_MAX")
    except (AttributeError, ValueError, OSError):
        iov_max = -1
    try:
        from importlib.metadata import PackageNotFoundError, version

        uvloop = f"{version('uvloop')} (for comparison)"
    except PackageNotFoundError:
        uvloop = "not installed"
    return [
        ("epoll", "yes" if hasattr(select, "epoll") else "no"),
        ("EPOLLEXCLUSIVE", "yes" if hasattr(select, "EPOLLEXCLUSIVE") else "no"),
        ("SO_REUSEPORT", "yes" if hasattr(socket, "SO_REUSEPORT") else "no"),
        ("sendmsg", "yes" if hasattr(socket.socket, "sendmsg") else "no"),
        ("IOV_MAX", str(iov_max) if iov_max > 0 else "unknown"),
        ("uvloop", uvloop),
    ]


def main() -> int:
    print(f"asyncio_relaxed {__version__}")
    print(f"Python {platform.python_version()} ({platform.python_implementation()}) "
          f"on {platform.system()} {platform.release()} {platform.machine()}")
    environ = {} if sys.flags.ignore_environment else os.environ
    try:
        config = resolve(environ=environ)
    except ValueError as exc:
        print(f"\nsettings: INVALID: {exc}")
        return 2
    print("\nsettings (keyword > environment > default):")
    print("\n".join(columns(settings_rows(config, environ))))
    if sys.flags.ignore_environment:
        print(f"  (python -E: {ENV_PREFIX}* variables are ignored)")
    for var in unknown_variables(config, environ):
        print(f"  note: {var} is not a setting of asyncio_relaxed {__version__}; ignored")
    print("\nplatform:")
    print("\n".join(columns(platform_rows())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
