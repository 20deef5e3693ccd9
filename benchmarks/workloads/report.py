"""What a run shows: the terminal table, the Markdown report, the charts, and
the comparison of two runs.

Every figure is a median of the repeats; the spread ((max - min) / median)
of the repeats is the noise band.  Ratios are to stock asyncio in the same
run, so two machines' runs compare by ratio, not by absolute figure.  The
files go through benchmarks.harness.results (:func:`save`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import results
from benchmarks.harness.tables import TIMES, markdown_table, ratio, text_table

#: (column title, metric key, format) per kind of workload.
COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    # kernel: the server's system CPU, part of its CPU (getrusage's ru_stime).
    "request": [("req/s", "rate", "{:,.0f}"), ("CPU µs/req", "cpu_us_per_unit", "{:.1f}"),
                ("kernel µs/req", "sys_us_per_unit", "{:.1f}"),
                ("p50 µs", "p50_us", "{:,.0f}"), ("p99 µs", "p99_us", "{:,.0f}")],
    "connection": [("conn/s", "rate", "{:,.0f}"), ("CPU µs/conn", "cpu_us_per_unit", "{:.1f}"),
                   ("kernel µs/conn", "sys_us_per_unit", "{:.1f}"),
                   ("p50 µs", "p50_us", "{:,.0f}"), ("p99 µs", "p99_us", "{:,.0f}")],
    "MiB": [("Gbit/s", "gbit_s", "{:.2f}"), ("CPU µs/MiB", "cpu_us_per_unit", "{:.0f}")],
    "idle": [("B/conn", "bytes_per_unit", "{:,.0f}")],
    # A datagram echoed; the latencies are a burst's (one datagram, or
    # udp-burst-1k's 32); lost: echoes that never came (the client's
    # timeout); faults: the server's minor page faults (a recv buffer served
    # by mmap faults per read); the last three from asyncio_relaxed's
    # statistics() only.
    "datagram": [("dgram/s", "rate", "{:,.0f}"), ("CPU µs/dgram", "cpu_us_per_unit", "{:.2f}"),
                 ("p50 µs", "p50_us", "{:,.0f}"), ("p99 µs", "p99_us", "{:,.0f}"),
                 ("lost", "lost", "{:,.0f}"), ("faults/dgram", "faults_per_unit", "{:.2f}"),
                 ("polls/dgram", "poll_waits_per_unit", "{:.3f}"),
                 ("read events/dgram", "datagram_read_events_per_unit", "{:.3f}"),
                 ("recvs/dgram", "datagram_recv_per_unit", "{:.3f}")],
    # ws-broadcast: a message delivered to one connection; the latencies
    # are a broadcast's, from its send to its last delivery.
    "message": [("msg/s", "rate", "{:,.0f}"), ("CPU µs/msg", "cpu_us_per_unit", "{:.2f}"),
                ("last delivery p50 µs", "p50_us", "{:,.0f}"),
                ("last delivery p99 µs", "p99_us", "{:,.0f}")],
    # redis-proxy: one command of a pipeline; the latencies are a pipeline's.
    "command": [("cmd/s", "rate", "{:,.0f}"), ("CPU µs/cmd", "cpu_us_per_unit", "{:.2f}"),
                ("pipeline p50 µs", "p50_us", "{:,.0f}"),
                ("pipeline p99 µs", "p99_us", "{:,.0f}")],
    "fairness": [("Jain conns", "jain", "{:.3f}"), ("Jain reqs", "jain_requests", "{:.3f}"),
                 ("max/min", "max_min", "{:.2f}"), ("conn/s", "conns_per_s", "{:,.0f}"),
                 ("req/s", "req_per_s", "{:,.0f}"), ("CPU µs/req", "server_cpu_us_per_req",
                                                      "{:.1f}"),
                 ("p50 µs", "p50_us", "{:,.0f}"), ("p99 µs", "p99_us", "{:,.0f}")],
}
# The same response in one write (/one) and in two (/two), each figure of
# /two over /one's, and the sends per request (asyncio_relaxed's counters).
COLUMNS["split"] = [
    ("req/s 1 write", "rate", "{:,.0f}"), ("req/s 2 writes", "rate_two", "{:,.0f}"),
    ("req/s 2/1", "rate_two_vs_one", "{:.2f}" + TIMES),
    ("CPU µs/req 1 write", "cpu_us_per_unit", "{:.1f}"),
    ("CPU µs/req 2 writes", "cpu_us_per_unit_two", "{:.1f}"),
    ("CPU 2/1", "cpu_two_vs_one", "{:.2f}" + TIMES),
    ("send/req 1 write", "send_per_unit", "{:.2f}"),
    ("send/req 2 writes", "send_per_unit_two", "{:.2f}"),
]
SYSCALL_COLUMNS = ("poll_waits", "epoll_ctl", "recv", "send", "accept")
#: Per kind of workload, the ratio column of its table: (title, metric, the
#: loop every row is divided by).
RATIO_COLUMNS: dict[str, tuple[str, str, str]] = {
    "request": ("CPU vs asyncio", "cpu_us_per_unit", "asyncio"),
    "connection": ("CPU vs asyncio", "cpu_us_per_unit", "asyncio"),
    "MiB": ("CPU vs asyncio", "cpu_us_per_unit", "asyncio"),
    "datagram": ("CPU vs asyncio", "cpu_us_per_unit", "asyncio"),
    "message": ("CPU vs asyncio", "cpu_us_per_unit", "asyncio"),
    "command": ("CPU vs asyncio", "cpu_us_per_unit", "asyncio"),
    "fairness": ("conn/s vs batch", "conns_per_s", "relaxed-batch"),
}
#: Per kind of workload, the figure the summary compares and whether a
#: lower one is better.
SUMMARY_METRICS: dict[str, tuple[str, bool]] = {
    "request": ("cpu_us_per_unit", True),
    "connection": ("cpu_us_per_unit", True),
    "MiB": ("gbit_s", False),
    "datagram": ("cpu_us_per_unit", True),
    "message": ("cpu_us_per_unit", True),
    "command": ("cpu_us_per_unit", True),
    "idle": ("bytes_per_unit", True),
    "fairness": ("jain", False),
    "split": ("cpu_us_per_unit_two", True),
}


def kind(entry: dict[str, Any]) -> str:
    if entry["params"]["server"] == "fairness":
        return "fairness"
    if entry["params"]["client"] == "idle":
        return "idle"
    if entry["params"]["client"] == "open":
        return "open"
    if entry["params"]["server"] == "split":
        return "split"
    return str(entry["unit"])


def columns(entry: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(title, metric key, format) of *entry*'s table: its kind's, or for the
    open-loop workloads the capacity, then per load the rate answered, its
    latencies from due time, the client's own send lag, its CPU use and
    its headroom (the share of its CPU neither working nor spinning idle,
    benchmarks.workloads.openloop: a spinning pacer's CPU is no load)."""
    if kind(entry) != "open":
        return COLUMNS[kind(entry)]
    out = [("capacity req/s", "rate", "{:,.0f}"), ("CPU µs/req", "cpu_us_per_unit", "{:.1f}")]
    of = entry["params"].get("rate_of")
    for load in entry["params"]["loads"]:
        at = f"@{load}%" + (f" of {of}" if of else "")
        out += [(f"req/s {at}", f"achieved_rate_{load}", "{:,.0f}"),
                (f"p50 µs {at}", f"p50_us_{load}", "{:,.0f}"),
                (f"p99 µs {at}", f"p99_us_{load}", "{:,.0f}"),
                (f"p99.9 µs {at}", f"p999_us_{load}", "{:,.0f}"),
                (f"lag p99 µs {at}", f"lag_p99_us_{load}", "{:,.0f}"),
                (f"client CPU {at}", f"client_cpu_{load}", "{:.2f}"),
                (f"client headroom {at}", f"client_headroom_{load}", "{:.2f}")]
    return out


