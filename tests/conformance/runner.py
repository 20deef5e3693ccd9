"""Compare CPython's asyncio test suite on the stock loop vs asyncio_relaxed.Loop.

On PyPy the suite is PyPy's own test.test_asyncio on PyPy's stock loop.

    python -m tests.conformance.runner [--python PATH ...]
        [--modes stock,eager,deferred,eager-pure] [--pure-on PATH ...]
        [--modules test_events ...] [--jobs 2] [--timeout 600] [--test-timeout 60]
        [--stock-from earlier.json] [--json out.json] [--logdir DIR]

One swap.py process per (python, module, mode).  A relaxed mode is a write
setting (eager, deferred) on the build the package chose (compiled on
CPython); with ``-pure`` after it, on the pure-Python build
(ASYNCIO_RELAXED_NO_EXTENSIONS=1); ``--pure-on PATH`` adds each relaxed
mode's ``-pure`` twin on that interpreter alone, in the same pool and
against the same stock run.  ``--stock-from`` takes the stock runs of an
earlier ``--json`` (a rerun under one of our settings, which the stock loop
does not read).  Exit status is 0 only if every
relaxed run matches stock (passed, skipped, failed+errors) and created loops.
A test that runs past --test-timeout is reported by name as hung (a failure),
and the module goes on after it in a new process.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWAP = os.path.join(ROOT, "tests", "conformance", "swap.py")
MARKER = "CONFORMANCE_RESULT "
MODULES = ["test_events", "test_sock_lowlevel", "test_sendfile", "test_server", "test_streams",
           "test_base_events", "test_sslproto", "test_unix_events", "test_subprocess",
           "test_tasks", "test_buffered_proto", "test_runners", "test_ssl",
           "test_server_context"]  # the last: 3.15+
# Measured stock wall seconds on a 2-core box (the rest take <= 4 s);
# only used to start the slow runs first.
COST = {"test_tasks": 16, "test_subprocess": 15, "test_events": 8, "test_ssl": 8,
        "test_sslproto": 5}
#: Differences that are the chosen semantics of a setting, not a fault, each
#: with its reason: (mode, test id) -> why.  The run still lists them.
EXPECTED: dict[tuple[str, str], str] = {
    ("deferred", "test.test_asyncio.test_sslproto.SslProtoHandshakeTests."
                 "test_connection_lost_when_busy"):
        "write=deferred sends at the end of the iteration: the BrokenPipeError of the "
        "test's first write() surfaces after its second write() and drain(), which the "
        "test expects to fail already (stock sends from write() itself)",
}
# tls=own: a test that reaches into stock's SSLProtocol class, which carries no
# connection there (the loop's own TLS transport does).
_STOCK_SSLPROTOCOL_ONLY = (
    "the test patches sslproto.SSLProtocol.connection_made to find the socket's "
    "transport, and tls=own carries TLS without an SSLProtocol (its own test: "
    "tests/test_tls.py, a failed handshake leaves no cycle)")
for _mode in ("eager", "deferred"):
    EXPECTED[(_mode, "test.test_asyncio.test_sslproto.SelectorStartTLSTests."
                     "test_create_connection_ssl_failed_certificate_no_cycles")] = (
        _STOCK_SSLPROTOCOL_ONLY)
#: Hung tests one (python, module, mode) run may step over before it gives up.
MAX_HANGS = 10
_COUNTS = ("run", "failures", "errors", "skipped", "expected_failures", "unexpected_successes",
           "passed")
# (python minor, module) pairs whose tests build every loop by hand (BaseEventLoop mocks),
# so zero swapped loops is expected there and not a swap failure.
ZERO_LOOPS_OK = {("3.10", "test_runners"), ("3.11", "test_runners"), ("3.12", "test_runners")}
Key = tuple[str, str, str]  # (python path, module, mode)


def probe(python: str) -> tuple[str | None, list[str]]:
    """Return (label, modules present) or (None, [reason]); the label is the
    version, after the implementation's name where that is not CPython."""
    try:
        p = subprocess.run([python, SWAP, "--probe"], capture_output=True, text=True,
                           timeout=60)
    except OSError as exc:
        return None, [str(exc)]
    if p.returncode:
        return None, [(p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]]
    version, implementation, modules = p.stdout.splitlines()[:3]
    label = version if implementation == "CPython" else f"{implementation}-{version}"
    IMPLEMENTATIONS[python] = implementation
    return label, modules.split()


