"""Memory per idle connection, by allocation site: what a connection keeps.

The ``idle-*`` workloads measure the server's RSS growth per idle
connection, which includes the allocator's slack and moves between runs;
this traces the Python allocations instead (``tracemalloc``: object sizes,
which move by a few bytes between runs where a table's growth lands) and
names where each byte was allocated.  One process
per loop serves ``--connections`` idle connections, opened by a client in
another process (so that its sockets are not traced), after a warm-up batch
of the same kind; the figure is the growth between two snapshots, per
connection, by file and line.  The figure includes the driver's protocol,
one slotted object of 40-48 bytes per connection on every loop, allocated
where the loop calls the protocol factory.  A compiled loop's own
allocations (through Python's allocator; tracemalloc sees no other) are
charged to the line of this module that runs the loop: the ``C`` column.

``--tls``: the same over TLS 1.3 (benchmarks.harness.tls; the client
finishes each handshake before the next connection), what an idle TLS
connection keeps: the SSL object, its BIOs and buffers (OpenSSL's own
allocations are C, outside Python's allocator, and not traced: the
``idle-*``-style RSS figure would add them).

tracemalloc is CPython's (PyPy has no ``_tracemalloc``): elsewhere the
command says so and counts nothing.  Run::

    python -m benchmarks memory [--loops asyncio,relaxed-eager] [--connections 400] [--tls]
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.counts.sites import group
from benchmarks.harness import loops, processes, results, tables, tls

if TYPE_CHECKING:
    import tracemalloc

DEFAULT_LOOPS = ("asyncio", "uvloop", "relaxed-eager")
CONNECTIONS = 400
WARMUP = 50
TOP = 14

#: The client: for each line of its stdin, connects that many sockets to
#: port argv[1] (over TLS when argv[2] is "tls", each handshake done before
#: the next); holds them until its stdin closes.
_CLIENT = """
import socket, sys
port = int(sys.argv[1])
if sys.argv[2] == "tls":
    from benchmarks.harness import tls
    context = tls.client_context()
    def connect():
        return context.wrap_socket(socket.create_connection(("127.0.0.1", port)),
                                   server_hostname=tls.HOSTNAME)
else:
    def connect():
        return socket.create_connection(("127.0.0.1", port))
held = []
for line in sys.stdin:
    held += [connect() for _ in range(int(line))]
"""
#: Connections asked for at a time: fewer than the listen backlog (100), so
#: that the client never waits for the loop to accept.
_BATCH = 50


class Idle(asyncio.Protocol):
    """Keeps its transport, as a server's protocol does; counts the accepted.
    Slotted: one object of 40-48 bytes per connection on every loop, no dict."""

    __slots__ = ("transport",)
    accepted = 0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        Idle.accepted += 1


def _site(frame: tracemalloc.Frame) -> str:
    path = Path(frame.filename)
    return f"{path.parent.name}/{path.name}:{frame.lineno}"


def child(loop_name: str, connections: int, over_tls: bool = False) -> dict[str, Any]:
    """Serve *connections* idle connections on *loop_name*; the traced growth
    per connection by site: {"connections": n, "sites": {site: [group, bytes]}}."""
    import tracemalloc  # CPython's: see run()

    loop = loops.factory(loop_name)()
    context = tls.server_context() if over_tls else None
    server = loop.run_until_complete(loop.create_server(Idle, "127.0.0.1", 0, ssl=context))
    port = server.sockets[0].getsockname()[1]
    client = processes.spawn(
        processes.python("-c", _CLIENT, str(port), "tls" if over_tls else "plain"),
        stdout=None, stderr=None)
    assert client.stdin is not None

    def batch(n: int) -> None:
        """*n* more connections, accepted and made (connection_made run)."""
        wanted = Idle.accepted + n
        deadline = time.monotonic() + 60
        while Idle.accepted < wanted:
            asked = min(_BATCH, wanted - Idle.accepted)
            client.stdin.write(f"{asked}\n")  # type: ignore[union-attr]
            client.stdin.flush()  # type: ignore[union-attr]
            goal = Idle.accepted + asked
            while Idle.accepted < goal:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{wanted - Idle.accepted} connections never made")
                loop.run_until_complete(asyncio.sleep(0.005))
        loop.run_until_complete(asyncio.sleep(0.05))  # nothing left half done

    try:
        batch(WARMUP)
        gc.collect()
        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
        batch(connections)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
    finally:
        client.stdin.close()
        client.wait(30)
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()
    sites: dict[str, list[Any]] = {}
    for stat in after.compare_to(before, "lineno"):
        if stat.size_diff <= 0:
            continue
        frame = stat.traceback[0]
        if Path(frame.filename).name == "tracemalloc.py":
            continue  # the snapshots' own bookkeeping
        # This file's lines allocate nothing that stays (the protocol is
        # slotted, made where the loop calls the factory): what they show is
        # a compiled loop's own allocations, made while they run the loop.
        where = "C" if frame.filename == __file__ else group(frame.filename)
        sites[_site(frame)] = [where, stat.size_diff]
    return {"connections": connections, "tls": over_tls, "sites": sites}


def untraceable() -> str | None:
    """Why tracemalloc cannot trace here, or None: it hooks CPython's
    allocators, and PyPy's stdlib has the module without its ``_tracemalloc``."""
    try:
        import tracemalloc  # noqa: F401
    except ImportError as exc:
        return (f"memory counts need tracemalloc, which {sys.implementation.name} "
                f"does not have ({exc}): CPython only")
    return None


