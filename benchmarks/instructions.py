"""Instructions per request, counted by callgrind: the loop's cost without the noise.

CPU time per request on a shared 2-CPU machine moves by 20-30 % between runs
(README, Benchmarks); the number of instructions a process executes for the
same work does not.  This measures one in-process echo per loop:

* ``PAIRS`` socket pairs; one end of each is served by the loop under test
  (``connect_accepted_socket`` + a plain echo Protocol), the other end is the
  client, driven by a callback on the same loop: it sends one message on
  every pair, and once every echo is back in full, the next round;
* the process runs under ``valgrind --tool=callgrind`` twice, with ``low``
  and ``high`` rounds (after the same warm-up), and the difference of the
  two instruction totals over ``(high - low) * PAIRS`` is the figure: start
  up, imports and warm-up cancel out;
* the ``floor`` row is the same driver around a minimal echo loop in pure
  Python (``epoll.poll``, ``recv``, ``send``, nothing else), so *above floor*
  is what a loop adds to the least any Python echo must execute.

User-space instructions only (callgrind does not see the kernel, whose share
is the same for every loop: the same system calls, see the strace counts of
``python -m benchmarks run``).  Instruction counts are not time (a cache miss
costs more than an add), but they move only when the code does, so a change
of a few per cent is visible in one run.  Counts include the driver, the
same Python code on every loop.

The ``http`` column (``--sizes ...,http``) is an aiohttp app on the loop
under test, ``GET /`` answering 0 bytes, over ``PAIRS`` keep-alive
connections driven the same way (one request per connection per round, the
next round once the handler has run for all of them and every response is
back).  It has no floor row (there is no minimal aiohttp): read it against
stock and uvloop, where aiohttp's own Python code is the same for every
loop and the difference is the loop's share.

Read the 100 KiB column as a count of user-space copies, not as a cost to
compare between loops: uvloop and asyncio_relaxed copy each message out of
a reusable, aligned buffer (about one counted instruction per byte under
valgrind), while stock asyncio has the kernel write into a fresh 256 KiB
``bytes`` (mmap, and a copy to an unaligned address: kernel work that
callgrind does not see and that costs stock 2-4x the CPU time of the others
in the suite's echo-protocol-100k).  The 1 KiB column is where the loop's
own Python code shows.

Run::

    python -m benchmarks instructions [--loops asyncio,uvloop,relaxed-eager]
        [--sizes 1024,102400,http] [--baseline DIR]

valgrind is a Debian package (``apt-get install valgrind``); without it the
command says so and exits, as it does on any Python but CPython (see run()).
A child run (``--child``) is what valgrind runs.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import checkout, loops, report, runner

ROOT = Path(__file__).resolve().parent.parent
PAIRS = 10
WARMUP_ROUNDS = 100
#: The two run lengths whose difference is measured: 5,000 requests apart
#: with 10 pairs; about 40 s of callgrind per run at 1 KiB on the 2-CPU
#: machine of the README.
LOW_ROUNDS = 100
HIGH_ROUNDS = 600
DEFAULT_LOOPS = ("asyncio", "uvloop", "relaxed-eager", "relaxed-deferred")
DEFAULT_SIZES = (1024, 100 * 1024)
#: The --sizes token of the aiohttp workload.
HTTP = "http"
HTTP_REQUEST = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"
FLOOR = "floor"
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


# -- the child: one echo run, the thing valgrind counts -------------------------------


def _no_hook(left: int) -> None:
    """The on_round of a run nobody watches."""


class Echo(asyncio.Protocol):
    """Writes back what it gets; the round's last byte schedules the driver."""

    def __init__(self, round_done: Callable[[int], None]) -> None:
        self.round_done = round_done

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)
        self.round_done(len(data))


def _pairs() -> tuple[list[socket.socket], list[socket.socket]]:
    served, clients = [], []
    for _ in range(PAIRS):
        a, b = socket.socketpair()
        a.setblocking(False)
        b.setblocking(False)
        served.append(a)
        clients.append(b)
    return served, clients


