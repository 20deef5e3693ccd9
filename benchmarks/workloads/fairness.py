"""Accept fairness: K pre-forked workers on one listen socket, who served what.

The parent makes one listening socket (SO_REUSEADDR, backlog 1024) and forks
K workers; each worker makes its loop after the fork (an epoll instance made
before a fork is one kernel object shared by every process) and serves
``loop.create_server(Reply, sock=sock)``.  A request is one line; the reply is
one line naming the worker, after about 50 µs of hashing (``WORK_BYTES``), so
a worker that takes more connections also spends more CPU.  The load comes
from a separate client process (``python -m benchmarks.workloads.client
--kind fairness``, running :func:`client` on benchmarks.harness.loops.client_loop:
the same client for every loop under test) running C concurrent clients,
with connection lifetimes (``MODES``) of

* ``close``: connect, one request, close;
* ``keepalive``: many requests per connection, reconnecting every
  ``KEEPALIVE_REQUESTS`` requests, so the spread of connections still means
  something;
* ``mixed``: ``MIXED_LONG_SHARE`` of the clients keep one connection for the
  whole run, the others make a new connection per request: a worker that
  holds long connections is busier, and a load-aware accept (accept=balanced)
  should give it fewer of the new ones.

Placement (``PLACEMENTS``): ``pinned``, every worker on CPU 0 and the client
on CPU 1 where the machine has two CPUs (``pinned`` in the result says
whether it happened), so the workers compete for one CPU and the accept race
is the scheduler's choice among them; or ``unpinned``, nothing pinned, the
workers free to run on every CPU as a deployed server's are.  The client
marks the start and the end of the measured window (after ``warmup``) on its
stdout; the parent relays them to the workers as SIGUSR1 / SIGUSR2, and each
worker reports what it served inside the window (connections, requests, CPU
time) on SIGTERM.  Results: Jain's index over per-worker connections (1.0 is
an even spread, 1/K is one worker taking everything) and over requests,
max/min over connections (inf when a worker got none), connections/s and
requests/s and p50/p99 latency seen by the client (a close-per-request
latency includes the connect, so an accept delay shows there), server CPU
µs per request, and per worker: connections, requests, CPU seconds and the
p99 latency of the requests it answered (the reply names the worker).

The runner measures it as the ``fairness-*`` workloads
(benchmarks.workloads.catalog); ``python -m benchmarks fairness`` runs a grid
of them::

    python -m benchmarks fairness --loops asyncio,uvloop,relaxed-batch,\\
relaxed-single,relaxed-relaxed,relaxed-balanced --workers 4 \\
        --concurrency 1,10,100 --mode close,keepalive --duration 3 --repeat 3
    python -m benchmarks fairness --workers 2,4 --concurrency 10 \\
        --mode close,keepalive,mixed --placement unpinned

Light load is concurrency 1, moderate 10, saturating 100 and more.  Only the
public API of asyncio_relaxed is used (through ``benchmarks.harness.loops``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import select
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from typing import Any

from benchmarks.harness import loops, maths, processes

#: Bytes hashed per request: sha256 of 72 KiB took about 50 µs on the 2-CPU
#: machine the README's figures come from (11 µs per 16 KiB, measured with
#: time.perf_counter over 10,000 digests), a small stand-in for a request's work.
WORK_BYTES = 72 * 1024
_WORK = bytes(WORK_BYTES)
#: Requests per keep-alive connection before the client reconnects: enough
#: to make keep-alive cheap, few enough that connections keep arriving.
KEEPALIVE_REQUESTS = 20
#: Connection lifetimes of the client (see above) and where the processes run.
MODES = ("close", "keepalive", "mixed")
PLACEMENTS = ("pinned", "unpinned")
#: mixed: the share of the clients that keep one connection for the whole
#: run (at least one, and at least one short client).
MIXED_LONG_SHARE = 0.5
#: Seconds on top of warmup + duration before everything is killed.
HARD_TIMEOUT_SLACK = 30.0
#: Seconds the workers get to start serving / to report.
STARTUP_TIMEOUT = 15.0
REPORT_TIMEOUT = 10.0
REQUEST = b"GET / HTTP/1.0\r\n"
METRICS = ("jain", "jain_requests", "max_min", "conns_per_s", "req_per_s",
           "p50_us", "p99_us", "server_cpu_us_per_req")


# -- the worker -------------------------------------------------------------------


class _Counts:
    connections = 0
    requests = 0
    #: This worker's index as its replies end it: b" 3\n".
    tail = b"\n"


class Reply(asyncio.Protocol):
    """One line in, ~50 µs of hashing, one line out naming the worker (per
    request line)."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        _Counts.connections += 1

    def data_received(self, data: bytes) -> None:
        lines = data.count(b"\n")
        _Counts.requests += lines
        for _ in range(lines):
            digest = hashlib.sha256(_WORK).hexdigest()[:8].encode()
            self.transport.write(b"ok " + digest + _Counts.tail)

    def eof_received(self) -> bool:
        return False  # close our side too


