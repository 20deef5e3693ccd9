"""``python -m asyncio_relaxed top`` as an operator uses it: in a terminal
(tmux), watching a 4-worker gunicorn pool under load; the screen is read
back (``tmux capture-pane``) and each worker's row held to what that
worker's own loop reported in its responses."""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from asyncio_relaxed import pool

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKERS = 4
REQUESTS = 400


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _screen(tmux: list[str]) -> list[str]:
    out = subprocess.run([*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True,
                         text=True, timeout=30, check=True)
    return out.stdout.splitlines()


def _rows_of(tmux: list[str], pids: set[int], seconds: float) -> dict[int, dict[str, str]]:
    """top's rows once they show every pid in ``pids``: top paints after its
    interpreter has started and imported rich, which on a loaded machine
    takes longer than the test's first requests."""
    deadline = time.monotonic() + seconds
    while True:
        screen = _screen(tmux)
        rows = _table(screen)
        if set(rows) == pids:
            return rows
        assert time.monotonic() < deadline, "\n".join(screen)
        time.sleep(0.2)


def _table(lines: list[str]) -> dict[int, dict[str, str]]:
    """The rows of top's table by pid, each a column name -> cell text;
    empty before top's first paint."""
    header = next((line for line in lines if "┃" in line and "pid" in line), None)
    if header is None:
        return {}
    names = [cell.strip() for cell in header.split("┃")[1:-1]]
    rows = {}
    for line in lines:
        if line.startswith("│"):
            cells = [cell.strip() for cell in line.split("│")[1:-1]]
            if len(cells) == len(names) and cells[0].isdigit():
                rows[int(cells[0])] = dict(zip(names, cells, strict=True))
    return rows


@pytest.fixture
def tmux(tmp_path: pathlib.Path) -> Iterator[list[str]]:
    path = shutil.which("tmux")
    if path is None:
        pytest.skip("needs tmux (Debian's tmux package), which is not installed here")
    command = [path, "-S", str(tmp_path / "tmux.sock")]  # a server of this test's own
    yield command
    subprocess.run([*command, "kill-server"], capture_output=True, timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_top_shows_every_worker_of_a_gunicorn_pool_as_its_own_loop_counts(
        tmp_path: pathlib.Path, tmux: list[str]) -> None:
    pytest.importorskip("gunicorn", reason="gunicorn is not installed")
    pytest.importorskip("aiohttp", reason="aiohttp is not installed")
    pytest.importorskip("rich", reason="rich is not installed (the top extra)")
    stats = tmp_path / "pool"
    stats.mkdir()
    port = _free_port()
    log = (tmp_path / "gunicorn.log").open("w+")
    arbiter = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "tests._pool_app:create_app",
         "--workers", str(WORKERS), "--bind", f"127.0.0.1:{port}",
         "--worker-class", "asyncio_relaxed.gunicorn.GunicornWebWorker",
         "-e", "ASYNCIO_RELAXED_ACCEPT=balanced", "-e", f"ASYNCIO_RELAXED_STATS_DIR={stats}",
         "--log-level", "info"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while len(pool.read(str(stats))) < WORKERS:
            assert arbiter.poll() is None and time.monotonic() < deadline, \
                pathlib.Path(log.name).read_text()
            time.sleep(0.1)
        pids = {worker.pid for worker in pool.read(str(stats))}
        for pid in pids:  # gunicorn's workers, not strays of another test
            with open(f"/proc/{pid}/stat", "rb") as stat:
                assert int(stat.read().rpartition(b")")[2].split()[1]) == arbiter.pid

        subprocess.run(
            [*tmux, "new-session", "-d", "-s", "top", "-x", "220", "-y", "40", "-c", str(ROOT),
             f"{sys.executable} -m asyncio_relaxed top {stats}"],
            check=True, timeout=30, env={**os.environ, "TERM": "xterm-256color"})
        _rows_of(tmux, pids, 30)  # top's first paint

        # Load: one connection per request, so a worker's own accept count
        # (in each of its responses) is also how many responses it sent.
        served: dict[int, int] = {}
        own: dict[int, dict[str, object]] = {}
        for index in range(REQUESTS):
            client = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            client.request("GET", "/")
            answer = json.loads(client.getresponse().read())
            client.close()
            served[answer["pid"]] = served.get(answer["pid"], 0) + 1
            own[answer["pid"]] = answer
            if index == REQUESTS // 2:
                _rows_of(tmux, pids, 10)  # every worker's row, while serving
        assert set(served) <= pids
        for pid in served:
            assert own[pid]["accepted"] == served[pid]
            assert own[pid]["strategies"] == ["balanced"]

        # The screen, once the workers have published what they hold now.
        expected = {pid: served.get(pid, 0) for pid in pids}
        deadline = time.monotonic() + 30
        while True:
            screen = _screen(tmux)
            rows = _table(screen)
            shown = {pid: int(row["accepted"]) for pid, row in rows.items()}
            if shown == expected and all(row["conns"] == "0" for row in rows.values()):
                break
            assert time.monotonic() < deadline, "\n".join(screen)
            time.sleep(0.5)
        for row in rows.values():
            assert row["accept"] == "balanced"
            assert row["tls"] == "0" and row["wbuf"] == "0"
            assert row["util"].endswith("%") and 0 <= int(row["util"][:-1]) <= 100
            assert row["lag p50"][-2:] in ("µs", "ms") or row["lag p50"].endswith("s")
            assert not row["age"].endswith("stale")
        footer = next(line for line in screen if "workers (" in line)
        assert f"{WORKERS} workers (0 stale), 0 connections" in footer
        jain = pool.jain(list(expected.values()))
        assert f"{jain:.3f} since start ({REQUESTS} accepted)" in " ".join(
            screen[screen.index(footer):])
        print("\n".join(screen))  # the capture, in the test's output with -s
    finally:
        arbiter.terminate()
        arbiter.wait(timeout=60)
        log.close()
    text = pathlib.Path(log.name).read_text()
    for pid in pids:  # each worker's startup line, once, in gunicorn's log
        assert f"in process {pid}: accept=balanced stats_dir={stats}" in text, text
        assert text.count(f"in process {pid}: ") == 1, text
    assert os.listdir(stats) == []  # every worker removed its file at its clean exit
