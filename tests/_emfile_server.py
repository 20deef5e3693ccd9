"""An echo server on asyncio_relaxed that runs out of file descriptors.

Run by tests/test_reliability.py in a subprocess, so that RLIMIT_NOFILE can be
lowered without touching the test process::

    python tests/_emfile_server.py HEADROOM '{"write": "eager", ...}'

The second argument holds the loop's keyword settings, as JSON.  Once the
loop, the server and the stdin watcher exist, the soft RLIMIT_NOFILE is set to
the highest open fd + 1 + HEADROOM, so about HEADROOM connections can be open
at once.  Every event is one line on stdout (t is time.monotonic()):

    port <port>                         ready, listening on 127.0.0.1:<port>
    accepted <peer port>                connection_made (the server sends b"hi\\n")
    lost <peer port>                    connection_lost
    error <t> <errno> <accept> <json>   an exception-handler call; <accept> is
                                        statistics().accept at that moment
    accepts <t> <accept> <iterations>   statistics().accept changed (checked
                                        every 0.1 s), and the loop's iterations
    closed                              the server was closed ("close" command)
    settled                             1.5 accept retry delays after "closed"

It echoes what it receives.  Commands on stdin, one a line: ``close`` closes
the server (the loop runs on).  At EOF on stdin it stops, exit status 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time
from asyncio import constants
from typing import Any

import asyncio_relaxed


def emit(*parts: object) -> None:
    sys.stdout.write(" ".join(str(part) for part in parts) + "\n")
    sys.stdout.flush()


class Echo(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.port = transport.get_extra_info("peername")[1]
        emit("accepted", self.port)
        transport.write(b"hi\n")

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        emit("lost", self.port)


def main() -> None:
    headroom = int(sys.argv[1])
    settings = json.loads(sys.argv[2])
    loop = asyncio_relaxed.new_event_loop(**settings)

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        emit(
            "error",
            f"{time.monotonic():.6f}",
            getattr(exc, "errno", None),
            loop.statistics().accept,  # type: ignore[attr-defined]
            json.dumps(str(context.get("message"))),
        )

    loop.set_exception_handler(handler)
    server = loop.run_until_complete(loop.create_server(Echo, "127.0.0.1", 0, backlog=128))
    port = server.sockets[0].getsockname()[1]

    stop = loop.create_future()

    def on_stdin() -> None:
        data = os.read(0, 4096)
        if not data:
            loop.remove_reader(0)
            stop.set_result(None)
            return
        for command in data.decode().split():
            if command == "close":
                server.close()
                emit("closed")
                loop.call_later(1.5 * constants.ACCEPT_RETRY_DELAY, emit, "settled")

    loop.add_reader(0, on_stdin)

    last_accept = -1

    def watch_accepts() -> None:
        nonlocal last_accept
        stats = loop.statistics()
        if stats.accept != last_accept:
            last_accept = stats.accept
            emit("accepts", f"{time.monotonic():.6f}", stats.accept, stats.iterations)
        loop.call_later(0.1, watch_accepts)

    watch_accepts()

    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1 + headroom, hard))
    emit("port", port)

    loop.run_until_complete(stop)
    server.close()
    loop.run_until_complete(server.wait_closed())
    loop.close()


if __name__ == "__main__":
    main()
