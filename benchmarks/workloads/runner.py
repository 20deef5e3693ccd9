"""One benchmark run: every selected workload on every selected loop.

Method (docs/benchmarks.md): the server runs in its own process pinned to
one CPU, the load generator in another pinned to a different CPU; for each
workload the loops are interleaved (A B C, A B C, ...) so that drift of a
noisy machine spreads over all loops; every run has a warm-up the figures
leave out; the report quotes the median of the repeats and their spread.

Server CPU time per request comes from the server process's own user+system
time over the measured window (two ``mark`` snapshots), so it stays valid
when the client, not the server, is the bottleneck.  System calls per
request come from ``loop.statistics()`` on our loop, and from ``strace -c
-f`` attached for a shorter window to every loop (ours too, as a cross-check)
for the workloads marked ``syscalls`` when strace is installed.

A run is one server process and one or more measured windows on it: one;
one per path (``Workload.paths``: the same response in one write and in
two); or the open-loop client's capacity, then its loads, per cent of that
capacity or of another loop's measured earlier in the run (``rate_of``)
(benchmarks.workloads.openloop).  A workload whose ``needs`` are missing
here is skipped with the reason; a loop whose server says it cannot serve
the workload (a peer without ``create_server(ssl=)``) is left out of it with
its reason (``unsupported`` in the JSON), never replaced.  Every process
starts through benchmarks.harness.processes; the TLS workloads' certificates
are made once per run (benchmarks.harness.tls).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import math
import os
import platform
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import checkout, loops, maths, processes, results, tls
from benchmarks.harness.processes import ROOT, Process, cpus
from benchmarks.workloads import fairness
from benchmarks.workloads.catalog import WORKLOADS, Workload
from benchmarks.workloads.catalog import missing as workload_missing

SCHEMA = 1
#: Seconds a server may take to answer a mark, which takes it one loop
#: iteration: one that falls further behind its input fails the run (rloop
#: 0.5.0's pipe-100k server answered after 70-79 s in 3 runs of 26 on the
#: 2-CPU machine of the README, once at 23 GB RSS).
MARK_TIMEOUT = 5.0
#: Longest measured window of a strace run: its figures are counts per
#: request, thousands of requests either way.
STRACE_WINDOW = 0.5
#: The shortest median request _figures calls a stall: a smoke test's
#: 0.2 s window on PyPy (its JIT still warming the client) sees 0.2 s.
STALL = 1.0


# -- the machine ------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    server_cpu, client_cpu = cpus()
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "pypy": ".".join(map(str, sys.pypy_version_info[:3]))  # type: ignore[attr-defined]
        if hasattr(sys, "pypy_version_info") else None,
        "pinned": server_cpu is not None,
        "server_cpu": server_cpu,
        "client_cpu": client_cpu,
        "wrk": wrk_version(),
        "strace": shutil.which("strace") is not None,
        "openssl": __import__("ssl").OPENSSL_VERSION,
        # Settings the children inherit: they change what the loops do.
        "environment": {k: v for k, v in os.environ.items()
                        if k.startswith("ASYNCIO_RELAXED_") or k in ("PYTHONASYNCIODEBUG",
                                                                     "PYTHONDEVMODE")},
    }


def wrk_version() -> str | None:
    if not shutil.which("wrk"):
        return None
    # wrk --version prints its version and exits 1.
    proc = processes.spawn(["wrk", "--version"], stdin=processes.DEVNULL)
    out, err = proc.communicate(timeout=10)
    return (out + err).split(" [")[0].strip() or "wrk"


# -- strace -------------------------------------------------------------------------

#: strace's syscall names -> the columns of the report.
SYSCALL_KINDS = {
    "poll_waits": ("epoll_wait", "epoll_pwait", "epoll_pwait2", "poll", "ppoll", "select",
                   "pselect6"),
    "epoll_ctl": ("epoll_ctl",),
    "recv": ("recvfrom", "recvmsg", "read", "readv", "recvmmsg"),
    "send": ("sendto", "sendmsg", "write", "writev", "sendmmsg"),
    "accept": ("accept", "accept4"),
}


def parse_strace(text: str) -> dict[str, int]:
    """Call counts per syscall from ``strace -c`` output."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        # % time, seconds, usecs/call, calls, [errors], syscall
        if len(parts) >= 5 and re.fullmatch(r"[\d.]+", parts[0]) and parts[-1] != "total":
            counts[parts[-1]] = int(parts[3])
    return counts


