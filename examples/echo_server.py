"""An echo server on the loop of your choice, and a side-by-side comparison.

Serve (Ctrl-C prints the server's CPU time and, for our loop, statistics()
per request of --size bytes)::

    python examples/echo_server.py serve --loop relaxed --api protocol --port 25000 --size 1024

Compare loops on one workload, each server pinned to CPU 0 and the client
to CPU 1, loops interleaved, median of the repeats::

    python examples/echo_server.py compare --size 1024 --clients 10 --duration 2 --repeat 3

The comparison is a quick look, not the benchmark suite: it reports
requests/s, the server's CPU microseconds per request (its own user+system
time, robust when the client is the bottleneck) and, for asyncio_relaxed,
system calls and callbacks per request from loop.statistics(); its last
line is the same medians as JSON, by loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from _loops import add_loop_option, loop_factory, missing

# -- the server -----------------------------------------------------------------


ECHOED = [0]  # bytes echoed by this server process, for the per-request report


class EchoProtocol(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        ECHOED[0] += len(data)
        self.transport.write(data)


class EchoBufferedProtocol(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self.buffer = bytearray(256 * 1024)
        self.view = memoryview(self.buffer)

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        ECHOED[0] += nbytes
        self.transport.write(self.view[:nbytes])  # our loop copies what it keeps


async def echo_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(256 * 1024):
        ECHOED[0] += len(data)
        writer.write(data)
        await writer.drain()
    writer.close()


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set_result, None)
    if args.api == "streams":
        server = await asyncio.start_server(echo_stream, args.host, args.port, backlog=1024)
    else:
        factory = EchoProtocol if args.api == "protocol" else EchoBufferedProtocol
        server = await loop.create_server(factory, args.host, args.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"listening": port}), flush=True)
    t0 = os.times()
    before = loop.statistics() if hasattr(loop, "statistics") else None
    await stop
    t1 = os.times()
    report: dict[str, Any] = {
        "loop": type(loop).__module__ + "." + type(loop).__qualname__,
        "cpu_seconds": (t1.user - t0.user) + (t1.system - t0.system),
    }
    if before is not None:
        report["statistics"] = (loop.statistics() - before).as_dict()
    server.close()
    if args.size:
        # Per request, where a request is one --size message echoed.
        requests = ECHOED[0] / args.size
        report["requests"] = requests
        if requests:
            report["cpu_us_per_request"] = report["cpu_seconds"] * 1e6 / requests
            for name, value in report.get("statistics", {}).items():
                if isinstance(value, int):
                    print(f"{name:>18} per request: {value / requests:8.3f}", file=sys.stderr)
    print(json.dumps(report), flush=True)


# -- the client and the comparison ----------------------------------------------


class Client(asyncio.Protocol):
    """Sends one message, waits for all of it back, repeats until the deadline."""

    def __init__(self, payload: bytes, deadline: float, done: asyncio.Future[None]) -> None:
        self.payload = payload
        self.deadline = deadline
        self.done = done
        self.pending = 0
        self.requests = 0
        self.latencies: list[float] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.send()

    def send(self) -> None:
        self.started = time.perf_counter()
        self.pending = len(self.payload)
        self.transport.write(self.payload)

    def data_received(self, data: bytes) -> None:
        self.pending -= len(data)
        if self.pending > 0:
            return
        now = time.perf_counter()
        self.requests += 1
        self.latencies.append(now - self.started)
        if now < self.deadline:
            self.send()
        else:
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def load(port: int, size: int, clients: int, duration: float) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    payload = os.urandom(size)
    deadline = time.perf_counter() + duration
    protocols = []
    waits = []
    for _ in range(clients):
        done = loop.create_future()
        proto = Client(payload, deadline, done)
        await loop.create_connection(lambda p=proto: p, "127.0.0.1", port)
        protocols.append(proto)
        waits.append(done)
    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*waits), duration + 30)
    elapsed = time.perf_counter() - started
    latencies = sorted(x for p in protocols for x in p.latencies)
    requests = sum(p.requests for p in protocols)
    return {
        "requests": requests,
        "elapsed": elapsed,
        "p50_us": latencies[len(latencies) // 2] * 1e6 if latencies else 0.0,
        "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6 if latencies else 0.0,
    }


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any] | None:
    command = [sys.executable, __file__, "serve", "--loop", name, "--api", args.api,
               "--port", "0", "--size", str(args.size)]
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    server_cpu, client_cpu = (cpus[0], cpus[-1]) if len(cpus) >= 2 else (None, None)
    preexec = (lambda: os.sched_setaffinity(0, {server_cpu})) if server_cpu is not None else None
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, preexec_fn=preexec)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            return None
        port = json.loads(line)["listening"]
        if client_cpu is not None:
            os.sched_setaffinity(0, {client_cpu})
        result = asyncio.run(load(port, args.size, args.clients, args.duration))
        proc.send_signal(signal.SIGINT)
        report = json.loads(proc.stdout.readline())
    finally:
        if proc.poll() is None:
            proc.wait(timeout=10)
        if cpus:
            os.sched_setaffinity(0, set(cpus))
    result["cpu_us_per_request"] = report["cpu_seconds"] * 1e6 / max(result["requests"], 1)
    stats = report.get("statistics")
    if stats:
        n = max(result["requests"], 1)
        result["syscalls_per_request"] = (
            stats["poll_waits"] + stats["epoll_ctl_add"] + stats["epoll_ctl_mod"]
            + stats["epoll_ctl_del"] + stats["recv"] + stats["send"] + stats["sendmsg"]
            + stats["accept"]
        ) / n
        result["callbacks_per_request"] = stats["callbacks"] / n
    return result


def compare(args: argparse.Namespace) -> None:
    names = [n for n in args.loops.split(",") if n]
    samples: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    skipped = {n: why for n in names if (why := missing(n))}
    for n, why in skipped.items():
        print(f"note: {n} skipped: {why}", file=sys.stderr)
    for round_ in range(args.repeat + 1):  # round 0 is the warm-up
        for name in names:  # interleaved: A B C, A B C, ...
            if name in skipped:
                continue
            result = run_one(name, args)
            if result is not None and round_ > 0:
                samples[name].append(result)
    print(f"echo {args.api}, {args.size} B messages, {args.clients} clients, "
          f"{args.duration}s x {args.repeat} (median), python {sys.version.split()[0]}")
    header = f"{'loop':<18}{'req/s':>10}{'CPU µs/req':>12}{'p50 µs':>9}{'p99 µs':>9}" \
             f"{'syscalls/req':>14}{'callbacks/req':>15}"
    print(header)
    table: dict[str, dict[str, float | None]] = {}
    for name in names:
        runs = samples[name]
        if not runs:
            continue

        def med(key: str, runs: list[dict[str, Any]] = runs) -> float | None:
            values = [r[key] for r in runs if key in r]
            return statistics.median(values) if values else None

        row = table[name] = {
            "req_per_s": statistics.median(r["requests"] / r["elapsed"] for r in runs),
            **{key: med(key) for key in ("cpu_us_per_request", "p50_us", "p99_us",
                                         "syscalls_per_request", "callbacks_per_request")}}
        cells = [f"{row[key]:{fmt}}" if row[key] is not None
                 else "—".rjust(int(fmt[1:].split(".")[0]))
                 for key, fmt in (("req_per_s", ">10.0f"), ("cpu_us_per_request", ">12.1f"),
                                  ("p50_us", ">9.0f"), ("p99_us", ">9.0f"),
                                  ("syscalls_per_request", ">14.2f"),
                                  ("callbacks_per_request", ">15.2f"))]
        print(f"{name:<18}" + "".join(cells))
    # The same medians for a program to read, by loop and by name.
    print(json.dumps({"loops": table}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run an echo server until SIGINT/SIGTERM")
    add_loop_option(s)
    s.add_argument("--api", choices=("protocol", "buffered", "streams"), default="protocol")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=25000)
    s.add_argument("--write", choices=("eager", "deferred"), help="relaxed write mode")
    s.add_argument("--partial-write", choices=("poll", "feed"), help="relaxed short-write policy")
    s.add_argument("--size", type=int, default=0,
                   help="message size: on exit, print statistics() per request (stderr)")
    c = sub.add_parser("compare", help="run the same echo load against each loop")
    c.add_argument("--loops", default="asyncio,uvloop,relaxed-eager,relaxed-deferred",
                   help="comma-separated --loop names (asyncio,uvloop,relaxed-eager,"
                   "relaxed-deferred)")
    c.add_argument("--api", choices=("protocol", "buffered", "streams"), default="protocol")
    c.add_argument("--size", type=int, default=1024, help="message size in bytes")
    c.add_argument("--clients", type=int, default=10)
    c.add_argument("--duration", type=float, default=2.0, help="seconds per run")
    c.add_argument("--repeat", type=int, default=3, help="measured runs per loop")
    args = parser.parse_args()
    if args.command == "compare":
        compare(args)
        return
    loop = loop_factory(parser, args.loop, write=args.write,
                        partial_write=args.partial_write)()
    try:
        loop.run_until_complete(serve(args))
    finally:
        loop.close()


if __name__ == "__main__":
    main()
