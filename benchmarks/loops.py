"""The one table of loops the benchmarks know: a name -> a loop factory.

Peers that are not installed (uvloop, rloop) are reported as missing with the
reason, never replaced by something else.  The relaxed presets cover each
setting that changes what a benchmark measures: write mode, partial-write
policy and accept strategy.  Only the public API of asyncio_relaxed is used.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import os
import subprocess
from collections.abc import Callable, Mapping

import asyncio_relaxed

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    name: str
    #: "asyncio", "uvloop", "rloop" or "relaxed".
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
    )
}

#: The loops of the default run of most workloads.
DEFAULT_LOOPS = ("asyncio", "uvloop", "rloop", "relaxed-eager", "relaxed-deferred")
#: The loops of the accept workloads (churn, fairness).
ACCEPT_LOOPS = ("asyncio", "uvloop", "relaxed-batch", "relaxed-single", "relaxed-relaxed",
                "relaxed-balanced")


#: Loops run from another checkout ("relaxed-eager@base"): name -> its path.
BASELINES: dict[str, str] = {}


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
    if kind == "asyncio":
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
