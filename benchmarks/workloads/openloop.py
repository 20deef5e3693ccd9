"""The open-loop load generator: ``python -m benchmarks.workloads.openloop``.

Theory of operation
===================

A closed-loop client (every other client of the suite, and wrk) sends a
connection's next request when the answer to the last one is back, so it
slows down with the server it measures: while a response is late, the
requests that would have been sent meanwhile are not, and their wait never
enters the figures (coordinated omission).  Here requests are due at a
constant rate whatever the answers do: request *i* is due at
``t0 + i / rate`` and goes out on connection ``i % C`` at its due time,
behind whatever that connection still has in flight (pipelined: the echo
server answers in order, so the answers are matched by their bytes).  Its
latency runs from its due time to the last byte of its answer, as wrk2
measures, so a request the client sent late still counts from when it was
due.  How late the client itself sent (``lag``: send time minus due time)
is reported beside the latencies: where it is large, the figures are the
client's, not the server's.

The pacer is a callback queued again with ``call_soon`` after each pass, so
it runs once per loop iteration and sends every request that has come due;
it never sleeps, because a timer would round to the loop's clock (libuv's,
under uvloop, counts milliseconds) and send the requests in bursts.  The
client therefore keeps its CPU busy through a run: the runner pins it to a
CPU of its own.

One process drives every window of a run, over the same connections: the
runner writes a port, then per window a command, ``closed`` (one request in
flight per connection: the capacity) or ``open RATE`` (requests per
second); the client runs the load through ``--warmup`` seconds, prints
``{"ready": true}``, and when the runner writes ``go`` (after marking the
server) counts the requests due in the next ``--duration`` seconds, stops
sending at its end, waits for every answer and prints the window's figures:
requests, elapsed, p50/p99/p99.9 latency (µs) and, open, the lag's p99 and
maximum.  The end of input closes the connections.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import sys
import threading
import time
from typing import Any

from benchmarks.harness import loops, maths

#: Seconds the client waits for the answers to a window's last requests.
DRAIN_TIMEOUT = 30.0


class Meter:
    """The window and what was answered in it, shared by every connection."""

    def __init__(self) -> None:
        self.start = math.inf  # the window: requests due in [start, end) count
        self.end = math.inf
        self.closed = False  # closed loop: a connection sends again on each answer
        self.sending = False
        self.outstanding = 0
        self.latencies: list[float] = []
        self.lags: list[float] = []
        self.drained: asyncio.Future[None] | None = None

    def answered(self, conn: Connection, due: float, now: float) -> None:
        self.outstanding -= 1
        if self.start <= due < self.end:
            self.latencies.append(now - due)
        if self.closed and self.sending:
            if now < self.end:
                conn.send(now)
            else:
                self.sending = False
        if not self.outstanding and self.drained is not None and not self.drained.done():
            self.drained.set_result(None)


class Connection(asyncio.Protocol):
    """One connection: requests in flight in order, each with its due time."""

    def __init__(self, meter: Meter, request: bytes, response: int) -> None:
        self.meter = meter
        self.request = request
        self.response = response
        self.left = response  # bytes still to come of the oldest answer
        self.due: collections.deque[float] = collections.deque()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def send(self, due: float) -> None:
        self.due.append(due)
        self.meter.outstanding += 1
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        size = len(data)
        if size < self.left:
            self.left -= size
            return
        now = time.perf_counter()
        while size >= self.left:
            size -= self.left
            self.left = self.response
            self.meter.answered(self, self.due.popleft(), now)
        self.left -= size

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.due and self.meter.drained is not None and not self.meter.drained.done():
            self.meter.drained.set_exception(ConnectionError(
                f"the server closed a connection with {len(self.due)} answers owed"))


class Pacer:
    """Sends request i at t0 + i / rate, round robin over the connections."""

    def __init__(self, meter: Meter, conns: list[Connection], rate: float) -> None:
        self.meter = meter
        self.conns = conns
        self.rate = rate
        self.t0 = time.perf_counter()
        self.sent = 0
        self.next_due = self.t0

    def __call__(self) -> None:
        meter = self.meter
        if not meter.sending:
            return
        clock = time.perf_counter
        conns = self.conns
        while self.next_due <= clock():
            due = self.next_due
            if due >= meter.end:
                meter.sending = False
                return
            conns[self.sent % len(conns)].send(due)
            if due >= meter.start:
                meter.lags.append(clock() - due)
            self.sent += 1
            self.next_due = self.t0 + self.sent / self.rate
        asyncio.get_running_loop().call_soon(self)


async def run_window(conns: list[Connection], command: str, warmup: float, duration: float,
                     commands: asyncio.Queue[str]) -> dict[str, Any]:
    """One window of *command* (``closed`` or ``open RATE``) on *conns*, which
    have nothing in flight: warm-up, ready, ``go``, the measured window,
    every answer back; the window's figures."""
    loop = asyncio.get_running_loop()
    meter = Meter()
    for conn in conns:
        conn.meter = meter
    meter.sending = True
    kind, _, rate = command.partition(" ")
    if kind == "closed":
        meter.closed = True
        now = time.perf_counter()
        for conn in conns:
            conn.send(now)
    elif kind == "open" and float(rate) > 0:
        loop.call_soon(Pacer(meter, conns, float(rate)))
    else:
        raise ValueError(f"unknown command {command!r}: closed, or open RATE")
    await asyncio.sleep(warmup)
    print(json.dumps({"ready": True}), flush=True)
    if (await commands.get()) != "go":
        raise ValueError("expected go")
    meter.start = time.perf_counter()
    meter.end = meter.start + duration
    await asyncio.sleep(duration)
    meter.sending = False
    meter.drained = loop.create_future()
    if meter.outstanding:
        await asyncio.wait_for(meter.drained, DRAIN_TIMEOUT)
    if not meter.latencies:
        raise RuntimeError(f"{command}: no request answered in the measured window")
    p50, p99, p999 = maths.percentiles(meter.latencies, 50, 99, 99.9)
    out: dict[str, Any] = {"requests": len(meter.latencies), "elapsed": duration,
                           "p50_us": p50 * 1e6, "p99_us": p99 * 1e6, "p999_us": p999 * 1e6}
    if meter.lags:
        out["lag_p99_us"] = maths.percentiles(meter.lags, 99)[0] * 1e6
        out["lag_max_us"] = max(meter.lags) * 1e6
    return out


async def run(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[str] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(commands.put_nowait, line.strip())
        loop.call_soon_threadsafe(commands.put_nowait, "")

    threading.Thread(target=read, daemon=True).start()
    port = int(await commands.get())
    request = b"r" * args.request
    conns = []
    for _ in range(args.concurrency):
        _, conn = await loop.create_connection(
            lambda: Connection(Meter(), request, args.response), "127.0.0.1", port)
        conns.append(conn)
    print(json.dumps({"client": f"builtin open loop, one process ({loops.client_loop()[0]})",
                      "connections": len(conns)}), flush=True)
    while command := await commands.get():
        result = await run_window(conns, command, args.warmup, args.duration, commands)
        print(json.dumps(result), flush=True)
    for conn in conns:
        conn.transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="the open-loop load generator")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--request", type=int, default=1024, help="bytes per request")
    parser.add_argument("--response", type=int, default=1024, help="bytes per answer")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=1.0)
    args = parser.parse_args()
    loop = loops.client_loop()[1]()
    try:
        loop.run_until_complete(run(args))
    finally:
        loop.close()


if __name__ == "__main__":
    main()
