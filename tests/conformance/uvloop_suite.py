"""uvloop's own tests of asyncio's loop (its AIO classes), on stock vs asyncio_relaxed.Loop.

    python -m tests.conformance.uvloop_suite [--modules test_udp test_process]
        [--modes stock,eager,deferred] [--test-timeout 60] [--timeout 900]
        [--workdir DIR] [--keep]

A run takes 12-15 s on CPython 3.11.7-3.13.0 here with uvloop 0.23.0, the
download included (test_udp: 8 passed, 2 skipped; test_process: 39 passed,
38 and a skip on 3.13), each mode the same as stock.

uvloop's sdist carries its tests (``tests/test_udp.py``, ``tests/test_process.py``
...), written against ``uvloop._testbase``: each ``Test_AIO_*`` class is an
``AIOTestCase``, which runs the test on ``asyncio.new_event_loop()``.  This
downloads the sdist of the installed uvloop version with pip into a temporary
directory (nothing of uvloop's is kept or committed), extracts the named
modules, runs every AIOTestCase class in them once on stock's loop and once
per mode on ours (``asyncio.new_event_loop()``, the policy's factory and
``SelectorEventLoop`` point at a counting ``asyncio_relaxed.Loop``: swap.py's
``install_swap``; each test's ``setUp`` checks that its loop is ours), and
compares the outcome of each test id.  Exit status 0 only if every mode's
outcomes equal stock's (a difference seen in one run is run again in both
modes, and only a difference seen both times counts, as runner.py does) and
every test of ours ran on our loop.

A test that runs past ``--test-timeout`` is reported by name as hung (a
failure) and the module goes on after it in a new process.  Where uvloop is
not installed (PyPy: it has no build there) this prints a note and exits 0.
``test_process`` imports psutil: where it is missing, pip installs it into the
temporary directory (``--target``), not into the interpreter.

One process per (module, mode): ``--child`` is that process's entry point.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import faulthandler
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import unittest
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MARKER = "UVLOOP_SUITE_RESULT "
# The conformance runner's pieces, by path (this folder is not a package's
# import root in the child, whose "tests" is uvloop's).
sys.path.insert(0, HERE)
import swap  # noqa: E402  (tests/conformance/swap.py)
from runner import run_child  # noqa: E402  (tests/conformance/runner.py)

MODULES = ["test_udp", "test_process"]
#: Hung tests one (module, mode) run may step over before it gives up.
MAX_HANGS = 5


# -- the child: one module in one mode ------------------------------------------------


class OutcomeResult(swap.WatchedResult):
    """Each test id's outcome (WatchedResult: the test running now, for the
    watchdog)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, str] = {}

    def _set(self, test: Any, outcome: str) -> None:
        name = getattr(test, "test_case", test).id()  # a subtest counts for its test
        if self.outcomes.get(name) in ("fail", "error") and outcome == "pass":
            return
        self.outcomes[name] = outcome

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._set(test, "pass")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._set(test, "fail")

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._set(test, "error")

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._set(test, "skip")

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._set(test, "xfail")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self._set(test, "xpass")

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._set(test, "fail" if issubclass(err[0], test.failureException) else "error")