def _snapshot() -> tuple[int, int, float]:
    t = os.times()
    return _Counts.connections, _Counts.requests, t.user + t.system


def _worker(index: int, loop_name: str, sock: socket.socket, report: int, pin: bool) -> None:
    """The child: serve on the shared socket; window marks by signal; report."""
    if pin:
        os.sched_setaffinity(0, {0})
    _Counts.tail = f" {index}\n".encode()
    loop = loops.factory(loop_name)()
    asyncio.set_event_loop(loop)
    marks: list[tuple[int, int, float]] = []
    done = loop.create_future()

    def finish() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_signal_handler(signal.SIGUSR1, lambda: marks.append(_snapshot()))
    loop.add_signal_handler(signal.SIGUSR2, lambda: marks.append(_snapshot()))
    loop.add_signal_handler(signal.SIGTERM, finish)

    async def serve() -> None:
        await loop.create_server(Reply, sock=sock)
        os.write(report, f"ready {index}\n".encode())
        await done

    loop.run_until_complete(serve())
    if len(marks) >= 2:
        (c0, r0, t0), (c1, r1, t1) = marks[0], marks[1]
        result = {"worker": index, "connections": c1 - c0, "requests": r1 - r0,
                  "cpu_s": t1 - t0}
    else:
        result = {"worker": index, "error": f"{len(marks)} window marks"}
    os.write(report, (json.dumps(result) + "\n").encode())


# -- the client (its own interpreter) -----------------------------------------------


class _ClientProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.waiter: asyncio.Future[bytes] | None = None
        self.buffer = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\n" in self.buffer and self.waiter is not None and not self.waiter.done():
            line, _, self.buffer = self.buffer.partition(b"\n")
            self.waiter.set_result(line)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionError("closed by the server"))


def _lifetimes(mode: str, concurrency: int) -> list[int | None]:
    """Requests per connection of each of the *concurrency* clients (None:
    one connection for the whole run)."""
    if mode == "close":
        return [1] * concurrency
    if mode == "keepalive":
        return [KEEPALIVE_REQUESTS] * concurrency
    if concurrency < 2:
        raise ValueError("mode mixed needs at least 2 clients: a long one and a short one")
    long = min(concurrency - 1, max(1, round(concurrency * MIXED_LONG_SHARE)))
    return [None] * long + [1] * (concurrency - long)