class Driver:
    """The client ends: one message on every pair per round; the next round
    once the server has echoed the whole round (``echoed``) and it is back.

    The same work per round on every loop: the driver reads only after the
    last echo was written, so it rarely finds a socket empty (a short write
    by the server leaves the rest for later; then it tries again)."""

    def __init__(self, clients: list[socket.socket], size: int, rounds: int,
                 on_round: Callable[[int], None] | None = None) -> None:
        self.clients = clients
        self.on_round = on_round or _no_hook
        self.message = os.urandom(size)
        self.size = size
        self.rounds = rounds
        self.missing = [0] * len(clients)
        self.unechoed = 0  # bytes of this round the server has not written back

    def send_round(self) -> None:
        self.rounds -= 1
        self.on_round(self.rounds)
        self.unechoed = self.size * len(self.clients)
        for i, client in enumerate(self.clients):
            client.sendall(self.message)  # the peer's buffer holds a whole message
            self.missing[i] = self.size

    def echoed(self, nbytes: int) -> bool:
        """The server wrote *nbytes* back; True when that completes the round."""
        self.unechoed -= nbytes
        return self.unechoed == 0

    def receive(self) -> bool:
        """Read what has come back; True once the whole round has."""
        for i, client in enumerate(self.clients):
            while self.missing[i]:
                try:
                    self.missing[i] -= len(client.recv(self.missing[i]))
                except BlockingIOError:
                    return False
        return True


def child(loop_name: str, size: int, rounds: int,
          on_round: Callable[[int], None] | None = None) -> None:
    """One echo run of *rounds* after the warm-up; *on_round(left)* is
    called as each round is sent, with the rounds left after it, and with
    -1 once the last is back."""
    served, clients = _pairs()
    for client in clients:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * size)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * size)
    driver = Driver(clients, size, WARMUP_ROUNDS + rounds, on_round)
    if loop_name == FLOOR:
        _floor(served, driver)
        return
    # Which tree asyncio_relaxed comes from, for the parent's check.
    print(json.dumps({"relaxed": checkout.relaxed_package()}), flush=True)
    loop = loops.factory(loop_name)()
    finished = loop.create_future()

    def next_round() -> None:
        # A loop callback, from the iteration after the round's last echo.
        if not driver.receive():
            loop.call_soon(next_round)  # a short write: the rest comes later
        elif driver.rounds:
            driver.send_round()
        else:
            driver.on_round(-1)
            finished.set_result(None)

    def round_done(nbytes: int) -> None:
        if driver.echoed(nbytes):
            loop.call_soon(next_round)

    for sock in served:
        loop.run_until_complete(loop.connect_accepted_socket(lambda: Echo(round_done), sock))
    driver.send_round()
    loop.run_until_complete(finished)
    loop.close()


def http_child(loop_name: str, rounds: int,
               on_round: Callable[[int], None] | None = None) -> None:
    """The aiohttp run: ``PAIRS`` keep-alive clients, one GET each per round
    (*on_round* as for :func:`child`)."""
    from aiohttp import web

    on_round = on_round or _no_hook
    print(json.dumps({"relaxed": checkout.relaxed_package()}), flush=True)
    loop = loops.factory(loop_name)()
    finished = loop.create_future()
    clients: list[socket.socket] = []
    missing = [0] * PAIRS  # responses not yet read, per client
    state = {"rounds": WARMUP_ROUNDS + rounds, "served": 0}

    def send_round() -> None:
        state["rounds"] -= 1
        on_round(state["rounds"])
        for i, client in enumerate(clients):
            client.sendall(HTTP_REQUEST)
            missing[i] += 1

    def receive() -> bool:
        # A 0-byte response is its head: one blank line ends each.
        for i, client in enumerate(clients):
            while missing[i]:
                try:
                    data = client.recv(65536)
                except BlockingIOError:
                    return False
                missing[i] -= data.count(b"\r\n\r\n")
        return True

    def next_round() -> None:
        if not receive():
            loop.call_soon(next_round)
        elif state["rounds"]:
            send_round()
        else:
            on_round(-1)
            finished.set_result(None)

    async def hello(request: web.Request) -> web.Response:
        state["served"] += 1
        if state["served"] % PAIRS == 0:
            loop.call_soon(next_round)
        return web.Response(body=b"")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/", hello)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        for _ in range(PAIRS):
            client = socket.create_connection(("127.0.0.1", port))
            client.setblocking(False)
            clients.append(client)
        send_round()
        await finished
        for client in clients:
            client.close()
        await runner.cleanup()

    loop.run_until_complete(main())
    loop.close()