def child(args: argparse.Namespace) -> int:
    # As swap.py: a process started in the background of a non-interactive
    # shell begins with SIGINT ignored, and one under nohup with SIGHUP
    # ignored, which the children it spawns inherit (test_send_signal's
    # SIGHUP then never ends its child): each to Python's own default.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    summary: dict[str, Any] = {"module": args.child, "mode": args.mode, "outcomes": {},
                               "loops_created": None, "not_ours": [], "hung": None}
    # uvloop's tests/ first: its modules import as "tests.test_udp", as in uvloop's tree
    # (this checkout's own tests/ package is not imported here).
    sys.path.insert(0, args.dir)
    if args.site:
        sys.path.insert(1, args.site)
    from uvloop import _testbase as tb

    not_ours: list[str] = []
    if args.mode != "stock":
        import asyncio_relaxed

        swap.install_swap()
        original_setup = tb.AIOTestCase.setUp

        def setUp(self: Any) -> None:
            original_setup(self)
            if not isinstance(self.loop, asyncio_relaxed.PyLoop):
                not_ours.append(self.id())

        tb.AIOTestCase.setUp = setUp  # type: ignore[method-assign]
        # "Is this asyncio's loop (not uvloop's)?": uvloop's tests ask it of the
        # loop's module name, to expect asyncio's behaviour where uvloop's differs
        # (test_udp's test_socketpair: stock refuses sendto() without an address on
        # a socketpair, uvloop sends).  Ours is held to asyncio's.
        original_is_asyncio = tb.BaseTestCase.is_asyncio_loop

        def is_asyncio_loop(self: Any) -> bool:
            return isinstance(self.loop, asyncio_relaxed.PyLoop) or original_is_asyncio(self)

        tb.BaseTestCase.is_asyncio_loop = is_asyncio_loop  # type: ignore[method-assign]

    module = __import__(f"tests.{args.child}", fromlist=["*"])
    loader = unittest.TestLoader()
    classes = [obj for obj in vars(module).values()
               if isinstance(obj, type) and issubclass(obj, tb.AIOTestCase)
               and obj is not tb.AIOTestCase and obj.__module__ == module.__name__]
    tests = [t for cls in sorted(classes, key=lambda c: c.__name__)
             for t in swap.flatten(loader.loadTestsFromTestCase(cls))]
    if args.tests:
        tests = [t for t in tests if t.id() in set(args.tests)]
    if args.after:
        ids = [t.id() for t in tests]
        tests = tests[ids.index(args.after) + 1:] if args.after in ids else tests

    def report(result: OutcomeResult) -> None:
        summary["outcomes"] = dict(result.outcomes)
        summary["not_ours"] = sorted(set(not_ours))
        if args.mode != "stock":
            summary["loops_created"] = swap.loops_created
            summary["write_seen"] = sorted(swap.write_seen)

    def watch(result: OutcomeResult) -> None:
        while True:
            time.sleep(min(1.0, args.test_timeout / 4))
            test = result.current
            if test is not None and time.monotonic() - result.started > args.test_timeout:
                sys.stderr.write(f"\nWATCHDOG: {test.id()} ran past {args.test_timeout:.0f} s;"
                                 " tracebacks:\n")
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                sys.stderr.flush()
                report(result)
                summary["hung"] = test.id()
                summary["outcomes"][test.id()] = "hung"
                print(MARKER + json.dumps(summary), flush=True)
                os._exit(3)

    class Runner(unittest.TextTestRunner):
        def _makeResult(self) -> OutcomeResult:
            result = super()._makeResult()
            threading.Thread(target=watch, args=(result,), daemon=True).start()
            return result  # type: ignore[return-value]

    # verbosity 2 on stderr: the last "... " line in the log names a test that hung.
    runner = Runner(stream=sys.stderr, verbosity=2, resultclass=OutcomeResult)
    result: Any = runner.run(unittest.TestSuite(tests))
    report(result)
    sys.stderr.flush()
    print(MARKER + json.dumps(summary), flush=True)
    # A test that failed may leave an executor's thread blocked (test_socketpair's
    # s2.recv when no datagram came), which the interpreter would join at exit
    # forever: the result is out, so exit now.
    os._exit(0)


# -- the parent: fetch, run, compare --------------------------------------------------


def fetch(version: str, workdir: str, modules: list[str]) -> tuple[str, list[str]]:
    """The sdist of uvloop *version*, its tests/ extracted into workdir/tests;
    (the folder to put on sys.path, the modules found)."""
    download = os.path.join(workdir, "sdist")
    # --no-binary for uvloop alone: with ":all:" pip would build its build
    # requirements (Cython) from source too, to prepare the sdist's metadata
    # (minutes of C compiling on 3.12 and 3.13).
    p = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary",
                        "uvloop", "--no-deps", f"uvloop=={version}", "-d", download],
                       capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise SystemExit("pip could not download uvloop's sdist:\n"
                         + "\n".join(p.stderr.strip().splitlines()[-15:]))
    (archive,) = (os.path.join(download, f) for f in os.listdir(download))
    target = os.path.join(workdir, "src")
    tests = os.path.join(target, "tests")
    os.makedirs(tests)
    with tarfile.open(archive) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
        wanted = {"tests/__init__.py"}
        found = []
        for name in modules:
            path = f"tests/{name}.py"
            if path in members:
                wanted.add(path)
                found.append(name)
        # What the modules import from tests/ (uvloop's tests/ has no such imports
        # today; a later version's are taken along).
        todo = list(wanted)
        while todo:
            fh = tar.extractfile(members[todo.pop()])
            assert fh is not None
            for node in ast.walk(ast.parse(fh.read())):
                names: list[str] = []
                if isinstance(node, ast.ImportFrom):
                    if node.level == 1 or node.module == "tests":
                        names = [f"tests/{a.name}.py" for a in node.names]
                        if node.module and node.level == 1:
                            names = [f"tests/{node.module.replace('.', '/')}.py"]
                    elif node.module and node.module.startswith("tests."):
                        names = [node.module.replace(".", "/") + ".py"]
                for path in names:
                    if path in members and path not in wanted:
                        wanted.add(path)
                        todo.append(path)
        for path in sorted(wanted):
            fh = tar.extractfile(members[path])
            assert fh is not None
            with open(os.path.join(target, path), "wb") as out:
                out.write(fh.read())
        if "tests/certs/ssl_cert.pem" in members:  # the TLS modules' certificates
            os.makedirs(os.path.join(tests, "certs"))
            for name in ("ssl_cert.pem", "ssl_key.pem"):
                fh = tar.extractfile(members[f"tests/certs/{name}"])
                assert fh is not None
                with open(os.path.join(tests, "certs", name), "wb") as out:
                    out.write(fh.read())
    return target, found