def summary_metric(entry: dict[str, Any]) -> tuple[str, bool] | None:
    """The figure the summary compares for *entry* and whether lower is
    better, or None: the open loop's p99 at its highest load; under mixed
    connection lifetimes, Jain's index over requests (the load a worker
    got, where its long connections count), not over new connections."""
    if kind(entry) == "open":
        return f"p99_us_{max(entry['params']['loads'])}", True
    if kind(entry) == "fairness" and entry["params"].get("mode") == "mixed":
        return "jain_requests", False
    return SUMMARY_METRICS.get(kind(entry))


def _fmt(fmt: str, value: float | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return fmt.format(value)


def rows(entry: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The header and the rows of one workload's table."""
    cols = columns(entry)
    header = ["loop", *(title for title, _, _ in cols)]
    unit = {"request": "req", "connection": "conn", "MiB": "MiB", "datagram": "dgram",
            "message": "msg", "command": "cmd"}.get(entry["unit"], "req")
    ratio_column = RATIO_COLUMNS.get(kind(entry))
    if ratio_column:
        title, metric, against = ratio_column
        base = entry["loops"].get(against, {}).get("median", {}).get(metric)
        header.append(title)
    has_sys = kind(entry) in ("request", "connection", "MiB", "message", "command") and any(
        "syscalls_strace" in v or "poll_waits_per_unit" in v["median"]
        for v in entry["loops"].values())
    if has_sys:
        header += [f"{c}/{unit}" for c in SYSCALL_COLUMNS] + [f"callbacks/{unit}"]
    out = []
    for name, data in entry["loops"].items():
        med = data["median"]
        row = [name, *(_fmt(fmt, med.get(key)) for _, key, fmt in cols)]
        if ratio_column:
            row.append(ratio(med.get(metric), base))
        if has_sys:
            # strace counts every loop the same way; statistics() is ours only.
            counts = data.get("syscalls_strace") or {
                k: med[f"{k}_per_unit"] for k in SYSCALL_COLUMNS if f"{k}_per_unit" in med}
            row += [_fmt("{:.2f}", counts.get(c)) for c in SYSCALL_COLUMNS]
            row.append(_fmt("{:.2f}", med.get("callbacks_per_unit")))
        out.append(row)
    return header, out


def ours(doc: dict[str, Any], entry: dict[str, Any]) -> list[str]:
    """Our default loops in *entry*, one per build: the relaxed loops run with
    asyncio_relaxed's default settings (``doc["defaults"]``), the compiled
    build's first; else the first relaxed loop; never an ``@base`` twin."""
    relaxed = [n for n in entry["loops"]
               if doc["loops"].get(n, {}).get("kind") == "relaxed" and "@" not in n]
    default = [n for n in relaxed
               if "defaults" in doc and doc["loops"][n].get("config") == doc["defaults"]]
    builds: dict[Any, str] = {}
    for name in default:
        builds.setdefault(doc["loops"][name].get("build"), name)
    if builds:
        return sorted(builds.values(), key=lambda n: doc["loops"][n].get("build") != "compiled")
    return relaxed[:1]


def summary(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Per workload, our default loop's figure over each peer's in the run
    (and over its own ``@base`` twin's): the header and the rows."""
    peers: list[str] = []
    picked = []
    for entry in doc["workloads"]:
        figure = summary_metric(entry)
        if figure is None:
            continue
        for name in ours(doc, entry):
            picked.append((entry, name, figure))
        peers += [n for n in entry["loops"]
                  if doc["loops"][n]["kind"] != "relaxed" and n not in peers]
    if any(f"{name}@base" in entry["loops"] for entry, name, _ in picked):
        peers.append("@base")
    header = ["workload", "our loop", "figure", "ours", *(f"vs {p}" for p in peers), "noise"]
    body = []
    for entry, name, (metric, lower) in picked:
        title, fmt = next((t, f) for t, key, f in columns(entry) if key == metric)
        value = entry["loops"][name]["median"].get(metric)
        cells = []
        for peer in peers:
            other = f"{name}@base" if peer == "@base" else peer
            data = entry["loops"].get(other)
            cells.append(ratio(value, data["median"].get(metric)) if data else "")
        worst = max((d["spread"].get(metric, 0.0) for d in entry["loops"].values()),
                    default=0.0)
        body.append([entry["name"], name, f"{title} {'↓' if lower else '↑'}", _fmt(fmt, value),
                     *cells, f"±{worst:.0%}"])
    return header, body


SUMMARY_NOTE = ("ours / each peer, medians of this run; ↓: lower is better (a ratio "
                "under 1 is ours ahead), ↑: higher is better; noise: the largest spread "
                "of the repeats in the workload")


def spread_note(entry: dict[str, Any]) -> str:
    worst = max((d["spread"].get("cpu_us_per_unit", d["spread"].get("jain", 0.0))
                 for d in entry["loops"].values()), default=0.0)
    return f"largest spread of the repeats: {worst:.0%}"


def per_worker(entry: dict[str, Any]) -> list[str]:
    """Per loop of a fairness workload, what each worker served in its
    median run by Jain's index over requests: connections, requests and,
    where the run has them, CPU seconds and p99 latency."""
    out = []
    for name, data in entry["loops"].items():
        runs = sorted((s for s in data["samples"] if "per_worker" in s),
                      key=lambda s: s.get("jain_requests") or 0.0)
        if not runs:
            continue
        workers = runs[len(runs) // 2]["per_worker"]
        parts = [f"connections {'/'.join(str(n) for n in workers['connections'])}",
                 f"requests {'/'.join(str(n) for n in workers['requests'])}"]
        if "cpu_s" in workers:
            parts.append("CPU s " + "/".join(f"{t:.2f}" for t in workers["cpu_s"]))
        if "p99_us" in workers:
            parts.append("p99 µs " + "/".join(_fmt("{:,.0f}", v) for v in workers["p99_us"]))
        out.append(f"{name}: " + " · ".join(parts))
    return out


PER_WORKER_NOTE = "Per worker (worker 0/1/..., the median run by Jain's index over requests)"


def headline(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    pinned = (f"server on CPU {m['server_cpu']}, client on CPU {m['client_cpu']}"
              if m["pinned"] else "not pinned (one CPU)")
    method = doc["method"]
    seen: dict[str, str] = {}
    for data in doc["loops"].values():
        label = "asyncio_relaxed" if data["kind"] == "relaxed" else data["kind"]
        if "baseline" in data:
            label = "@base:"
        seen.setdefault(label, data["version"])
    versions = ", ".join(f"{k} {v}" for k, v in seen.items())
    # "CPython 3.15.2", "PyPy 3.11.17 (PyPy 8.0.1)"; "Python 3.11.7" for a
    # run recorded without its implementation.
    python = f"{m.get('implementation', 'Python')} {m['python']}"
    if m.get("pypy"):
        python += f" (PyPy {m['pypy']})"
    return (f"{doc['started']} · {python} · {m['cpus']} CPUs ({m['cpu_model']}) · "
            f"{pinned} · {method['repeat']} x {method['duration']} s per loop after "
            f"{method['warmup']} s warm-up, median · {versions}")


def terminal(doc: dict[str, Any], out: Callable[[str], None] = print) -> None:
    out(headline(doc))
    for entry in doc["workloads"]:
        out("")
        out(f"{entry['name']}: {entry['about']} ({spread_note(entry) if entry['loops'] else ''})")
        if "skipped" in entry:
            out(f"  skipped: {entry['skipped']}")
        if entry["loops"]:
            out(text_table(*rows(entry)))
        for name, why in entry.get("unsupported", {}).items():
            out(f"  {name} not run: {why}")
        if kind(entry) == "fairness" and (lines := per_worker(entry)):
            out(f"{PER_WORKER_NOTE}:")
            for line in lines:
                out(f"  {line}")
        for name, errors in entry.get("errors", {}).items():
            out(f"  {name}: {len(errors)} failed run(s): {errors[0]}")
    for name, why in doc["skipped"].items():
        out(f"note: {name} skipped: {why}")
    header, body = summary(doc)
    if body:
        out("")
        out(f"Summary ({SUMMARY_NOTE}):")
        out(text_table(header, body))
    failed = [f"{entry['name']} on {name} ({len(errors)})" for entry in doc["workloads"]
              for name, errors in entry.get("errors", {}).items()]
    if failed:
        out(f"failed runs, their errors above: {', '.join(failed)}")


def markdown(doc: dict[str, Any], charts: list[str]) -> str:
    """The Markdown report of a run; *charts* the file names of its charts."""
    parts = [f"# Benchmark run {doc['started']}", "", headline(doc), "",
             f"Command: `python -m benchmarks {' '.join(doc['command'][1:])}`", ""]
    for name, why in doc["skipped"].items():
        parts.append(f"- {name} skipped: {why}")
    header, body = summary(doc)
    if body:
        parts += ["", "## Summary", "", markdown_table(header, body), "", SUMMARY_NOTE + "."]
    for entry in doc["workloads"]:
        parts += ["", f"## {entry['name']}", "", entry["about"] + ".", ""]
        if "skipped" in entry:
            parts.append(f"Skipped: {entry['skipped']}.")
        if entry["loops"]:
            clients = {d["client"] for d in entry["loops"].values()}
            parts += [markdown_table(*rows(entry)), "",
                      f"Client: {', '.join(sorted(clients))}; {spread_note(entry)}."]
        for name, why in entry.get("unsupported", {}).items():
            parts.append(f"- {name} not run: {why}")
        if kind(entry) == "fairness" and (lines := per_worker(entry)):
            parts += ["", f"{PER_WORKER_NOTE}:", ""] + [f"- {line}" for line in lines]
        for name, errors in entry.get("errors", {}).items():
            parts.append(f"- {name}: {len(errors)} failed run(s): `{errors[0]}`")
    if charts:
        parts += ["", "## Charts", ""] + [f"![{Path(p).stem}]({p})" for p in charts]
    return "\n".join(parts) + "\n"


def charts(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The charts, matplotlib figures by name: server CPU per unit (lower is
    better, ``cpu``) and fairness per loop (``jain``); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    made: dict[str, Any] = {}
    specs: tuple[tuple[str, str, Callable[[dict[str, Any]], bool], str], ...] = (
        ("server CPU per request, connection, MiB, datagram, message or command (lower is "
         "better)", "cpu_us_per_unit",
         lambda e: kind(e) in ("request", "connection", "MiB", "datagram", "message", "command"),
         "µs per {unit}"),
        ("accept fairness (Jain's index over connections, 1 = even)", "jain",
         lambda e: kind(e) == "fairness", "Jain's index"),
    )
    for title, metric, pick, label in specs:
        entries = [e for e in doc["workloads"] if pick(e) and e["loops"]]
        if not entries:
            continue
        cols = min(3, len(entries))
        rows_ = math.ceil(len(entries) / cols)
        fig, axes = plt.subplots(rows_, cols, figsize=(5 * cols, 3.2 * rows_), squeeze=False)
        # zip stops at the last entry: spare axes stay empty (turned off below).
        for ax, entry in zip(axes.flat, entries, strict=False):
            names = list(entry["loops"])
            values = [entry["loops"][n]["median"].get(metric, 0.0) for n in names]
            lows = [min(s.get(metric, v) for s in entry["loops"][n]["samples"])
                    for n, v in zip(names, values, strict=True)]
            highs = [max(s.get(metric, v) for s in entry["loops"][n]["samples"])
                     for n, v in zip(names, values, strict=True)]
            ax.bar(names, values, yerr=[[v - lo for v, lo in zip(values, lows, strict=True)],
                                        [hi - v for v, hi in zip(values, highs, strict=True)]],
                   color=["#999999" if n == "asyncio" else "#5b8def" if n.startswith("relaxed")
                          else "#e8a33d" for n in names], capsize=3)
            ax.set_title(entry["name"], fontsize=9)
            ax.set_ylabel(label.format(unit=entry["unit"]), fontsize=8)
            ax.tick_params(axis="x", labelrotation=45, labelsize=7)
            if metric == "jain":
                ax.set_ylim(min(0.8, min(values) - 0.02), 1.0)
        for ax in list(axes.flat)[len(entries):]:
            ax.axis("off")
        fig.suptitle(f"{title} — {doc['started']}, bars: median, whiskers: min-max", fontsize=10)
        fig.tight_layout()
        made[metric.split("_")[0]] = fig
    latency = latency_chart(doc, plt)
    if latency is not None:
        made["latency"] = latency
    return made


def spectra(entry: dict[str, Any]) -> list[tuple[str, dict[str, list[list[float]]]]]:
    """An open-loop workload's latency distributions to draw: per load (its
    column's title), per loop, the ``spectrum_us`` of the repeat whose p99
    at that load is the median (the lower middle of an even count)."""
    out = []
    for load in entry["params"].get("loads") or ():
        per_loop = {}
        for name, data in entry["loops"].items():
            samples = sorted((s for s in data["samples"] if f"spectrum_us_{load}" in s),
                             key=lambda s: s[f"p99_us_{load}"])
            if samples:
                per_loop[name] = samples[(len(samples) - 1) // 2][f"spectrum_us_{load}"]
        if per_loop:
            of = entry["params"].get("rate_of")
            out.append((f"{entry['name']} @{load}% of {of or 'each loop'}'s capacity", per_loop))
    return out


def latency_chart(doc: dict[str, Any], plt: Any) -> Any:
    """The open-loop windows' latency distributions (``latency``): latency
    by percentile, the percentile axis spread as HdrHistogram plots it
    (1 / (1 - p): 90 %, 99 %, 99.9 % equally apart), one line per loop;
    None where the run has no open-loop window with a distribution."""
    panels = [panel for e in doc["workloads"] if kind(e) == "open" for panel in spectra(e)]
    if not panels:
        return None
    cols = min(3, len(panels))
    rows_ = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(5 * cols, 3.4 * rows_), squeeze=False)
    for ax, (title, per_loop) in zip(axes.flat, panels, strict=False):
        for name, spectrum in per_loop.items():
            # The maximum (100 %) has no place on a 1 / (1 - p) axis: it
            # stands one step past the last percentile.
            xs = [1 / (1 - q / 100) if q < 100 else None for q, _ in spectrum]
            last = max((x for x in xs if x is not None), default=1.0)
            xs = [x if x is not None else last * 10 for x in xs]
            ax.plot(xs, [v for _, v in spectrum], marker=".", label=name,
                    color="#999999" if name == "asyncio" else None,
                    linewidth=2.0 if name.startswith("relaxed") else 1.0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = [2, 10, 100, 1000, 10000, 100000]
        ax.set_xticks(ticks)
        ax.set_xticklabels(["50%", "90%", "99%", "99.9%", "99.99%", "99.999%"], fontsize=7)
        ax.set_title(title, fontsize=8)
        ax.set_ylabel("latency µs", fontsize=8)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"open-loop latency by percentile (the last point: the maximum) — "
                 f"{doc['started']}, the median repeat's", fontsize=10)
    fig.tight_layout()
    return fig


def save(doc: dict[str, Any], directory: Path, *, charts_too: bool = True) -> Path:
    """Write a run's JSON, Markdown and (with *charts_too* and matplotlib)
    charts to *directory*; return the JSON's path."""
    name = results.stamp(doc["started"])
    figures = charts(doc) if charts_too else {}
    made = [results.chart_name(name, figure) for figure in figures or {}]
    path = results.save(directory, name, doc, markdown(doc, made), figures)
    if figures:
        import matplotlib.pyplot as plt

        for figure in figures.values():
            plt.close(figure)
    return path


def no_charts_note(implementation: str = sys.implementation.name) -> str:
    """What a run without matplotlib says: on PyPy the bench extra leaves it
    out, having no wheel there (pyproject.toml), so no "pip install"."""
    fix = ("pip install matplotlib" if implementation == "cpython" else
           f"the bench extra leaves it out on {implementation}, which it has no wheel for")
    return f"note: matplotlib is not installed; no charts ({fix})"


def write_reports(doc: dict[str, Any], directory: Path, *, charts_too: bool) -> None:
    """Save a run (:func:`save`) and print its tables, summary and files."""
    path = save(doc, directory, charts_too=charts_too)
    made = sorted(directory.glob(f"{path.stem}-*.png")) if charts_too else []
    if charts_too and not made:
        print(no_charts_note(), file=sys.stderr)
    terminal(doc)
    print(f"\nresults: {path}  report: {path.with_suffix('.md')}"
          + "".join(f"  chart: {p}" for p in made))


def compare(a: dict[str, Any], b: dict[str, Any], out: Callable[[str], None] = print) -> int:
    """Print B relative to A per workload and loop; return how many changed beyond noise."""
    out(f"A: {headline(a)}")
    out(f"B: {headline(b)}")
    out("ratio = B / A of the medians; noise = the larger spread of the two runs' repeats")
    changed = 0
    a_work = {e["name"]: e for e in a["workloads"]}
    header = ["workload", "loop", "metric", "A", "B", "B/A", "noise", ""]
    body = []
    for entry in b["workloads"]:
        old = a_work.get(entry["name"])
        if old is None:
            continue
        metrics = [key for _, key, _ in columns(entry) if not key.startswith("p")]
        for name, data in entry["loops"].items():
            if name not in old["loops"]:
                continue
            for key in metrics:
                va = old["loops"][name]["median"].get(key)
                vb = data["median"].get(key)
                if not va or vb is None or not math.isfinite(va) or not math.isfinite(vb):
                    continue
                noise = max(old["loops"][name]["spread"].get(key, 0.0),
                            data["spread"].get(key, 0.0))
                ratio = vb / va
                flag = "changed" if abs(ratio - 1) > noise else ""
                changed += bool(flag)
                body.append([entry["name"], name, key, f"{va:.4g}", f"{vb:.4g}",
                             f"{ratio:.3f}", f"±{noise:.0%}", flag])
    if body:
        out(text_table(header, body))
    else:
        out("no workload and loop in common")
    return changed
