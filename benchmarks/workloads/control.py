"""How a server process answers the runner: marks, the end of input, limits.

Every server of a run (benchmarks.workloads.server, its uvicorn kind in
benchmarks.workloads.asgi, the floors in benchmarks.workloads.floors)
prints ``{"listening": PORT, ...}`` and then answers the runner over
stdin/stdout: each ``mark`` line is answered with one JSON line, a
:func:`snapshot` of the process (its CPU seconds, user + system, from
``getrusage``, of which ``sys`` the kernel's, and its minor page faults;
its resident memory; on asyncio_relaxed's loop, ``loop.statistics()``);
the end of input stops the server.  The runner
subtracts two marks around the measured window, so start-up and warm-up
cost nothing.

The marks are read by a thread blocked on stdin and handed to the loop with
``call_soon_threadsafe``, which every loop supports, so the snapshot is taken
on the loop's thread; the thread costs nothing while it waits.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import threading
from collections.abc import Callable
from typing import Any


def snapshot(loop: asyncio.AbstractEventLoop | None) -> dict[str, Any]:
    """The process's CPU seconds and RSS, and *loop*'s statistics() if it has them."""
    usage = resource.getrusage(resource.RUSAGE_SELF)  # µs resolution; os.times() has ticks
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    mark: dict[str, Any] = {"cpu": usage.ru_utime + usage.ru_stime, "sys": usage.ru_stime,
                            "rss": rss, "minflt": usage.ru_minflt}
    statistics = getattr(loop, "statistics", None) if loop is not None else None
    if callable(statistics):
        mark["statistics"] = statistics().as_dict()
    return mark


def listening(port: int, loop: str, relaxed: str | None, **more: Any) -> None:
    """Tell the runner the server listens on *port*: the first line of output."""
    print(json.dumps({"listening": port, "pid": os.getpid(), "loop": loop,
                      "relaxed": relaxed, **more}), flush=True)


def unsupported(why: str) -> None:
    """Tell the runner this loop cannot serve the workload (a peer without
    ``create_server(ssl=)``, say), in place of :func:`listening`: it notes
    *why* and runs the workload without the loop."""
    print(json.dumps({"unsupported": why}), flush=True)


def finish(future: asyncio.Future[None]) -> None:
    """Resolve *future* unless it is done (a stop that may come twice)."""
    if not future.done():
        future.set_result(None)


def raise_fd_limit() -> None:
    """Allow as many sockets as the hard limit (the idle workload holds 10,000)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def control(loop: asyncio.AbstractEventLoop, stop: Callable[[], object]) -> None:
    """Answer the runner from a thread blocked on stdin: each ``mark`` with a
    snapshot taken on *loop*'s thread, the end of input with *stop* there."""

    def report() -> None:
        print(json.dumps(snapshot(loop)), flush=True)

    def read() -> None:
        for line in sys.stdin:
            if line.strip() == "mark":
                loop.call_soon_threadsafe(report)
        loop.call_soon_threadsafe(stop)

    threading.Thread(target=read, daemon=True).start()


class Wakeup:
    """The runner's marks for a server without an event loop (a floor): a
    thread blocked on stdin writes one byte per line to a socket pair whose
    reading end the server polls with its connections: ``m`` for a mark,
    ``q`` at the end of input."""

    def __init__(self) -> None:
        import socket

        self.reader, self._writer = socket.socketpair()
        self.reader.setblocking(False)
        self.running = True
        threading.Thread(target=self._read, daemon=True).start()

    def fileno(self) -> int:
        return self.reader.fileno()

    def _read(self) -> None:
        for line in sys.stdin:
            if line.strip() == "mark":
                self._writer.send(b"m")
        self._writer.send(b"q")

    def ready(self) -> None:
        """The reading end is readable: answer each mark; note the end."""
        for byte in self.reader.recv(64):
            if byte == ord("m"):
                print(json.dumps(snapshot(None)), flush=True)
            else:
                self.running = False

    def close(self) -> None:
        self.reader.close()
        self._writer.close()