def _floor(served: list[socket.socket], driver: Driver) -> None:
    """The least a Python echo executes: poll, recv, send; same driver."""
    epoll = select.epoll()
    by_fd = {sock.fileno(): sock for sock in served}
    for fd in by_fd:
        epoll.register(fd, select.EPOLLIN)
    driver.send_round()
    while True:
        done = False
        for fd, _ in epoll.poll(-1, PAIRS):
            sock = by_fd[fd]
            data = sock.recv(65536)
            sock.send(data)  # a short send never happens at these sizes
            done = driver.echoed(len(data)) or done
        if done:
            while not driver.receive():
                pass
            if not driver.rounds:
                driver.on_round(-1)
                return
            driver.send_round()


# -- the parent: valgrind runs and the table -----------------------------------------


def count(name: str, size: int | str, rounds: int) -> int:
    """Instructions callgrind collected for one child run of loop *name*."""
    first = checkout.import_dir(name) if name != FLOOR else None
    env = runner._env(first)  # the checkout's shim first, then this tree
    env["PYTHONHASHSEED"] = "0"  # the same dict layouts in every run
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               sys.executable, "-m", "benchmarks", "instructions", "--child",
               loops.preset(name) if name != FLOOR else name, str(size), str(rounds)]
    # In the baseline's shim folder: see checkout.import_dir.
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800,
                          cwd=first or ROOT)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr[-2000:]}")
    if name != FLOOR:
        checkout.check_package(name, json.loads(proc.stdout)["relaxed"], ROOT)
    return parse_collected(proc.stderr, command)


def parse_collected(stderr: str, command: Sequence[str] = ()) -> int:
    found = _COLLECTED.findall(stderr)
    if not found:
        raise RuntimeError(f"no callgrind total in the output of {' '.join(command)}:\n"
                           f"{stderr[-2000:]}")
    return int(found[-1])


def per_request(low: int, high: int, low_rounds: int = LOW_ROUNDS,
                high_rounds: int = HIGH_ROUNDS) -> float:
    return (high - low) / ((high_rounds - low_rounds) * PAIRS)


def measure(loop_names: Sequence[str], sizes: Sequence[int | str], jobs: int,
            progress: Callable[[str], None]) -> dict[str, dict[str, float]]:
    """{loop: {size: instructions per request}}, the floor included (not for http)."""
    tasks = [(name, size, rounds) for name in (FLOOR, *loop_names) for size in sizes
             for rounds in (LOW_ROUNDS, HIGH_ROUNDS) if not (name == FLOOR and size == HTTP)]

    def one(task: tuple[str, int | str, int]) -> tuple[tuple[str, int | str, int], int]:
        name, size, rounds = task
        started = time.monotonic()
        total = count(name, size, rounds)
        progress(f"  {name} {size} B x {rounds} rounds: {total:,} instructions "
                 f"({time.monotonic() - started:.0f} s)")
        return task, total

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        totals = dict(pool.map(one, tasks))
    return {name: {str(size): per_request(totals[(name, size, LOW_ROUNDS)],
                                          totals[(name, size, HIGH_ROUNDS)])
                   for size in sizes if (name, size, LOW_ROUNDS) in totals}
            for name in (FLOOR, *loop_names)}


