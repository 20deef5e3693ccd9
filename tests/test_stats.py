"""Counters and the frozen LoopStatistics snapshot of ``_stats``.

Plain objects only: no loop, no sockets.
"""

from __future__ import annotations

import dataclasses

import pytest

from asyncio_relaxed._stats import COUNTERS, Counters, LoopStatistics

NAMES = list(COUNTERS)


def _distinct(counters: Counters) -> dict[str, int]:
    """Give every counter a distinct power of two; return name -> value."""
    values = {name: 1 << i for i, name in enumerate(NAMES)}
    for name, value in values.items():
        setattr(counters, name, value)
    return values


def test_counter_table_has_descriptions() -> None:
    """Every counter has a non-empty description and the key ones exist."""
    assert len(NAMES) == len(set(NAMES)) == 36
    for required in (
        "events",
        "poll_waits",
        "epoll_ctl_add",
        "epoll_ctl_mod",
        "epoll_ctl_del",
        "always_ready_fds",
    ):
        assert required in COUNTERS
    assert all(isinstance(text, str) and text.strip() for text in COUNTERS.values())


def test_counters_start_at_zero() -> None:
    """A new Counters has 0 for every COUNTERS name, as int."""
    counters = Counters()
    for name in NAMES:
        value = getattr(counters, name)
        assert value == 0
        assert type(value) is int


def test_counters_are_slots_without_dict() -> None:
    """Counters has one slot per counter (and the three internal sums) and no
    __dict__, so typos fail."""
    counters = Counters()
    assert Counters.__slots__ == (*NAMES, "sent_at_once", "queued_at_once", "datagram_sent_ok")
    assert not hasattr(counters, "__dict__")
    with pytest.raises(AttributeError):
        counters.poll_wait = 1  # type: ignore[attr-defined]


def test_sent_at_once_counts_one_write_and_one_send() -> None:
    """The transport's fast path counts a write sent at once in one slot;
    the snapshot shows it as a write and as a send, and reset() clears it."""
    counters = Counters()
    counters.writes, counters.send, counters.sent_at_once = 2, 3, 5
    snap = counters.snapshot("epoll")
    assert (snap.writes, snap.send, snap.syscalls) == (7, 8, 8)
    counters.reset()
    assert counters.sent_at_once == 0 and counters.snapshot("epoll").send == 0


def test_queued_at_once_counts_one_write_and_one_deferred_write() -> None:
    """A deferred write that queues its transport counts in one slot; the
    snapshot shows it as a write and a deferred write."""
    counters = Counters()
    counters.writes, counters.writes_deferred, counters.queued_at_once = 2, 3, 5
    snap = counters.snapshot("epoll")
    assert (snap.writes, snap.writes_deferred, snap.send, snap.syscalls) == (7, 8, 0, 0)
    counters.reset()
    assert counters.queued_at_once == 0


def test_datagram_sent_ok_counts_one_send_and_one_datagram_sent() -> None:
    """A datagram the kernel took counts in one slot; the snapshot shows it
    as a send (a system call) and as a datagram sent."""
    counters = Counters()
    counters.datagram_send, counters.datagrams_sent, counters.datagram_sent_ok = 2, 3, 5
    snap = counters.snapshot("epoll")
    assert (snap.datagram_send, snap.datagrams_sent, snap.syscalls) == (7, 8, 7)
    counters.reset()
    assert counters.datagram_sent_ok == 0


def test_reset_zeroes_every_counter() -> None:
    """reset() puts every counter back to zero."""
    counters = Counters()
    _distinct(counters)
    counters.reset()
    assert all(getattr(counters, name) == 0 for name in NAMES)