def client(port: int, concurrency: int, mode: str, warmup: float, duration: float) -> None:
    """The load generator (its own process, started by :func:`run_once`):
    prints ``start`` and ``end`` around the measured window, then its JSON."""
    client, new_loop = loops.client_loop()
    state = {"measuring": False, "stop": False}
    latencies: list[float] = []
    by_worker: dict[int, list[float]] = {}
    counts = {"requests": 0, "connections": 0, "errors": 0}

    async def one_client(per_connection: int | None) -> None:
        loop = asyncio.get_running_loop()
        while not state["stop"]:
            start = time.perf_counter()
            try:
                transport, proto = await loop.create_connection(
                    _ClientProtocol, "127.0.0.1", port)
            except OSError:
                counts["errors"] += 1
                await asyncio.sleep(0.001)
                continue
            if state["measuring"]:
                counts["connections"] += 1
            try:
                served = 0
                while per_connection is None or served < per_connection:
                    proto.waiter = loop.create_future()
                    transport.write(REQUEST)
                    line = await proto.waiter
                    end = time.perf_counter()
                    served += 1
                    if state["measuring"]:
                        counts["requests"] += 1
                        latencies.append((end - start) * 1e6)
                        by_worker.setdefault(int(line.rsplit(b" ", 1)[1]), []).append(
                            latencies[-1])
                    if state["stop"]:
                        break
                    start = end
            except (OSError, ConnectionError):
                counts["errors"] += 1
            finally:
                transport.close()

    async def main() -> dict[str, Any]:
        tasks = [asyncio.ensure_future(one_client(n)) for n in _lifetimes(mode, concurrency)]
        await asyncio.sleep(warmup)
        print("start", flush=True)
        state["measuring"] = True
        t0 = time.perf_counter()
        await asyncio.sleep(duration)
        state["measuring"] = False
        elapsed = time.perf_counter() - t0
        print("end", flush=True)
        state["stop"] = True
        await asyncio.wait(tasks, timeout=5)
        for task in tasks:
            task.cancel()
        p50, p99 = maths.percentiles(latencies, 50, 99) if latencies else (math.nan, math.nan)
        worker_p99 = {str(w): maths.percentiles(values, 99)[0]
                      for w, values in by_worker.items()}
        return {"client": client, "elapsed": elapsed, **counts, "p50_us": p50, "p99_us": p99,
                "p99_us_by_worker": worker_p99}

    loop = new_loop()
    try:
        result = loop.run_until_complete(main())
    finally:
        loop.close()
    print(json.dumps(result), flush=True)


# -- the parent ---------------------------------------------------------------------


def _can_pin() -> bool:
    if not hasattr(os, "sched_setaffinity"):
        return False
    try:
        return {0, 1} <= os.sched_getaffinity(0)
    except OSError:
        return False


