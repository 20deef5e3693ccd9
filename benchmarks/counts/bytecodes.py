"""Bytecodes per request, per function: where a loop's Python cost goes.

``python -m benchmarks instructions`` gives one number per loop (callgrind
instructions per request); this splits the Python part of it by function.
It runs the same in-process workload (:mod:`benchmarks.counts.driver`: the
1 KiB echo over socket pairs, the same over TLS, or the aiohttp hello) and
counts, with
``sys.monitoring``'s INSTRUCTION events (CPython 3.12+), the bytecodes each
function executes during the measured rounds, after the same warm-up.  The
counts are exact and repeat from run to run: they move only when the code
does.  A bytecode is not a fixed cost (a call or an attribute store costs
more than a jump; above the floor's, the 1 KiB echo's cost 49-86 machine
instructions each on 3.12, by loop: docs/benchmarks.md), and C code (the
socket calls, ``epoll.poll``) executes none: read the table as *which
Python code runs per request*, and the callgrind figure as what it all
costs.

Functions are grouped by where their code lives (benchmarks.counts.sites):
``asyncio_relaxed``, ``asyncio``, ``floor`` (the minimal epoll echo of the
``floor`` row, plain or TLS; no floor for http), the driver (the same code
on every loop), and the rest.  Over TLS (``--size tls``) OpenSSL's work is
C and counts no bytecode: what shows is the Python around it (stock's
sslproto, which our loop uses today).

Run::

    python -m benchmarks bytecodes [--loops relaxed-eager,relaxed-deferred]
        [--size 1024|tls|http|life|tlslife] [--rounds 200] [--top 25]
"""

from __future__ import annotations

import collections
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import CodeType
from typing import Any

from benchmarks.counts import driver
from benchmarks.counts.sites import GROUPS, function_name, group
from benchmarks.harness import loops, processes, results, tables, tls

DEFAULT_LOOPS = ("floor", "asyncio", "relaxed-eager", "relaxed-deferred")
ROUNDS = 200
TOP = 25


def count(loop_name: str, size: int | str, rounds: int) -> dict[str, Any]:
    """Run the workload on *loop_name*, counting the bytecodes of *rounds*
    rounds: {"requests": n, "functions": {name: [group, bytecodes]}}."""
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None:
        raise RuntimeError("bytecode counts need sys.monitoring (CPython 3.12+)")
    tool = monitoring.PROFILER_ID
    monitoring.use_tool_id(tool, "benchmarks.bytecodes")
    counts: collections.Counter[CodeType] = collections.Counter()

    def instruction(code: CodeType, offset: int) -> None:
        counts[code] += 1

    def on_round(left: int) -> None:
        # Count from the first measured round's send to the end of the last.
        if left == rounds - 1:
            monitoring.set_events(tool, monitoring.events.INSTRUCTION)
        elif left < 0:
            monitoring.set_events(tool, 0)

    monitoring.register_callback(tool, monitoring.events.INSTRUCTION, instruction)
    try:
        driver.run(loop_name, size, rounds, on_round)
    finally:
        monitoring.set_events(tool, 0)
        monitoring.register_callback(tool, monitoring.events.INSTRUCTION, None)
        monitoring.free_tool_id(tool)
    functions: dict[str, list[Any]] = {}
    for code, n in counts.items():
        name = function_name(code)
        entry = functions.setdefault(name, [group(code.co_filename, name), 0])
        entry[1] += n
    return {"requests": rounds * driver.PAIRS, "functions": functions}


def per_request(counted: dict[str, Any]) -> dict[str, tuple[str, float]]:
    requests = counted["requests"]
    return {name: (where, n / requests) for name, (where, n) in counted["functions"].items()}


def totals(rows: dict[str, tuple[str, float]]) -> dict[str, float]:
    """Bytecodes per request by group, and "loop": ours, stock's and the
    floor's together (everything but the driver and the rest)."""
    out = dict.fromkeys(GROUPS, 0.0)
    for where, n in rows.values():
        out[where] += n
    out["loop"] = out["asyncio_relaxed"] + out["asyncio"] + out["floor"]
    return out


