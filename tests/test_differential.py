"""Differential tests: the same random operations on stock asyncio and on ours.

Each example is one sequence of transport operations, peer actions, timers
and writes from another thread (see ``_differential.py``), run over a real
connection (a socketpair, or TCP on loopback) once on the stock loop and
once on the loop under test; what a protocol observes must agree, up to the
differences ``_differential.normalise`` forgives, each with its reason.  On
the stock loop itself the test checks that the harness is deterministic.

The tests after it are the differences this found, shrunk to one case each.

CI runs a bounded number of examples; ``docs/testing.md`` has the longer run.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import _differential as diff
import pytest
from _hypothesis_profiles import bounded, timeout
from hypothesis import given
from hypothesis import strategies as st

from conftest import run

DIFFERENTIAL_EXAMPLES = 150  # per loop


def needs_harness(loop_name: str) -> None:
    if loop_name == "uvloop":
        pytest.skip("the harness compares stock with asyncio_relaxed; uvloop's own "
                    "semantics differ where test_behaviour.py says")


@timeout()
@bounded(DIFFERENTIAL_EXAMPLES)
@given(
    kind=st.sampled_from(["socketpair", "tcp"]),
    ops=diff.sequences(),
    first=st.tuples(diff.BUFFER_SIZES, diff.BEHAVIOUR),
    keep_open=st.booleans(),
)
def test_random_sequences_observe_as_on_stock(
    loop_name: str, kind: str, ops: list[Any], first: Any, keep_open: bool
) -> None:
    needs_harness(loop_name)
    stock, stock_broken = diff.observe("asyncio", kind, ops, protocol=first, keep_open=keep_open)
    ours, ours_broken = diff.observe(loop_name, kind, ops, protocol=first, keep_open=keep_open,
                                     spin_check="end")
    assert not stock_broken, f"stock broke the harness's invariants: {stock_broken}"
    assert not ours_broken, f"{loop_name} broke invariants: {ours_broken}"
    difference = diff.differs_from_stock(stock, ours, loop_name)
    assert difference is None, (
        f"{loop_name} differs from stock, reproduce with\n"
        f"  _differential.observe({loop_name!r}, {kind!r}, {ops!r}, protocol={first!r}, "
        f"keep_open={keep_open!r})\n{difference}")


# -- the harness has teeth -------------------------------------------------------------


def test_the_comparison_sees_a_lost_byte_and_a_reordered_callback() -> None:
    """What normalise() forgives must not swallow real differences: one byte
    less at the peer, or eof_received and data swapped, is seen in every mode."""
    ops: list[Any] = [("write", "bytes", 1000), ("peer_send", 100), ("peer_shutdown",)]
    stock, _ = diff.observe("asyncio", "socketpair", ops, keep_open=True)
    fewer = [("peer received", item[1] - 1, item[2]) if item[0] == "peer received" else item
             for item in stock]
    data = next(i for i, item in enumerate(stock) if item[0] == "data")
    eof = next(i for i, item in enumerate(stock) if item[2:3] == ("eof_received",))
    swapped = list(stock)
    swapped[data], swapped[eof] = swapped[eof], swapped[data]
    for loop_name in diff.FACTORIES:
        assert diff.differs_from_stock(stock, stock, loop_name) is None
        assert diff.differs_from_stock(stock, fewer, loop_name) is not None
        assert diff.differs_from_stock(stock, swapped, loop_name) is not None


# -- differences found, one test each ------------------------------------------------------


def stock_outcome(call: Any) -> tuple[str, str]:
    """What *call*(transport) raises on the stock loop, as (type, message)."""
    stock = asyncio.SelectorEventLoop()
    try:
        return stock.run_until_complete(_outcome(stock, call))
    finally:
        stock.close()


async def _outcome(loop: asyncio.AbstractEventLoop, call: Any) -> tuple[str, str]:
    a, b = socket.socketpair()
    with a, b:
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
        try:
            call(transport)
        except Exception as exc:
            return type(exc).__name__, str(exc)
        finally:
            transport.close()
            await asyncio.sleep(0)
    return "nothing", ""


def test_writelines_after_write_eof_raises_as_stock(
    loop: asyncio.AbstractEventLoop, loop_name: str
) -> None:
    """writelines() after write_eof() raises stock's RuntimeError, message and
    all.  Stock 3.10 and 3.11 have no writelines of their own (WriteTransport
    joins the chunks and calls write(), so "Cannot call write() after
    write_eof()"); 3.12+ says writelines().  Found by the differential test:
    [("write_eof",), ("writelines", ())]."""
    if loop_name == "uvloop":
        pytest.skip("uvloop's error texts are its own")

    def eof_then_writelines(transport: Any) -> None:
        transport.write_eof()
        transport.writelines([b"x"])

    expected = stock_outcome(eof_then_writelines)
    assert expected[0] == "RuntimeError"
    assert run(loop, _outcome(loop, eof_then_writelines)) == expected


def test_writelines_of_a_str_after_write_eof_raises_as_stock(
    loop: asyncio.AbstractEventLoop, loop_name: str
) -> None:
    """writelines(["text"]) after write_eof() raises what stock raises first.
    Stock 3.11's WriteTransport.writelines joins the chunks before anything
    else, so the join's TypeError comes before write()'s RuntimeError;
    3.12+ checks for write_eof() first.  Found by the differential test:
    [("write_eof",), ("writelines", (("str", 0),))]."""
    if loop_name == "uvloop":
        pytest.skip("uvloop's error texts are its own")

    def eof_then_writelines_of_text(transport: Any) -> None:
        transport.write_eof()
        transport.writelines(["text"])

    expected = stock_outcome(eof_then_writelines_of_text)
    assert expected[0] in ("TypeError", "RuntimeError")
    assert run(loop, _outcome(loop, eof_then_writelines_of_text)) == expected