class _Lines:
    """Lines from a file descriptor, read with a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending = b""

    def readline(self, deadline: float) -> str:
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer before the deadline")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    raise EOFError("the other side went away")
                self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line.decode()


def _fork() -> int:
    # Python 3.12+ warns when a process with threads forks (pytest-timeout's
    # thread, for one); the child runs no thread-dependent code before exec-free
    # serving, and makes its loop after the fork.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@contextlib.contextmanager
def _cleanup(pids: list[int], procs: list[subprocess.Popen[str]]) -> Iterator[None]:
    """Whatever happens, no worker and no client outlives the run."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()  # our own child, by its pid
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        _signal_all(pids, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def run_once(loop: str, *, workers: int, concurrency: int, mode: str,
             duration: float, warmup: float = 0.5,
             placement: str = "pinned") -> dict[str, object]:
    """One measurement of *loop* (a name from ``benchmarks.harness.loops.SPECS``),
    *mode* one of ``MODES``, *placement* one of ``PLACEMENTS``.

    Returns ``{"metrics": {...}, "per_worker": {"connections": [...],
    "requests": [...], "cpu_s": [...], "p99_us": [...]}, "client": str,
    "pinned": bool, "placement": str}``; every metric is a positive finite
    float when the run worked, except ``max_min``, which is ``inf`` when a
    worker served no connection in the window; a worker's ``p99_us`` is
    None when it answered no request in the window.  Raises LookupError for
    a loop that is missing here, RuntimeError when the run failed,
    TimeoutError past ``warmup + duration + HARD_TIMEOUT_SLACK``.
    """
    why = loops.missing(loop)
    if why:
        raise LookupError(why)
    if workers < 1 or concurrency < 1 or duration <= 0 or warmup < 0:
        raise ValueError("workers and concurrency must be >= 1, duration > 0, warmup >= 0")
    if mode not in MODES or placement not in PLACEMENTS:
        raise ValueError(f"mode {mode!r}, placement {placement!r}: modes "
                         f"{', '.join(MODES)}; placements {', '.join(PLACEMENTS)}")
    _lifetimes(mode, concurrency)  # mixed with one client fails here, not in the client
    deadline = time.monotonic() + warmup + duration + HARD_TIMEOUT_SLACK
    pin = placement == "pinned" and _can_pin()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # listening socket only
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    read_end, write_end = os.pipe()
    pids: list[int] = []
    procs: list[subprocess.Popen[str]] = []
    try:
        with _cleanup(pids, procs):
            for index in range(workers):
                pid = _fork()
                if pid == 0:  # the worker: never returns into the caller's code
                    code = 1
                    try:
                        os.close(read_end)
                        signal.signal(signal.SIGINT, signal.SIG_IGN)
                        _worker(index, loop, sock, write_end, pin)
                        code = 0
                    finally:
                        os._exit(code)
                pids.append(pid)
            os.close(write_end)
            write_end = -1
            reports = _Lines(read_end)
            start_by = min(deadline, time.monotonic() + STARTUP_TIMEOUT)
            for _ in range(workers):
                if not reports.readline(start_by).startswith("ready"):
                    raise RuntimeError("a worker did not start")
            load = processes.spawn(
                processes.python("-m", "benchmarks.workloads.client", "--kind", "fairness",
                                 "--port", str(port), "--concurrency", str(concurrency),
                                 "--mode", mode, "--warmup", str(warmup),
                                 "--duration", str(duration)),
                cpu=1 if pin else None, stdin=processes.DEVNULL, stderr=None)
            procs.append(load)
            assert load.stdout is not None
            out = _Lines(load.stdout.fileno())
            for mark, sig in (("start", signal.SIGUSR1), ("end", signal.SIGUSR2)):
                line = out.readline(deadline)
                if line != mark:
                    raise RuntimeError(f"client said {line!r}, expected {mark!r}")
                _signal_all(pids, sig)
            client_result = json.loads(out.readline(deadline))
            _signal_all(pids, signal.SIGTERM)
            report_by = min(deadline, time.monotonic() + REPORT_TIMEOUT)
            results = [json.loads(reports.readline(report_by)) for _ in pids]
    finally:
        sock.close()
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    bad = [r for r in results if "error" in r]
    if bad:
        raise RuntimeError(f"workers failed: {bad}")
    results.sort(key=lambda r: int(r["worker"]))
    connections = [int(r["connections"]) for r in results]
    requests = [int(r["requests"]) for r in results]
    cpu = sum(float(r["cpu_s"]) for r in results)
    elapsed = float(client_result["elapsed"])
    served = sum(requests)
    if not served or not client_result["requests"]:
        raise RuntimeError(f"nothing was served: {client_result}")
    metrics = {
        "jain": maths.jain(connections),
        "jain_requests": maths.jain(requests),
        "max_min": maths.max_min(connections),
        "conns_per_s": client_result["connections"] / elapsed,
        "req_per_s": client_result["requests"] / elapsed,
        "p50_us": float(client_result["p50_us"]),
        "p99_us": float(client_result["p99_us"]),
        "server_cpu_us_per_req": cpu / served * 1e6 if cpu > 0 else math.nan,
    }
    worker_p99 = client_result["p99_us_by_worker"]
    return {
        "metrics": metrics,
        "per_worker": {"connections": connections, "requests": requests,
                       "cpu_s": [float(r["cpu_s"]) for r in results],
                       "p99_us": [worker_p99.get(str(i)) for i in range(workers)]},
        "client": str(client_result["client"]),
        "pinned": pin,
        "placement": placement,
        "errors": int(client_result["errors"]),
    }
