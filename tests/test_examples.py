"""The echo example runs for real: a server process per loop and a client."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.parametrize("api", ["protocol", "buffered", "streams"])
def test_echo_compare_prints_a_row_per_loop(api: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "echo_server.py"), "compare",
         "--loops", "asyncio,relaxed-eager,relaxed-deferred", "--api", api,
         "--duration", "0.3", "--repeat", "1", "--clients", "4"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()[2:]}
    assert set(rows) == {"asyncio", "relaxed-eager", "relaxed-deferred"}
    for name, values in rows.items():
        assert float(values[0]) > 0, (name, values)  # req/s
        assert float(values[1]) > 0, (name, values)  # server CPU µs per request
    assert float(rows["relaxed-eager"][4]) > 0  # syscalls per request, ours only


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags", [["--loop", "asyncio"], ["--loop", "relaxed", "--accept", "single"],
              ["--loop", "relaxed", "--accept", "relaxed"]],
    ids=["asyncio", "relaxed-single", "relaxed-relaxed"],
)
def test_prefork_workers_share_one_socket(flags: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "prefork_server.py"), "--workers", "2",
         "--port", "0", "--load", "100", *flags],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.splitlines()[-1])
    assert sum(summary["connections"]) == 100  # every connection served, by some worker
    assert len(summary["connections"]) == 2
    assert 0.5 <= summary["jain"] <= 1.0