def psutil_site(workdir: str) -> tuple[str | None, str | None]:
    """(a folder to add to sys.path, or None if psutil imports already; why not, if it
    cannot be had)."""
    if importlib.util.find_spec("psutil") is not None:
        return None, None
    site = os.path.join(workdir, "site")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", site,
                        "--only-binary", ":all:", "psutil"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode:
        return None, f"psutil cannot be installed: {p.stderr.strip().splitlines()[-1:]}"
    return site, None


def run_part(module: str, mode: str, src: str, site: str | None, logdir: str,
             test_timeout: float, timeout: float, tests: list[str] | None = None,
             after: str | None = None, tag: str = "") -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env.pop("ASYNCIO_RELAXED_WRITE", None)
    if mode != "stock":
        env["ASYNCIO_RELAXED_WRITE"] = mode
    cmd = [sys.executable, os.path.abspath(__file__), "--child", module, "--mode", mode,
           "--dir", src, "--test-timeout", str(test_timeout), "--timeout", str(timeout)]
    if site:
        cmd += ["--site", site]
    if tests:
        cmd += ["--tests", *tests]
    if after:
        cmd += ["--after", after]
    log = os.path.join(logdir, f"{module}-{mode}{tag}.log")
    start = time.monotonic()
    found, rc = run_child(cmd, src, env, timeout + 30, log, MARKER)
    res: dict[str, Any] = found or {"error": f"no result (rc={rc}; log {log})"}
    res["wall"] = time.monotonic() - start
    res["log"] = log
    return res


def run_one(module: str, mode: str, src: str, site: str | None, logdir: str,
            test_timeout: float, timeout: float, tests: list[str] | None = None,
            tag: str = "") -> dict[str, Any]:
    """*module* (or *tests*) in *mode*; after a hang, the rest of it, merged."""
    res = run_part(module, mode, src, site, logdir, test_timeout, timeout, tests, tag=tag)
    hung: list[str] = []
    while res.get("hung") and not res.get("error") and len(hung) < MAX_HANGS:
        hung.append(res["hung"])
        rest = run_part(module, mode, src, site, logdir, test_timeout, timeout, tests,
                        after=hung[-1], tag=f"{tag}-after{len(hung)}")
        if rest.get("error"):
            return rest
        res["outcomes"].update(rest["outcomes"])
        res["not_ours"] = sorted({*res["not_ours"], *rest["not_ours"]})
        if res.get("loops_created") is not None:
            res["loops_created"] += rest.get("loops_created") or 0
        res["wall"] += rest["wall"]
        res["hung"] = rest.get("hung")
    if res.get("hung"):
        hung.append(res["hung"])
    res["hung_tests"] = hung
    return res