def test_snapshot_is_a_frozen_copy_naming_the_backend() -> None:
    """snapshot() copies every counter into a frozen LoopStatistics with the backend."""
    counters = Counters()
    values = _distinct(counters)
    snap = counters.snapshot("epoll")
    assert type(snap) is LoopStatistics
    assert snap.backend == "epoll"
    for name, value in values.items():
        assert getattr(snap, name) == value
    counters.events += 5
    counters.reset()
    assert snap.events == values["events"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.events = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.backend = "poll"  # type: ignore[misc]


def test_snapshot_fields_follow_counter_order() -> None:
    """LoopStatistics fields are backend then COUNTERS, in order."""
    assert [f.name for f in dataclasses.fields(LoopStatistics)] == ["backend", *NAMES]


def test_empty_statistics_default_to_zero() -> None:
    """LoopStatistics(backend) alone has every counter at zero."""
    stats = LoopStatistics("select")
    assert stats.backend == "select"
    assert all(getattr(stats, name) == 0 for name in NAMES)
    assert Counters().snapshot("select") == stats


def test_subtraction_gives_differences() -> None:
    """after - before is a snapshot of per-counter differences with after's backend."""
    counters = Counters()
    before = counters.snapshot("epoll")
    values = _distinct(counters)
    counters.events = 3
    after = counters.snapshot("epoll")
    delta = after - before
    assert type(delta) is LoopStatistics
    assert delta.backend == "epoll"
    for name in NAMES:
        expected = 3 if name == "events" else values[name]
        assert getattr(delta, name) == expected
    assert (after - after) == LoopStatistics("epoll")
    assert (before - after).events == -3
    assert (LoopStatistics("poll") - LoopStatistics("epoll")).backend == "poll"


def test_subtraction_with_other_types_is_a_type_error() -> None:
    """Subtracting a non-snapshot raises TypeError (NotImplemented)."""
    snap = LoopStatistics("epoll", 1)
    with pytest.raises(TypeError):
        snap - 1  # type: ignore[operator]
    with pytest.raises(TypeError):
        snap - {"iterations": 1}  # type: ignore[operator]


def test_epoll_ctl_sums_add_mod_del() -> None:
    """epoll_ctl is exactly epoll_ctl_add + epoll_ctl_mod + epoll_ctl_del."""
    counters = Counters()
    values = _distinct(counters)
    snap = counters.snapshot("epoll")
    assert snap.epoll_ctl == (
        values["epoll_ctl_add"] + values["epoll_ctl_mod"] + values["epoll_ctl_del"]
    )
    assert (
        LoopStatistics("epoll", epoll_ctl_add=2, epoll_ctl_mod=3, epoll_ctl_del=5).epoll_ctl == 10
    )


def test_syscalls_sums_exactly_the_documented_counters() -> None:
    """syscalls = poll_waits + epoll_ctl + recv + send + sendmsg + accept
    + datagram_recv + datagram_send + pipe_read + pipe_write, nothing else."""
    counters = Counters()
    values = _distinct(counters)
    included = (
        "poll_waits",
        "epoll_ctl_add",
        "epoll_ctl_mod",
        "epoll_ctl_del",
        "recv",
        "send",
        "sendmsg",
        "accept",
        "datagram_recv",
        "datagram_send",
        "pipe_read",
        "pipe_write",
    )
    # Distinct powers of two: the sum identifies exactly which counters are in it.
    assert counters.snapshot("epoll").syscalls == sum(values[name] for name in included)


def test_derived_properties_survive_subtraction() -> None:
    """epoll_ctl and syscalls of a difference are the differences of the sums."""
    before = LoopStatistics("epoll", poll_waits=1, epoll_ctl_add=1, recv=4)
    after = LoopStatistics(
        "epoll", poll_waits=3, epoll_ctl_add=2, epoll_ctl_del=1, recv=9, recv_eagain=7
    )
    delta = after - before
    assert delta.epoll_ctl == 2
    assert delta.syscalls == 2 + 2 + 5


def test_as_dict_keys_and_values() -> None:
    """as_dict() has backend then every counter, in order, with the snapshot's values."""
    counters = Counters()
    values = _distinct(counters)
    as_dict = counters.snapshot("poll").as_dict()
    assert list(as_dict) == ["backend", *NAMES]
    assert as_dict == {"backend": "poll", **values}
    assert "epoll_ctl" not in as_dict
    assert "syscalls" not in as_dict
