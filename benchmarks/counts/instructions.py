"""Instructions per request, counted by callgrind: the loop's cost without the noise.

CPU time per request on a shared 2-CPU machine moves by 20-30 % between runs
(README, Benchmarks); the number of instructions a process executes for the
same work does not.  This measures one in-process workload per loop
(benchmarks.counts.driver: an echo over ``PAIRS`` socket pairs driven from
the same loop, or the aiohttp hello):

* the process runs under ``valgrind --tool=callgrind`` twice, with ``low``
  and ``high`` rounds (after the same warm-up), and the difference of the
  two instruction totals over ``(high - low) * PAIRS`` is the figure: start
  up, imports, the TLS handshakes and warm-up cancel out;
* the ``floor`` row is the same driver around a minimal echo loop in pure
  Python (``epoll.poll``, ``recv``, ``send``, nothing else; over TLS an
  ``SSLObject`` with memory BIOs), so *above floor* is what a loop adds to
  the least any Python echo must execute.

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

The ``uvicorn`` column (``--sizes ...,uvicorn``) is the same with uvicorn
(httptools) serving the ``uvicorn-json`` workloads' Starlette app: ``POST
/items/42`` with a 74 B JSON body, checked and answered in JSON.  No floor
row either: uvicorn's, Starlette's and the app's Python is the same on every
loop, so a difference between rows is the loop's share.

The ``life`` column (``--sizes ...,life``) is a connection's life, per
connection: connect, a 1 KiB echo, close (benchmarks.counts.driver), with
the accept, the transport's making and its end in it.  Like ``http`` it has
no floor row: read it against stock.

The ``tlslife`` column (``--sizes ...,tlslife``) is the same over TLS 1.3,
a full handshake per connection (``tls-churn`` in one process): connect,
handshake, a 1 KiB echo, close_notify both ways, close, with the clients'
side of it in the count (the same Python and OpenSSL work on every loop).
Its handshakes cost about 15 million instructions per connection, so it
runs 10 and 60 rounds after 10 of warm-up (500 connections apart), not
100 and 600 after 100.  No floor row: read it against stock and uvloop.

The ``udp`` column (``--sizes ...,udp``) is a datagram echo counted per
datagram: bursts of 4 datagrams of 1 KiB from each of ``PAIRS`` clients to
one server socket, each sent back with ``sendto`` (``udp-burst-1k``'s
shape), above a floor that reads with ``recvfrom`` until the socket runs
dry and answers with ``sendto``.

The ``tls`` column (``--sizes ...,tls``) is the 1 KiB echo over TLS 1.3
(an RSA-2048 certificate, benchmarks.harness.tls, made once by the parent):
what each loop's TLS stack (stock's sslproto, uvloop's, ours) executes per
request above the memory-BIO floor, OpenSSL's own work included on every row.

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
        [--sizes 1024,102400,http,uvicorn,tls,udp,life,tlslife] [--baseline DIR]

valgrind is a Debian package (``apt-get install valgrind``); without it the
command says so and exits, as it does on any Python but CPython (see run()).
A child run (``--child``) is what valgrind runs.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.counts import driver
from benchmarks.counts.driver import (
    FLOOR,
    HTTP,
    LIFE,
    NO_FLOOR,
    PAIRS,
    TLS,
    TLSLIFE,
    UDP,
    UDP_BURST,
    UVICORN,
    WARMUP_ROUNDS,
)
from benchmarks.harness import checkout, loops, processes, results, tables, tls

#: The two run lengths whose difference is measured: 5,000 requests apart
#: with 10 pairs; about 40 s of callgrind per run at 1 KiB on the 2-CPU
#: machine of the README.
LOW_ROUNDS = 100
HIGH_ROUNDS = 600
DEFAULT_LOOPS = ("asyncio", "uvloop", "relaxed-eager", "relaxed-deferred")
DEFAULT_SIZES = (1024, 100 * 1024)
#: The run lengths of the workloads whose rounds cost the most (see the docstring).
SIZE_ROUNDS: dict[int | str, tuple[int, int]] = {TLSLIFE: (10, 60)}
#: What a round is made of where it is not one request per pair.
REQUESTS_PER_ROUND: dict[int | str, int] = {UDP: PAIRS * UDP_BURST}
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


# -- the parent: valgrind runs and the table -----------------------------------------


def count(name: str, size: int | str, rounds: int) -> int:
    """Instructions callgrind collected for one child run of loop *name*."""
    first = checkout.import_dir(name) if name != FLOOR else None
    # The checkout's shim first, then this tree; the same dict layouts in every run.
    env = processes.environment(first, PYTHONHASHSEED="0")
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               *processes.python("-m", "benchmarks", "instructions", "--child",
                                 loops.preset(name) if name != FLOOR else name, str(size),
                                 str(rounds))]
    out, err = processes.call(command, timeout=1800, import_dir=first, env=env)
    if name != FLOOR:
        checkout.check_package(name, json.loads(out)["relaxed"], processes.ROOT)
    return parse_collected(err, command)


def parse_collected(stderr: str, command: Sequence[str] = ()) -> int:
    found = _COLLECTED.findall(stderr)
    if not found:
        raise RuntimeError(f"no callgrind total in the output of {' '.join(command)}:\n"
                           f"{stderr[-2000:]}")
    return int(found[-1])


def per_request(low: int, high: int, low_rounds: int = LOW_ROUNDS,
                high_rounds: int = HIGH_ROUNDS, per_round: int = PAIRS) -> float:
    return (high - low) / ((high_rounds - low_rounds) * per_round)


def rounds_of(size: int | str) -> tuple[int, int]:
    """The (low, high) rounds of workload *size*."""
    return SIZE_ROUNDS.get(size, (LOW_ROUNDS, HIGH_ROUNDS))


def measure(loop_names: Sequence[str], sizes: Sequence[int | str], jobs: int,
            progress: Callable[[str], None]) -> dict[str, dict[str, float]]:
    """{loop: {size: instructions per request}}, the floor included (not for
    http, uvicorn and the lives, which have none)."""
    tasks = [(name, size, rounds) for name in (FLOOR, *loop_names) for size in sizes
             for rounds in rounds_of(size)
             if not (name == FLOOR and size in NO_FLOOR)]

    def one(task: tuple[str, int | str, int]) -> tuple[tuple[str, int | str, int], int]:
        name, size, rounds = task
        started = time.monotonic()
        total = count(name, size, rounds)
        progress(f"  {name} {size} B x {rounds} rounds: {total:,} instructions "
                 f"({time.monotonic() - started:.0f} s)")
        return task, total

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        totals = dict(pool.map(one, tasks))
    return {name: {str(size): per_request(totals[(name, size, rounds_of(size)[0])],
                                          totals[(name, size, rounds_of(size)[1])],
                                          *rounds_of(size),
                                          REQUESTS_PER_ROUND.get(size, PAIRS))
                   for size in sizes if (name, size, rounds_of(size)[0]) in totals}
            for name in (FLOOR, *loop_names)}


def table(result: dict[str, dict[str, float]],
          sizes: Sequence[int | str]) -> tuple[list[str], list[list[str]]]:
    """The header and rows: instructions per request, above the floor, ratio
    to stock (for http and life, which have no floor: instructions and their
    ratio to stock)."""
    head = ["loop"]
    for size in sizes:
        if size == HTTP:
            head += ["aiohttp hello: instr/req", "vs asyncio"]
            continue
        if size == UVICORN:
            head += ["uvicorn JSON: instr/req", "vs asyncio"]
            continue
        if size == LIFE:
            head += ["a connection's life: instr/conn", "vs asyncio"]
            continue
        if size == TLSLIFE:
            head += ["a TLS connection's life: instr/conn", "vs asyncio"]
            continue
        unit = "req"
        if size == UDP:
            label, unit = f"UDP {driver.UDP_SIZE // 1024} KiB", "dgram"
        elif size in driver.OVER_TLS:
            label = f"{'TLS' if size == TLS else 'start_tls'} {driver.TLS_SIZE // 1024} KiB"
        elif size == driver.STREAMS:
            label = f"streams {driver.STREAMS_SIZE // 1024} KiB"
        else:
            label = f"{size // 1024} KiB" if int(size) % 1024 == 0 else f"{size} B"
        head += [f"{label}: instr/{unit}", "above floor", "vs asyncio (above floor)"]
    floor = result[FLOOR]
    stock = result.get("asyncio")
    body = []
    for name, by_size in result.items():
        cells = [name]
        for size in sizes:
            key = str(size)
            if size in NO_FLOOR:
                if name == FLOOR:
                    cells += ["—", "—"]
                else:
                    cells.append(f"{by_size[key]:,.0f}")
                    cells.append(tables.ratio(by_size[key], stock and stock[key]))
                continue
            above = by_size[key] - floor[key]
            cells.append(f"{by_size[key]:,.0f}")
            cells.append("—" if name == FLOOR else f"{above:,.0f}")
            if stock is None or name == FLOOR:
                cells.append("—")
            else:
                cells.append(tables.ratio(above, stock[key] - floor[key]))
        body.append(cells)
    return head, body


def child_main(loop_name: str, size: str, rounds: str) -> None:
    """What valgrind runs (``--child LOOP SIZE ROUNDS``): one echo or http run."""
    driver.run(loop_name, size if size in driver.NAMED else int(size), int(rounds))


def run(loop_names: Sequence[str], sizes: Sequence[int | str], *, baseline: Path | None,
        jobs: int, folder: Path, command: Sequence[str]) -> int:
    """Count *loop_names* (the floor too) at *sizes*; write the JSON and the
    Markdown table to *folder* and print the table.  2 without valgrind, or
    on a Python that is not CPython."""
    names = list(loop_names or DEFAULT_LOOPS)
    refused = [n for n in names if n not in loops.EVENT_LOOPS]
    if refused:
        # Checked before any count: a name no child can run would end the
        # run after every other count was made.
        print(f"--loops {','.join(refused)}: not an event loop (known: "
              f"{', '.join(loops.EVENT_LOOPS)}); the floor rows come with every count",
              file=sys.stderr)
        return 2
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
    for size, needs in ((HTTP, ("aiohttp",)), (UVICORN, driver.UVICORN_NEEDS)):
        absent = [name for name in needs if importlib.util.find_spec(name) is None]
        if size in sizes and absent:
            print(f"note: the {size} workload skipped: {', '.join(absent)} not installed",
                  file=sys.stderr)
            sizes.remove(size)
    over_tls = [size for size in sizes if size in driver.NEEDS_CERTIFICATES]
    if over_tls:
        why = tls.missing()
        if why:
            for size in over_tls:
                print(f"note: the {size} workload skipped: {why}", file=sys.stderr)
                sizes.remove(size)
        else:
            tls.ensure()  # the certificates, once, before valgrind starts a child
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
    started = results.stamp(results.now())
    result = measure(runnable, sizes, jobs, lambda line: print(line, file=sys.stderr, flush=True))
    header, body = table(result, sizes)
    line = "python -m benchmarks " + " ".join(command[1:])
    doc = {"started": started, "command": line, "python": sys.version,
           "pairs": PAIRS, "rounds": [LOW_ROUNDS, HIGH_ROUNDS], "warmup_rounds": WARMUP_ROUNDS,
           "size_rounds": {str(size): [*rounds_of(size), driver.warmup_rounds(size)]
                           for size in sizes if size in SIZE_ROUNDS},
           "versions": {n: loops.version(n) for n in runnable},
           "instructions_per_request": result}
    path = results.save(folder, f"{started}-instructions", doc, tables.markdown(
        f"Instructions per request ({started})",
        f"`{line}`, {PAIRS} socket pairs (echo, TLS echo) or keep-alive connections (http), "
        f"callgrind; Python {sys.version.split()[0]}", [("", header, body)]))
    print(tables.text_table(header, body))
    print(f"\nresults: {path}  report: {path.with_suffix('.md')}")
    return 0
