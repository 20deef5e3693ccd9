"""Child processes: the one way the suite starts one, and the CPUs it pins them to.

Every process the suite starts goes through :func:`spawn`: the servers and
clients of a run, wrk and strace, valgrind around a count tool's child,
the count tools' children, the fairness client, the memory tool's client.
So every child starts the same way: from this tree (the working directory
is the checkout's root, or a baseline's shim folder, see
benchmarks.harness.checkout), with this tree on PYTHONPATH, pinned to the
CPU asked for, its stdout read as text.  (The fairness workers are forked,
not started: they share the listening socket, which is the point.)

:class:`Process` is a child that speaks JSON lines on stdout and reads
commands on stdin (the runner's servers and clients); :func:`call` runs a
child to its end and returns its output; :func:`child_json` runs
``python -m benchmarks ...`` and returns the JSON of its last line (a count
tool's child prints it last).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

#: The checkout's root: the folder holding asyncio_relaxed/ and benchmarks/.
ROOT = Path(__file__).resolve().parent.parent.parent
#: Seconds any one server or client may take to answer before the run is
#: abandoned.
HARD_TIMEOUT = 120.0
PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL


def cpus() -> tuple[int | None, int | None]:
    """(server CPU, client CPU), or (None, None) on a one-CPU machine."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None, None
    return allowed[0], allowed[-1]


def pin(cpu: int | None) -> Callable[[], None] | None:
    """A preexec_fn that pins the child to *cpu* (None: no pinning)."""
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def environment(first: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a child: PYTHONPATH *first* (a baseline checkout's
    shim folder), then this tree, then the caller's; plus *extra*."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [first, str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def python(*args: str) -> list[str]:
    """The command line of a Python child: this interpreter with *args*."""
    return [sys.executable, *args]


def spawn(command: Sequence[str], *, cpu: int | None = None, import_dir: str | None = None,
          env: dict[str, str] | None = None, stdin: int | None = PIPE,
          stdout: int | None = PIPE, stderr: int | None = PIPE) -> subprocess.Popen[str]:
    """Start *command*: the one way the suite starts a process.

    It starts in *import_dir* (a baseline's shim folder: ``python -m`` puts
    its working directory first on sys.path, see
    benchmarks.harness.checkout.import_dir) or this tree, with
    :func:`environment` (*env* replaces it), pinned to *cpu* when given."""
    return subprocess.Popen(
        list(command), stdin=stdin, stdout=stdout, stderr=stderr, text=True,
        cwd=import_dir or ROOT, env=env if env is not None else environment(import_dir),
        preexec_fn=pin(cpu),
    )


def call(command: Sequence[str], *, timeout: float, cpu: int | None = None,
         import_dir: str | None = None, env: dict[str, str] | None = None) -> tuple[str, str]:
    """Run *command* to its end (:func:`spawn`, no input): its (stdout,
    stderr).  A non-zero exit raises RuntimeError with the end of its
    stderr; past *timeout* it is killed and TimeoutError raised."""
    proc = spawn(command, cpu=cpu, import_dir=import_dir, env=env, stdin=DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise TimeoutError(f"{' '.join(command)} ran past {timeout} s") from None
    if proc.returncode:
        raise RuntimeError(f"{' '.join(command)} failed (exit {proc.returncode}):\n"
                           f"{err[-2000:]}")
    return out, err


def child_json(args: Sequence[str], timeout: float) -> dict[str, Any]:
    """Run ``python -m benchmarks *args*`` from this tree; the JSON of its
    last line of output (a count tool's child prints it last)."""
    out, _ = call(python("-m", "benchmarks", *args), timeout=timeout)
    return json.loads(out.splitlines()[-1])  # type: ignore[no-any-return]


def readline(stream: IO[str], timeout: float) -> str:
    """A line of *stream*, or TimeoutError when none comes within *timeout*."""
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError(f"no answer within {timeout} s")
    return stream.readline()


class Process:
    """A child speaking JSON lines on stdout, killed on exit whatever happens
    (inside :func:`processes`)."""

    def __init__(self, command: Sequence[str], cpu: int | None,
                 import_dir: str | None = None, **extra: str) -> None:
        """*extra*: variables added to the child's :func:`environment`."""
        self.proc = spawn(command, cpu=cpu, import_dir=import_dir,
                          env=environment(import_dir, **extra))
        self.command = command

    def read(self, timeout: float = HARD_TIMEOUT) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = readline(self.proc.stdout, timeout)
        if not line:
            self.proc.kill()
            assert self.proc.stderr is not None
            err = self.proc.stderr.read()
            raise RuntimeError(f"{' '.join(self.command)} failed:\n{err[-2000:]}")
        return json.loads(line)  # type: ignore[no-any-return]

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def processes() -> Iterator[list[Process]]:
    """A list to add Process objects to; each is killed and reaped on the way out."""
    started: list[Process] = []
    try:
        yield started
    finally:
        for p in reversed(started):
            if p.proc.poll() is None:
                p.proc.kill()
            p.proc.wait()
            for stream in (p.proc.stdin, p.proc.stdout, p.proc.stderr):
                if stream is not None:
                    stream.close()
