"""The one table of loops the benchmarks know: a name -> a loop factory.

Peers that are not installed (uvloop, rloop) are reported as missing with the
reason, never replaced by something else.  The relaxed presets cover each
setting that changes what a benchmark measures: write mode, partial-write
policy and accept strategy.  Only the public API of asyncio_relaxed is used.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import importlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping

import asyncio_relaxed

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    name: str
    #: "asyncio", "uvloop", "rloop", "relaxed", or "floor" (no event loop).
    kind: str
    #: asyncio_relaxed settings (keyword arguments of new_event_loop).
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: What the preset shows, for the report.
    about: str = ""


# The presets.  "relaxed" alone is the default configuration, whatever the
# defaults are at the time of the run (the JSON records them).
SPECS: dict[str, LoopSpec] = {
    s.name: s
    for s in (
        LoopSpec("asyncio", "asyncio", about="stock SelectorEventLoop"),
        LoopSpec("uvloop", "uvloop", about="libuv, Cython"),
        LoopSpec("rloop", "rloop", about="Rust (rloop), when installed"),
        LoopSpec("relaxed", "relaxed", about="asyncio_relaxed, default settings"),
        LoopSpec("relaxed-eager", "relaxed", {"write": "eager", "partial_write": "poll"},
                 "send at once; wait for writability after a short write"),
        LoopSpec("relaxed-deferred", "relaxed", {"write": "deferred", "partial_write": "poll"},
                 "one coalesced sendmsg per iteration"),
        LoopSpec("relaxed-feed", "relaxed", {"write": "deferred", "partial_write": "feed"},
                 "deferred, retry a short write next iteration"),
        LoopSpec("relaxed-batch", "relaxed", {"accept": "batch"}, "accept up to backlog per event"),
        LoopSpec("relaxed-single", "relaxed", {"accept": "single"}, "one accept per event"),
        LoopSpec("relaxed-relaxed", "relaxed", {"accept": "relaxed"},
                 "one accept, then yield the CPU"),
        LoopSpec("relaxed-balanced", "relaxed", {"accept": "balanced"},
                 "load-aware accept"),
        LoopSpec("floor", "floor",
                 about="no event loop: the least a Python echo server runs (epoll, "
                       "accept, recv, send); echo-protocol workloads only"),
    )
}

#: The loops of the default run of most workloads.
DEFAULT_LOOPS = ("asyncio", "uvloop", "rloop", "relaxed-eager", "relaxed-deferred")
#: The loops of the accept workloads (churn, fairness).
ACCEPT_LOOPS = ("asyncio", "uvloop", "relaxed-batch", "relaxed-single", "relaxed-relaxed",
                "relaxed-balanced")


#: Loops run from another checkout ("relaxed-eager@base"): name -> its path.
BASELINES: dict[str, str] = {}
#: Checkout path -> a folder holding only a link to its asyncio_relaxed.
_SHIMS: dict[str, str] = {}
_SHIMS_LOCK = threading.Lock()


def register_baseline(name: str, path: object) -> str:
    """Add loop *name* as run from the checkout at *path* (``--baseline``).

    The twin is called ``name@base``: its server processes import
    asyncio_relaxed from *path* first, so one run compares a change with
    what it changed, next to the same peers.
    """
    twin = f"{name}@base"
    spec = SPECS[name]
    SPECS[twin] = dataclasses.replace(spec, name=twin, about=f"{spec.about}, from {path}")
    BASELINES[twin] = str(path)
    return twin


def preset(name: str) -> str:
    """The preset a (possibly baseline) loop name runs."""
    return name.partition("@")[0]


def baseline_path(name: str) -> str | None:
    return BASELINES.get(name)


def import_dir(name: str) -> str | None:
    """Where a child process running loop *name* must start, or None (this tree).

    ``python -m`` puts its working directory first on sys.path, ahead of
    PYTHONPATH, so a child started in this tree imports this tree's
    asyncio_relaxed whatever PYTHONPATH says (every ``@base`` row before
    2026-11-30 03:00 measured the new code that way).  A baseline's child
    starts in, and puts first on PYTHONPATH, a folder holding only a link to
    the checkout's asyncio_relaxed: that package comes from the checkout,
    benchmarks/ and everything else from this tree, even when the checkout
    has a benchmarks/ of its own.
    """
    path = BASELINES.get(name)
    if path is None:
        return None
    with _SHIMS_LOCK:  # benchmarks.instructions asks from several threads
        shim = _SHIMS.get(path)
        if shim is None:
            shim = tempfile.mkdtemp(prefix="relaxed-baseline-")
            os.symlink(os.path.join(path, "asyncio_relaxed"),
                       os.path.join(shim, "asyncio_relaxed"))
            atexit.register(shutil.rmtree, shim, True)  # the link only, not the checkout
            _SHIMS[path] = shim
    return shim


def relaxed_package() -> str | None:
    """The folder this process imports asyncio_relaxed from (children report
    it, and check_package compares it with the tree they should use)."""
    spec = importlib.util.find_spec("asyncio_relaxed")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def check_package(name: str, package_dir: str | None, root: object) -> None:
    """Refuse a result whose child imported asyncio_relaxed from the wrong tree.

    *package_dir* is what the child reported (the folder of the package it
    imported), *root* this tree."""
    if package_dir is None or SPECS[name].kind != "relaxed":
        return
    expected = os.path.realpath(BASELINES.get(name) or str(root))
    got = os.path.dirname(os.path.realpath(package_dir))
    if got != expected:
        raise RuntimeError(f"the server of {name} imported asyncio_relaxed from {package_dir}, "
                           f"not from {expected}: its figures would belong to another checkout")


def missing(name: str) -> str | None:
    """Why loop *name* cannot run here, or None when it can."""
    spec = SPECS.get(name)
    if spec is None:
        return f"unknown loop {name!r}; known: {', '.join(SPECS)}"
    if spec.kind in ("uvloop", "rloop"):
        try:
            importlib.import_module(spec.kind)
        except ImportError:
            return f"{spec.kind} is not installed (pip install {spec.kind})"
    if name in BASELINES:
        if not os.path.isfile(os.path.join(BASELINES[name], "asyncio_relaxed", "__init__.py")):
            return f"{BASELINES[name]} holds no asyncio_relaxed package"
        return None  # its settings are checked by its own server process
    if spec.kind == "relaxed":
        try:
            asyncio_relaxed.resolve(spec.settings, environ={})
        except (TypeError, ValueError) as exc:
            return f"this asyncio_relaxed does not support {dict(spec.settings)}: {exc}"
    return None


def factory(name: str) -> LoopFactory:
    """A zero-argument loop factory for loop *name* (see :data:`SPECS`)."""
    spec = SPECS[name]
    why = missing(name)
    if why:
        raise LookupError(why)
    if spec.kind == "floor":
        raise LookupError("floor is not an event loop: benchmarks.server runs it itself")
    if spec.kind == "asyncio":
        return asyncio.SelectorEventLoop
    if spec.kind in ("uvloop", "rloop"):
        module = importlib.import_module(spec.kind)
        return module.new_event_loop  # type: ignore[no-any-return]
    settings = dict(spec.settings)
    return lambda: asyncio_relaxed.new_event_loop(**settings)


def config(name: str) -> dict[str, object] | None:
    """The full settings loop *name* runs with (environment included), or None."""
    if SPECS[name].kind != "relaxed" or name in BASELINES:
        return None
    resolved = asyncio_relaxed.resolve(SPECS[name].settings)
    return {f.name: str(getattr(resolved, f.name)) if isinstance(getattr(resolved, f.name), str)
            else getattr(resolved, f.name) for f in dataclasses.fields(resolved)}


def version(name: str) -> str:
    """The version of the package behind loop *name*."""
    kind = SPECS[name].kind
    if kind in ("asyncio", "floor"):
        import platform

        return platform.python_version()
    if name in BASELINES:
        rev = subprocess.run(["git", "-C", BASELINES[name], "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        return f"checkout {BASELINES[name]}" + (f" at {rev}" if rev else "")
    from importlib import metadata

    try:
        return metadata.version("asyncio-relaxed" if kind == "relaxed" else kind)
    except metadata.PackageNotFoundError:
        return "missing"
