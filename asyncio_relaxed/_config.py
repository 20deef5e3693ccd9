"""Every tunable of asyncio_relaxed, defined once.

Each field of :class:`Config` carries its unit, its default and the reason for
the default in its metadata; the environment table and the error messages are
derived from those fields, so a new setting is added in one place.

Precedence, read once when a loop is created: keyword argument > environment
variable (``ASYNCIO_RELAXED_<FIELD>``) > default.  ``python -E`` (which sets
``sys.flags.ignore_environment``) makes the environment invisible, as it does
for ``PYTHONASYNCIODEBUG``.

This module knows nothing of asyncio; it is tested without sockets.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "ENV_PREFIX",
    "NO_EXTENSIONS_VAR",
    "AcceptStrategy",
    "Config",
    "DatagramMode",
    "PartialWrite",
    "PipeMode",
    "Poller",
    "TlsMode",
    "Transports",
    "WriteMode",
    "no_extensions",
    "resolve",
]

ENV_PREFIX = "ASYNCIO_RELAXED_"


class WriteMode(enum.StrEnum):
    """When ``transport.write()`` touches the socket."""

    #: Send at once when nothing is buffered (stock asyncio, uvloop 0.23).
    EAGER = "eager"
    #: Queue the transport; flush every queued transport once per loop
    #: iteration, coalescing its buffers into one ``sendmsg`` (uvloop <= 0.22).
    DEFERRED = "deferred"


class PartialWrite(enum.StrEnum):
    """What follows a short send (the kernel took only part of the data)."""

    #: Wait for the socket to become writable (EPOLLOUT), as stock asyncio.
    POLL = "poll"
    #: Retry on the next loop iteration without waiting (libuv's pending
    #: queue), at most ``feed_limit`` times in a row, then fall back to POLL.
    FEED = "feed"


class AcceptStrategy(enum.StrEnum):
    """How many connections a listener accepts per readiness event."""

    #: Up to ``accept_batch`` accepts per event (stock asyncio, bpo-27906):
    #: fast under connection storms, unfair across pre-forked workers.  On
    #: Linux no more than the accept queue holds, so none finds it empty
    #: (stock's last accept of every event does).
    BATCH = "batch"
    #: One accept per event (libuv >= 1.45, uvloop): no wasted EAGAIN accept.
    SINGLE = "single"
    #: One accept, then give up the CPU (nanosleep 1 ns, libuv 2012's relaxed
    #: accept) so a sibling process sharing the socket takes the next one.
    RELAXED = "relaxed"
    #: For pre-forked workers sharing a socket: accept what is queued (on
    #: Linux, as many as the accept queue holds, so no accept finds it
    #: empty), then register the listener with the poller anew, which moves
    #: this worker in the order the next connection wakes them, so the
    #: winner rotates; a worker holding more than one open connection does
    #: that only after a rest out of the poller that grows with what it
    #: holds (load-aware).  No shared memory; the theory of operation is in
    #: asyncio_relaxed/_accept.py.
    BALANCED = "balanced"


class Poller(enum.StrEnum):
    """Which kernel interface waits for I/O."""

    AUTO = "auto"
    EPOLL = "epoll"
    POLL = "poll"
    SELECT = "select"


class Transports(enum.StrEnum):
    """Which transports carry a kind of connection: TLS (``tls``), pipes
    (``pipe``) or datagram endpoints (``datagram``).  The settings' own
    documentation (their ``why``) says what each choice does."""

    #: The loop's own transports (asyncio_relaxed/_tls.py, _pipes.py,
    #: _datagram.py): reads into the loop's one buffer, writes on its send
    #: path, counted in loop.statistics().
    OWN = "own"
    #: Stock asyncio's transports (SSLProtocol, the pipe and datagram
    #: transports) over the loop's poller.
    STOCK = "stock"


#: The type of the tls, pipe and datagram settings by the setting's name.
TlsMode = Transports
PipeMode = Transports
DatagramMode = Transports


def _field(default: Any, *, unit: str, why: str) -> Any:
    return dataclasses.field(default=default, metadata={"unit": unit, "why": why})


@dataclasses.dataclass(frozen=True)
class Config:
    """The resolved settings of one loop.  Immutable once the loop exists."""

    write: WriteMode = _field(
        WriteMode.EAGER,
        unit="mode",
        why=(
            "eager sends at once and is what stock asyncio and uvloop 0.23 do; "
            "uvloop 0.23 went back to immediate writes (+10 % echo, and a "
            "'write then blocking recv' hang fixed, uvloop #631). deferred "
            "wins when a callback writes many small pieces."
        ),
    )
    partial_write: PartialWrite = _field(
        PartialWrite.POLL,
        unit="mode",
        why=(
            "poll is libuv's fix for the tcp-raw-pipe regression "
            "(18.56 -> 0.80 Gbit/s with 16 MiB writes when the pending queue "
            "skipped the wait); feed wins when the reader drains at once."
        ),
    )
    feed_limit: int = _field(
        4,
        unit="iterations",
        why=(
            "how many iterations in a row a short write is retried without "
            "waiting for EPOLLOUT before falling back to poll, so a slow peer "
            "cannot make the loop spin."
        ),
    )
    accept: AcceptStrategy = _field(
        AcceptStrategy.BATCH,
        unit="strategy",
        why=(
            "batch is stock asyncio's: the most connections per wake-up for one "
            "process. single and relaxed trade accept throughput for an even "
            "spread across processes sharing a listener (libuv measured relaxed "
            "at 3,944 vs 12,331 req/s in node http_simple_auto and turned it off); "
            "balanced takes what is queued without an accept into an empty "
            "queue, then re-registers the listener (after a rest that grows "
            "with the connections the worker holds, if more than one), for an "
            "even spread at little cost."
        ),
    )
    accept_batch: int = _field(
        0,
        unit="connections",
        why=(
            "accepts per readiness event under accept=batch; 0 means the "
            "server's listen backlog, as stock asyncio does (100 by default)."
        ),
    )
    exclusive_accept: bool = _field(
        False,
        unit="flag",
        why=(
            "register listeners with EPOLLEXCLUSIVE so one readiness event wakes "
            "one of the processes sharing a listener, not all of them (Linux "
            "4.5+); off by default, as a lone process gains nothing."
        ),
    )
    keepalive: bool = _field(
        False,
        unit="flag",
        why=(
            "SO_KEEPALIVE on every TCP connection (libuv uv_tcp_keepalive); off "
            "by default like stock asyncio and the kernel."
        ),
    )
    keepalive_idle: int = _field(
        0,
        unit="seconds",
        why="TCP_KEEPIDLE: idle time before the first probe; 0 keeps the system's (7200 s).",
    )
    keepalive_interval: int = _field(
        0,
        unit="seconds",
        why="TCP_KEEPINTVL: time between probes; 0 keeps the system's (75 s).",
    )
    keepalive_count: int = _field(
        0,
        unit="probes",
        why="TCP_KEEPCNT: unanswered probes before the connection drops; 0 keeps the system's (9).",
    )
    poller: Poller = _field(
        Poller.AUTO,
        unit="backend",
        why=(
            "auto takes epoll where the platform has it, else the platform's "
            "best selector; forcing poll or select tests the fallbacks on Linux."
        ),
    )
    time_metrics: bool = _field(
        True,
        unit="flag",
        why=(
            "time blocked in the poll vs busy, and loop lag, in loop.health() and "
            "/metrics: the clock is read around a wait and every 32nd iteration, "
            "never per callback (docs/settings.md gives the instruction cost); "
            "off saves that."
        ),
    )
    slow_callback: float = _field(
        0.0,
        unit="seconds",
        why=(
            "report a callback that runs longer than this, with its task, through "
            "logging or loop.set_slow_callback_handler(), at most once a second; "
            "0 turns it off. Stock asyncio does it only in debug mode."
        ),
    )
    tls: Transports = _field(
        Transports.OWN,
        unit="mode",
        why=(
            "own carries TLS in one transport per connection (socket, "
            "SSLObject, memory BIOs), reading into the loop's one buffer and "
            "sending records with the loop's send path; stock uses asyncio's "
            "SSLProtocol over the loop's socket transport, three objects per "
            "connection, for ssl=, start_tls() and TLS over TLS alike."
        ),
    )
    datagram: Transports = _field(
        Transports.OWN,
        unit="mode",
        why=(
            "own reads up to datagram_batch datagrams per readiness event into "
            "the loop's one buffer (one exact-size copy each) and counts them; "
            "stock is asyncio's datagram transport, one recvfrom(256 KiB) "
            "allocation per event. Both have stock's semantics."
        ),
    )
    datagram_batch: int = _field(
        32,
        unit="datagrams",
        why=(
            "datagrams read per readiness event at most under datagram=own, "
            "fewer when the socket runs dry (EAGAIN), the protocol pauses reading "
            "or the transport closes: libuv's uv__udp_recvmsg reads up to 32 per "
            "event, so a burst of 32 costs one loop iteration (the cheapest batch "
            "on the udp-burst-1k benchmark: docs/settings.md). 1 reads one per "
            "event, as stock does."
        ),
    )
    pipe: Transports = _field(
        Transports.OWN,
        unit="mode",
        why=(
            "own reads a pipe into the loop's one buffer (one exact-size copy) "
            "and writes it through the loop's write queue, so write=deferred "
            "coalesces a callback's writes to a child's stdin into one write; "
            "stock is asyncio's pipe transports, one os.read(256 KiB) allocation "
            "per read and one os.write per write. Both have stock's semantics."
        ),
    )
    stats_dir: str = _field(
        "",
        unit="directory",
        why=(
            "where the loop publishes its statistics, health and listeners once a "
            "second, one file per process, for `python -m asyncio_relaxed top` and "
            "asyncio_relaxed.metrics.PoolCollector to read a whole pre-forked pool; "
            "empty (the default) publishes nothing and costs nothing."
        ),
    )
    read_size: int = _field(
        256 * 1024,
        unit="bytes",
        why=(
            "size of the loop's one reusable receive buffer, the most one "
            "recv_into reads: stock's max_size, so a read takes as much as "
            "stock's. Stock allocates it per read with recv(256 KiB), which "
            "glibc serves with mmap + mremap + munmap (strace, 1 KiB echo); here it "
            "is allocated once per loop and each read copies only what arrived."
        ),
    )

    def tcp_options(self) -> list[tuple[str, str, int]]:
        """(level, option, value) names for the keepalive settings in force.

        Names, not numbers, so that this module stays free of platform
        constants; the loop resolves them with getattr(socket, ...) and skips
        what the platform lacks.
        """
        if not self.keepalive:
            return []
        options = [("SOL_SOCKET", "SO_KEEPALIVE", 1)]
        for option, value in (
            ("TCP_KEEPIDLE", self.keepalive_idle),
            ("TCP_KEEPINTVL", self.keepalive_interval),
            ("TCP_KEEPCNT", self.keepalive_count),
        ):
            if value:
                options.append(("IPPROTO_TCP", option, value))
        return options

    def describe(self) -> list[tuple[str, str, Any, str, str]]:
        """(field, env var, value, unit, why) for every setting."""
        rows = []
        for f in dataclasses.fields(self):
            rows.append(
                (
                    f.name,
                    ENV_PREFIX + f.name.upper(),
                    getattr(self, f.name),
                    f.metadata["unit"],
                    f.metadata["why"],
                )
            )
        return rows


# Lower and upper bounds for the integer settings, inclusive.
_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "accept_batch": (0, 65_535),
    "keepalive_idle": (0, 32_767),
    "keepalive_interval": (0, 32_767),
    "keepalive_count": (0, 127),
    "feed_limit": (1, 1_000),
    "read_size": (1024, 16 * 1024 * 1024),
    "datagram_batch": (1, 1024),
}


# Lower and upper bounds for the seconds settings, inclusive.
_FLOAT_BOUNDS: dict[str, tuple[float, float]] = {
    "slow_callback": (0.0, 3600.0),
}


def _parse_seconds(name: str) -> Callable[[str, Any], float]:
    low, high = _FLOAT_BOUNDS[name]

    def parse(where: str, value: Any) -> float:
        number: float | None
        if isinstance(value, bool):
            number = None
        elif isinstance(value, (int, float)):
            number = float(value)
        else:
            try:
                number = float(str(value).strip())
            except ValueError:
                number = None
        if number is None or not low <= number <= high:  # NaN fails too
            raise ValueError(
                f"{where}={value!r} is not a valid setting; allowed: a number of seconds "
                f"from {low:g} to {high:g} (0 turns it off)"
            )
        return number

    return parse


def _parse_directory(where: str, value: Any) -> str:
    path = value.strip() if isinstance(value, str) else value
    if path == "":
        return ""
    if (not isinstance(path, str) or not os.path.isdir(path)
            or not os.access(path, os.W_OK | os.X_OK)):
        raise ValueError(
            f"{where}={value!r} is not a valid setting; allowed: an existing directory this "
            "process can write (create it first), or empty to publish nothing"
        )
    return path


def _parse_enum(kind: type[enum.Enum]) -> Callable[[str, Any], Any]:
    def parse(where: str, value: Any) -> Any:
        if isinstance(value, kind):
            return value
        token = value.strip().lower() if isinstance(value, str) else value
        try:
            return kind(token)
        except ValueError:
            allowed = "|".join(m.value for m in kind)
            raise ValueError(
                f"{where}={value!r} is not a valid setting; allowed: {allowed}"
            ) from None

    return parse


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _parse_bool(where: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    token = value.strip().lower() if isinstance(value, str) else value
    if token in _TRUE or token == 1:
        return True
    if token in _FALSE or token == 0:
        return False
    raise ValueError(
        f"{where}={value!r} is not a valid setting; allowed: {'|'.join(_TRUE + _FALSE)}"
    )


def _parse_int(name: str) -> Callable[[str, Any], int]:
    low, high = _INT_BOUNDS[name]

    def parse(where: str, value: Any) -> int:
        if isinstance(value, bool):
            number = None
        elif isinstance(value, int):
            number = value
        else:
            try:
                number = int(str(value).strip().replace("_", ""), 10)
            except ValueError:
                number = None
        if number is None or not low <= number <= high:
            raise ValueError(
                f"{where}={value!r} is not a valid setting; allowed: an integer "
                f"from {low} to {high}"
            )
        return number

    return parse


_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "write": _parse_enum(WriteMode),
    "partial_write": _parse_enum(PartialWrite),
    "feed_limit": _parse_int("feed_limit"),
    "accept": _parse_enum(AcceptStrategy),
    "accept_batch": _parse_int("accept_batch"),
    "exclusive_accept": _parse_bool,
    "keepalive": _parse_bool,
    "keepalive_idle": _parse_int("keepalive_idle"),
    "keepalive_interval": _parse_int("keepalive_interval"),
    "keepalive_count": _parse_int("keepalive_count"),
    "poller": _parse_enum(Poller),
    "time_metrics": _parse_bool,
    "slow_callback": _parse_seconds("slow_callback"),
    "tls": _parse_enum(TlsMode),
    "datagram": _parse_enum(DatagramMode),
    "datagram_batch": _parse_int("datagram_batch"),
    "pipe": _parse_enum(PipeMode),
    "stats_dir": _parse_directory,
    "read_size": _parse_int("read_size"),
}
assert set(_PARSERS) == {f.name for f in dataclasses.fields(Config)}


#: The variable that makes the package use its pure-Python build
#: (:mod:`asyncio_relaxed._builds`), as aiohttp's and yarl's
#: ``*_NO_EXTENSIONS``: read once, when the package is imported, and checked
#: by :func:`resolve` as every setting is, so a bad value fails each loop's
#: creation.
NO_EXTENSIONS_VAR = ENV_PREFIX + "NO_EXTENSIONS"


def no_extensions(environ: Mapping[str, str] | None = None) -> bool:
    """Whether :data:`NO_EXTENSIONS_VAR` asks for the pure-Python build
    (empty or unset: no).  Raises ValueError for a value that is no
    boolean, naming the variable and what is allowed."""
    if environ is None:
        environ = {} if sys.flags.ignore_environment else os.environ
    raw = environ.get(NO_EXTENSIONS_VAR)
    if raw is None or raw.strip() == "":
        return False
    return _parse_bool(NO_EXTENSIONS_VAR, raw)


def resolve(
    options: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Build a :class:`Config` from keyword *options*, the environment, defaults.

    *environ* defaults to ``os.environ`` unless Python runs with ``-E``.
    Raises ValueError naming the keyword or variable, the value and what is
    allowed; TypeError for an unknown keyword.
    """
    options = dict(options or {})
    unknown = sorted(set(options) - set(_PARSERS))
    if unknown:
        raise TypeError(
            f"unknown asyncio_relaxed option(s): {', '.join(unknown)}; "
            f"known: {', '.join(sorted(_PARSERS))}"
        )
    if environ is None:
        environ = {} if sys.flags.ignore_environment else os.environ
    no_extensions(environ)  # (read at import: asyncio_relaxed._builds)
    values: dict[str, Any] = {}
    for name, parse in _PARSERS.items():
        if name in options and options[name] is not None:
            values[name] = parse(name, options[name])
            continue
        var = ENV_PREFIX + name.upper()
        raw = environ.get(var)
        if raw is not None and raw.strip() != "":
            values[name] = parse(var, raw)
    return Config(**values)
