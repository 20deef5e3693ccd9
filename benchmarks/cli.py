"""The suite's one command line:
``python -m benchmarks run|compare|fairness|instructions|bytecodes|memory``.

``run`` and ``fairness`` go through the same runner
(benchmarks.workloads.runner) and the same report
(benchmarks.workloads.report): ``fairness`` is a grid of the ``fairness-*``
workloads with its own defaults (the accept loops, 3 s runs); ``compare``
reads two runs' JSON.  The count tools (benchmarks.counts): ``instructions``
per request under callgrind, ``bytecodes`` per function (3.12+),
``memory`` per idle connection by allocation site; each runs its children
as ``python -m benchmarks TOOL --child ...``.  Nothing imports this module
but ``benchmarks/__main__.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.counts import bytecodes, driver, instructions, memory
from benchmarks.harness import loops
from benchmarks.workloads import catalog, fairness, report, runner

#: Seconds of warm-up per run on CPython: ``run`` 0.25 s, which keeps the
#: default set within about 4 minutes with every peer (docs/benchmarks.md,
#: the default set); ``fairness`` 0.5 s, its runs being 3 s.
WARMUP = {"run": 0.25, "fairness": 0.5}
#: Seconds of warm-up per run on PyPy, for both commands: every run is a new
#: server process whose JIT starts cold.  http-0b on PyPy 8.0.1, CPU µs per
#: request after 0.25/2/5/10 s: 283/77/48/56, spreads ±41-191 % (5 s to 10 s
#: moves the median less than its spread; docs/benchmarks.md, PyPy).
JIT_WARMUP = 5.0

#: The --mode tokens of ``fairness`` (connection lifetimes) and the ones it
#: runs when none is given: a new connection per request, and keep-alive.
MODES: tuple[str, ...] = fairness.MODES
DEFAULT_MODES = ("close", "keepalive")


def _names(text: str | None) -> list[str] | None:
    return [n for n in text.split(",") if n] if text else None


def _ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of "
                                         "integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each value must be >= 1")
    return values


def _size(text: str) -> int | str:
    """A size of the count tools: bytes, or the tls, starttls, streams, http,
    uvicorn, udp, life or tlslife workload."""
    if text in driver.NAMED:
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a size in bytes, {driver.TLS} "
                                         f"(1 KiB over TLS), {driver.STARTTLS} (the same "
                                         f"after start_tls), {driver.STREAMS} (1 KiB through "
                                         f"streams), {driver.HTTP}, {driver.UVICORN}, "
                                         f"{driver.UDP}, "
                                         f"{driver.LIFE} (a connection's life) or "
                                         f"{driver.TLSLIFE} (a TLS connection's life)"
                                         ) from None


def _sizes(text: str) -> list[int | str]:
    return [_size(part) for part in text.split(",") if part]


def _tokens(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of *allowed* tokens."""

    def parse(text: str) -> list[str]:
        tokens = [t for t in text.split(",") if t]
        if not tokens or any(t not in allowed for t in tokens):
            raise argparse.ArgumentTypeError(f"{text!r}: allowed {', '.join(allowed)}")
        return tokens

    return parse


def _loops_option(p: argparse.ArgumentParser, default: Sequence[str] | None) -> None:
    p.add_argument("--loops", default=",".join(default) if default else None,
                   help="comma-separated (" + (",".join(default) if default else
                                                "default: each workload's own")
                   + f"); known: {', '.join(loops.SPECS)}")


def default_warmup(command: str, implementation: str = sys.implementation.name) -> float:
    """The warm-up of *command* (``run`` or ``fairness``) on *implementation*:
    :data:`JIT_WARMUP` on PyPy, :data:`WARMUP` elsewhere."""
    if implementation == "pypy":
        return max(JIT_WARMUP, WARMUP[command])
    return WARMUP[command]


def _repeat_options(p: argparse.ArgumentParser, duration: float, warmup: float) -> None:
    p.add_argument("--duration", type=float, default=duration,
                   help=f"measured seconds per run ({duration:g})")
    p.add_argument("--warmup", type=float, default=warmup,
                   help=f"warm-up seconds per run ({warmup:g})")
    p.add_argument("--repeat", type=int, default=3, help="runs per loop, interleaved (3)")


