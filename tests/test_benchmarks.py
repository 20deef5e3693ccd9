"""The benchmark suite: its maths, its parsers, and a smoke run of every kind
of workload on the stock loop and ours (schema and positive, finite numbers;
no timing assertions)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from benchmarks import __main__ as cli
from benchmarks import loops, maths, report, runner
from benchmarks.workloads import WORKLOADS, Workload

# -- maths ---------------------------------------------------------------------------


def test_median_odd_even_and_unsorted() -> None:
    assert maths.median([3, 1, 2]) == 2
    assert maths.median([4, 1, 3, 2]) == 2.5
    with pytest.raises(ValueError):
        maths.median([])


def test_percentile_interpolates_like_numpy_linear() -> None:
    values = list(range(1, 101))  # 1..100
    assert maths.percentile(values, 50) == 50.5  # == the median
    assert maths.percentile(values, 99) == pytest.approx(99.01)
    assert maths.percentile(values, 0) == 1
    assert maths.percentile(values, 100) == 100
    assert maths.percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        maths.percentile(values, 101)
    with pytest.raises(ValueError):
        maths.percentile([], 50)


def test_spread_is_range_over_median() -> None:
    assert maths.spread([9, 10, 11]) == pytest.approx(0.2)
    assert maths.spread([5, 5]) == 0
    assert maths.spread([0, 0]) == 0


def test_jain_index_bounds_and_known_values() -> None:
    assert maths.jain([10, 10, 10, 10]) == 1.0
    assert maths.jain([40, 0, 0, 0]) == 0.25  # 1/n: one worker took everything
    assert maths.jain([1, 3]) == pytest.approx(16 / 20)
    assert maths.jain([0, 0]) == 1.0
    with pytest.raises(ValueError):
        maths.jain([])


def test_max_min() -> None:
    assert maths.max_min([2, 4, 8]) == 4
    assert maths.max_min([3, 0]) == math.inf


# -- parsers -------------------------------------------------------------------------

WRK_OUTPUT = """\
Running 1s test @ http://127.0.0.1:8080/
  1 threads and 10 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.10ms  320.55us   8.91ms   93.20%
    Req/Sec     9.10k   310.12     9.50k    70.00%
  Latency Distribution
     50%    1.02ms
     75%    1.15ms
     90%    1.30ms
     99%  850.00us
  9055 requests in 1.00s, 1.30MB read
Requests/sec:   9054.12
Transfer/sec:      1.30MB
"""


def test_parse_wrk() -> None:
    out = runner.parse_wrk(WRK_OUTPUT)
    assert out == {"requests": 9055.0, "elapsed": 1.0, "p50_us": 1020.0, "p99_us": 850.0}
    with pytest.raises(RuntimeError, match="Socket errors"):
        runner.parse_wrk(WRK_OUTPUT + "  Socket errors: connect 0, read 3, write 0, timeout 0\n")
    with pytest.raises(ValueError):
        runner.parse_wrk("nothing")


STRACE_OUTPUT = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 40.00    0.004000           2      2000           sendto
 30.00    0.003000           1      2100       100 recvfrom
 20.00    0.002000          10       200           epoll_wait
 10.00    0.001000           1        10           epoll_ctl
------ ----------- ----------- --------- --------- ----------------
100.00    0.010000                  4310       100 total
"""


def test_parse_strace_and_group() -> None:
    raw = runner.parse_strace(STRACE_OUTPUT)
    assert raw == {"sendto": 2000, "recvfrom": 2100, "epoll_wait": 200, "epoll_ctl": 10}
    grouped = runner.strace_counts(raw)
    assert grouped == {"poll_waits": 200, "epoll_ctl": 10, "recv": 2100, "send": 2000,
                       "accept": 0}


# -- the tables ----------------------------------------------------------------------


def test_every_workload_is_runnable_by_name() -> None:
    from benchmarks import client, server

    for w in WORKLOADS.values():
        assert w.server in (*server.KINDS, "fairness"), w
        assert w.client in (*client.KINDS, "wrk", "fairness"), w
        assert set(w.loops) <= set(loops.SPECS), w
    assert any(w.default for w in WORKLOADS.values())


def test_unknown_loop_and_workload_fail_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["run", "--loops", "tokio"])
    assert "unknown loop 'tokio'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="unknown workload"):
        cli.main(["run", "--workloads", "echo-nothing"])
    assert loops.missing("nope") is not None


def test_workloads_by_pattern() -> None:
    names = [w.name for w in runner.select(["fairness-k2-*", "churn"], full=False)]
    assert set(names) == {"churn", *(f"fairness-k2-c{c}-{m}" for c in (1, 10, 100)
                                     for m in ("close", "keepalive"))}
    assert len(runner.select(None, full=True)) == len(WORKLOADS)


