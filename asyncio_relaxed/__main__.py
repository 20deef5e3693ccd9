"""``python -m asyncio_relaxed``: version, every setting, platform facts;
``python -m asyncio_relaxed top``: a pool's workers, live.

Run it where the server runs, with the server's environment: it lists every
setting a loop created there would use, with its keyword, its environment
variable and whether the environment set it, then the platform facts that
decide what the settings can do.  Exit status 2 when a variable holds a
value the loop would refuse (the message names it, as the loop's would).
``top`` reads the snapshots the loops of a pool publish to their
``stats_dir`` (asyncio_relaxed/_top.py).  Output into a closed pipe
(``| head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import os
import platform
import select
import socket
import sys
from collections.abc import Mapping, Sequence

from ._config import ENV_PREFIX, NO_EXTENSIONS_VAR, Config, resolve
from ._startup import token, unknown_variables
from ._version import __version__


def columns(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """*rows* as lines of left-aligned columns, each as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        (indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        .rstrip()
        for row in rows
    ]


def settings_rows(config: Config, environ: Mapping[str, str]) -> list[tuple[str, ...]]:
    """A header and one row per setting: keyword, variable, value, unit, source."""
    rows: list[tuple[str, ...]] = [("keyword", "environment variable", "value", "unit", "set by")]
    for name, var, value, unit, _why in config.describe():
        source = "environment" if environ.get(var, "").strip() else "default"
        rows.append((name, var, token(value) or "(none)", unit, source))
    return rows


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


def build_line() -> str:
    """Which build a loop made here runs, and why where it is the pure one."""
    from . import _builds  # (imports the loop: only for the report)

    if _builds.BUILD == "compiled":
        return "build: compiled (asyncio_relaxed._speedups)"
    return f"build: pure ({_builds.WHY})" if _builds.WHY else "build: pure"


def settings_report() -> int:
    print(f"asyncio_relaxed {__version__}")
    print(f"Python {platform.python_version()} ({platform.python_implementation()}) "
          f"on {platform.system()} {platform.release()} {platform.machine()}")
    print(build_line())
    environ = {} if sys.flags.ignore_environment else os.environ
    try:
        config = resolve(environ=environ)
    except ValueError as exc:
        print(f"\nsettings: INVALID: {exc}")
        return 2
    print("\nsettings (keyword > environment > default):")
    print("\n".join(columns(settings_rows(config, environ))))
    no_extensions = environ.get(NO_EXTENSIONS_VAR, "").strip()
    print(f"  {NO_EXTENSIONS_VAR}={no_extensions or '(unset)'}: the pure-Python build "
          f"when on (read when the package is imported)")
    if sys.flags.ignore_environment:
        print(f"  (python -E: {ENV_PREFIX}* variables are ignored)")
    for var, closest in unknown_variables(config, environ):
        hint = f" (did you mean {closest}?)" if closest else ""
        print(f"  note: {var} is not a setting of asyncio_relaxed {__version__}; ignored{hint}")
    print("\nplatform:")
    print("\n".join(columns(platform_rows())))
    return 0


def parser() -> argparse.ArgumentParser:
    command = argparse.ArgumentParser(
        prog="python -m asyncio_relaxed",
        description="Without a command: the version, every setting a loop made here would "
        "use (keyword, environment variable, value, source) and the platform's facts; exit "
        "status 2 if a variable holds a value the loop would refuse.")
    commands = command.add_subparsers(dest="command", metavar="COMMAND")
    top = commands.add_parser(
        "top", help="the workers of a pool, live (their loops' stats_dir)",
        description="One row per worker whose loop publishes to DIR (the stats_dir setting): "
        "utilisation and its last minute, lag p50/p99, open connections, accepts and reads "
        "per second, write buffer, accept strategy and rests; Jain's index of accepts "
        "across the workers.  Ctrl-C quits.")
    top.add_argument("directory", nargs="?", metavar="DIR",
                     help=f"the pool's stats_dir (default: ${ENV_PREFIX}STATS_DIR)")
    top.add_argument("--once", action="store_true", help="print the table once and exit")
    top.add_argument("--json", action="store_true",
                     help="print the workers and the pool once as JSON and exit (needs no rich)")
    top.add_argument("--interval", type=float, default=1.0,
                     help="seconds between redraws (default: 1, the loops' publishing interval)")
    return command


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command != "top":
            status = settings_report()
            sys.stdout.flush()  # here, where a closed pipe is caught
            return status
        from . import _top

        directory = args.directory or (
            "" if sys.flags.ignore_environment else os.environ.get(f"{ENV_PREFIX}STATS_DIR", ""))
        if not directory:
            print(f"python -m asyncio_relaxed top: no directory; name one, or set "
                  f"{ENV_PREFIX}STATS_DIR as the pool's loops have it", file=sys.stderr)
            return 2
        if not os.path.isdir(directory):
            print(f"python -m asyncio_relaxed top: {directory!r} is not a directory (the "
                  "pool's stats_dir)", file=sys.stderr)
            return 2
        status = _top.main(directory, once=args.once, as_json=args.json,
                           interval=max(args.interval, 0.1))
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # The reader went away (| head): nothing more to say.  Point stdout
        # at /dev/null so the interpreter's final flush raises nothing.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