@contextlib.contextmanager
def strace(pid: int, out: dict[str, int]) -> Iterator[None]:
    """Count the system calls of process *pid* (all threads) while inside."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as f:
        proc = processes.spawn(["strace", "-c", "-f", "-p", str(pid), "-o", f.name],
                               stdin=processes.DEVNULL, stdout=processes.DEVNULL)
        try:
            assert proc.stderr is not None
            processes.readline(proc.stderr, 10)  # "strace: Process N attached"
            time.sleep(0.1)  # the other threads' attach lines
            yield
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=10)
            assert proc.stderr is not None
            proc.stderr.close()
        out.update(parse_strace(f.read()))


# -- one run ------------------------------------------------------------------------


class Unsupported(Exception):
    """The server of a loop cannot serve the workload (it said why)."""


def server_command(w: Workload, loop: str) -> list[str]:
    return processes.python("-m", "benchmarks.workloads.server", "--kind", w.server,
                            "--loop", loops.preset(loop), *w.server_args, *_tls_flag(w))


#: The built-in client's glibc malloc, its thresholds fixed.  With them
#: dynamic, a TLS client can land in a state where its buffers are mmapped
#: and unmapped (page faults by the thousand a second): it then runs at
#: about a third of its speed, every server sees one request a wakeup
#: where it saw several, and the server's CPU a request doubles
#: (tls-echo-1k-c10 on 3.15, docs/benchmarks.md).  The client is the instrument: it must not make
#: the servers' figures depend on a heuristic of its own heap.  The servers
#: keep glibc's defaults, as users run them (their faults are a column).
CLIENT_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(4 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def client_command(w: Workload, warmup: float, duration: float,
                   path: str | None = None) -> list[str]:
    """The built-in client of *w* (the window on *path*, default ``w.path``);
    it reads the server's port from its input."""
    if w.client == "open":
        if w.starttls:
            raise ValueError(f"{w.name}: the open-loop client has no --starttls")
        return processes.python(
            "-m", "benchmarks.workloads.openloop", "--concurrency", str(w.concurrency),
            "--protocol", w.protocol, "--arrivals", w.arrivals,
            "--request", str(w.request), "--response", str(w.response),
            "--path", path or w.path, "--pipeline", str(w.pipeline),
            *(("--body", w.body) if w.body else ()),
            "--warmup", str(warmup), "--duration", str(duration), *_tls_flag(w))
    kind = "http" if w.client == "wrk" else w.client
    return processes.python(
        "-m", "benchmarks.workloads.client", "--kind", kind,
        "--concurrency", str(w.concurrency), "--request", str(w.request),
        "--response", str(w.response), "--path", path or w.path,
        "--warmup", str(warmup), "--duration", str(duration), *_tls_flag(w),
        *(("--burst", str(w.burst)) if w.client == "udp" else ()), *_request_flags(w))


def _request_flags(w: Workload) -> tuple[str, ...]:
    """The built-in client's options for *w*'s method, body and pipeline,
    where they are not the defaults (the commands of the workloads before
    them stay as they were)."""
    out: tuple[str, ...] = ()
    if w.method != "GET" or w.body:
        out += ("--method", w.method, "--body", w.body)
    if w.client == "resp":
        out += ("--pipeline", str(w.pipeline))
    return out


def _tls_flag(w: Workload) -> tuple[str, ...]:
    """The server's and the built-in client's TLS option for *w*."""
    return ("--starttls",) if w.starttls else ("--tls",) if w.tls else ()


def per_unit(counts: dict[str, int], units: float) -> dict[str, float]:
    return {k: v / units for k, v in counts.items()}


