"""Every workload of the suite, defined once: what server, what load, which loops.

A workload runs on its ``loops`` when it is named (``--workloads``,
``--full``).  ``default_loops`` puts it in the default set, the one
``python -m benchmarks run`` runs, on those loops: our default configuration
against every peer, and a second preset only where it is the point of the
workload (``write=deferred`` under small writes, ``accept=balanced`` under
fairness).  That set is sized to finish within 6 minutes on a 2-core
machine with every peer (a peer whose runs time out adds its timeouts): at
3 repeats of 0.25 s warm-up + 1 s each and one strace run of at most 0.5 s
where system calls are counted, a loop costs about 4.5 s per workload
(docs/benchmarks.md has the timings of runs).
Where each workload comes from (docs/benchmarks.md): vmbench's echo
servers, HAProxy's 0 B / 4 KiB HTTP test, node's tcp-raw-pipe, libuv's
accept fairness, TechEmpower's plaintext test (uvicorn), wrk2's
constant-rate load (open loop), the TLS echo behind create_server(ssl=),
and a UDP echo (create_datagram_endpoint) in single datagrams and in
QUIC's bursts.

Three TLS workloads are in the default set, on our default settings and
the peers: the 1 KiB echo (``tls-echo-1k-c10``), aiohttp over TLS
(``https-0b``) and a handshake per connection (``tls-churn``); so are a
latency (``openloop-http-0b-uvloop80``: p99 at 80 % of uvloop's capacity)
and an application (``uvicorn-json``).  The rest
(the 64 KiB echo, start_tls, the TLS floors, the aiofastnet pairings, the
``tls`` presets) and the UDP workloads (``udp-*``) run by name, each on
all its loops.

The application workloads (``_apps``: uvicorn + Starlette, aiohttp with
PostgreSQL, a websockets broadcast, a Redis-protocol server; issue #43) run
by name only, on every loop that can run them.

A workload that needs a package the suite does not (uvicorn, httptools)
names it in ``needs``, and one that needs a server of ``.ci/services``
(PostgreSQL) names it in ``services``; where either is missing,
:func:`missing` says so and the runner skips the workload with that reason.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from importlib import metadata

from benchmarks.harness import services as services_file
from benchmarks.harness.loops import (
    ACCEPT_LOOPS,
    IO_LOOPS,
    PEERS,
    SPECS,
    TLS_LOOPS,
    TRANSPORT_PEERS,
    UDP_LOOPS,
)
from benchmarks.workloads.apps import MESSAGE, PG_POOL
from benchmarks.workloads.fairness import MODES, PLACEMENTS

KiB = 1024
MiB = 1024 * 1024
#: The default set's loops: our default settings (write=eager,
#: partial_write=poll; accept=batch) on each build, and the peers.
IO_DEFAULT = (*PEERS, "relaxed-eager", "relaxed-eager-pure")
ACCEPT_DEFAULT = (*PEERS, "relaxed-batch", "relaxed-batch-pure")


#: The Workload fields that only the open-loop client reads: the other
#: workloads' parameters leave them out.
OPEN_ONLY = ("arrivals", "protocol", "rate_of")


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    about: str
    #: A kind of benchmarks.workloads.server, or "fairness"
    #: (benchmarks.workloads.fairness).
    server: str
    #: A kind of benchmarks.workloads.client, "open"
    #: (benchmarks.workloads.openloop) or "wrk" (the built-in "http" client
    #: when wrk is not on PATH).
    client: str
    concurrency: int = 10
    request: int = 1 * KiB
    response: int = 1 * KiB
    path: str = "/"
    #: Extra arguments of the server process.
    server_args: tuple[str, ...] = ()
    #: What one "request" is in the per-request figures.
    unit: str = "request"
    loops: tuple[str, ...] = IO_LOOPS
    #: Its loops in the default set; () leaves it out of that set.
    default_loops: tuple[str, ...] = ()
    #: Also count system calls with strace on a shorter run (peers included).
    syscalls: bool = False
    #: Further measured windows on the same server process, one per path,
    #: after the one on ``path``; each window's figures are suffixed with
    #: its path's name (``/two``: ``rate_two``), compared with the first's.
    paths: tuple[str, ...] = ()
    #: open-loop client only: the constant rates, in per cent of the
    #: capacity the same client measured first on the same server.
    loads: tuple[int, ...] = ()
    #: Distributions it needs beyond the suite's, "name" or "name>=version".
    needs: tuple[str, ...] = ()
    #: fairness only: workers, connection lifetimes (MODES), placement.
    workers: int = 0
    mode: str = ""
    placement: str = "pinned"
    #: Over TLS 1.3: the server and the client with --tls.
    tls: bool = False
    #: With tls: reached by start_tls after a plain exchange, the server and
    #: the client with --starttls instead of --tls.
    starttls: bool = False
    #: udp client only: datagrams each client sends at a time before it
    #: waits for all their echoes.
    burst: int = 1
    #: open-loop client only (benchmarks.workloads.openloop): the arrival
    #: process (``constant``, ``poisson``); what a request is (``echo``,
    #: ``http``, ``http-post-json``, ``redis``).
    arrivals: str = "constant"
    protocol: str = "echo"
    #: open-loop client only: the loop whose capacity, measured in the same
    #: run, ``loads`` are per cent of, so that every loop gets the same
    #: rates ("": each loop's own capacity).  The runner runs that loop
    #: first in each repeat (benchmarks.workloads.runner.plan).
    rate_of: str = ""
    #: HTTP clients: the request's method; its body (a JSON text; the
    #: open-loop client's http-post-json JSON or redis command, "" its
    #: default); the defaults are a GET without body, as every workload
    #: before them.
    method: str = "GET"
    body: str = ""
    #: resp and open-loop clients: requests (commands) written as one and
    #: answered as one, each connection.
    pipeline: int = 1
    #: Servers of .ci/services it talks to ("postgres"; read from
    #: .services.json, benchmarks.harness.services).
    services: tuple[str, ...] = ()

    @property
    def serves(self) -> str:
        """What a floor must serve to run it (benchmarks.harness.loops.LoopSpec.serves)."""
        return self.server + ("+starttls" if self.starttls else "+tls" if self.tls else "")

    def params(self) -> dict[str, object]:
        """The parameters that define the workload (for the JSON)."""
        fields = dataclasses.asdict(self)
        for key in ("name", "about", "loops", "default_loops", "syscalls", "needs", "services"):
            fields.pop(key)
        if self.client != "udp":
            fields.pop("burst")  # the TCP workloads' parameters as they were
        if self.client != "open":
            for key in OPEN_ONLY:
                fields.pop(key)
        for key, default in _QUIET.items():
            if fields[key] == default:
                fields.pop(key)  # likewise, where they are the defaults
        return fields

    @property
    def default(self) -> bool:
        """In the default set."""
        return bool(self.default_loops)


#: Fields that :meth:`Workload.params` leaves out while they are their
#: defaults, so that the workloads from before them keep their parameters.
_QUIET = {"method": "GET", "body": "", "pipeline": 1}


def _sizes(size: int) -> str:
    return f"{size // MiB}m" if size >= MiB else f"{size // KiB}k"


def _echo() -> list[Workload]:
    out = []
    for api in ("protocol", "buffered", "streams"):
        for size in (1 * KiB, 10 * KiB, 100 * KiB):
            for conc in (10, 1000):
                # Not echo-buffered in the default set: the protocol reads
                # into its own buffer, so the loop's share is smallest there.
                default = conc == 10 and api != "buffered" and (
                    size == 1 * KiB or (api == "protocol" and size == 100 * KiB))
                out.append(Workload(
                    f"echo-{api}-{_sizes(size)}-c{conc}",
                    f"echo, {api} server, {size // KiB} KiB messages, {conc} connections",
                    f"echo-{api}", "echo", conc, size, size,
                    loops=(*IO_LOOPS, *TRANSPORT_PEERS),
                    default_loops=IO_DEFAULT if default else (),
                    syscalls=(api == "protocol" and size == KiB and conc == 10)))
    return out


_LIFETIMES = {
    "close": "a new connection per request",
    "keepalive": "keep-alive (reconnect every 20 requests)",
    "mixed": "half keep-alive for the whole run, half a new connection per request",
}


def fairness(workers: int, concurrency: int, mode: str, placement: str = "pinned",
             default_loops: tuple[str, ...] = ()) -> Workload:
    """K pre-forked workers on one listen socket under C clients
    (benchmarks.fairness): ``fairness-k{K}-c{C}-{mode}``, and
    ``-unpinned`` where the workers are free on every CPU."""
    if mode not in MODES or placement not in PLACEMENTS:
        raise ValueError(f"fairness mode {mode!r}, placement {placement!r}: "
                         f"modes {', '.join(MODES)}; placements {', '.join(PLACEMENTS)}")
    where = ("" if placement == "pinned"
             else "; workers and client unpinned, free on every CPU")
    return Workload(
        f"fairness-k{workers}-c{concurrency}-{mode}" + ("" if placement == "pinned"
                                                         else f"-{placement}"),
        f"{workers} pre-forked workers on one listen socket, {concurrency} clients, "
        + _LIFETIMES[mode] + where,
        "fairness", "fairness", concurrency, unit="request", loops=ACCEPT_LOOPS,
        default_loops=default_loops, workers=workers, mode=mode, placement=placement)


def _fairness() -> list[Workload]:
    # In the default set: four workers, one client, a new connection per
    # request, where the strategies come apart (README, "Accept fairness").
    default = ("asyncio", "uvloop", "relaxed-batch", "relaxed-balanced")
    grid = [fairness(workers, conc, mode, "pinned",
                     default if (workers, conc, mode) == (4, 1, "close") else ())
            for workers in (2, 4) for conc in (1, 10, 100) for mode in ("close", "keepalive")]
    # As deployed: the same workers unpinned, and mixed lifetimes, where a
    # worker holding long connections should take fewer new ones
    # (accept=balanced's load-awareness), pinned and unpinned.
    deployed = [fairness(workers, 10, mode, placement)
                for workers in (2, 4) for mode, placement in (
                    ("close", "unpinned"), ("keepalive", "unpinned"),
                    ("mixed", "pinned"), ("mixed", "unpinned"))]
    return grid + deployed


#: The TLS workloads' loops without the floors (no floor serves HTTP).
_TLS_EVENT_LOOPS = tuple(n for n in TLS_LOOPS if SPECS[n].kind != "floor")


def _tls() -> list[Workload]:
    """Issue #25's TLS workloads: TLS 1.3, an RSA-2048 certificate
    (benchmarks.harness.tls), on every loop and the TLS floors."""
    return [
        Workload("tls-echo-1k-c10", "echo over TLS 1.3, protocol server, 1 KiB messages, "
                 "10 connections", "echo-protocol", "echo", 10, 1 * KiB, 1 * KiB,
                 loops=TLS_LOOPS, tls=True, needs=("trustme",), default_loops=IO_DEFAULT),
        Workload("tls-echo-64k-c10", "echo over TLS 1.3, protocol server, 64 KiB messages, "
                 "10 connections", "echo-protocol", "echo", 10, 64 * KiB, 64 * KiB,
                 loops=TLS_LOOPS, tls=True, needs=("trustme",)),
        Workload("https-0b", "aiohttp keep-alive over TLS 1.3, GET returning 0 B, "
                 "10 connections", "http", "wrk", 10, path="/", loops=_TLS_EVENT_LOOPS,
                 tls=True, needs=("aiohttp", "trustme"), default_loops=IO_DEFAULT),
        Workload("tls-churn", "a new TLS 1.3 connection per 1 KiB request (a full handshake "
                 "each), 10 clients", "echo-protocol", "churn", 10, unit="connection",
                 loops=TLS_LOOPS, tls=True, needs=("trustme",), default_loops=IO_DEFAULT),
        # asyncpg's and SMTP's way to TLS: the same echo as tls-echo-1k-c10
        # once the connections are upgraded, so the two compare start_tls
        # with ssl= on each loop.
        Workload("starttls-echo-1k-c10", "echo over TLS 1.3 reached by start_tls on both sides "
                 "after a plain STARTTLS exchange, protocol server, 1 KiB messages, "
                 "10 connections", "echo-protocol", "echo", 10, 1 * KiB, 1 * KiB,
                 loops=_TLS_EVENT_LOOPS, tls=True, starttls=True, needs=("trustme",)),
    ]


def _udp() -> list[Workload]:
    """Issue #32's datagram workloads: a UDP echo server
    (create_datagram_endpoint) under 10 clients, each with its own
    connected socket; the figure is server CPU per datagram echoed.
    ``udp-burst-1k`` is QUIC's shape: a flight of 32 datagrams, then the
    wait for their answers.  By name only (``--workloads 'udp-*'``)."""
    return [
        Workload("udp-echo-64b-c10", "UDP echo, 64 B datagrams, 10 clients, one datagram "
                 "in flight each", "udp-echo", "udp", 10, 64, 64, unit="datagram",
                 loops=UDP_LOOPS),
        Workload("udp-echo-1k-c10", "UDP echo, 1 KiB datagrams, 10 clients, one datagram "
                 "in flight each", "udp-echo", "udp", 10, 1 * KiB, 1 * KiB, unit="datagram",
                 loops=UDP_LOOPS),
        Workload("udp-burst-1k", "UDP echo, 10 clients each sending 32 datagrams of 1 KiB "
                 "at a time and waiting for the 32 echoes (QUIC's shape)", "udp-echo", "udp",
                 10, 1 * KiB, 1 * KiB, unit="datagram", loops=UDP_LOOPS, burst=32),
        # aioquic (QUIC and TLS 1.3 in Python) over each loop's datagram
        # endpoint (benchmarks.workloads.quic); no floor serves it.
        Workload("quic-10m", "QUIC (aioquic): one connection, 10 MiB streams one at a time, "
                 "the server counts them", "quic", "quic", 1, 10 * MiB, 2, unit="MiB",
                 loops=tuple(n for n in UDP_LOOPS if SPECS[n].kind != "floor"), tls=True,
                 needs=("aioquic", "trustme")),
    ]


#: The JSON body of the uvicorn-json workloads (benchmarks.workloads.apps.check_item).
ITEM = '{"name": "widget", "price": 9.5, "quantity": 3, "tags": ["blue", "small"]}'


def _openloop() -> list[Workload]:
    """Issue #43's open-loop workloads beyond ``openloop-1k``
    (benchmarks.workloads.openloop), on the suite's servers: latency from
    each request's due time at 50, 80 and 95 % of each loop's capacity, or
    at 80 % of uvloop's (``rate_of``: the same rate for every loop).  By
    name only."""
    about = "10 connections, latency from each request's due time"
    return [
        Workload("openloop-1k-poisson",
                 "open-loop latency: 1 KiB echo, Poisson arrivals at 50 %, 80 % and 95 % of the "
                 f"capacity measured first, {about}", "echo-protocol", "open", 10,
                 loads=(50, 80, 95), arrivals="poisson"),
        Workload("openloop-http-0b",
                 "open-loop latency: aiohttp keep-alive GET returning 0 B, pipelined, at 50 %, "
                 f"80 % and 95 % of the capacity measured first, {about}", "http", "open", 10,
                 path="/", loads=(50, 80, 95), protocol="http", needs=("aiohttp",)),
        Workload("openloop-http-0b-uvloop80",
                 "open-loop latency: aiohttp keep-alive GET returning 0 B, pipelined, at 80 % "
                 f"of uvloop's capacity in the same run on every loop, {about}", "http", "open",
                 10, path="/", loads=(80,), protocol="http", rate_of="uvloop",
                 needs=("aiohttp",), default_loops=IO_DEFAULT),
        Workload("openloop-tls-1k",
                 "open-loop latency: 1 KiB echo over TLS 1.3, protocol server, at 50 %, 80 % "
                 f"and 95 % of the capacity measured first, {about}", "echo-protocol", "open",
                 10, loads=(50, 80, 95), loops=_TLS_EVENT_LOOPS, tls=True, needs=("trustme",)),
        Workload("openloop-tls-1k-uvloop80",
                 "open-loop latency: 1 KiB echo over TLS 1.3, protocol server, at 80 % of "
                 f"uvloop's capacity in the same run on every loop, {about}", "echo-protocol",
                 "open", 10, loads=(80,), loops=_TLS_EVENT_LOOPS, tls=True, rate_of="uvloop",
                 needs=("trustme",)),
        Workload("openloop-uvicorn-json-uvloop80",
                 "open-loop latency: uvicorn + Starlette (httptools), POST /items/{id} with a "
                 f"JSON body, pipelined, at 80 % of uvloop's capacity in the same run on every "
                 f"loop, {about}", "uvicorn-json", "open", 10, path="/items/42",
                 loads=(80,), protocol="http-post-json", body=ITEM, rate_of="uvloop",
                 needs=("uvicorn>=0.36", "starlette", "httptools")),
        # redis-proxy's server, the store holding a 64 B value at "key"
        # (benchmarks.workloads.apps.serve_resp) for the client's GETs.
        Workload("openloop-redis-proxy-uvloop80",
                 "open-loop latency: Redis protocol on asyncio.Protocol, a request of 16 "
                 "pipelined GETs of a 64 B value in one write, at 80 % of uvloop's capacity in "
                 f"the same run on every loop, {about}", "resp", "open", 10,
                 server_args=("--value", "64"), loads=(80,), protocol="redis", body="GET key",
                 pipeline=16, rate_of="uvloop"),
    ]


#: The uvicorn loops (uvicorn-plaintext's) and, over TLS, the TLS workloads'
#: but the aiofastnet pairings, which uvicorn's --loop cannot name.
_UVICORN_TLS_LOOPS = tuple(n for n in _TLS_EVENT_LOOPS if SPECS[n].kind != "aiofastnet")


def _apps() -> list[Workload]:
    """Issue #43's application workloads (benchmarks.workloads.apps): an
    app's own work beside each loop's, by name only, on every loop that
    can run them, plain and, where the app would be, over TLS 1.3."""
    uvicorn = ("uvicorn>=0.36", "starlette")
    json_about = ("uvicorn + Starlette {}, POST /items/{{id}} with a {} B JSON body checked "
                  "by hand, a JSON answer, keep-alive, 10 connections")
    return [
        Workload("uvicorn-json", json_about.format("(httptools)", len(ITEM)), "uvicorn-json",
                 "wrk", 10, len(ITEM), path="/items/42", method="POST", body=ITEM,
                 needs=(*uvicorn, "httptools"), default_loops=IO_DEFAULT),
        Workload("uvicorn-json-h11", json_about.format("(h11)", len(ITEM)), "uvicorn-json",
                 "wrk", 10, len(ITEM), path="/items/42", server_args=("--http", "h11"),
                 method="POST", body=ITEM, needs=(*uvicorn, "h11")),
        Workload("uvicorn-json-tls", json_about.format("(httptools) over TLS 1.3", len(ITEM)),
                 "uvicorn-json", "wrk", 10, len(ITEM), path="/items/42",
                 loops=_UVICORN_TLS_LOOPS, tls=True, method="POST", body=ITEM,
                 needs=(*uvicorn, "httptools", "trustme")),
        Workload("aiohttp-pg", "aiohttp, GET /users/{id} answering JSON from one PostgreSQL "
                 f"query through an asyncpg pool of {PG_POOL}, keep-alive, 10 connections",
                 "aiohttp-pg", "wrk", 10, path="/users/42", needs=("aiohttp", "asyncpg"),
                 services=("postgres",)),
        Workload("aiohttp-pg-tls", "aiohttp over TLS 1.3, GET /users/{id} answering JSON from "
                 f"one PostgreSQL query through an asyncpg pool of {PG_POOL}, keep-alive, "
                 "10 connections", "aiohttp-pg", "wrk", 10, path="/users/42",
                 loops=_TLS_EVENT_LOOPS, tls=True, needs=("aiohttp", "asyncpg", "trustme"),
                 services=("postgres",)),
        Workload("ws-broadcast-1000", f"websockets: {MESSAGE} B broadcast to 1,000 connections, "
                 "the next once every connection has the last; per message delivered, "
                 "latency to a broadcast's last delivery", "ws-broadcast", "ws", 1000,
                 response=MESSAGE, unit="message", needs=("websockets>=13.0",)),
        Workload("redis-proxy", "Redis protocol on asyncio.Protocol, GET from a dict, 16 "
                 "pipelined commands per write, 64 B values, 10 connections", "resp", "resp",
                 10, response=64, unit="command", pipeline=16),
    ]


#: The ``needs`` that pyproject.toml's bench extra leaves out off CPython:
#: no wheel for PyPy 8.0's ABI for httptools, nor for the cryptography that
#: trustme needs; asyncpg does not support PyPy.
CPYTHON_ONLY = ("httptools", "trustme", "asyncpg")


def missing(w: Workload, implementation: str = sys.implementation.name) -> str | None:
    """Why workload *w* cannot run here (a distribution of ``needs`` is not
    installed, or too old), or None when it can."""
    for need in w.needs:
        name, _, least = need.partition(">=")
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            if implementation != "cpython" and name in CPYTHON_ONLY:
                return (f"{w.name} needs {name}, which the bench extra leaves out on "
                        f"{implementation}: no wheel there for it or what it needs")
            return f"{w.name} needs {name}, which is not installed (pip install '{need}')"
        if least and _release(have) < _release(least):
            return f"{w.name} needs {need}; this is {name} {have} (pip install -U '{need}')"
    for service in w.services:
        why = services_file.missing(service)
        if why:
            return f"{w.name} needs {service}: {why}"
    return None


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version: "0.36.1rc1" -> (0, 36, 1)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        *_echo(),
        Workload("http-0b", "aiohttp keep-alive, GET returning 0 B, 10 connections",
                 "http", "wrk", 10, path="/", default_loops=IO_DEFAULT, syscalls=True,
                 needs=("aiohttp",)),
        Workload("http-4k", "aiohttp keep-alive, GET returning 4 KiB, 10 connections",
                 "http", "wrk", 10, path="/4k", needs=("aiohttp",)),
        # uvicorn writes a response's head and its body apart (at
        # http.response.start and http.response.body), as split-writes' /two.
        Workload("uvicorn-plaintext",
                 "uvicorn + httptools, an ASGI app answering 13 B of text/plain, keep-alive, "
                 "10 connections", "uvicorn", "wrk", 10, path="/", syscalls=True,
                 needs=("uvicorn>=0.36", "httptools")),
        Workload("split-writes",
                 "the same HTTP response (13 B body) in one write and in two, head then body, "
                 "10 keep-alive connections", "split", "wrk", 10, path="/one",
                 paths=("/two",)),
        Workload("openloop-1k",
                 "open-loop latency: 1 KiB echo at a constant rate, 50 %, 80 % and 95 % of the "
                 "capacity measured first, 10 connections, latency from each request's due time",
                 "echo-protocol", "open", 10, loads=(50, 80, 95)),
        Workload("pipe-100k", "tcp-raw-pipe: one connection, 100 KiB chunks echoed",
                 "pipe", "pipe", 1, 100 * KiB, unit="MiB"),
        Workload("pipe-16m", "tcp-raw-pipe: one connection, 16 MiB chunks echoed",
                 "pipe", "pipe", 1, 16 * MiB, unit="MiB"),
        Workload("small-writes", "16 writes of 64 B per request in one callback, 10 connections",
                 "pieces", "echo", 10, 64, 16 * 64,
                 server_args=("--request", "64", "--pieces", "16", "--piece", "64"),
                 default_loops=(*IO_DEFAULT, "relaxed-deferred"), syscalls=True),
        Workload("churn", "a new connection per 1 KiB request, 10 clients",
                 "echo-protocol", "churn", 10, unit="connection",
                 loops=(*PEERS, "relaxed-batch", "relaxed-single", "relaxed-batch-pure"),
                 default_loops=ACCEPT_DEFAULT, syscalls=True),
        Workload("idle-2000", "server memory per idle connection, 2,000 connections",
                 "echo-protocol", "idle", 2000, unit="connection", default_loops=IO_DEFAULT),
        Workload("idle-10000", "server memory per idle connection, 10,000 connections",
                 "echo-protocol", "idle", 10000, unit="connection"),
        *_fairness(),
        *_tls(),
        *_udp(),
        *_openloop(),
        *_apps(),
    )
}
