"""The interest table (asyncio_relaxed._interest) against a plain model.

No sockets, no kernel: a hypothesis state machine drives the table and a
model that keeps each fd's state as named fields (registered, wanted,
applied, owned, exclusive, dirty) and states each rule the way the module
docstring does.  After every step the two must agree on every fd, the table
must store exactly the states that are not what no entry says (COMMON for a
registered fd, 0 for another), and each call must ask the kernel for what
the model says it needs.  The "kernel" is the model's ``applied``: whatever
a change asks for is taken as done, as the poller does after its system call.
"""

from __future__ import annotations

import dataclasses

import pytest
from _hypothesis_profiles import bounded
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from asyncio_relaxed import _interest
from asyncio_relaxed._interest import APPLY, COMMON, NOTHING, REMOVE, InterestTable

R, W = _interest.READ, _interest.WRITE
FDS = st.integers(3, 4)
MASKS = st.sampled_from([R, W, R | W])


@dataclasses.dataclass
class Fd:
    registered: bool = False
    wanted: int = 0
    applied: int = 0
    owned: bool = False
    exclusive: bool = False
    dirty: bool = False
    data: object = None

    def encoded(self) -> int:
        return (self.wanted | self.applied << _interest.APPLIED_SHIFT
                | (_interest.OWNED if self.owned else 0)
                | (_interest.EXCLUSIVE if self.exclusive else 0))


def needed(fd: Fd, lazy: bool) -> int:
    """What makes the kernel hold what is wanted; with *lazy*, not when the
    only difference is reading dropped from an owned, non-exclusive fd."""
    if fd.wanted == fd.applied:
        return NOTHING
    only_read_dropped = not fd.wanted & ~fd.applied and fd.applied & ~fd.wanted == R
    if lazy and only_read_dropped and fd.owned and not fd.exclusive:
        return NOTHING
    return APPLY if fd.wanted else REMOVE


class TableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = InterestTable()
        self.model: dict[int, Fd] = {}

    def fd(self, number: int) -> Fd:
        return self.model.setdefault(number, Fd())

    def kernel(self, number: int, change: int) -> None:
        fd = self.fd(number)
        if change == APPLY:
            fd.applied = fd.wanted
        elif change == REMOVE:
            fd.applied = 0
        self.table.set_applied(number, fd.applied)

    @rule(number=FDS, events=MASKS)
    def register(self, number: int, events: int) -> None:
        fd = self.fd(number)
        if fd.registered:
            return
        data = object()
        result = self.table.register(number, events, data)
        fd.registered, fd.wanted, fd.data = True, events, data
        if fd.owned and fd.applied:
            assert result is False  # the kernel holds this file: the flush decides
            fd.dirty = events != fd.applied
        else:
            assert result is True
            self.kernel(number, APPLY)

    @rule(number=FDS, events=MASKS)
    def modify(self, number: int, events: int) -> None:
        fd = self.fd(number)
        if not fd.registered:
            return
        data = object()
        self.table.modify(number, events, data)
        if events != fd.wanted:
            fd.dirty = True
        fd.wanted, fd.data = events, data

    @rule(number=FDS)
    def unregister(self, number: int) -> None:
        fd = self.fd(number)
        if not fd.registered:
            return
        events, data, change = self.table.unregister(number)
        assert (events, data) == (fd.wanted, fd.data)
        fd.registered, fd.wanted, fd.exclusive, fd.data = False, 0, False, None
        if fd.owned and fd.applied:
            assert change == NOTHING
            fd.dirty = True
        else:
            assert change == (REMOVE if fd.applied else NOTHING)
            fd.dirty = False
            self.kernel(number, change)

    @rule(number=FDS)
    def own(self, number: int) -> None:
        self.table.own(number)
        self.fd(number).owned = True

    @rule(number=FDS)
    def release(self, number: int) -> None:
        fd = self.fd(number)
        change = self.table.release(number)
        fd.owned, fd.dirty = False, False
        assert change == (needed(fd, lazy=False) if fd.applied else NOTHING)
        self.kernel(number, change)

    @rule(number=FDS)
    def start_common(self, number: int) -> None:
        """A transport's new socket: own() then register(R), in one step."""
        fd = self.fd(number)
        fresh = (fd.owned and not fd.registered and not fd.applied and not fd.exclusive)
        assert self.table.fresh(number) == fresh
        data = object()
        if not fresh:
            before = self.table.state(number)
            assert not self.table.start_common(number, data)
            assert self.table.state(number) == before  # left as it is
            return
        assert self.table.start_common(number, data)
        fd.registered, fd.wanted, fd.data, fd.dirty = True, R, data, False
        fd.applied = R  # the poller's EPOLL_CTL_ADD
        assert self.table.state(number) == COMMON

    @rule(number=FDS)
    def end_common(self, number: int) -> None:
        """A transport's close: unregister() then release(), in one step."""
        fd = self.fd(number)
        common = fd.registered and fd.encoded() == COMMON
        assert self.table.common(number) == common
        if not common:
            before = self.table.state(number)
            assert self.table.end_common(number, None) is None
            assert self.table.state(number) == before  # left as it is
            return
        assert self.table.end_common(number, None) is fd.data
        fd.registered, fd.wanted, fd.data, fd.owned, fd.dirty = False, 0, None, False, False
        fd.applied = 0  # the poller's EPOLL_CTL_DEL
        assert self.table.state(number) == 0

    @rule(number=FDS)
    def exclusive(self, number: int) -> None:
        self.table.set_exclusive(number)
        self.fd(number).exclusive = True

    @rule()
    def flush(self) -> None:
        dirty = self.table.take_dirty()
        assert dirty == {n for n, fd in self.model.items() if fd.dirty}
        for number in dirty:
            fd = self.model[number]
            fd.dirty = False
            change = self.table.change(number, lazy=True)
            assert change == needed(fd, lazy=True)
            self.kernel(number, change)

    @precondition(lambda self: any(fd.applied for fd in self.model.values()))
    @rule(data=st.data())
    def unwanted_event(self, data: st.DataObject) -> None:
        """The kernel reports a direction the fd does not want (a lazily
        kept interest, a hang-up, or a stray)."""
        number = data.draw(st.sampled_from(sorted(n for n, fd in self.model.items()
                                                  if fd.applied)))
        fd = self.model[number]
        change = self.table.unwanted(number)
        if fd.owned:
            fd.dirty = False
            assert change == needed(fd, lazy=False)
            self.kernel(number, change)
        elif not fd.wanted:
            assert change is None  # a stray: the poller removes it
            self.kernel(number, REMOVE)
        else:
            assert change == NOTHING

    @invariant()
    def agrees(self) -> None:
        table = self.table
        for number, fd in self.model.items():
            assert table.state(number) == fd.encoded(), (number, fd)
            assert (number in table.data) == fd.registered
            if fd.registered:
                assert table.data[number] is fd.data
            assert (number in table.dirty) == fd.dirty
            # The common case is stored as no entry; everything else has one.
            nothing = COMMON if fd.registered else 0
            assert (number in table.states) == (fd.encoded() != nothing), (number, fd)


test_interest_table_against_the_model = bounded(150)(TableMachine).TestCase


@pytest.mark.parametrize("kind", ["paused", "closed"])
def test_pause_and_resume_in_one_iteration_cost_nothing(kind: str) -> None:
    """The poller's reason to be: an owned reader removed and added back
    before the flush asks nothing of the kernel."""
    table = InterestTable()
    table.own(5)
    assert table.register(5, R, "reader") is True
    table.set_applied(5, R)
    assert 5 not in table.states  # COMMON: no entry
    table.unregister(5)
    if kind == "paused":
        assert table.register(5, R, "reader again") is False
        assert [table.change(fd, lazy=True) for fd in table.take_dirty()] == []
    else:
        assert table.release(5) == REMOVE
