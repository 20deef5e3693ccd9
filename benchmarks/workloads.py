"""Every workload of the suite, defined once: what server, what load, which loops.

``DEFAULT`` marks the set ``python -m benchmarks run`` runs in a few minutes
on a 2-core machine; ``--full`` runs all of them.  The sources of each
workload are in DESIGN.md section 4: vmbench's echo servers, HAProxy's
0 B / 4 KiB HTTP test, node's tcp-raw-pipe, libuv's accept fairness.
"""

from __future__ import annotations

import dataclasses

from benchmarks.loops import ACCEPT_LOOPS, DEFAULT_LOOPS

KiB = 1024
MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    about: str
    #: A kind of benchmarks.server, or "fairness" (benchmarks.fairness).
    server: str
    #: A kind of benchmarks.client, or "wrk" (the built-in "http" client
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
    loops: tuple[str, ...] = DEFAULT_LOOPS
    default: bool = False
    #: Also count system calls with strace on a shorter run (peers included).
    syscalls: bool = False
    #: fairness only: workers and keep-alive.
    workers: int = 0
    keepalive: bool = False

    def params(self) -> dict[str, object]:
        """The parameters that define the workload (for the JSON)."""
        fields = dataclasses.asdict(self)
        for key in ("name", "about", "loops", "default", "syscalls"):
            fields.pop(key)
        return fields


def _sizes(size: int) -> str:
    return f"{size // MiB}m" if size >= MiB else f"{size // KiB}k"


def _echo() -> list[Workload]:
    out = []
    for api in ("protocol", "buffered", "streams"):
        for size in (1 * KiB, 10 * KiB, 100 * KiB):
            for conc in (10, 1000):
                default = conc == 10 and (size == 1 * KiB or (api == "protocol"
                                                              and size == 100 * KiB))
                out.append(Workload(
                    f"echo-{api}-{_sizes(size)}-c{conc}",
                    f"echo, {api} server, {size // KiB} KiB messages, {conc} connections",
                    f"echo-{api}", "echo", conc, size, size, default=default,
                    syscalls=(api == "protocol" and size == KiB and conc == 10)))
    return out


def _fairness() -> list[Workload]:
    out = []
    for workers in (2, 4):
        for conc in (1, 10, 100):
            for keepalive in (False, True):
                mode = "keepalive" if keepalive else "close"
                out.append(Workload(
                    f"fairness-k{workers}-c{conc}-{mode}",
                    f"{workers} pre-forked workers on one listen socket, {conc} clients, "
                    + ("keep-alive (reconnect every 20 requests)" if keepalive
                       else "a new connection per request"),
                    "fairness", "fairness", conc, unit="request", loops=ACCEPT_LOOPS,
                    default=(workers == 4 and conc in (1, 100) and not keepalive),
                    workers=workers, keepalive=keepalive))
    return out


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        *_echo(),
        Workload("http-0b", "aiohttp keep-alive, GET returning 0 B, 10 connections",
                 "http", "wrk", 10, path="/", default=True, syscalls=True),
        Workload("http-4k", "aiohttp keep-alive, GET returning 4 KiB, 10 connections",
                 "http", "wrk", 10, path="/4k", default=True),
        Workload("pipe-100k", "tcp-raw-pipe: one connection, 100 KiB chunks echoed",
                 "pipe", "pipe", 1, 100 * KiB, unit="MiB", default=True),
        Workload("pipe-16m", "tcp-raw-pipe: one connection, 16 MiB chunks echoed",
                 "pipe", "pipe", 1, 16 * MiB, unit="MiB"),
        Workload("small-writes", "16 writes of 64 B per request in one callback, 10 connections",
                 "pieces", "echo", 10, 64, 16 * 64,
                 server_args=("--request", "64", "--pieces", "16", "--piece", "64"),
                 default=True, syscalls=True),
        Workload("churn", "a new connection per 1 KiB request, 10 clients",
                 "echo-protocol", "churn", 10, unit="connection",
                 loops=("asyncio", "uvloop", "rloop", "relaxed-batch", "relaxed-single"),
                 default=True, syscalls=True),
        Workload("idle-2000", "server memory per idle connection, 2,000 connections",
                 "echo-protocol", "idle", 2000, unit="connection", default=True),
        Workload("idle-10000", "server memory per idle connection, 10,000 connections",
                 "echo-protocol", "idle", 10000, unit="connection"),
        *_fairness(),
    )
}
