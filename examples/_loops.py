"""The examples' ``--loop``: the loop table of benchmarks/loops.py.

The examples run as scripts from the checkout (``python
examples/echo_server.py``), which puts examples/, not the checkout, on
sys.path: the checkout is appended here, so ``benchmarks.loops`` is the same
table for the tests, the examples and the benchmarks, and every package
installed in the environment still comes first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHECKOUT = str(Path(__file__).resolve().parent.parent)
if CHECKOUT not in sys.path:
    sys.path.append(CHECKOUT)

from benchmarks import loops  # noqa: E402  (importable from the checkout only)


def add_loop_option(parser: argparse.ArgumentParser, default: str = "relaxed") -> None:
    parser.add_argument("--loop", choices=loops.EVENT_LOOPS, default=default, metavar="NAME",
                        help=f"the event loop ({default}): {', '.join(loops.EVENT_LOOPS)}; "
                        "relaxed-* are asyncio_relaxed's presets (benchmarks/loops.py)")


def loop_factory(parser: argparse.ArgumentParser, name: str,
                 **settings: str | None) -> loops.LoopFactory:
    """The factory of loop *name* with asyncio_relaxed *settings* (None: the
    preset's, else the environment's); a loop that cannot run here, or
    settings given to another loop than ours, stop the script with the reason."""
    why = loops.missing(name)
    if why:
        parser.error(f"--loop {name}: {why}")
    try:
        return loops.factory(name, **settings)
    except ValueError as exc:
        parser.error(f"--loop {name}: {exc}")