def statistics_counts(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """The report's syscall and callback columns from two statistics() marks."""
    d = {k: after[k] - before[k] for k in after if isinstance(after[k], int)}
    counts = {
        "poll_waits": d["poll_waits"],
        "epoll_ctl": d["epoll_ctl_add"] + d["epoll_ctl_mod"] + d["epoll_ctl_del"],
        "recv": d["recv"],
        "send": d["send"] + d["sendmsg"],
        "accept": d["accept"],
        "callbacks": d["callbacks"],
    }
    # The datagram transport's own counters (datagram=own; a loop from
    # before it has none): its reads and read events, whose ratio is the
    # datagrams a batch read, and its sends.
    for key in ("datagram_read_events", "datagram_recv", "datagram_send"):
        if key in d:
            counts[key] = d[key]
    return counts


def strace_counts(raw: dict[str, int]) -> dict[str, int]:
    return {kind: sum(raw.get(n, 0) for n in names) for kind, names in SYSCALL_KINDS.items()}


def run_one(w: Workload, loop: str, *, warmup: float, duration: float,
            syscalls: bool = False,
            rate_base: Callable[[float], float] | None = None) -> dict[str, Any]:
    """One measured run of workload *w* on *loop*: the sample's metrics.

    One server process serves every window of the run: one, or one per path
    (``w.paths``), or the open-loop client's capacity and loads (per cent of
    ``rate_base(capacity)``, by default the capacity itself)."""
    if w.server == "fairness":
        outcome: dict[str, Any] = fairness.run_once(
            loop, workers=w.workers, concurrency=w.concurrency, mode=w.mode,
            duration=duration, warmup=warmup, placement=w.placement)
        return {**outcome["metrics"], "per_worker": outcome["per_worker"],
                "client": outcome["client"], "pinned": outcome["pinned"],
                "placement": outcome["placement"]}
    server_cpu, client_cpu = cpus()
    traced: dict[str, int] = {}
    use_wrk = w.client == "wrk" and shutil.which("wrk") is not None
    with processes.processes() as started:
        server = Process(server_command(w, loop), server_cpu, checkout.import_dir(loop))
        started.append(server)

        def builtin(path: str | None = None) -> Process | None:
            if use_wrk:
                return None
            client = Process(client_command(w, warmup, duration, path), client_cpu,
                             **CLIENT_MALLOC)
            started.append(client)
            return client

        client = builtin()  # it starts up while the server does, then waits for the port
        listening = server.read()
        if "unsupported" in listening:
            raise Unsupported(listening["unsupported"])
        port = listening["listening"]
        checkout.check_package(loop, listening.get("relaxed"), ROOT)
        if w.client == "open":
            assert client is not None
            sample = _open_loop(w, loop, server, client, port, duration, rate_base)
        else:
            trace = strace(server.proc.pid, traced) if syscalls else None
            sample = _figures(w, loop, duration, *_window(w, server, client, port, w.path,
                                                          warmup, duration, client_cpu, trace))
            first = w.path.strip("/")
            for path in w.paths:
                name = path.strip("/")
                more = _figures(w, loop, duration, *_window(w, server, builtin(path), port,
                                                            path, warmup, duration, client_cpu,
                                                            None))
                sample.update({f"{key}_{name}": value for key, value in more.items()
                               if key not in ("client", "units")})
                sample[f"rate_{name}_vs_{first}"] = more["rate"] / sample["rate"]
                sample[f"cpu_{name}_vs_{first}"] = (more["cpu_us_per_unit"]
                                                    / sample["cpu_us_per_unit"])
        server.close()
    if syscalls:  # a strace run: only its counts mean anything (strace slows the server)
        return {"syscalls_strace": per_unit(strace_counts(traced), sample["units"])}
    sample.pop("units")
    return sample


def _window(w: Workload, server: Process, client: Process | None, port: int, path: str,
            warmup: float, duration: float, cpu: int | None,
            trace: contextlib.AbstractContextManager[None] | None,
            ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]:
    """One measured window on *path*, by wrk (*client* None) or the built-in
    *client*, between two marks of the server, inside *trace* if given:
    (the client's result, the marks before and after, the client's name)."""
    before: dict[str, Any] = {}
    if w.client == "idle":
        before = _mark(server)
    if client is None:
        _wrk(port, w, max(1, round(warmup)), cpu, path)  # warm-up
        client_name = wrk_version() or "wrk"
    else:
        client.say(str(port))
        client_name = client.read()["client"]
    if w.client == "idle":
        # Every connection is open and idle now: the second mark must
        # come before "go", which closes them.
        after = _mark(server)
    else:
        before = _mark(server)
    with trace or contextlib.nullcontext():
        if client is None:
            result = _wrk(port, w, max(1, round(duration)), cpu, path)
        else:
            client.say("go")
            result = client.read()
        if w.client != "idle":
            after = _mark(server)
    return result, before, after, client_name


def cpu_us(before: dict[str, Any], after: dict[str, Any], key: str = "cpu") -> int:
    """The server's CPU seconds *key* between two marks, in whole
    microseconds: getrusage's resolution, so the kernel's part ("sys") is
    never above the whole ("cpu", user + system), which float sums of the
    two times can put a rounding below it."""
    return round((after[key] - before[key]) * 1e6)


def _figures(w: Workload, loop: str, duration: float, result: dict[str, Any],
             before: dict[str, Any], after: dict[str, Any], client_name: str) -> dict[str, Any]:
    """A window's figures from the client's result and the server's marks
    (``units``: what the per-unit figures divide by); a window of *duration*
    seconds whose median request took longer, and a second or more, is a
    failed run."""
    units = float(result["requests"])
    if not units > 0:
        raise RuntimeError(f"{w.name} on {loop}: the client completed nothing")
    p50 = result.get("p50_us")
    if p50 is not None and p50 > max(duration, STALL) * 1e6:
        # A loop that stalls each request (a peer whose TLS waits for a
        # timeout) completes a few in the window: their CPU per request
        # is no figure of the workload.
        raise RuntimeError(f"{w.name} on {loop}: the median request took {p50 / 1e6:,.1f} s, "
                           f"longer than the {duration:g} s window: the load was not served")
    sample: dict[str, Any] = {"client": client_name, "units": units}
    if w.client == "idle":
        sample["bytes_per_unit"] = (after["rss"] - before["rss"]) / units
        sample["cpu_us_per_unit"] = cpu_us(before, after) / units
        return sample
    sample["rate"] = units / result["elapsed"]
    if w.unit == "MiB":
        sample["gbit_s"] = result["gbit_s"]
    sample["cpu_us_per_unit"] = cpu_us(before, after) / units
    if "sys" in after and "sys" in before:
        # The kernel's part of the CPU: a loop's system calls, which an
        # instruction count (user space only) leaves out.
        sample["sys_us_per_unit"] = cpu_us(before, after, "sys") / units
    if "minflt" in after and "minflt" in before:
        # Minor page faults: glibc serving stock's recv(256 KiB) by mmap
        # (a fault or more per read) rather than from the heap shows here.
        sample["faults_per_unit"] = (after["minflt"] - before["minflt"]) / units
    if result.get("non_2xx"):
        raise RuntimeError(f"{w.name} on {loop}: {result['non_2xx']} responses were not 2xx")
    for key in ("p50_us", "p99_us", "p999_us", "max_us", "spectrum_us", "achieved_rate",
                "client_cpu", "client_headroom", "pacer", "pacer_wait", "lag_p99_us",
                "lag_max_us", "lost", "late", "bursts", "broadcasts", "pipelines"):
        if key in result:
            sample[key] = result[key]
    if "statistics" in after:
        sample["syscalls"] = per_unit(statistics_counts(before["statistics"],
                                                        after["statistics"]), units)
    return sample


def _open_loop(w: Workload, loop: str, server: Process, client: Process,
               port: int, duration: float,
               rate_base: Callable[[float], float] | None = None) -> dict[str, Any]:
    """The open-loop windows (benchmarks.workloads.openloop) on one server
    and one client process: the capacity (closed loop, ``rate``), then each
    load of ``w.loads`` per cent of ``target_base`` (``rate_base(rate)``
    when given: another loop's capacity under ``w.rate_of``; else ``rate``)
    at ``w.arrivals``; the figures of load L carry the suffix ``_L`` and
    ``target_L`` is the rate asked for."""
    client.say(str(port))
    sample = {"client": client.read()["client"]}

    def window(command: str) -> dict[str, Any]:
        client.say(command)
        client.read()  # ready: the warm-up is over
        before = _mark(server)
        client.say("go")
        result = client.read()
        return _figures(w, loop, duration, result, before, _mark(server), sample["client"])

    sample.update(window("closed"))
    sample["target_base"] = rate_base(sample["rate"]) if rate_base else sample["rate"]
    for load in w.loads:
        target = sample["target_base"] * load / 100
        figures = window(f"open {target:.1f}")
        sample.update({f"{key}_{load}": value for key, value in figures.items()
                       if key not in ("client", "units")})
        sample[f"target_{load}"] = target
    client.close()  # the end of its input: it closes its connections and exits
    return sample


def _mark(server: Process) -> dict[str, Any]:
    server.say("mark")
    try:
        return server.read(MARK_TIMEOUT)
    except TimeoutError:
        raise TimeoutError(f"the server answered no mark within {MARK_TIMEOUT} s: it is "
                           "behind its input") from None


_WRK_TIME = re.compile(r"([\d.]+)(us|ms|s)\b")


def _wrk_us(text: str) -> float:
    m = _WRK_TIME.fullmatch(text.strip())
    if not m:
        raise ValueError(f"wrk latency {text!r}")
    return float(m.group(1)) * {"us": 1.0, "ms": 1e3, "s": 1e6}[m.group(2)]


def parse_wrk(text: str) -> dict[str, float]:
    """requests, elapsed, p50_us, p99_us from ``wrk --latency`` output."""
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", text)
    if not m:
        raise ValueError(f"unexpected wrk output:\n{text}")
    elapsed = float(m.group(2)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(3)]
    out = {"requests": float(m.group(1)), "elapsed": elapsed}
    for pct, key in (("50", "p50_us"), ("99", "p99_us")):
        lm = re.search(rf"^\s*{pct}(?:\.0+)?%\s+(\S+)", text, re.M)
        if lm:
            out[key] = _wrk_us(lm.group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", text)
    if errors:
        raise RuntimeError(f"wrk reported errors: {errors.group(0)}")
    return out


def wrk_script(w: Workload) -> str | None:
    """wrk's Lua script for *w*'s method and JSON body, or None for a GET
    without body."""
    if w.method == "GET" and not w.body:
        return None
    return (f"wrk.method = {_lua(w.method)}\nwrk.body = {_lua(w.body)}\n"
            'wrk.headers["Content-Type"] = "application/json"\n')


def _lua(text: str) -> str:
    """*text* as a Lua string literal: JSON's escapes of a str without control
    characters (\\" \\\\) are Lua's, and UTF-8 goes through as it is."""
    import json

    return json.dumps(text, ensure_ascii=False)


def _wrk(port: int, w: Workload, seconds: int, cpu: int | None,
         path: str | None = None) -> dict[str, Any]:
    scheme = "https" if w.tls else "http"  # wrk's own TLS (OpenSSL) for https-0b
    script = wrk_script(w)
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as f:
        if script:
            f.write(script)
            f.flush()
        out, _ = processes.call(
            ["wrk", "-t1", f"-c{w.concurrency}", f"-d{seconds}s", "--latency",
             *(("-s", f.name) if script else ()),
             f"{scheme}://127.0.0.1:{port}{path or w.path}"], timeout=seconds + 30, cpu=cpu)
    return parse_wrk(out)


# -- the run ------------------------------------------------------------------------

#: Metrics whose median and spread the report gives, first (when a sample
#: has them); every other number of a sample follows.
METRICS = ("rate", "gbit_s", "cpu_us_per_unit", "p50_us", "p99_us", "bytes_per_unit",
           "jain", "jain_requests", "max_min", "conns_per_s", "req_per_s",
           "server_cpu_us_per_req")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summarize(samples: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """The medians and spreads of the samples' numbers; a window's
    ``syscalls`` counts (``syscalls_two``: the window on /two) as
    ``KIND_per_unit`` (``KIND_per_unit_two``), medians only."""
    medians: dict[str, float] = {}
    spreads: dict[str, float] = {}
    keys = [*METRICS, *sorted({k for s in samples for k, v in s.items()
                               if _number(v) and k not in METRICS})]
    for key in keys:
        values = [s[key] for s in samples if _number(s.get(key)) and math.isfinite(s[key])]
        if values:
            medians[key] = statistics.median(values)
            spreads[key] = maths.spread(values)
    for name in sorted({k for s in samples for k in s if k.startswith("syscalls")}):
        nested = [s[name] for s in samples if name in s]
        suffix = name.removeprefix("syscalls")
        medians.update({f"{k}_per_unit{suffix}": statistics.median([n[k] for n in nested])
                        for k in nested[0]})
    return medians, spreads


def select(names: Sequence[str] | None, full: bool) -> list[Workload]:
    """The workloads named (shell patterns allowed: ``echo-*``), or every
    workload with *full*, each on its loops; or the default set, each on its
    ``default_loops``."""
    if names:
        unknown = [n for n in names if not fnmatch.filter(WORKLOADS, n)]
        if unknown:
            raise SystemExit(f"unknown workload(s) {', '.join(unknown)}; "
                             f"known: {', '.join(WORKLOADS)}")
        return [w for name, w in WORKLOADS.items() if any(fnmatch.fnmatchcase(name, n)
                                                           for n in names)]
    if full:
        return list(WORKLOADS.values())
    return [dataclasses.replace(w, loops=w.default_loops) for w in WORKLOADS.values()
            if w.default]


class Progress:
    """Progress lines: which run of how many, the time so far and an estimate
    of the time left (the mean time of the runs so far, times those left)."""

    def __init__(self, total: int, out: Callable[[str], None]) -> None:
        self.total = total
        self.done = 0
        self.out = out
        self.started = time.monotonic()

    def step(self, what: str) -> None:
        elapsed = time.monotonic() - self.started
        left = (f", ~{_clock(elapsed / self.done * (self.total - self.done))} left"
                if self.done else "")
        self.done += 1
        width = len(str(self.total))
        self.out(f"[{self.done:>{width}}/{self.total} {_clock(elapsed)}{left}] {what}")


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


def plan(workloads: Sequence[Workload], loop_names: Sequence[str] | None,
         baseline: Path | None) -> tuple[list[str], list[tuple[Workload, list[str]]]]:
    """(every loop of the run, [(workload, its loops in run order)]).

    A workload runs its own loops (``Workload.loops``) that ``loop_names``
    (all when None) allows, and the other loops named there that fit it
    (:func:`_fits`); with *baseline*, every relaxed preset's ``@base`` twin
    right after it, except under fairness, which forks this process.  An
    open-loop workload whose loads are per cent of another loop's capacity
    (``Workload.rate_of``) runs that loop too, named or not, and first, so
    that in each repeat its capacity is measured before the other loops'
    loads are set from it (:func:`_rate_base`).
    """
    wanted = set(loop_names) if loop_names else None
    order = list(loops.SPECS)
    all_loops = sorted({n for w in workloads for n in w.loops if not wanted or n in wanted}
                       | (wanted or set()) | {w.rate_of for w in workloads if w.rate_of},
                       key=lambda n: order.index(n) if n in order else len(order))
    if baseline:
        all_loops = [x for n in all_loops for x in (
            (n, checkout.register(n, baseline)) if loops.SPECS.get(n, None)
            and loops.SPECS[n].kind == "relaxed" else (n,))]
    runs = []
    for w in workloads:
        names = [n for n in w.loops if not wanted or n in wanted]
        if baseline and w.server != "fairness":
            names = [x for n in names for x in (n, *(b for b in all_loops
                                                    if b.startswith(n + "@")))]
        if wanted:
            names += [n for n in all_loops if n in wanted and n not in names
                      and n in loops.SPECS and _fits(w, n)]
        if w.rate_of:
            names = [w.rate_of, *(n for n in names if n != w.rate_of)]
        runs.append((w, names))
    return all_loops, runs


def run(
    workloads: Sequence[Workload],
    loop_names: Sequence[str] | None,
    *,
    duration: float,
    warmup: float,
    repeat: int,
    syscalls: bool,
    baseline: Path | None = None,
    command: Sequence[str] | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every workload on its loops; return the results document.

    *command* is the command line the document records (this process's
    when None); *progress* gets a line per run and each note."""
    started = results.now()
    all_loops, runs = plan(workloads, loop_names, baseline)
    skipped = {n: why for n in all_loops if (why := loops.missing(n))}
    for name, why in skipped.items():
        progress(f"note: loop {name} skipped: {why}")
    if syscalls and not shutil.which("strace"):
        progress("note: strace is not installed; syscall counts come from "
                 "loop.statistics() on asyncio_relaxed only")
        syscalls = False
    runs = [(w, [n for n in names if n not in skipped]) for w, names in runs]
    unable = {w.name: why for w, _ in runs
              if (why := workload_missing(w) or _reference_missing(w, skipped))}
    for why in unable.values():
        progress(f"note: {why}; skipped")
    runs = [(w, [] if w.name in unable else names) for w, names in runs]
    if any(w.tls and names for w, names in runs):
        tls.ensure()  # the certificates, once, for every child of the run
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "started": started.isoformat(timespec="seconds"),
        "command": list(command or [Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine(),
        "method": {"duration": duration, "warmup": warmup, "repeat": repeat,
                   "order": "per workload, loops interleaved in each repeat"},
        "loops": {n: {"version": loops.version(n), "kind": loops.SPECS[n].kind,
                      "settings": dict(loops.SPECS[n].settings), "about": loops.SPECS[n].about,
                      "config": loops.config(n), "build": loops.build(n),
                      **({"baseline": loops.SPECS[n].checkout} if "@" in n else {})}
                  for n in all_loops if n not in skipped},
        "defaults": loops.defaults(),
        "skipped": skipped,
        "workloads": [],
    }
    if any(w.client == "wrk" for w in workloads) and not doc["machine"]["wrk"]:
        progress("note: wrk is not installed; HTTP load comes from the built-in client")
    meter = Progress(sum(len(names) * (repeat + int(syscalls and w.syscalls))
                         for w, names in runs), progress)
    for w, names in runs:
        entry: dict[str, Any] = {"name": w.name, "about": w.about, "unit": w.unit,
                                 "params": w.params(), "loops": {}, "errors": {},
                                 "unsupported": {}}
        if w.name in unable:
            entry["skipped"] = unable[w.name]
        samples: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for r in range(repeat):
            for name in names:
                meter.step(f"{w.name:<26} {name:<18} run {r + 1}/{repeat}")
                if name in entry["unsupported"]:
                    continue
                try:
                    samples[name].append(run_one(w, name, warmup=warmup, duration=duration,
                                                 rate_base=_rate_base(w, name, samples)))
                except Unsupported as exc:
                    entry["unsupported"][name] = str(exc)
                    progress(f"  not run: {exc}")
                except Exception as exc:  # one failed run must not lose the others
                    entry["errors"].setdefault(name, []).append(f"{type(exc).__name__}: {exc}")
                    progress(f"  failed: {type(exc).__name__}: {exc}")
        for name in names:
            if not samples[name]:
                continue
            medians, spreads = summarize(samples[name])
            entry["loops"][name] = {"samples": samples[name], "median": medians,
                                    "spread": spreads, "client": samples[name][0]["client"]}
        if syscalls and w.syscalls:
            for name in names:
                meter.step(f"{w.name:<26} {name:<18} strace -c")
                if name not in entry["loops"]:
                    continue
                try:
                    traced = run_one(w, name, warmup=warmup, duration=min(duration, STRACE_WINDOW),
                                     syscalls=True)
                except Exception as exc:
                    entry["errors"].setdefault(name, []).append(f"strace: {exc}")
                    continue
                entry["loops"][name]["syscalls_strace"] = traced["syscalls_strace"]
        doc["workloads"].append(entry)
    doc["finished"] = results.now().isoformat()
    return doc


def _reference_missing(w: Workload, skipped: dict[str, str]) -> str | None:
    """Why the loop whose capacity *w*'s loads are per cent of cannot run
    here, or None."""
    if w.rate_of and w.rate_of in skipped:
        return (f"{w.name} sets its rates from {w.rate_of}'s capacity, and {w.rate_of} is "
                f"skipped: {skipped[w.rate_of]}")
    return None


def _rate_base(w: Workload, loop: str,
               samples: dict[str, list[dict[str, Any]]]) -> Callable[[float], float] | None:
    """What *w*'s loads on *loop* are per cent of, from the loop's own
    capacity: None (the capacity itself) unless ``w.rate_of`` names a loop.
    Then the median of that loop's capacities measured so far in the run
    (*samples*, its first in each repeat: :func:`plan`), with, on that loop
    itself, the one it has just measured: in each repeat every loop gets the
    same rates."""
    if not w.rate_of:
        return None
    if loop == w.rate_of:
        earlier = [s["rate"] for s in samples[loop]]
        return lambda own: statistics.median([*earlier, own])
    measured = [s["rate"] for s in samples.get(w.rate_of, [])]
    if not measured:
        raise RuntimeError(f"{w.name}: no capacity of {w.rate_of} measured in this run "
                           "to set the rates from")
    reference = statistics.median(measured)
    return lambda own: reference


def _fits(w: Workload, loop: str) -> bool:
    """An accept preset only where accept matters, a datagram preset only
    on a UDP workload, a write preset elsewhere, a floor only where it has a
    server (LoopSpec.serves)."""
    spec = loops.SPECS[loops.preset(loop)]
    if spec.kind == "floor":
        return w.serves in spec.serves
    settings = loops.SPECS[loops.preset(loop)].settings
    accept_workload = w.client in ("churn", "fairness")
    if any(key.startswith("datagram") for key in settings):
        return w.client == "udp"
    return not (("accept" in settings) and not accept_workload)
