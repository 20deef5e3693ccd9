"""Server connections the collector frees detach from their Server once.

The scenarios are tests/_collected.py's; here they run on every loop of the
suite, and on ours under ``python -O`` too.  The explicit-order tests call a
transport's finaliser by hand before or after close() and abort(), the two
orders in which the collector may finalise a transport and the StreamWriter
that closes it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import _collected
import pytest

from conftest import REFCOUNTED, Recorder, run

ROOT = Path(__file__).resolve().parent.parent

#: Scenarios whose transport is found only by the collector, with nothing
#: scheduled for it: stock 3.11-3.12's finaliser does not detach it
#: (3.13's does), so the server keeps counting it.
_STOCK_KEEPS_COUNTING = {
    ("abort_after_write", "create_server"),
    ("paused_mid_read", "create_server"),
}
#: On PyPy (8.0.1, its asyncio 3.11's) the start_server ones too: the server's
#: StreamWriter, whose __del__ closes the transport there (and so detaches
#: it), was not finalised while the scenario ran, even with three
#: collections where the scenario makes one (seen by patching its __del__);
#: on CPython it is.  Our loop's transport detaches itself on both.
if not REFCOUNTED:
    _STOCK_KEEPS_COUNTING |= {
        ("abort_after_write", "start_server"),
        ("paused_mid_read", "start_server"),
    }


def _check(report: dict[str, Any], loop_name: str, scenario: str, kind: str) -> None:
    assert report["errors"] == []
    counts = report["counts"]
    assert min(counts.values()) >= 0, counts
    if (loop_name == "asyncio" and sys.version_info < (3, 13)
            and (scenario, kind) in _STOCK_KEEPS_COUNTING):
        # Stock's, as it is: the count never drops, and 3.12's wait_closed()
        # waits for it.
        assert counts["later"] == 1
    else:
        assert counts["later"] == 0, counts
        assert report["closed"]
    if scenario == "buffered_then_drop":
        assert report["received"] == 1 << 20  # written before close(): delivered


@pytest.mark.parametrize("kind", _collected.KINDS)
@pytest.mark.parametrize("scenario", list(_collected.SCENARIOS))
def test_collected_connection_detaches_once(loop: asyncio.AbstractEventLoop, loop_name: str,
                                            scenario: str, kind: str) -> None:
    if loop_name == "uvloop":
        pytest.skip("uvloop's Server keeps its connections in C: no count to read")
    report = run(loop, _collected.SCENARIOS[scenario](kind))
    _check(report.as_dict(), loop_name, scenario, kind)


@pytest.mark.slow
@pytest.mark.parametrize("loop_name", ["asyncio", "relaxed-eager", "relaxed-deferred"])
def test_collected_connections_under_optimisation(loop_name: str) -> None:
    """Under -O, where 3.11-3.12's Server._detach asserts nothing, a second
    detach would take the count below zero (and hang wait_closed on 3.12)."""
    out = subprocess.run(
        [sys.executable, "-O", str(ROOT / "tests" / "_collected.py"), loop_name],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    reports = json.loads(out.splitlines()[-1])
    assert len(reports) == len(_collected.SCENARIOS) * len(_collected.KINDS)
    for key, report in reports.items():
        scenario, kind = key.split()
        _check(report, loop_name, scenario, kind)


# -- the finaliser's order, by hand (our transport) --------------------------------


async def _served_transport(loop: Any) -> tuple[Any, Any, Recorder, list[Any], Any, Any]:
    """A server connection of ours with its Server, counting the Server's
    detach calls and the poller's releases of the connection's fd."""
    protocols: list[Recorder] = []

    def factory() -> Recorder:
        protocols.append(Recorder(loop))
        return protocols[-1]

    server = await loop.create_server(factory, "127.0.0.1", 0)
    _, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
    while not protocols or protocols[0].transport is None:
        await asyncio.sleep(0.001)
    protocol = protocols[0]
    detaches: list[Any] = []
    original = server._detach

    def counting_detach(*args: Any) -> None:
        detaches.append(args)
        original(*args)

    server._detach = counting_detach  # type: ignore[method-assign]
    transport = protocol.transport
    releases: list[int] = []
    poller = loop._shared.poller
    # A close releases the fd through release_reader (one call, which
    # unregisters it too) or through release.
    originals = {name: getattr(poller, name) for name in ("release", "release_reader")}

    inside: list[str] = []

    def counting(name: str) -> Any:
        def call(fd: int) -> Any:
            if fd == transport._sock_fd and not inside:  # release_reader's own release()
                releases.append(fd)
            inside.append(name)
            try:
                return originals[name](fd)
            finally:
                inside.pop()
        return call

    for name in originals:
        setattr(poller, name, counting(name))
    return server, transport, protocol, detaches, (releases, poller, originals), writer


def _finalise(transport: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        transport.__del__()


@pytest.mark.parametrize("order", [
    ("close", "del"), ("del", "close"), ("abort", "del"), ("del", "abort"),
    ("del", "del"), ("close", "del", "abort"),
])
def test_finaliser_and_close_detach_once(relaxed_loop: Any, order: tuple[str, ...]) -> None:
    loop = relaxed_loop

    async def main() -> None:
        server, transport, protocol, detaches, (releases, poller, originals), client = (
            await _served_transport(loop))
        try:
            for step in order:
                if step == "del":
                    _finalise(transport)
                else:
                    getattr(transport, step)()
            for _ in range(5):
                await asyncio.sleep(0)
            assert len(detaches) == 1
            assert len(releases) == 1
            assert transport.get_extra_info("socket").fileno() == -1
            # connection_lost runs only where close() or abort() scheduled it
            # before the finaliser: a finalised transport is lost already.
            assert protocol.lost.done() == (order[0] != "del")
            server.close()
            await asyncio.wait_for(server.wait_closed(), 2)
        finally:
            for name in originals:
                delattr(poller, name)
            client.close()

    run(loop, main())
