"""Run one CPython ``test.test_asyncio`` module, optionally on ``asyncio_relaxed.Loop``.

    python tests/conformance/swap.py test_events --mode relaxed   # or: -m tests.conformance.swap
    python tests/conformance/swap.py test_tasks --mode stock --tests ID [ID ...]
    python tests/conformance/swap.py test_events --mode relaxed --after ID   # the rest
    python tests/conformance/swap.py --probe   # version, implementation, modules present

On PyPy the suite is PyPy's own (its stdlib is CPython's, with PyPy's changes);
``pypy/`` goes first on sys.path there (see its ``_testcapi.py``).

A watchdog ends the process when one test runs longer than ``--test-timeout``
seconds: it dumps every thread's traceback to stderr and prints a summary of
what ran so far, with the test that hung; the runner goes on with ``--after``.

In relaxed mode every route the suite uses to build a selector loop is pointed at a
counting subclass of ``asyncio_relaxed.Loop`` *before* the test module is imported
(test modules subclass ``asyncio.SelectorEventLoop`` at import time).  The write mode
is whatever ``ASYNCIO_RELAXED_WRITE`` says; the loop reads it itself.
The last stdout line starting with ``MARKER`` is a JSON summary for runner.py.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import signal
import sys
import threading
import time
import unittest
from collections.abc import Iterator

MARKER = "CONFORMANCE_RESULT "
#: First on sys.path on PyPy only: a _testcapi that raises ImportError.
PYPY_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pypy")
loops_created = 0
write_seen: set[str] = set()  # write modes the created loops report, proves the env var landed
builds_seen: set[str] = set()  # the builds of the created loops (compiled, pure)


def install_swap() -> type:
    """Point asyncio's selector-loop entry points at a counting asyncio_relaxed.Loop."""
    import asyncio.selector_events
    import asyncio.unix_events as ue

    import asyncio_relaxed
    from asyncio_relaxed import Loop  # imported before patching: Loop's base is the real class

    class CountingLoop(Loop):  # a class, not a function: _loop_factory is read via the instance
        def __init__(self, *args: object, **kwargs: object) -> None:
            global loops_created
            loops_created += 1
            super().__init__(*args, **kwargs)
            mode = getattr(getattr(self, "config", None), "write", None)
            if mode is not None:
                write_seen.add(str(getattr(mode, "value", mode)))
            compiled = getattr(asyncio_relaxed, "CLoop", None)
            builds_seen.add("compiled" if compiled is not None and isinstance(self, compiled)
                            else "pure")

    for mod in (asyncio, ue):
        mod.SelectorEventLoop = CountingLoop
        if hasattr(mod, "EventLoop"):  # 3.13+; test_runners passes loop_factory=asyncio.EventLoop
            mod.EventLoop = CountingLoop
    # new_event_loop(), asyncio.run(), Runner and IsolatedAsyncioTestCase all go through the
    # default policy's class attribute; it is the same class object on 3.10-3.13.
    policies = {getattr(ue, "_UnixDefaultEventLoopPolicy", None),
                getattr(asyncio, "DefaultEventLoopPolicy", None)}
    for policy in filter(None, policies):
        policy._loop_factory = CountingLoop

    # Prove the swap took before running anything; don't count these probe loops.
    global loops_created
    for probe in (asyncio.new_event_loop(), asyncio.SelectorEventLoop()):
        ok = isinstance(probe, CountingLoop) and isinstance(
            probe, asyncio.selector_events.BaseSelectorEventLoop)
        probe.close()
        if not ok:
            raise RuntimeError(f"swap did not take: got {type(probe)!r}")
    loops_created = 0
    write_seen.clear()
    builds_seen.clear()
    return CountingLoop


def import_test_package() -> str:
    """Import ``test.test_asyncio`` (on PyPy with PYPY_PATH first); its folder."""
    if sys.implementation.name == "pypy":
        sys.path.insert(0, PYPY_PATH)
    import test.test_asyncio as package

    return os.path.dirname(package.__file__)


def probe() -> None:
    """``--probe``: the version, the implementation and the modules present,
    one line each (runner.probe); fails as the import fails."""
    folder = import_test_package()
    print(platform.python_version())
    print(platform.python_implementation())
    print(*sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py")))


def test_name(test: unittest.TestCase) -> str:
    # Subtest failures are reported against their parent so names stay loadable for reruns.
    return getattr(test, "test_case", test).id()


class WatchedResult(unittest.TextTestResult):
    """Records the test that is running and since when, for the watchdog."""

    current: unittest.TestCase | None = None
    started = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        self.current, self.started = test, time.monotonic()
        super().startTest(test)

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)
        self.current = None


class CountingResult(WatchedResult):
    """Counts passes directly: 3.12+ no longer includes decorator skips in testsRun."""

    passed = 0

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self.passed += 1

    def addExpectedFailure(self, test: unittest.TestCase, err: object) -> None:
        super().addExpectedFailure(test, err)
        self.passed += 1


