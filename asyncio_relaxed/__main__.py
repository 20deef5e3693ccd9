"""``python -m asyncio_relaxed``: version, resolved settings, platform facts.

Run it where the server runs, with the server's environment, to see what a
loop created there would use and which variable set each value.
"""

from __future__ import annotations

import os
import platform
import select
import socket
import sys

from . import __version__
from ._config import ENV_PREFIX, resolve


def main() -> int:
    print(f"asyncio_relaxed {__version__}")
    print(f"Python {platform.python_version()} ({platform.python_implementation()}) "
          f"on {platform.system()} {platform.release()} {platform.machine()}")
    try:
        config = resolve()
    except ValueError as exc:
        print(f"\nsettings: INVALID: {exc}")
        return 2
    environ = {} if sys.flags.ignore_environment else os.environ
    print("\nsettings (keyword > environment > default):")
    for name, var, value, unit, _why in config.describe():
        source = f"from {var}" if environ.get(var, "").strip() else "default"
        print(f"  {name:<14} = {value!s:<10} {unit:<11} {source}")
    if sys.flags.ignore_environment:
        print(f"  (python -E: {ENV_PREFIX}* variables are ignored)")
    print("\nplatform:")
    print(f"  epoll          {'yes' if hasattr(select, 'epoll') else 'no'}")
    print(f"  EPOLLEXCLUSIVE {'yes' if hasattr(select, 'EPOLLEXCLUSIVE') else 'no'}")
    print(f"  SO_REUSEPORT   {'yes' if hasattr(socket, 'SO_REUSEPORT') else 'no'}")
    print(f"  sendmsg        {'yes' if hasattr(socket.socket, 'sendmsg') else 'no'}")
    try:
        iov_max = os.sysconf("SC_IOV_MAX")
    except (AttributeError, ValueError, OSError):
        iov_max = -1
    print(f"  IOV_MAX        {iov_max if iov_max > 0 else 'unknown'}")
    try:
        from importlib.metadata import PackageNotFoundError, version

        print(f"  uvloop         {version('uvloop')} (for comparison)")
    except PackageNotFoundError:
        print("  uvloop         not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