def _output_options(p: argparse.ArgumentParser, charts: bool = True) -> None:
    p.add_argument("--results", type=Path, default=Path("results"),
                   help="where the JSON, the Markdown" + (" and the charts" if charts else "")
                   + " go (results/)")
    if charts:
        p.add_argument("--no-charts", action="store_true", help="no PNG charts")


def _baseline_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--baseline", type=Path, metavar="DIR",
                   help=f"also {what} each relaxed preset from the asyncio_relaxed in DIR "
                   "(e.g. a git worktree of main) as NAME@base, in the same run")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run the same workloads on stock asyncio, the peer loops "
        f"({', '.join(loops.PEERS[1:])}) and asyncio_relaxed side by side "
        "(see README, 'Benchmarks').")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("run", help="run the default set of workloads (or --full, or --workloads)",
                       description="Run workloads on their loops: by default the default set "
                       "(benchmarks/workloads/catalog.py), our default settings against every "
                       "peer; progress on stderr, then a table per workload and a summary of our "
                       "default loop against each peer.")
    r.add_argument("--full", action="store_true",
                   help="every workload on all its loops, not the default set")
    r.add_argument("--workloads", help="comma-separated names or shell patterns (echo-*), each "
                   f"on all its loops; known: {', '.join(catalog.WORKLOADS)}")
    _loops_option(r, None)
    _repeat_options(r, 1.0, default_warmup("run"))
    r.add_argument("--no-syscalls", action="store_true",
                   help="skip the strace -c counts of every loop")
    _output_options(r)
    _baseline_option(r, "run")

    c = sub.add_parser("compare", help="what changed from run A to run B (their JSON)",
                       description="B relative to A per workload, loop and figure, with the "
                       "noise band of each (the larger spread of the two runs' repeats).")
    c.add_argument("a", type=Path, metavar="A.json")
    c.add_argument("b", type=Path, metavar="B.json")

    f = sub.add_parser("fairness", help="accept fairness: K pre-forked workers x C clients x "
                       "mode", description="K pre-forked workers on one listen socket "
                       "(benchmarks/fairness.py): each combination of --workers, "
                       "--concurrency and --mode is a fairness-* workload, run and reported "
                       "as by run.")
    _loops_option(f, loops.ACCEPT_LOOPS)
    f.add_argument("--workers", type=_ints, default=[4], help="comma-separated, e.g. 2,4 (4)")
    f.add_argument("--concurrency", type=_ints, default=[1, 10, 100],
                   help="clients, comma-separated (1,10,100)")
    f.add_argument("--mode", type=_tokens(MODES), default=list(DEFAULT_MODES),
                   help=f"connection lifetimes, comma-separated: {', '.join(MODES)} "
                   f"({','.join(DEFAULT_MODES)})")
    f.add_argument("--placement", type=_tokens(fairness.PLACEMENTS), default=["pinned"],
                   help="comma-separated: pinned (workers on one CPU, the client on "
                   "another), unpinned (free on every CPU, as deployed) (pinned)")
    _repeat_options(f, 3.0, default_warmup("fairness"))
    _output_options(f)

    i = sub.add_parser("instructions", help="instructions per request, counted by callgrind",
                       description=(instructions.__doc__ or "").split("\n\n")[0])
    _loops_option(i, instructions.DEFAULT_LOOPS)
    i.add_argument("--sizes", type=_sizes, default=list(instructions.DEFAULT_SIZES),
                   help="message sizes in bytes, tls for the 1 KiB echo over TLS 1.3, "
                   "starttls for the same reached by start_tls, streams for 1 KiB "
                   "through asyncio's streams, "
                   "http for the aiohttp workload, uvicorn for the uvicorn-json app, "
                   "udp for a datagram echo, life and tlslife for a connection's "
                   "life, plain and over TLS (1024,102400)")
    _baseline_option(i, "count")
    i.add_argument("--jobs", type=int, default=2, help="valgrind runs at once (2)")
    _output_options(i, charts=False)
    i.add_argument("--child", nargs=3, metavar=("LOOP", "SIZE", "ROUNDS"),
                   help=argparse.SUPPRESS)

    b = sub.add_parser("bytecodes", help="bytecodes per request per function (Python 3.12+)",
                       description=(bytecodes.__doc__ or "").split("\n\n")[0])
    _loops_option(b, bytecodes.DEFAULT_LOOPS)
    b.add_argument("--size", type=_size, default=1024,
                   help="message size in bytes, tls for the 1 KiB echo over TLS 1.3, "
                   "streams for 1 KiB through asyncio's streams, "
                   "http for the aiohttp workload, uvicorn for the uvicorn-json app, "
                   "or life and tlslife for a connection's life, plain and over TLS (1024)")
    b.add_argument("--rounds", type=int, default=bytecodes.ROUNDS,
                   help=f"measured rounds of {driver.PAIRS} requests ({bytecodes.ROUNDS})")
    b.add_argument("--top", type=int, default=bytecodes.TOP,
                   help=f"functions in the second table ({bytecodes.TOP})")
    _output_options(b, charts=False)
    b.add_argument("--child", nargs=3, metavar=("LOOP", "SIZE", "ROUNDS"),
                   help=argparse.SUPPRESS)

    m = sub.add_parser("memory", help="memory per idle connection by allocation site",
                       description=(memory.__doc__ or "").split("\n\n")[0])
    _loops_option(m, memory.DEFAULT_LOOPS)
    m.add_argument("--connections", type=int, default=memory.CONNECTIONS,
                   help=f"idle connections traced ({memory.CONNECTIONS})")
    m.add_argument("--top", type=int, default=memory.TOP,
                   help=f"sites in the second table ({memory.TOP})")
    m.add_argument("--tls", action="store_true", help="idle connections over TLS 1.3")
    _output_options(m, charts=False)
    m.add_argument("--child", nargs=2, metavar=("LOOP", "CONNECTIONS"), help=argparse.SUPPRESS)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    args = p.parse_args(args_list)
    if args.command == "compare":
        report.compare(*(_run_document(p, path) for path in (args.a, args.b)))
        return 0
    if args.command == "instructions" and args.child:
        instructions.child_main(*args.child)
        return 0
    if args.command == "bytecodes" and args.child:
        bytecodes.child_main(*args.child)
        return 0
    if args.command == "memory" and args.child:
        memory.child_main(*args.child, over_tls=args.tls)
        return 0
    names = _names(args.loops)
    for name in names or ():
        if name not in loops.SPECS:
            p.error(f"--loops: unknown loop {name!r}; known: {', '.join(loops.SPECS)}")
    command = ["__main__.py", *args_list]
    if args.command == "memory":
        if args.connections < 1 or args.top < 1:
            p.error("--connections and --top must be >= 1")
        return memory.run(names or [], connections=args.connections, top=args.top,
                          folder=args.results, command=command, over_tls=args.tls)
    if args.command == "bytecodes":
        if args.rounds < 1 or args.top < 1:
            p.error("--rounds and --top must be >= 1")
        return bytecodes.run(names or [], args.size, rounds=args.rounds, top=args.top,
                             folder=args.results, command=command)
    if args.command == "instructions":
        return instructions.run(names or [], args.sizes, baseline=args.baseline,
                                jobs=args.jobs, folder=args.results, command=command)
    if args.repeat < 1 or args.duration <= 0 or args.warmup < 0:
        p.error("--repeat must be >= 1, --duration > 0 and --warmup >= 0")
    if args.command == "fairness":
        chosen = [catalog.fairness(w, c, mode, placement)
                  for placement in args.placement for w in args.workers
                  for mode in args.mode for c in args.concurrency]
        if "mixed" in args.mode and min(args.concurrency) < 2:
            p.error("--mode mixed needs --concurrency 2 or more: a long client and a short one")
        syscalls, baseline = False, None
    else:
        chosen = runner.select(_names(args.workloads), args.full)
        syscalls, baseline = not args.no_syscalls, args.baseline
    doc = runner.run(chosen, names, duration=args.duration, warmup=args.warmup,
                     repeat=args.repeat, syscalls=syscalls, baseline=baseline,
                     command=command,
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    report.write_reports(doc, args.results, charts_too=not args.no_charts)
    return 0


def _run_document(p: argparse.ArgumentParser, path: Path) -> dict[str, Any]:
    """The JSON of a run or fairness command at *path*; anything else stops with why."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        p.error(f"{path}: {exc}")
    if not isinstance(doc, dict) or "workloads" not in doc:
        p.error(f"{path} is not the JSON of a run or fairness command (it has no "
                "\"workloads\"): compare reads those only")
    return doc