#: Each probed interpreter's implementation (CPython, PyPy).
IMPLEMENTATIONS: dict[str, str] = {}


def run_child(cmd: list[str], cwd: str, env: dict[str, str], timeout: float, log: str,
              marker: str) -> tuple[dict | None, object]:
    """Run *cmd*, its stderr then its stdout into *log*: the JSON summary of
    its last stdout line that starts with *marker* (None without one), and
    its exit status ("timeout" after *timeout* seconds)."""
    with open(log, "w") as fh:
        try:
            p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=fh,
                               text=True, timeout=timeout)
            out, rc = p.stdout, p.returncode
        except subprocess.TimeoutExpired as exc:
            out, rc = (exc.stdout or b"").decode(errors="replace"), "timeout"
        fh.write(out)
    lines = [ln for ln in out.splitlines() if ln.startswith(marker)]
    return (json.loads(lines[-1][len(marker):]) if lines else None), rc


def run_one(python: str, module: str, mode: str, timeout: float, test_timeout: float,
            logdir: str, tests: list[str] | None = None, tag: str = "") -> dict:
    """Run *module* (or *tests*) once; after a hang, the rest of it, merged."""
    res = run_part(python, module, mode, timeout, test_timeout, logdir, tests, tag)
    hung: list[str] = []
    while res.get("hung") and len(hung) < MAX_HANGS and not tests:
        hung.append(res.pop("hung"))
        rest = run_part(python, module, mode, timeout, test_timeout, logdir, None,
                        f"{tag}-after{len(hung)}", after=hung[-1])
        if rest.get("error"):
            return rest
        for name in _COUNTS:
            res[name] = res.get(name, 0) + rest.get(name, 0)
        for name in ("bad", "skipped_names"):
            res[name] = sorted({*res.get(name, ()), *rest.get(name, ())})
        if res.get("loops_created") is not None:
            res["loops_created"] += rest.get("loops_created") or 0
            res["write_seen"] = sorted({*res.get("write_seen", ()), *rest.get("write_seen", ())})
            res["builds_seen"] = sorted({*res.get("builds_seen", ()),
                                         *rest.get("builds_seen", ())})
        res["wall"] = res.get("wall", 0) + rest.get("wall", 0)
        res["hung"] = rest.get("hung")
    if res.get("hung"):
        hung.append(res.pop("hung"))
    res["hung_tests"] = hung
    return res


def run_part(python: str, module: str, mode: str, timeout: float, test_timeout: float,
             logdir: str, tests: list[str] | None = None, tag: str = "",
             after: str | None = None) -> dict:
    env = dict(os.environ)  # PYTHONASYNCIODEBUG / PYTHONWARNINGS pass through untouched
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env.pop("ASYNCIO_RELAXED_WRITE", None)
    env.pop("ASYNCIO_RELAXED_NO_EXTENSIONS", None)
    if mode != "stock":
        env["ASYNCIO_RELAXED_WRITE"] = write_mode(mode)
        if mode.endswith(PURE):
            env["ASYNCIO_RELAXED_NO_EXTENSIONS"] = "1"
    cmd = [python, SWAP, module, "--mode", "stock" if mode == "stock" else "relaxed",
           "--timeout", str(max(timeout - 10, 1)),  # faulthandler fires first: tracebacks in log
           "--test-timeout", str(test_timeout)]
    if tests:
        cmd += ["--tests", *tests]
    if after:
        cmd += ["--after", after]
    log = os.path.join(logdir, f"{os.path.basename(os.path.dirname(os.path.dirname(python)))}"
                               f"-{module}-{mode}{tag}.log")
    start = time.monotonic()
    res, rc = run_child(cmd, ROOT, env, timeout, log, MARKER)
    if res is None:  # name the test that was running (verbose unittest prints "name (id) ... ")
        with open(log, errors="replace") as fh:
            started = [ln.split(" ... ")[0] for ln in fh if " ... " in ln]
        res = {"error": f"no result (rc={rc}, last test: {started[-1] if started else '-'})"}
    res.update(wall=round(time.monotonic() - start, 1), log=log)
    return res


#: A mode's suffix that runs it on the pure-Python build (ASYNCIO_RELAXED_NO_EXTENSIONS=1);
#: without it a relaxed mode runs the build the package chose (compiled on CPython).
PURE = "-pure"


def write_mode(mode: str) -> str:
    """The write setting of a relaxed *mode* ("eager", "deferred-pure"...)."""
    return mode.removesuffix(PURE)


