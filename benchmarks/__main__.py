"""``python -m benchmarks run`` and ``python -m benchmarks compare A.json B.json``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks import loops, report, runner
from benchmarks.workloads import WORKLOADS


def _names(text: str | None) -> list[str] | None:
    return [n for n in text.split(",") if n] if text else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run the same workloads on stock asyncio, uvloop, rloop and "
        "asyncio_relaxed side by side (see README, 'Benchmarks').")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the default set (or --full, or --workloads)")
    r.add_argument("--full", action="store_true", help="every workload, not the default set")
    r.add_argument("--workloads", help="comma-separated names or shell patterns (echo-*); "
                   f"known: {', '.join(WORKLOADS)}")
    r.add_argument("--loops", help=f"comma-separated; known: {', '.join(loops.SPECS)}")
    r.add_argument("--duration", type=float, default=1.0, help="measured seconds per run (1)")
    r.add_argument("--warmup", type=float, default=0.5, help="warm-up seconds per run (0.5)")
    r.add_argument("--repeat", type=int, default=3, help="runs per loop, interleaved (3)")
    r.add_argument("--no-syscalls", action="store_true",
                   help="skip the strace -c counts of every loop")
    r.add_argument("--results", type=Path, default=Path("results"),
                   help="where the JSON, Markdown and charts go (results/)")
    r.add_argument("--no-charts", action="store_true")
    r.add_argument("--baseline", type=Path, metavar="DIR",
                   help="also run each relaxed preset from the asyncio_relaxed in DIR "
                   "(e.g. a git worktree of main) as NAME@base, in the same run")
    c = sub.add_parser("compare", help="what changed from run A to run B")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = parser.parse_args(argv)

    if args.command == "compare":
        report.compare(json.loads(args.a.read_text()), json.loads(args.b.read_text()))
        return 0
    if args.repeat < 1 or args.duration <= 0 or args.warmup < 0:
        parser.error("--repeat must be >= 1, --duration > 0 and --warmup >= 0")
    loop_names = _names(args.loops)
    for name in loop_names or ():
        if name not in loops.SPECS:
            parser.error(f"--loops: unknown loop {name!r}; known: {', '.join(loops.SPECS)}")
    workloads = runner.select(_names(args.workloads), args.full)
    doc = runner.run(workloads, loop_names, duration=args.duration, warmup=args.warmup,
                     repeat=args.repeat, syscalls=not args.no_syscalls,
                     baseline=args.baseline,
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    path = runner.save(doc, args.results)
    made = [] if args.no_charts else report.charts(doc, path.with_suffix(""))
    if not args.no_charts and not made:
        print("note: matplotlib is not installed; no charts (pip install matplotlib)",
              file=sys.stderr)
    md = path.with_suffix(".md")
    md.write_text(report.markdown(doc, made))
    report.terminal(doc)
    print(f"\nresults: {path}  report: {md}" + "".join(f"  chart: {p}" for p in made))
    return 0


if __name__ == "__main__":
    sys.exit(main())