def differences(stock: dict[str, str], ours: dict[str, str]) -> list[str]:
    return sorted(t for t in set(stock) | set(ours) if stock.get(t) != ours.get(t))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modules", nargs="+", default=MODULES)
    ap.add_argument("--modes", default="stock,eager,deferred")
    ap.add_argument("--test-timeout", type=float, default=60, help="per-test seconds")
    ap.add_argument("--timeout", type=float, default=900, help="per-process seconds")
    ap.add_argument("--workdir", help="where the sdist goes (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the workdir and the logs (kept anyway after a difference)")
    # the child's
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--site", help=argparse.SUPPRESS)
    ap.add_argument("--tests", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--after", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)

    if importlib.util.find_spec("uvloop") is None:
        print(f"note: uvloop is not installed on {sys.implementation.name} "
              f"{sys.version.split()[0]}; its suite is not run here")
        return 0
    from importlib.metadata import version

    uv_version = version("uvloop")
    modes = [m for m in a.modes.split(",") if m]
    if modes[:1] != ["stock"]:
        modes.insert(0, "stock")
    workdir = a.workdir or tempfile.mkdtemp(prefix="uvloop-suite-")
    os.makedirs(workdir, exist_ok=True)
    logdir = os.path.join(workdir, "logs")
    os.makedirs(logdir, exist_ok=True)
    t0 = time.monotonic()
    ok = True
    try:
        src, modules = fetch(uv_version, workdir, a.modules)
        for name in sorted(set(a.modules) - set(modules)):
            print(f"note: uvloop {uv_version}'s sdist has no tests/{name}.py")
        site, why = psutil_site(workdir) if "test_process" in modules else (None, None)
        if why:
            print(f"note: test_process skipped: {why}")
            modules.remove("test_process")
        print(f"uvloop {uv_version}'s tests, python {sys.version.split()[0]}: "
              f"{', '.join(modules)} in {', '.join(modes)} (logs in {logdir})", flush=True)
        report: list[str] = []
        for module in modules:
            res = {mode: run_one(module, mode, src, site, logdir, a.test_timeout, a.timeout)
                   for mode in modes}
            stock = res["stock"]
            for mode in modes:
                r = res[mode]
                if r.get("error"):
                    ok = False
                    report.append(f"{module} [{mode}]: {r['error']}")
                    continue
                counts: dict[str, int] = {}
                for outcome in r["outcomes"].values():
                    counts[outcome] = counts.get(outcome, 0) + 1
                line = f"{module:14} {mode:9} " + " ".join(
                    f"{k} {v}" for k, v in sorted(counts.items())) + f"  ({r['wall']:.0f} s)"
                marks = []
                if mode != "stock":
                    if not r.get("loops_created"):
                        ok = False
                        marks.append("NO LOOP OF OURS CREATED")
                    if r["not_ours"]:
                        ok = False
                        marks.append(f"{len(r['not_ours'])} tests not on our loop")
                    if r.get("write_seen", [mode]) not in ([], [mode]):
                        ok = False
                        marks.append(f"loops used write={r['write_seen']}")
                    if not stock.get("error"):
                        diff = differences(stock["outcomes"], r["outcomes"])
                        if diff:  # once more, both modes: only a stable difference counts
                            again = {m: run_one(module, m, src, site, logdir, a.test_timeout,
                                                a.timeout, diff, tag="-rerun")
                                     for m in ("stock", mode)}
                            if any(x.get("error") for x in again.values()):
                                stable = diff
                            else:
                                stable = [t for t in diff
                                          if again["stock"]["outcomes"].get(t)
                                          == stock["outcomes"].get(t)
                                          and again[mode]["outcomes"].get(t)
                                          == r["outcomes"].get(t)]
                            if stable:
                                ok = False
                                marks.append(f"DIFF {len(stable)}")
                                report += [f"{module} [{mode}] {t}: stock "
                                           f"{stock['outcomes'].get(t, 'not run')}, ours "
                                           f"{r['outcomes'].get(t, 'not run')}" for t in stable]
                            else:
                                marks.append(f"flaky-only {len(diff)}")
                for name in r.get("hung_tests", ()):
                    ok = ok and mode == "stock"
                    marks.append(f"HUNG {name}")
                print(line + ("  " + "; ".join(marks) if marks else ""), flush=True)
                if mode == "stock":
                    bad = sorted(t for t, o in r["outcomes"].items()
                                 if o in ("fail", "error", "hung", "xpass"))
                    if bad:
                        print("  failing on stock too (compared, not counted against ours): "
                              + ", ".join(t.rsplit(".", 2)[-2] + "." + t.rsplit(".", 1)[-1]
                                          for t in bad))
        print(f"total wall {time.monotonic() - t0:.0f} s")
        for line in report:
            print(line)
        print("uvloop suite: " + ("ours matches stock" if ok else "DIFFERENCES (above)"))
    finally:
        if ok and not a.keep and not a.workdir:
            with contextlib.suppress(OSError):
                shutil.rmtree(workdir)
        else:
            print(f"kept: {workdir} (the sdist's tests and the logs)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