def table(result: dict[str, dict[str, float]],
          sizes: Sequence[int | str]) -> tuple[list[str], list[list[str]]]:
    """The header and rows: instructions per request, above the floor, ratio
    to stock (for http, which has no floor: instructions and their ratio to
    stock)."""
    head = ["loop"]
    for size in sizes:
        if isinstance(size, str):  # HTTP
            head += ["aiohttp hello: instr/req", "vs asyncio"]
            continue
        label = f"{size // 1024} KiB" if size % 1024 == 0 else f"{size} B"
        head += [f"{label}: instr/req", "above floor", "vs asyncio (above floor)"]
    floor = result[FLOOR]
    stock = result.get("asyncio")
    body = []
    for name, by_size in result.items():
        cells = [name]
        for size in sizes:
            key = str(size)
            if size == HTTP:
                if name == FLOOR:
                    cells += ["—", "—"]
                else:
                    cells.append(f"{by_size[key]:,.0f}")
                    cells.append(report.ratio(by_size[key], stock and stock[key]))
                continue
            above = by_size[key] - floor[key]
            cells.append(f"{by_size[key]:,.0f}")
            cells.append("—" if name == FLOOR else f"{above:,.0f}")
            if stock is None or name == FLOOR:
                cells.append("—")
            else:
                cells.append(report.ratio(above, stock[key] - floor[key]))
        body.append(cells)
    return head, body


def child_main(loop_name: str, size: str, rounds: str) -> None:
    """What valgrind runs (``--child LOOP SIZE ROUNDS``): one echo or http run."""
    if size == HTTP:
        http_child(loop_name, int(rounds))
    else:
        child(loop_name, int(size), int(rounds))


def run(loop_names: Sequence[str], sizes: Sequence[int | str], *, baseline: Path | None,
        jobs: int, results: Path, command: Sequence[str]) -> int:
    """Count *loop_names* (the floor too) at *sizes*; write the JSON and the
    Markdown table to *results* and print the table.  2 without valgrind, or
    on a Python that is not CPython."""
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind); nothing counted",
              file=sys.stderr)
        return 2
    if sys.implementation.name != "cpython":
        # What the figures mean (instructions of the interpreter per request,
        # against the floor's) holds for CPython's interpreter only: PyPy runs
        # machine code its JIT wrote during the run, so a count would be
        # mostly the JIT's tracing and compiling, not the loop's work.
        print(f"instruction counts are of CPython's interpreter, not "
              f"{sys.implementation.name}'s JIT; nothing counted", file=sys.stderr)
        return 2
    sizes = list(sizes)
    if HTTP in sizes and importlib.util.find_spec("aiohttp") is None:
        print("note: the http workload skipped: aiohttp is not installed", file=sys.stderr)
        sizes.remove(HTTP)
    names = list(loop_names or DEFAULT_LOOPS)
    if baseline is not None:
        names += [checkout.register(n, baseline.resolve()) for n in list(names)
                  if loops.SPECS[n].kind == "relaxed"]
    runnable = []
    for name in names:
        why = loops.missing(name)
        if why:
            print(f"note: {name} skipped: {why}", file=sys.stderr)
        else:
            runnable.append(name)
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    result = measure(runnable, sizes, jobs, lambda line: print(line, file=sys.stderr, flush=True))
    header, body = table(result, sizes)
    line = "python -m benchmarks " + " ".join(command[1:])
    doc = {"started": started, "command": line, "python": sys.version,
           "pairs": PAIRS, "rounds": [LOW_ROUNDS, HIGH_ROUNDS], "warmup_rounds": WARMUP_ROUNDS,
           "versions": {n: loops.version(n) for n in runnable},
           "instructions_per_request": result}
    path, md = report.save_counts(
        results, f"{started}-instructions", doc, f"Instructions per request ({started})",
        f"`{line}`, {PAIRS} socket pairs (echo) or keep-alive connections (http), "
        f"callgrind; Python {sys.version.split()[0]}", [("", header, body)])
    print(report.text_table(header, body))
    print(f"\nresults: {path}  report: {md}")
    return 0


if __name__ == "__main__":  # the same as python -m benchmarks instructions
    from benchmarks.cli import main

    sys.exit(main(["instructions", *sys.argv[1:]]))