def count_tables(result: dict[str, dict[str, tuple[str, float]]],
           top: int) -> tuple[tuple[list[str], list[list[str]]], tuple[list[str], list[list[str]]]]:
    """(totals per loop, the *top* functions of any loop with each loop's count)."""
    names = list(result)
    sums = {name: totals(rows) for name, rows in result.items()}
    head = ["loop", "the loop's", *GROUPS]
    body = [[name, f"{sums[name]['loop']:.1f}", *(f"{sums[name][g]:.1f}" for g in GROUPS)]
            for name in names]
    where = {fn: g for rows in result.values() for fn, (g, _) in rows.items()}
    chosen = tables.top_keys(result, top, skip="driver")
    fn_head = ["function", "where", *names]
    fn_body = [[fn, where[fn], *(f"{result[name][fn][1]:.1f}" if fn in result[name] else "—"
                                 for name in names)] for fn in chosen]
    return (head, body), (fn_head, fn_body)


def run(loop_names: Sequence[str], size: int | str, *, rounds: int, top: int,
        folder: Path, command: Sequence[str]) -> int:
    """Count each loop (one at a time, in this process's children), print the
    tables, and write the JSON and Markdown to *folder*.  2 before 3.12."""
    if not hasattr(sys, "monitoring"):
        print("bytecode counts need sys.monitoring (CPython 3.12+); nothing counted",
              file=sys.stderr)
        return 2
    names = []
    for name in loop_names or DEFAULT_LOOPS:
        why = loops.missing(name)
        if why:
            print(f"note: {name} skipped: {why}", file=sys.stderr)
        elif name == driver.FLOOR and size in driver.NO_FLOOR:
            print(f"note: {name} skipped: the {size} workload has no floor", file=sys.stderr)
        elif loops.SPECS[name].kind not in ("asyncio", "relaxed", "floor"):
            print(f"note: {name} skipped: its loop is compiled code, which executes "
                  "no bytecode to count", file=sys.stderr)
        else:
            names.append(name)
    if size in driver.NEEDS_CERTIFICATES:
        tls.ensure()  # the certificates, once, for every child
    started = results.stamp(results.now())
    result: dict[str, dict[str, tuple[str, float]]] = {}
    for name in names:
        # A fresh process per loop: one loop's warmed caches and imports
        # cannot change another's counts.
        result[name] = per_request(processes.child_json(
            ["bytecodes", "--child", name, str(size), str(rounds)], 600))
        print(f"  {name}: {totals(result[name])['loop']:.1f} bytecodes per request "
              "in the loop", file=sys.stderr, flush=True)
    (head, body), (fn_head, fn_body) = count_tables(result, top)
    line = "python -m benchmarks " + " ".join(command[1:])
    label = {driver.HTTP: "aiohttp hello", driver.UVICORN: "uvicorn + Starlette JSON",
             driver.TLS: "1 KiB echo over TLS 1.3",
             driver.STARTTLS: "1 KiB echo over TLS 1.3 reached by start_tls",
             driver.STREAMS: "1 KiB echo through asyncio's streams",
             driver.LIFE: "a connection's life (connect, 1 KiB echo, close)",
             driver.TLSLIFE: "a TLS connection's life (connect, TLS 1.3 handshake, "
                             "1 KiB echo, close_notify, close)"}.get(
        str(size), f"{size} B echo")
    doc = {"started": started, "command": line, "python": sys.version, "size": size,
           "rounds": rounds, "pairs": driver.PAIRS,
           "versions": {n: loops.version(n) for n in names},
           "bytecodes_per_request": {n: {fn: {"where": g, "bytecodes": v}
                                         for fn, (g, v) in rows.items()}
                                     for n, rows in result.items()}}
    path = results.save(folder, f"{started}-bytecodes", doc, tables.markdown(
        f"Bytecodes per request ({started})",
        f"`{line}`: {label}, {driver.PAIRS} pairs x {rounds} rounds after "
        f"{driver.warmup_rounds(size)} warm-up rounds, sys.monitoring; "
        f"Python {sys.version.split()[0]}",
        [("", head, body), (f"The {len(fn_body)} functions with the most, on any loop "
                            "(the driver's left out):", fn_head, fn_body)]))
    print(tables.text_table(head, body))
    print()
    print(tables.text_table(fn_head, fn_body))
    print(f"\nresults: {path}  report: {path.with_suffix('.md')}")
    return 0


def child_main(loop_name: str, size: str, rounds: str) -> None:
    """``--child LOOP SIZE ROUNDS``: count one run, print its JSON last."""
    counted = count(loop_name, size if size in driver.NAMED else int(size),
                    int(rounds))
    sys.stdout.flush()
    print(json.dumps(counted))