def test_missing_peer_is_skipped_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    real = loops.importlib.import_module

    def without_rloop(name: str) -> Any:
        if name == "rloop":
            raise ImportError("No module named 'rloop'")
        return real(name)

    monkeypatch.setattr(loops.importlib, "import_module", without_rloop)
    notes: list[str] = []
    doc = runner.run([WORKLOADS["echo-protocol-1k-c10"]], ["rloop", "no-such-loop"],
                     duration=0.1, warmup=0.0, repeat=1, syscalls=False, progress=notes.append)
    assert doc["skipped"]["rloop"] == "rloop is not installed (pip install rloop)"
    assert "unknown loop" in doc["skipped"]["no-such-loop"]
    assert doc["workloads"][0]["loops"] == {}
    assert any("rloop skipped" in line for line in notes)


# -- the smoke run -------------------------------------------------------------------

#: One workload of every (server, client) kind; the built-in HTTP client is
#: forced by the "http" client kind (wrk is used for "wrk" when installed).
SMOKE = [
    "echo-protocol-1k-c10", "echo-buffered-1k-c10", "echo-streams-1k-c10", "http-0b",
    "pipe-100k", "small-writes", "churn", "idle-2000", "fairness-k2-c10-close",
]


def _positive_finite(where: str, value: Any) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _positive_finite(f"{where}.{key}", inner)
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            _positive_finite(f"{where}[{i}]", inner)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        assert math.isfinite(value) and value >= 0, (where, value)


@pytest.mark.slow
@pytest.mark.bench
@pytest.mark.timeout(240)
def test_smoke_every_kind_of_workload(tmp_path: Path) -> None:
    # strace on one workload only (it adds a run per loop); idle with fewer
    # connections: the smoke checks the plumbing, not the figures.
    workloads = [dataclasses.replace(WORKLOADS[n], syscalls=n == "small-writes") for n in SMOKE]
    workloads[SMOKE.index("idle-2000")] = dataclasses.replace(WORKLOADS["idle-2000"],
                                                             concurrency=200)
    workloads.append(Workload("http-builtin", "aiohttp, the built-in client", "http", "http", 4))
    doc = runner.run(workloads, ["asyncio", "relaxed"], duration=0.2, warmup=0.1, repeat=1,
                     syscalls=shutil.which("strace") is not None, progress=lambda line: None)
    path = runner.save(doc, tmp_path)
    doc = json.loads(path.read_text())  # what a reader of results/ gets
    assert doc["schema"] == runner.SCHEMA
    assert {"started", "finished", "command", "machine", "method", "loops", "skipped",
            "workloads"} <= set(doc)
    assert doc["machine"]["python"]
    assert set(doc["loops"]) >= {"asyncio", "relaxed"}
    for entry in doc["workloads"]:
        assert entry["errors"] == {}, entry["name"]
        assert set(entry["loops"]) == {"asyncio", "relaxed"}, entry["name"]
        for name, data in entry["loops"].items():
            where = f"{entry['name']}/{name}"
            assert data["samples"] and data["client"], where
            med = data["median"]
            if entry["params"]["client"] == "idle":
                assert "bytes_per_unit" in med, where  # may be 0: RSS moves by pages
            elif entry["params"]["server"] == "fairness":
                assert med["jain"] > 0 and med["conns_per_s"] > 0, where
            else:
                assert med["rate"] > 0 and med["cpu_us_per_unit"] > 0, where
            if name == "relaxed" and entry["params"]["client"] not in ("idle", "fairness"):
                assert med["callbacks_per_unit"] > 0, where  # from loop.statistics()
            _positive_finite(where, data)
    # The reports render, and compare finds every pair in common.
    report.terminal(doc, out=lambda line: None)
    assert "| loop |" in report.markdown(doc, [])
    lines: list[str] = []
    assert report.compare(doc, doc, out=lines.append) == 0
    assert any("echo-protocol-1k-c10" in line for line in lines)


@pytest.mark.bench
@pytest.mark.timeout(60)
def test_floor_runs_on_echo_protocol_only() -> None:
    floor_workloads = [WORKLOADS["echo-protocol-1k-c10"], WORKLOADS["http-0b"],
                       WORKLOADS["echo-streams-1k-c10"]]
    doc = runner.run(floor_workloads, ["floor"], duration=0.2, warmup=0.1, repeat=1,
                     syscalls=False, progress=lambda line: None)
    echo, http, streams = doc["workloads"]
    assert echo["errors"] == {} and echo["loops"]["floor"]["median"]["cpu_us_per_unit"] > 0
    assert "statistics" not in echo["loops"]["floor"]["samples"][0]
    assert http["loops"] == {} and streams["loops"] == {}  # no floor server there
    with pytest.raises(LookupError, match="not an event loop"):
        loops.factory("floor")