def per_connection(counted: dict[str, Any]) -> dict[str, tuple[str, float]]:
    n = counted["connections"]
    return {site: (where, size / n) for site, (where, size) in counted["sites"].items()}


def count_tables(result: dict[str, dict[str, tuple[str, float]]], top: int
           ) -> tuple[tuple[list[str], list[list[str]]], tuple[list[str], list[list[str]]]]:
    """(bytes per connection per loop, by group; the *top* sites of any loop
    with each loop's bytes)."""
    names = list(result)
    groups = ("asyncio_relaxed", "asyncio", "C", "other")
    head = ["loop", "B per connection", *groups]
    body = []
    for name, rows in result.items():
        by = dict.fromkeys(groups, 0.0)
        for where, b in rows.values():
            by[where] = by.get(where, 0.0) + b
        body.append([name, f"{sum(by.values()):,.0f}", *(f"{by[g]:,.0f}" for g in groups)])
    chosen = tables.top_keys(result, top)
    site_head = ["allocated at", *names]
    site_body = [[site, *(f"{result[n][site][1]:,.0f}" if site in result[n] else "—"
                          for n in names)] for site in chosen]
    return (head, body), (site_head, site_body)


def run(loop_names: Sequence[str], *, connections: int, top: int, folder: Path,
        command: Sequence[str], over_tls: bool = False) -> int:
    """Trace each loop in its own process; print and save the tables.  2
    where tracemalloc cannot trace (PyPy)."""
    why = untraceable()
    if why:
        print(f"{why}; nothing counted", file=sys.stderr)
        return 2
    names = []
    for name in loop_names or DEFAULT_LOOPS:
        why = loops.missing(name)
        if why or loops.SPECS[name].kind == "floor":
            print(f"note: {name} skipped: {why or 'the floor has no server'}", file=sys.stderr)
        else:
            names.append(name)
    if over_tls:
        tls.ensure()  # the certificates, once, for every child
    started = results.stamp(results.now())
    result: dict[str, dict[str, tuple[str, float]]] = {}
    for name in names:
        result[name] = per_connection(processes.child_json(
            ["memory", "--child", name, str(connections), *(["--tls"] if over_tls else [])],
            300))
        print(f"  {name}: traced", file=sys.stderr, flush=True)
    (head, body), (site_head, site_body) = count_tables(result, top)
    line = "python -m benchmarks " + " ".join(command[1:])
    doc = {"started": started, "command": line, "python": sys.version,
           "connections": connections, "warmup_connections": WARMUP, "tls": over_tls,
           "versions": {n: loops.version(n) for n in names},
           "bytes_per_connection": {n: {site: {"where": g, "bytes": b}
                                        for site, (g, b) in rows.items()}
                                    for n, rows in result.items()}}
    kind = "idle TLS 1.3 connections" if over_tls else "idle connections"
    path = results.save(folder, f"{started}-memory", doc, tables.markdown(
        f"Memory per idle connection ({started})",
        f"`{line}`: {connections} {kind} after {WARMUP}, tracemalloc; "
        f"Python {sys.version.split()[0]}",
        [("", head, body), (f"The {len(site_body)} sites with the most, on any loop:",
                            site_head, site_body)]))
    print(tables.text_table(head, body))
    print()
    print(tables.text_table(site_head, site_body))
    print(f"\nresults: {path}  report: {path.with_suffix('.md')}")
    return 0


def child_main(loop_name: str, connections: str, over_tls: bool = False) -> None:
    """``--child LOOP N [--tls]``: trace one loop, print its JSON last."""
    counted = child(loop_name, int(connections), over_tls)
    sys.stdout.flush()
    print(json.dumps(counted))
