"""One worker of a test pool: serves echo on an inherited listening socket
with its loop publishing to a stats directory; on each line of stdin it
publishes at once and prints, on one line of stdout, what its own loop says
of itself (statistics, gauges, listeners) at that same moment.

    python tests/_pool_worker.py FD STATS_DIR [SETTING=VALUE ...]
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import sys

import asyncio_relaxed


class Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


def report(loop: asyncio_relaxed.Loop) -> None:
    # Publish and read in one callback: nothing of the loop runs between.
    loop._health.publisher.publish()
    own = {
        "statistics": loop.statistics().as_dict(),
        "gauges": loop.gauges().as_dict(),
        "listeners": [dataclasses.asdict(listener) for listener in loop.listener_statistics()],
        "health": loop.health().as_dict(),
    }
    print(json.dumps(own, default=str), flush=True)


async def main(fd: int) -> None:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, asyncio_relaxed.Loop)
    sock = socket.socket(fileno=fd)
    server = await loop.create_server(Echo, sock=sock)
    done = loop.create_future()

    def command() -> None:
        line = sys.stdin.readline()
        if not line:
            loop.remove_reader(sys.stdin.fileno())
            done.set_result(None)
        else:
            report(loop)

    loop.add_reader(sys.stdin.fileno(), command)
    print("ready", flush=True)
    await done
    server.close()
    await server.wait_closed()


if __name__ == "__main__":
    settings = dict(arg.split("=", 1) for arg in sys.argv[3:])
    asyncio_relaxed.run(main(int(sys.argv[1])), stats_dir=sys.argv[2], **settings)