@pytest.mark.timeout(60)
def test_floor_server_echoes_every_byte_through_short_sends() -> None:
    """8 MiB written before any is read: the floor's sends come up short and
    it must keep the rest (EPOLLOUT with input off), or the bytes differ."""
    import socket
    import subprocess
    import sys
    import threading

    with subprocess.Popen([sys.executable, "-m", "benchmarks.server", "--kind",
                           "echo-protocol", "--loop", "floor"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, cwd=runner.ROOT) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        try:
            listening = json.loads(proc.stdout.readline())
            assert listening["loop"] == "floor"
            payload = bytes(range(256)) * (8 * 1024 * 4)  # 8 MiB
            with socket.create_connection(("127.0.0.1", listening["listening"])) as conn:
                conn.settimeout(30)
                sender = threading.Thread(target=conn.sendall, args=(payload,))
                sender.start()
                got = bytearray()
                while len(got) < len(payload):
                    chunk = conn.recv(1 << 20)
                    assert chunk, "the floor closed the connection"
                    got += chunk
                sender.join()
            assert bytes(got) == payload
            proc.stdin.write("mark\n")
            proc.stdin.flush()
            mark = json.loads(proc.stdout.readline())
            assert mark["cpu"] > 0 and mark["rss"] > 0
            proc.stdin.close()
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


# -- instructions per request (callgrind) ---------------------------------------------


def test_instructions_parse_and_arithmetic() -> None:
    from benchmarks import instructions

    stderr = ("==1== Events    : Ir\n==1== Collected : 482200271\n==1==\n"
              "==1== I   refs: 482,200,271\n")
    assert instructions.parse_collected(stderr) == 482_200_271
    with pytest.raises(RuntimeError, match="no callgrind total"):
        instructions.parse_collected("valgrind: command not found", ["valgrind", "x"])
    # 1,000 rounds x 10 pairs apart: 10,000 requests.
    assert instructions.per_request(1_000_000, 251_000_000, 200, 1200) == 25_000
    rows = instructions.table(
        {"floor": {"1024": 11_000.0}, "asyncio": {"1024": 24_000.0},
         "relaxed-eager": {"1024": 17_500.0}}, [1024])
    assert rows[0].startswith("| loop | 1 KiB: instr/req | above floor |")
    assert rows[3] == "| asyncio | 24,000 | 13,000 | 1.00x |"
    assert rows[4] == "| relaxed-eager | 17,500 | 6,500 | 0.50x |"
    # The http column has no floor: instructions and their ratio to stock.
    rows = instructions.table(
        {"floor": {"1024": 11_000.0}, "asyncio": {"1024": 24_000.0, "http": 80_000.0},
         "relaxed-eager": {"1024": 17_500.0, "http": 60_000.0}}, [1024, "http"])
    assert rows[0].endswith("| aiohttp hello: instr/req | vs asyncio |")
    assert rows[2] == "| floor | 11,000 | — | — | — | — |"
    assert rows[4] == "| relaxed-eager | 17,500 | 6,500 | 0.50x | 60,000 | 0.75x |"


def test_instructions_without_valgrind_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import instructions

    monkeypatch.setattr(instructions.shutil, "which", lambda name: None)
    assert instructions.main(["--loops", "asyncio"]) == 2
    assert "valgrind is not installed" in capsys.readouterr().err


@pytest.mark.bench
@pytest.mark.parametrize("loop_name", ["floor", "asyncio", "relaxed-eager", "relaxed-deferred"])
@pytest.mark.parametrize("size", [1024, 100 * 1024, "http"])
def test_instructions_child_echoes_every_round(loop_name: str, size: int | str) -> None:
    """The run valgrind counts, without valgrind: every round comes back."""
    import subprocess
    import sys

    from benchmarks import instructions

    if size == "http":
        if loop_name == "floor":
            pytest.skip("the http workload has no floor")
        pytest.importorskip("aiohttp")

    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.instructions", "--child", loop_name, str(size), "20"],
        cwd=instructions.ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_a_baseline_child_imports_the_baseline_package(tmp_path: Path) -> None:
    """``python -m`` puts its working directory first on sys.path: a baseline
    child must import the checkout's asyncio_relaxed and this tree's
    benchmarks/, and a child that imported the wrong tree is refused."""
    import os
    import subprocess
    import sys

    base = tmp_path / "base"
    shutil.copytree(runner.ROOT / "asyncio_relaxed", base / "asyncio_relaxed",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (base / "benchmarks").mkdir()
    (base / "benchmarks" / "__init__.py").write_text(
        "raise ImportError('the checkout's benchmarks/ shadowed the harness')\n")
    twin = loops.register_baseline("relaxed-eager", base)
    try:
        shim = loops.import_dir(twin)
        assert shim is not None
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.instructions", "--child", "relaxed-eager",
             "1024", "3"],
            cwd=shim, env=runner._env(shim), capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        reported = json.loads(proc.stdout)["relaxed"]
        assert os.path.realpath(reported) == os.path.realpath(base / "asyncio_relaxed")
        loops.check_package(twin, reported, runner.ROOT)  # the right tree: no error
        with pytest.raises(RuntimeError, match="another checkout"):
            loops.check_package("relaxed-eager", reported, runner.ROOT)
    finally:
        loops.SPECS.pop(twin)
        loops.BASELINES.pop(twin)
