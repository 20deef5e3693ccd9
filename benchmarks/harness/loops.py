"""The one table of event loops: a name -> a loop factory, for the benchmarks
and the tests' behaviour suite (tests/conftest.py).

A peer that cannot run here (not installed, or no build for this Python) is
reported by :func:`missing` with the reason, and its callers skip it: it is
never replaced by another loop.  The relaxed presets cover each setting that
changes what a benchmark measures: write mode, partial-write policy and
accept strategy.  Only the public API of asyncio_relaxed is used.

Selections of the table: :data:`PEERS` (the loops we are measured against),
:data:`IO_LOOPS` and :data:`ACCEPT_LOOPS` (the benchmarks' workloads),
:data:`SUITE_LOOPS` (the tests' behaviour suite), :data:`TLS_LOOPS` (the TLS
workloads), :data:`UDP_LOOPS` (the UDP workloads) and :data:`EVENT_LOOPS`
(every name that makes an event loop).
The floors (kind ``floor``) are servers without an event loop, each serving
the workloads of :attr:`LoopSpec.serves` (benchmarks.workloads.floors).

:func:`client_loop` is the loop of the built-in load generators: the same
client for every server loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import os
import platform
import sys
from collections.abc import Callable, Mapping

import asyncio_relaxed
from benchmarks.harness import processes

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    name: str
    #: "asyncio", the module of a peer ("uvloop", "rloop", "zuvloop",
    #: "rsloop"; each has ``new_event_loop()``), "relaxed", "aiofastnet"
    #: (aiofastnet's transports patched onto the loop of ``base``), or
    #: "floor" (no event loop: benchmarks.workloads.floors serves it).
    kind: str
    #: asyncio_relaxed settings (keyword arguments of new_event_loop).
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: What the preset shows, for the report.
    about: str = ""
    #: The oldest Python the peer has builds for.
    python: tuple[int, int] = (3, 10)
    #: The checkout a ``NAME@base`` twin imports asyncio_relaxed from
    #: (benchmarks.checkout); None: this tree.
    checkout: str | None = None
    #: floor only: the servers it stands in for, a server kind of
    #: benchmarks.workloads.server, with ``+tls`` over TLS.
    serves: tuple[str, ...] = ()
    #: aiofastnet only: the loop under the patch, "asyncio" or "uvloop".
    base: str = ""
    #: relaxed only: "pure" runs asyncio_relaxed.PyLoop, the pure-Python
    #: build, where the others run asyncio_relaxed.Loop, the build the
    #: package chose (the compiled one where it imports).
    build: str = ""


#: The kinds that are an installable package with ``new_event_loop()``.
PEER_KINDS = ("uvloop", "rloop", "zuvloop", "rsloop")

# "relaxed" alone is the default configuration, whatever the defaults are at
# the time of the run (the JSON records them).
SPECS: dict[str, LoopSpec] = {
    s.name: s
    for s in (
        LoopSpec("asyncio", "asyncio", about="stock SelectorEventLoop"),
        LoopSpec("uvloop", "uvloop", about="libuv, Cython"),
        LoopSpec("rloop", "rloop", about="Rust (rloop), when installed"),
        LoopSpec("zuvloop", "zuvloop", about="libuv, Zig (zuvloop), when installed",
                 python=(3, 14)),
        LoopSpec("rsloop", "rsloop", about="Rust (rsloop), when installed"),
        LoopSpec("asyncio+aiofastnet", "aiofastnet", base="asyncio",
                 about="stock's loop, aiofastnet's Cython transports (aiofastnet.patch_loop)"),
        LoopSpec("uvloop+aiofastnet", "aiofastnet", base="uvloop",
                 about="uvloop, aiofastnet's Cython transports (aiofastnet.patch_loop)"),
        LoopSpec("relaxed", "relaxed", about="asyncio_relaxed, default settings"),
        LoopSpec("relaxed-eager", "relaxed", {"write": "eager", "partial_write": "poll"},
                 "send at once; wait for writability after a short write"),
        LoopSpec("relaxed-eager-feed", "relaxed", {"write": "eager", "partial_write": "feed"},
                 "send at once; retry a short write next iteration"),
        LoopSpec("relaxed-deferred", "relaxed", {"write": "deferred", "partial_write": "poll"},
                 "one coalesced sendmsg per iteration"),
        LoopSpec("relaxed-feed", "relaxed", {"write": "deferred", "partial_write": "feed"},
                 "deferred, retry a short write next iteration"),
        LoopSpec("relaxed-eager-pure", "relaxed", {"write": "eager", "partial_write": "poll"},
                 "relaxed-eager on the pure-Python build", build="pure"),
        LoopSpec("relaxed-deferred-pure", "relaxed",
                 {"write": "deferred", "partial_write": "poll"},
                 "relaxed-deferred on the pure-Python build", build="pure"),
        LoopSpec("relaxed-batch", "relaxed", {"accept": "batch"}, "accept up to backlog per event"),
        LoopSpec("relaxed-batch-pure", "relaxed", {"accept": "batch"},
                 "relaxed-batch on the pure-Python build", build="pure"),
        LoopSpec("relaxed-single", "relaxed", {"accept": "single"}, "one accept per event"),
        LoopSpec("relaxed-relaxed", "relaxed", {"accept": "relaxed"},
                 "one accept, then yield the CPU"),
        LoopSpec("relaxed-balanced", "relaxed", {"accept": "balanced"},
                 "load-aware accept"),
        LoopSpec("floor", "floor",
                 about="no event loop: the least a Python echo server runs (epoll, "
                       "accept, recv, send); echo-protocol workloads only",
                 serves=("echo-protocol",)),
        LoopSpec("floor-tls-bio", "floor",
                 about="no event loop: epoll + ssl.SSLObject with memory BIOs, one reused "
                       "buffer each way; the TLS echo workloads only",
                 serves=("echo-protocol+tls",)),
        LoopSpec("floor-tls-socket", "floor",
                 about="no event loop: epoll + a non-blocking ssl.SSLSocket; the TLS echo "
                       "workloads only", serves=("echo-protocol+tls",)),
        LoopSpec("floor-udp", "floor",
                 about="no event loop: epoll, recvfrom_into one buffer until EAGAIN, sendto; "
                       "the UDP echo workloads only", serves=("udp-echo",)),
            )
}


def tls_presets(fields: object) -> tuple[LoopSpec, ...]:
    """The presets of asyncio_relaxed's ``tls`` setting (``own``,
    its own TLS transport, or ``stock``, stock's SSLProtocol over our
    transport), when *fields* (the names of :class:`asyncio_relaxed.Config`'s
    fields) has it; none before.  Both then run every TLS workload."""
    if "tls" not in fields:  # type: ignore[operator]
        return ()
    return (LoopSpec("relaxed-tls-own", "relaxed", {"tls": "own"},
                     "asyncio_relaxed's own TLS transport"),
            LoopSpec("relaxed-tls-stock", "relaxed", {"tls": "stock"},
                     "stock's SSLProtocol over asyncio_relaxed's transport"))


SPECS.update((s.name, s) for s in tls_presets(
    {f.name for f in dataclasses.fields(asyncio_relaxed.Config)}))

#: The ``datagram_batch`` values the UDP workloads compare (libuv reads 32
#: per event, our default when the presets were made).
DATAGRAM_BATCHES = (1, 8, 32, 64)


def datagram_presets(fields: object) -> tuple[LoopSpec, ...]:
    """The presets of asyncio_relaxed's ``datagram`` setting, when *fields*
    (the names of :class:`asyncio_relaxed.Config`'s fields) has it:
    ``relaxed-datagram-stock`` (stock's datagram transport on our loop) and,
    with ``datagram_batch``, ``relaxed-datagram-batch-N`` (our transport
    reading at most N datagrams per readiness event); none before."""
    if "datagram" not in fields:  # type: ignore[operator]
        return ()
    out = [LoopSpec("relaxed-datagram-stock", "relaxed", {"datagram": "stock"},
                    "stock's datagram transport on asyncio_relaxed's loop")]
    if "datagram_batch" in fields:  # type: ignore[operator]
        out += [LoopSpec(f"relaxed-datagram-batch-{n}", "relaxed",
                         {"datagram": "own", "datagram_batch": str(n)},
                         f"asyncio_relaxed's datagram transport, at most {n} per event")
                for n in DATAGRAM_BATCHES]
    return tuple(out)


SPECS.update((s.name, s) for s in datagram_presets(
    {f.name for f in dataclasses.fields(asyncio_relaxed.Config)}))

#: The loops we are measured against.
PEERS = ("asyncio", *PEER_KINDS)
#: aiofastnet's transports on stock's loop and on uvloop: peers of the
#: workloads where transports decide (the echo and TLS workloads).
TRANSPORT_PEERS = ("asyncio+aiofastnet", "uvloop+aiofastnet")
#: asyncio_relaxed's default settings on the pure-Python build, beside the
#: compiled one that "relaxed-eager" runs where it imports.
PURE_DEFAULT = ("relaxed-eager-pure",)
#: The loops of the I/O workloads (echo, http, pipe, small writes, idle).
IO_LOOPS = (*PEERS, "relaxed-eager", "relaxed-deferred", *PURE_DEFAULT, "relaxed-deferred-pure")
#: The loops of the accept-fairness workloads.
ACCEPT_LOOPS = ("asyncio", "uvloop", "relaxed-batch", "relaxed-single", "relaxed-relaxed",
                "relaxed-balanced")
#: The tests' behaviour suite: stock, uvloop, and ours in each write x
#: partial-write setting, and in each write mode on the pure-Python build.
SUITE_LOOPS = ("asyncio", "uvloop", "relaxed-eager", "relaxed-eager-feed", "relaxed-deferred",
               "relaxed-feed", "relaxed-eager-pure", "relaxed-deferred-pure")
#: The loops of the TLS workloads: the peers, our default settings, the
#: ``tls`` presets where the setting exists, and the TLS floors.
TLS_LOOPS = (*PEERS, *TRANSPORT_PEERS, "relaxed-eager", *PURE_DEFAULT,
             *(n for n in SPECS if n.startswith("relaxed-tls-")), "floor-tls-bio",
             "floor-tls-socket")
#: The loops of the UDP workloads: the peers, the aiofastnet pairings
#: (aiofastnet patches create_datagram_endpoint with its own Cython
#: datagram transport), our default settings, stock's datagram transport on
#: our loop where the setting exists, and the UDP floor.  The
#: ``relaxed-datagram-batch-N`` presets run where named (``--loops``).
UDP_LOOPS = (*PEERS, *TRANSPORT_PEERS, "relaxed-eager", *PURE_DEFAULT,
             *(n for n in SPECS if n == "relaxed-datagram-stock"), "floor-udp")
#: Every name that makes an event loop (the floors do not).
EVENT_LOOPS = tuple(name for name, spec in SPECS.items() if spec.kind != "floor")


def preset(name: str) -> str:
    """The preset a (possibly ``@base``) loop name runs."""
    return name.partition("@")[0]


#: The interpreter (``sys.implementation.name``).  The peers are compiled
#: extensions built for CPython only: none has a wheel for PyPy (PyPy 8.0,
#: Python 3.11), and neither uvloop's sdist nor rloop's and rsloop's build
#: there, so on PyPy a missing peer is one to compare with on
#: CPython, not one to install.
IMPLEMENTATION = sys.implementation.name


def missing(name: str) -> str | None:
    """Why loop *name* cannot run here, or None when it can."""
    spec = SPECS.get(name)
    if spec is None:
        return f"unknown loop {name!r}; known: {', '.join(SPECS)}"
    if spec.kind == "aiofastnet":
        for module in ("aiofastnet", spec.base):
            why = _unimportable(module)
            if why:
                return f"{name}: {why}"
        return None
    if spec.kind in PEER_KINDS:
        if IMPLEMENTATION == "cpython" and sys.version_info[:2] < spec.python:
            return (f"{spec.kind} has builds for Python {'.'.join(map(str, spec.python))} "
                    f"and later only; this is {platform.python_version()}")
        why = _unimportable(spec.kind)
        if why:
            return why
    if spec.checkout is not None:
        if not os.path.isfile(os.path.join(spec.checkout, "asyncio_relaxed", "__init__.py")):
            return f"{spec.checkout} holds no asyncio_relaxed package"
        return None  # its settings are checked by its own server process
    if spec.kind == "relaxed":
        try:
            asyncio_relaxed.resolve(spec.settings, environ={})
        except (TypeError, ValueError) as exc:
            return f"this asyncio_relaxed does not support {dict(spec.settings)}: {exc}"
        if spec.build == "pure" and getattr(asyncio_relaxed, "BUILD", "pure") == "pure":
            return (f"{name}: the pure-Python build is this asyncio_relaxed's only one here "
                    f"(the {name.removesuffix('-pure')} preset runs it)")
    return None


def build(name: str) -> str | None:
    """The asyncio_relaxed build relaxed loop *name* runs ("compiled" or
    "pure"), None for another loop."""
    spec = SPECS[preset(name)]
    if spec.kind != "relaxed":
        return None
    return "pure" if spec.build == "pure" else getattr(asyncio_relaxed, "BUILD", "pure")


def loop_class(name: str) -> type[asyncio.AbstractEventLoop]:
    """The asyncio_relaxed class of relaxed loop *name*: the pure-Python
    build's for a ``build="pure"`` preset, else the package's choice."""
    if SPECS[preset(name)].build == "pure":
        return asyncio_relaxed.PyLoop  # type: ignore[no-any-return]
    return asyncio_relaxed.Loop


def _unimportable(module: str) -> str | None:
    """Why *module*, a peer's compiled package, does not import here, or
    None (stock's asyncio always does)."""
    if module == "asyncio":
        return None
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            return f"{module} does not import here: {exc}"
        if IMPLEMENTATION != "cpython":
            here = {"pypy": "PyPy"}.get(IMPLEMENTATION, IMPLEMENTATION)
            return (f"{module} has no build for {here} (a compiled extension for "
                    "CPython only): nothing to install here; compare with it on CPython")
        return f"{module} is not installed (pip install {module})"
    except ImportError as exc:
        return f"{module} does not import here: {exc}"
    return None


def factory(name: str, **settings: str | None) -> LoopFactory:
    """A zero-argument loop factory for loop *name* (see :data:`SPECS`).

    *settings* (relaxed loops only) override the preset's; None leaves a
    setting to the preset, then to its environment variable or default.
    Raises LookupError, with the reason, for a loop that cannot run here.
    """
    spec = SPECS.get(name)
    why = missing(name)
    if spec is None or why:
        raise LookupError(why)
    given = {key: value for key, value in settings.items() if value is not None}
    if given and spec.kind != "relaxed":
        raise ValueError(f"{' and '.join(given)}: settings of asyncio_relaxed, which loop "
                         f"{name} ({spec.about}) is not; use relaxed or a relaxed-* preset")
    if spec.kind == "floor":
        raise LookupError(f"{name} is not an event loop: benchmarks.workloads.floors "
                          "serves it")
    if spec.kind == "asyncio":
        return asyncio.SelectorEventLoop
    if spec.kind in PEER_KINDS:
        module = importlib.import_module(spec.kind)
        return module.new_event_loop  # type: ignore[no-any-return]
    if spec.kind == "aiofastnet":
        aiofastnet = importlib.import_module("aiofastnet")
        base = factory(spec.base)
        return lambda: aiofastnet.patch_loop(base())
    options = {**spec.settings, **given}
    cls = loop_class(name)
    return lambda: cls(**options)


def client_loop() -> tuple[str, LoopFactory]:
    """The loop of the built-in load generators and its label: uvloop when
    it runs here, else stock asyncio; the same client for every server loop
    of a run (the results name it)."""
    if missing("uvloop") is None:
        import uvloop

        return f"uvloop {uvloop.__version__}", uvloop.new_event_loop
    return f"asyncio (Python {platform.python_version()})", asyncio.SelectorEventLoop


def config(name: str) -> dict[str, object] | None:
    """The full settings loop *name* runs with (environment included), or None."""
    spec = SPECS[name]
    if spec.kind != "relaxed" or spec.checkout is not None:
        return None
    return settings_dict(asyncio_relaxed.resolve(spec.settings))


def defaults() -> dict[str, object]:
    """asyncio_relaxed's default settings (no keyword, no environment)."""
    return settings_dict(asyncio_relaxed.resolve({}, environ={}))


def settings_dict(resolved: object) -> dict[str, object]:
    """A resolved configuration as plain JSON values (modes as their token)."""
    out: dict[str, object] = {}
    for field in dataclasses.fields(resolved):  # type: ignore[arg-type]
        value = getattr(resolved, field.name)
        out[field.name] = str(value) if isinstance(value, str) else value
    return out


def version(name: str) -> str:
    """The version of the package behind loop *name*."""
    spec = SPECS[name]
    if spec.kind in ("asyncio", "floor"):
        return platform.python_version()
    if spec.kind == "aiofastnet":
        return f"aiofastnet {_distribution('aiofastnet')} on {spec.base} {version(spec.base)}"
    if spec.checkout is not None:
        try:
            rev = processes.call(["git", "-C", spec.checkout, "rev-parse", "--short", "HEAD"],
                                 timeout=30)[0].strip()
        except (OSError, RuntimeError, TimeoutError):  # not a git checkout, or no git
            rev = ""
        return f"checkout {spec.checkout}" + (f" at {rev}" if rev else "")
    return _distribution("asyncio-relaxed" if spec.kind == "relaxed" else spec.kind)


def _distribution(name: str) -> str:
    """The installed version of distribution *name*, or "missing"."""
    from importlib import metadata  # here: every server process imports this module

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "missing"
