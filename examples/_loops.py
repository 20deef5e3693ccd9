"""The examples' ``--loop``: a small table of their own.

Stock asyncio, uvloop when it is installed, and asyncio_relaxed with its
defaults and in each write mode; a script's own options (``--write``,
``--accept``, ...) set the rest of our loop's settings.  Only the public API
of asyncio_relaxed is used.  (The benchmarks have the full table, with the
other peers and every preset: benchmarks/harness/loops.py.)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
from collections.abc import Callable

import asyncio_relaxed

LoopFactory = Callable[[], asyncio.AbstractEventLoop]

#: Name -> asyncio_relaxed settings (keywords of new_event_loop), or None
#: for a loop that is not ours.
LOOPS: dict[str, dict[str, str] | None] = {
    "asyncio": None,
    "uvloop": None,
    "relaxed": {},  # the defaults, or the environment's ASYNCIO_RELAXED_* settings
    "relaxed-eager": {"write": "eager"},
    "relaxed-deferred": {"write": "deferred"},
}


def missing(name: str) -> str | None:
    """Why loop *name* cannot run here, or None."""
    if name not in LOOPS:
        return f"unknown loop {name!r}; known: {', '.join(LOOPS)}"
    if name == "uvloop" and importlib.util.find_spec("uvloop") is None:
        return "uvloop is not installed (pip install uvloop)"
    return None


def add_loop_option(parser: argparse.ArgumentParser, default: str = "relaxed") -> None:
    parser.add_argument("--loop", choices=tuple(LOOPS), default=default, metavar="NAME",
                        help=f"the event loop ({default}): {', '.join(LOOPS)}")


def loop_factory(parser: argparse.ArgumentParser, name: str,
                 **settings: str | None) -> LoopFactory:
    """The factory of loop *name* with asyncio_relaxed *settings* (None: the
    loop's own, else the environment's); a loop that cannot run here, a bad
    setting, or settings given to another loop than ours stop the script
    with the reason."""
    why = missing(name)
    if why:
        parser.error(f"--loop {name}: {why}")
    given = {key: value for key, value in settings.items() if value is not None}
    preset = LOOPS[name]
    if preset is None:
        if given:
            parser.error(f"--loop {name}: {', '.join(given)} are settings of asyncio_relaxed; "
                         "use --loop relaxed")
        if name == "uvloop":
            import uvloop

            return uvloop.new_event_loop
        return asyncio.SelectorEventLoop
    options = {**preset, **given}
    try:
        asyncio_relaxed.resolve(options)  # a bad value fails here, naming it
    except (TypeError, ValueError) as exc:
        parser.error(f"--loop {name}: {exc}")
    return lambda: asyncio_relaxed.new_event_loop(**options)