def flatten(suite: unittest.TestSuite) -> Iterator[unittest.TestCase]:
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from flatten(item)
        else:
            yield item


def after(suite: unittest.TestSuite, test_id: str) -> unittest.TestSuite:
    """The tests of *suite* that come after *test_id*, in its order."""
    tests = list(flatten(suite))
    ids = [t.id() for t in tests]
    return unittest.TestSuite(tests[ids.index(test_id) + 1:] if test_id in ids else tests)


def summarise(summary: dict[str, object], result: CountingResult) -> None:
    bad = sorted({test_name(t) for t, _ in result.failures + result.errors}
                 | {test_name(t) for t in result.unexpectedSuccesses})
    skipped = sorted(test_name(t) for t, _ in result.skipped)
    summary.update(
        run=result.testsRun, failures=len(result.failures), errors=len(result.errors),
        skipped=len(result.skipped), expected_failures=len(result.expectedFailures),
        unexpected_successes=len(result.unexpectedSuccesses),
        passed=result.passed,
        bad=bad, skipped_names=skipped,
    )
    if summary["mode"] == "relaxed":
        summary["loops_created"] = loops_created
        summary["write_seen"] = sorted(write_seen)
        summary["builds_seen"] = sorted(builds_seen)


def watch(result: CountingResult, summary: dict[str, object], limit: float) -> None:
    """End the process when one test runs past *limit* seconds, naming it."""
    while True:
        time.sleep(min(1.0, limit / 4))
        test = result.current
        if test is not None and time.monotonic() - result.started > limit:
            name = test.id()
            sys.stderr.write(f"\nWATCHDOG: {name} ran past {limit:.0f} s; tracebacks:\n")
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
            summarise(summary, result)
            summary["hung"] = name
            summary["bad"] = sorted({*summary["bad"], test_name(test)})  # type: ignore[misc]
            print(MARKER + json.dumps(summary), flush=True)
            os._exit(3)


def main() -> int:
    # A process started in the background of a non-interactive shell begins
    # with SIGINT ignored, and then asyncio.Runner installs no handler and
    # _thread.interrupt_main() does nothing: test_runners' tests would hang
    # on stock and ours alike.  Python's own default, whatever started us.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Under nohup SIGHUP starts ignored and every child process inherits that
    # (test_subprocess's send_signal tests would wait for a child that stays).
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    ap = argparse.ArgumentParser()
    ap.add_argument("module", nargs="?",
                    help="e.g. test_events (package test.test_asyncio is implied)")
    ap.add_argument("--probe", action="store_true", help="print what runner.probe reads")
    ap.add_argument("--mode", choices=("stock", "relaxed"), default="stock")
    ap.add_argument("--tests", nargs="*", help="full test ids to run instead of the module")
    ap.add_argument("--after", help="run only the module's tests after this test id")
    ap.add_argument("--test-timeout", type=float, default=0,
                    help="seconds one test may take before the watchdog ends the run")
    ap.add_argument("--timeout", type=float, default=0,
                    help="dump tracebacks and exit after this many seconds (hang diagnosis)")
    args = ap.parse_args()
    if args.probe:
        probe()
        return 0
    if not args.module:
        ap.error("a module, or --probe")
    if args.timeout > 0:
        faulthandler.dump_traceback_later(args.timeout, exit=True)

    summary: dict[str, object] = {
        "module": args.module, "python": platform.python_version(), "mode": args.mode,
        "write_mode": os.environ.get("ASYNCIO_RELAXED_WRITE") if args.mode == "relaxed" else None,
        "loops_created": None, "error": None,
    }
    if args.mode == "relaxed":
        try:
            install_swap()
        except Exception as exc:  # report, don't traceback: runner shows this string
            summary["error"] = f"swap failed: {exc!r}"
            print(MARKER + json.dumps(summary), flush=True)
            return 2

    import_test_package()
    name = f"test.test_asyncio.{args.module}"
    loader = unittest.TestLoader()
    suite = loader.loadTestsFromNames(args.tests) if args.tests else loader.loadTestsFromName(name)
    if args.after:
        suite = after(suite, args.after)

    class Runner(unittest.TextTestRunner):
        def _makeResult(self) -> CountingResult:
            result = super()._makeResult()
            if args.test_timeout > 0:
                threading.Thread(target=watch, args=(result, summary, args.test_timeout),
                                 daemon=True).start()
            return result  # type: ignore[return-value]

    # verbosity 2 on stderr: the last "... " line in the log names a hung test.
    runner = Runner(stream=sys.stderr, verbosity=2, resultclass=CountingResult)
    result = runner.run(suite)
    summarise(summary, result)  # type: ignore[arg-type]
    sys.stderr.flush()
    print(MARKER + json.dumps(summary), flush=True)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