def expected_build(mode: str, implementation: str) -> str:
    """The build a relaxed *mode*'s loops must be of: the pure one for a
    ``-pure`` mode and wherever no compiled module exists (PyPy)."""
    return "pure" if mode.endswith(PURE) or implementation != "CPython" else "compiled"


def outcome(res: dict) -> tuple | None:
    return None if res.get("error") else (res["passed"], res["skipped"], len(res["bad"]))


def resolve(py: str, mod: str, mode: str, res: dict, timeout: float, test_timeout: float,
            logdir: str) -> list[str]:
    """Rerun tests whose outcome differs once in both modes; return confirmed regressions."""
    stock, rel = res[(py, mod, "stock")], res[(py, mod, mode)]
    diff = sorted(set(stock["bad"]) ^ set(rel["bad"]))
    rerun = [t for t in diff if " " not in t]  # "setUpClass (x.Y)" holders are not loadable
    if rerun:
        again = {m: run_one(py, mod, m, timeout, test_timeout, logdir, rerun, "-rerun")
                 for m in ("stock", mode)}
        if any(a.get("error") for a in again.values()):
            return diff
        s2, r2 = set(again["stock"]["bad"]), set(again[mode]["bad"])
        # Flaky = outcome changed between runs in either mode; only stable differences count.
        stable = [t for t in rerun if (t in stock["bad"]) == (t in s2)
                  and (t in rel["bad"]) == (t in r2)]
        diff = [t for t in diff if t not in rerun] + stable
    rel["confirmed_diff"] = diff
    return [t for t in diff if t in rel["bad"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", help="interpreter path (repeatable)")
    ap.add_argument("--modes", default="stock,eager,deferred")
    ap.add_argument("--modules", nargs="+", default=MODULES)
    ap.add_argument("--jobs", type=int, default=2)
    # Slowest stock module takes ~16 s; the per-test watchdog catches a hang
    # first, this only a process that hangs outside a test.
    ap.add_argument("--timeout", type=float, default=600, help="per-process seconds")
    # Stock's slowest single test takes ~5 s here.
    ap.add_argument("--test-timeout", type=float, default=60, help="per-test seconds")
    ap.add_argument("--pure-on", action="append", default=[], metavar="PATH",
                    help="on this --python, run each relaxed mode on the pure build too "
                    "(MODE-pure; repeatable)")
    ap.add_argument("--stock-from", metavar="JSON",
                    help="take each stock run from this earlier --json where it has one "
                    "(the same interpreter and module) instead of running it again")
    ap.add_argument("--json", help="save all results here")
    ap.add_argument("--logdir", help="per-run logs (default: a new temp dir)")
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    logdir = a.logdir or tempfile.mkdtemp(prefix="conformance-")
    os.makedirs(logdir, exist_ok=True)
    pythons = a.python or sorted(glob.glob("/root/.pyenv/versions/3.1[1-3].*/bin/python"),
                                 key=lambda p: [int(x) for x in p.split("/")[-3].split(".")])
    pythons = pythons or [sys.executable]

    unknown = sorted(set(a.pure_on) - set(pythons))
    if unknown:
        ap.error(f"--pure-on {unknown[0]} is not one of the --python interpreters")
    twins = [m + PURE for m in modes if m != "stock" and not m.endswith(PURE)]
    columns = modes + [m for m in twins if a.pure_on and m not in modes]

    def modes_of(py: str) -> list[str]:
        return modes + [m for m in twins if m not in modes] if py in a.pure_on else modes

    reused: dict[Key, dict] = {}
    if a.stock_from:
        with open(a.stock_from) as fh:
            reused = {(r["python_path"], r["module"], "stock"): r for r in json.load(fh)
                      if r.get("run_mode") == "stock" and "module" in r
                      and not r.get("error")}

    versions: dict[str, str] = {}
    jobs: list[Key] = []
    for py in pythons:
        version, present = probe(py)
        if version is None:
            print(f"SKIP {py}: no test.test_asyncio ({present[0]})")
            continue
        versions[py] = version
        jobs += [(py, m, mode) for m in a.modules if m in present for mode in modes_of(py)]
        missing = [m for m in a.modules if m not in present]
        if missing:
            print(f"note: {version} lacks {', '.join(missing)}")
    jobs.sort(key=lambda k: -COST.get(k[1], 5))  # longest first packs the pool better
    res: dict[Key, dict] = {k: reused[k] for k in jobs if k in reused}
    jobs = [k for k in jobs if k not in res]
    print(f"{len(jobs)} runs, {a.jobs} at a time, logs in {logdir}"
          + (f"; {len(res)} stock runs from {a.stock_from}" if a.stock_from else ""),
          flush=True)
    t0 = time.monotonic()
    with ThreadPoolExecutor(a.jobs) as pool:
        futs = {k: pool.submit(run_one, *k, a.timeout, a.test_timeout, logdir) for k in jobs}
        res.update({k: f.result() for k, f in futs.items()})

    ok, regressions = True, {}
    expected: set[tuple[str, str]] = set()
    def cell(r: dict) -> str:
        return ("ERR" if r.get("error") else "{}/{}/{}".format(*outcome(r))) + f" {r['wall']:.0f}s"

    width = max([8, *map(len, versions.values())])
    hdr = f"{'python':{width}} {'module':20} " + " ".join(f"{m + ' p/s/f':>20}" for m in columns)
    print("\n" + hdr + f" {'loops':>11}  diff\n" + "-" * (len(hdr) + 18))
    for py, version in versions.items():
        for mod in (m for m in a.modules if (py, m, modes[0]) in res):
            row = {m: res[(py, mod, m)] for m in modes_of(py)}
            marks = []
            for mode, r in row.items():
                if r.get("error"):
                    ok = False
                    marks.append(f"{mode}:{r['error']} (log {r['log']})")
                if mode == "stock" or r.get("error"):
                    continue
                # Zero loops means the swap missed this module's loop construction path.
                minor = version.rsplit("-", 1)[-1].rsplit(".", 1)[0]
                if not r["loops_created"] and (minor, mod) not in ZERO_LOOPS_OK:
                    ok = False
                    marks.append(f"{mode}:0 loops")
                if r.get("write_seen", [write_mode(mode)]) not in ([], [write_mode(mode)]):
                    ok = False
                    marks.append(f"{mode}:loops used write={r['write_seen']}")
                build = expected_build(mode, IMPLEMENTATIONS.get(py, "CPython"))
                if r.get("builds_seen", [build]) not in ([], [build]):
                    ok = False
                    marks.append(f"{mode}:loops of the {'/'.join(r['builds_seen'])} build")
                s = row.get("stock", {"error": "not run"})
                if s.get("error"):
                    continue
                for name in r.get("hung_tests", ()):
                    ok = False
                    marks.append(f"{mode}:HUNG {name}")
                if outcome(r) != outcome(s) or r["bad"] != s["bad"]:
                    regressed = resolve(py, mod, mode, res, a.timeout, a.test_timeout, logdir)
                    allowed = [t for t in r["confirmed_diff"]
                               if (write_mode(mode), t) in EXPECTED]
                    for name in allowed:
                        expected.add((write_mode(mode), name))
                    r["confirmed_diff"] = [t for t in r["confirmed_diff"] if t not in allowed]
                    regressed = [t for t in regressed if t not in allowed]
                    if allowed and not r["confirmed_diff"]:
                        marks.append(f"{mode}:expected")
                    elif (r["confirmed_diff"]
                          or (r["skipped"], r["run"]) != (s["skipped"], s["run"])):
                        ok = False
                        marks.append(f"{mode}:DIFF")
                        skips = set(r["skipped_names"]) ^ set(s["skipped_names"])
                        regressions[(version, mod, mode)] = regressed + [
                            f"skip differs: {n}" for n in sorted(skips)]
                    elif not allowed:
                        marks.append(f"{mode}:flaky-only")
            loops = "/".join(str(r.get("loops_created")) for m, r in row.items() if m != "stock")
            cells = (cell(row[m]) if m in row else "-" for m in columns)
            print(f"{version:{width}} {mod:20} " + " ".join(f"{c:>20}" for c in cells)
                  + f" {loops or '-':>11}  {' '.join(marks)}")
    print(f"\ntotal wall {time.monotonic() - t0:.0f}s")
    for mode, name in sorted(expected):
        print(f"\nexpected difference [{mode}] {name}:\n  {EXPECTED[(mode, name)]}")
    for (version, mod, mode), names in regressions.items():
        print(f"\n{version} {mod} [{mode}] fails under relaxed but passes under stock:")
        print("\n".join(f"  {n}" for n in names)
              or "  (none: only skips, test counts or stock-only failures differ)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump([{"python_path": k[0], "module": k[1], "run_mode": k[2], **v}
                       for k, v in res.items()],
                      fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
