"""K pre-forked workers sharing one listening socket; who served what.

Each worker makes its own loop after fork() (an epoll instance made before a
fork is one kernel object shared by parent and children) and answers every
request line with its worker number.  On exit each worker reports the
connections and requests it served, and the parent prints each worker's
share and Jain's fairness index ((sum x)^2 / (n * sum x^2): 1.0 is perfectly
even, 1/n is one worker taking everything)::

    python examples/prefork_server.py --workers 4 --loop relaxed --accept single
    python examples/prefork_server.py --workers 4 --accept batch --load 2000
    python examples/prefork_server.py --workers 4 --accept balanced --load 2000

With --load N the parent itself connects N times, one connection at a time
(one request each), then stops the workers; without it, serve until Ctrl-C.
With --stats-dir DIR (or ASYNCIO_RELAXED_STATS_DIR) every worker's loop
publishes its statistics there: watch the pool with
``python -m asyncio_relaxed top DIR``::

    mkdir -p /dev/shm/pool
    python examples/prefork_server.py --workers 4 --accept balanced --stats-dir /dev/shm/pool
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
from typing import Any

from _loops import LoopFactory, add_loop_option, loop_factory


class Answer(asyncio.Protocol):
    """One line in, the worker's number out; counts what this worker served."""

    counts = {"connections": 0, "requests": 0}
    worker = b"0"

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        Answer.counts["connections"] += 1

    def data_received(self, data: bytes) -> None:
        lines = data.count(b"\n")
        Answer.counts["requests"] += lines
        self.transport.write((Answer.worker + b"\n") * lines)


def worker(index: int, sock: socket.socket, factory: LoopFactory, report: int) -> None:
    """The child: make its loop, serve on the shared socket until SIGTERM, then report."""
    loop = factory()
    Answer.worker = str(index).encode()
    stop = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))

    async def serve() -> None:
        server = await loop.create_server(Answer, sock=sock)
        os.write(report, b"ready\n")
        await stop
        server.close()

    loop.run_until_complete(serve())
    loop.close()
    os.write(report, json.dumps({"worker": index, "pid": os.getpid(), **Answer.counts}).encode()
             + b"\n")


def jain(values: list[int]) -> float:
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


def load(address: tuple[str, int], n: int) -> None:
    for _ in range(n):
        with socket.create_connection(address, timeout=10) as s:
            s.sendall(b"hello\n")
            s.recv(64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_loop_option(parser)
    parser.add_argument("--accept", choices=("batch", "single", "relaxed", "balanced"),
                        help="relaxed accept strategy (default: ASYNCIO_RELAXED_ACCEPT or batch)")
    parser.add_argument("--write", choices=("eager", "deferred"), help="relaxed write mode")
    parser.add_argument("--stats-dir", help="every worker's loop publishes its statistics "
                        "there (default: ASYNCIO_RELAXED_STATS_DIR, else none)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090, help="0 picks a free port")
    parser.add_argument("--load", type=int, default=0,
                        help="connect this many times, one at a time, then stop and report")
    args = parser.parse_args()
    factory = loop_factory(parser, args.loop, write=args.write, accept=args.accept,
                           stats_dir=args.stats_dir)

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # listening socket only
    sock.bind((args.host, args.port))
    sock.listen(1024)
    sock.setblocking(False)
    address = sock.getsockname()
    print(json.dumps({"listening": address[1], "workers": args.workers}), flush=True)

    read_end, write_end = os.pipe()
    children = []
    for index in range(args.workers):
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(read_end)
            code = 0
            try:
                worker(index, sock, factory, write_end)
            except BaseException:
                code = 1
                raise
            finally:
                os._exit(code)
        children.append(pid)
    os.close(write_end)
    reports = os.fdopen(read_end)
    for _ in children:  # every worker is serving before any load
        assert reports.readline().strip() == "ready"

    try:
        if args.load:
            load(address, args.load)
        else:
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    except KeyboardInterrupt:
        pass
    finally:
        for pid in children:
            os.kill(pid, signal.SIGTERM)
    results = sorted((json.loads(reports.readline()) for _ in children), key=lambda r: r["worker"])
    for pid in children:
        os.waitpid(pid, 0)
    connections = [r["connections"] for r in results]
    total = sum(connections) or 1
    print(f"{'worker':>6} {'pid':>8} {'connections':>12} {'share':>7} {'requests':>9}")
    for r in results:
        print(f"{r['worker']:>6} {r['pid']:>8} {r['connections']:>12} "
              f"{r['connections'] / total:>7.1%} {r['requests']:>9}")
    print(f"Jain's index over connections: {jain(connections):.3f}; "
          f"max/min: {max(connections)}/{min(connections)}")
    print(json.dumps({"connections": connections, "requests": [r["requests"] for r in results],
                      "jain": jain(connections)}), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
