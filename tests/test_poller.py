"""The deferred-interest poller of ``_poller``, with pipes, socketpairs and files only.

Most tests run on three backends: raw epoll (``DeferredSelector()``), and the same
bookkeeping driving a stdlib ``PollSelector`` and ``SelectSelector``.  The
``epoll_ctl_*`` counters are kept by the DeferredSelector itself, so they are the same on
every backend.  Tests about epoll's own sharp edges (EPERM, dup'd descriptors)
use the epoll backend only.
"""

from __future__ import annotations

import errno
import os
import select
import selectors
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _hypothesis_profiles import bounded
from hypothesis import given
from hypothesis import strategies as st

from asyncio_relaxed._poller import (
    EVENT_READ,
    EVENT_WRITE,
    MISSING,
    DeferredSelector,
    EpollBackend,
    SelectorBackend,
    default_backend,
)
from asyncio_relaxed._stats import Counters

R = EVENT_READ
W = EVENT_WRITE

BACKENDS: dict[str, Callable[[], DeferredSelector]] = {
    "epoll": lambda: DeferredSelector(),
    "poll": lambda: DeferredSelector(SelectorBackend(selectors.PollSelector())),
    "select": lambda: DeferredSelector(SelectorBackend(selectors.SelectSelector())),
}

Pair = Callable[[], "tuple[socket.socket, socket.socket]"]


@pytest.fixture(params=list(BACKENDS))
def poller(request: pytest.FixtureRequest) -> Iterator[DeferredSelector]:
    p = BACKENDS[request.param]()
    yield p
    p.close()


@pytest.fixture
def epoll() -> Iterator[DeferredSelector]:
    p = DeferredSelector()
    assert p.backend_name == "epoll"
    yield p
    p.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    """A factory of connected socket pairs, all closed at teardown."""
    made: list[socket.socket] = []

    def make() -> tuple[socket.socket, socket.socket]:
        a, b = socket.socketpair()
        made.extend((a, b))
        return a, b

    yield make
    for sock in made:
        sock.close()


def ctl(p: DeferredSelector) -> tuple[int, int, int]:
    """(ADD, MOD, DEL) sent to the kernel so far."""
    return (p.stats.epoll_ctl_add, p.stats.epoll_ctl_mod, p.stats.epoll_ctl_del)


def by_fd(ready: list[tuple[selectors.SelectorKey, int]]) -> list[tuple[int, int]]:
    return sorted((key.fd, mask) for key, mask in ready)


# -- construction ---------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "backend_type", "name"),
    [
        ("auto", EpollBackend, "epoll"),
        ("epoll", EpollBackend, "epoll"),
        ("poll", SelectorBackend, "poll"),
        ("select", SelectorBackend, "select"),
    ],
)
def test_default_backend_kinds(kind: str, backend_type: type, name: str) -> None:
    """default_backend(kind) gives the documented backend type and name on Linux."""
    backend = default_backend(kind)
    p = DeferredSelector(backend)
    try:
        assert type(backend) is backend_type
        assert backend.name == name
        assert p.backend_name == name
    finally:
        p.close()


@pytest.mark.parametrize(
    ("selector_type", "name"),
    [
        (selectors.PollSelector, "poll"),
        (selectors.SelectSelector, "select"),
        (selectors.EpollSelector, "epoll"),
    ],
)
def test_plain_stdlib_selector_is_wrapped(selector_type: type, name: str) -> None:
    """A stdlib selector passed to DeferredSelector is wrapped in a
    SelectorBackend named after it."""
    p = DeferredSelector(selector_type())
    try:
        assert type(p._backend) is SelectorBackend
        assert p.backend_name == name
    finally:
        p.close()


def test_given_counters_are_used(pair: Pair) -> None:
    """DeferredSelector(stats=...) counts into the Counters it was given."""
    counters = Counters()
    p = DeferredSelector(stats=counters)
    try:
        a, _ = pair()
        p.register(a, R)
        p.select(0)
        assert p.stats is counters
        assert (counters.epoll_ctl_add, counters.poll_waits) == (1, 1)
    finally:
        p.close()


def test_epoll_fileno_is_valid_until_close() -> None:
    """The epoll backend's fileno() is an open fd until close(), and close() twice is fine."""
    p = DeferredSelector()
    fd = p.fileno()
    assert fd >= 0
    os.fstat(fd)  # an open descriptor
    p.close()
    with pytest.raises(OSError) as info:
        os.fstat(fd)
    assert info.value.errno == errno.EBADF
    p.close()


def test_selector_backend_without_fileno_answers_minus_one() -> None:
    """A wrapped SelectSelector has no kernel object: fileno() is -1."""
    p = BACKENDS["select"]()
    try:
        assert p.fileno() == -1
    finally:
        p.close()


def test_close_is_idempotent(poller: DeferredSelector, pair: Pair) -> None:
    """close() forgets every key and may be called again."""
    a, _ = pair()
    poller.register(a, R)
    poller.close()
    assert len(poller.get_map()) == 0
    poller.close()
    assert len(poller.get_map()) == 0


# -- register: applied at once, visible at once ----------------------------


def test_register_applies_at_once(poller: DeferredSelector, pair: Pair) -> None:
    """register() sends exactly one ADD immediately and leaves nothing pending."""
    a, _ = pair()
    key = poller.register(a, R, "data")
    assert key == selectors.SelectorKey(a, a.fileno(), R, "data")
    assert ctl(poller) == (1, 0, 0)
    assert poller.pending_changes == 0
    assert poller.stats.poll_waits == 0


def test_get_key_and_get_map_reflect_changes_synchronously(
    poller: DeferredSelector, pair: Pair,
) -> None:
    """get_key/get_map see register, modify and unregister before any flush."""
    a, _ = pair()
    c, _ = pair()
    key_a = poller.register(a, R)
    key_c = poller.register(c.fileno(), W)
    mapping = poller.get_map()
    assert len(mapping) == 2
    assert sorted(mapping) == sorted([a.fileno(), c.fileno()])
    assert mapping[a] == key_a
    assert mapping[a.fileno()] == key_a
    assert mapping[c] == key_c
    assert poller.get_key(c.fileno()) == key_c

    new_a = poller.modify(a, R | W, "x")
    assert poller.get_key(a) == new_a
    assert mapping[a.fileno()].events == R | W

    assert poller.unregister(c.fileno()) == key_c
    assert len(mapping) == 1
    assert list(mapping) == [a.fileno()]
    assert c.fileno() not in mapping
    with pytest.raises(KeyError, match="is not registered"):
        poller.get_key(c)
    # The two ADDs, and the DEL of an fd nobody owns, sent at once (edge 1).
    assert ctl(poller) == (2, 0, 1)


def test_register_of_closed_fd_raises_at_once(epoll: DeferredSelector) -> None:
    """On epoll, registering a closed fd raises OSError(EBADF) from register() itself."""
    r, w = os.pipe()
    os.close(w)
    os.close(r)
    with pytest.raises(OSError) as info:
        epoll.register(r, R)
    assert info.value.errno == errno.EBADF
    assert len(epoll.get_map()) == 0
    assert ctl(epoll) == (1, 0, 0)
    assert epoll.select(0) == []


def _closed_socket() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.close()
    return sock


# Each case is an operation run on the DeferredSelector and
# on a stdlib SelectSelector; the exception type and text must be the same.
NOT_A_FILE = object()
_CLOSED = _closed_socket()
ERROR_CASES: dict[str, Callable[[selectors.BaseSelector, socket.socket], Any]] = {
    "register twice": lambda s, a: (s.register(a, R), s.register(a, W)),
    "register twice by fd": lambda s, a: (s.register(a, R), s.register(a.fileno(), R)),
    "unregister unknown": lambda s, a: s.unregister(a),
    "unregister twice": lambda s, a: (s.register(a, R), s.unregister(a), s.unregister(a)),
    "modify unknown": lambda s, a: s.modify(a, R),
    "get_key unknown": lambda s, a: s.get_key(a),
    "get_map unknown": lambda s, a: s.get_map()[a],
    "events zero": lambda s, a: s.register(a, 0),
    "events too big": lambda s, a: s.register(a, 4),
    "events negative": lambda s, a: s.register(a, -1),
    "negative fd": lambda s, a: s.register(-3, R),
    "no fileno": lambda s, a: s.register(NOT_A_FILE, R),
    "str object": lambda s, a: s.register("not a file", R),
    "closed socket": lambda s, a: s.register(_CLOSED, R),
}
# (keys left, ADDs sent, DELs sent) after the case, where not (0, 0, 0): the
# failing call sends nothing.
AFTER_ERROR = {
    "register twice": (1, 1, 0),
    "register twice by fd": (1, 1, 0),
    "unregister twice": (0, 1, 1),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_match_stdlib_selectors(poller: DeferredSelector, pair: Pair, case: str) -> None:
    """Error types and texts are those of stdlib selectors; a failed register leaves no key."""
    a, _ = pair()
    operation = ERROR_CASES[case]
    reference = selectors.SelectSelector()
    try:
        with pytest.raises((KeyError, ValueError)) as expected:
            operation(reference, a)
    finally:
        reference.close()
    with pytest.raises(expected.type) as got:
        operation(poller, a)
    assert got.value.args == expected.value.args
    keys_left, adds, dels = AFTER_ERROR.get(case, (0, 0, 0))
    assert len(poller.get_map()) == keys_left
    assert ctl(poller) == (adds, 0, dels)


def test_error_texts(poller: DeferredSelector, pair: Pair) -> None:
    """The KeyError texts are the familiar selectors ones."""
    a, _ = pair()
    poller.register(a, R)
    with pytest.raises(KeyError) as info:
        poller.register(a, R)
    assert info.value.args == (f"{a!r} (FD {a.fileno()}) is already registered",)
    poller.unregister(a)
    with pytest.raises(KeyError) as info:
        poller.modify(a, W)
    assert info.value.args == (f"{a!r} is not registered",)


@pytest.mark.parametrize("events", [0, 4, R | W | 8])
def test_modify_with_bad_events_keeps_the_key(
    poller: DeferredSelector, pair: Pair, events: int,
) -> None:
    """modify() with invalid events raises ValueError and changes nothing."""
    a, _ = pair()
    key = poller.register(a, R)
    with pytest.raises(ValueError, match=rf"^Invalid events: {events}$"):
        poller.modify(a, events)
    assert poller.get_key(a) == key
    assert poller.pending_changes == 0


def test_closed_socket_is_found_by_identity(poller: DeferredSelector, pair: Pair) -> None:
    """A socket closed while registered is still found, by identity, and can be unregistered."""
    a, _ = pair()
    key = poller.register(a, R)
    a.close()
    assert poller.get_key(a) == key
    assert poller.get_map()[a] == key
    assert poller.unregister(a) == key
    assert poller.select(0) == []
    assert ctl(poller) == (1, 0, 1)


# -- modify: deferred to the flush ----------------------------------------


@pytest.mark.parametrize("how", ["select", "flush"])
def test_modify_is_deferred_until_flush(poller: DeferredSelector, pair: Pair, how: str) -> None:
    """modify() sends nothing until select()/flush(), then exactly one MOD."""
    a, _ = pair()
    poller.register(a, R)
    key = poller.modify(a, R | W)
    assert ctl(poller) == (1, 0, 0)
    assert poller.pending_changes == 1
    if how == "flush":
        poller.flush()
        assert ctl(poller) == (1, 1, 0)
        assert poller.pending_changes == 0
    # The socket is writable and not readable: the kernel got the MOD.
    assert poller.select(0) == [(key, W)]
    assert ctl(poller) == (1, 1, 0)
    assert poller.select(0) == [(key, W)]
    assert ctl(poller) == (1, 1, 0)


def test_modify_there_and_back_costs_nothing(poller: DeferredSelector, pair: Pair) -> None:
    """modify to R|W and back to R before the flush sends no MOD."""
    a, _ = pair()
    poller.register(a, R)
    poller.modify(a, R | W)
    key = poller.modify(a, R)
    assert poller.select(0) == []
    assert ctl(poller) == (1, 0, 0)
    assert poller.get_key(a) == key


def test_modify_data_only_is_not_a_change(poller: DeferredSelector, pair: Pair) -> None:
    """modify() with the same events and new data updates the key, marks nothing dirty."""
    a, b = pair()
    poller.register(a, R, "old")
    key = poller.modify(a, R, "new")
    assert key.data == "new"
    assert poller.pending_changes == 0
    b.send(b"x")
    assert poller.select(0) == [(key, R)]
    assert ctl(poller) == (1, 0, 0)


def test_unregister_of_unowned_fd_is_sent_at_once(poller: DeferredSelector, pair: Pair) -> None:
    """Nobody promised to release() it: the DEL goes out before the fd can be closed."""
    a, b = pair()
    poller.register(a, R)
    poller.unregister(a)
    assert ctl(poller) == (1, 0, 1)
    assert poller.pending_changes == 0
    b.send(b"x")
    assert poller.select(0) == []
    assert ctl(poller) == (1, 0, 1)


def test_requeue_is_one_del_and_one_add_and_keeps_the_fd_polled(
    epoll: DeferredSelector, pair: Pair
) -> None:
    """requeue() registers the fd with the kernel anew, at once; what is
    polled does not change: a ready fd is still reported by the next poll."""
    a, b = pair()
    epoll.register(a, R)
    b.send(b"x")
    assert epoll.reregister(a.fileno())
    assert ctl(epoll) == (2, 0, 1)
    assert epoll.pending_changes == 0
    assert by_fd(epoll.select(0)) == [(a.fileno(), R)]


def test_requeue_sends_nothing_unless_the_kernel_holds_what_is_wanted(
    poller: DeferredSelector, pair: Pair
) -> None:
    a, _ = pair()
    fd = a.fileno()
    assert not poller.reregister(fd)  # not registered
    poller.register(a, R)
    poller.modify(a, R | W)
    assert not poller.reregister(fd)  # a change is pending
    poller.select(0)
    sent = ctl(poller)
    # epoll only: the point is epoll's wait-queue order; others send nothing.
    assert poller.reregister(fd) is (poller.backend_name == "epoll")
    if poller.backend_name != "epoll":
        assert ctl(poller) == sent


def test_unregister_of_owned_fd_is_deferred_then_one_del(
    poller: DeferredSelector, pair: Pair,
) -> None:
    """An owned fd's unregister() sends one DEL at the flush; events stop."""
    a, b = pair()
    poller.own(a.fileno())
    poller.register(a, R)
    poller.unregister(a)
    assert ctl(poller) == (1, 0, 0)
    assert poller.pending_changes == 1
    b.send(b"x")
    assert poller.select(0) == []
    assert ctl(poller) == (1, 0, 1)
    assert poller.select(0) == []
    assert poller.stats.events == 0


def test_owned_read_removal_is_lazy_until_an_event(poller: DeferredSelector, pair: Pair) -> None:
    """An owned fd whose reading interest is dropped stays polled: nothing is
    sent at the flush; the first unwanted event sends the DEL and is dropped."""
    a, b = pair()
    poller.own(a.fileno())
    poller.register(a, R)
    poller.unregister(a)
    assert poller.select(0) == []
    assert ctl(poller) == (1, 0, 0)
    assert poller.select(0) == []
    assert ctl(poller) == (1, 0, 0)
    # Registered again later, with the kernel still holding R: free.
    key = poller.register(a, R)
    assert poller.select(0) == []
    assert ctl(poller) == (1, 0, 0)
    poller.modify(a, W)  # R dropped, W added: not lazy, one MOD
    assert poller.select(0) == [(key._replace(events=W), W)]
    assert ctl(poller) == (1, 1, 0)
    poller.unregister(a)
    b.send(b"x")
    # W dropped: never lazy (a writable socket would wake the next poll).
    assert poller.select(0) == []
    assert ctl(poller) == (1, 1, 1)


def test_ready_gives_fd_data_mask_and_select_equal_keys(
    poller: DeferredSelector, pair: Pair,
) -> None:
    """ready() is select() for the loop: (fd, data, mask), no SelectorKey made;
    keys are made on demand and equal to what register returned."""
    a, b = pair()
    key = poller.register(a, R, "data")
    b.send(b"x")
    assert poller.ready(0) == [(a.fileno(), "data", R)]
    assert poller.select(0) == [(key, R)]
    assert poller.get_map().get(a) == key
    assert poller.get_map().get(b) is None
    assert poller.get_map().get(b, "none") == "none"
    with pytest.raises(ValueError, match="Invalid file descriptor: -1"):
        poller.get_map().get(-1)  # as selectors' mapping (3.13's _remove_reader)
    assert poller.get_key(a.fileno()).fileobj is a  # the file object, not the fd


def test_common_state_costs_no_state_entry(poller: DeferredSelector, pair: Pair) -> None:
    """A connection's usual state (owned, reading, kernel told) is implied by
    its registration: the state table holds entries only for the others,
    one dict entry less per idle connection (tests/test_memory.py)."""
    fds = []
    for _ in range(3):
        a, _b = pair()
        poller.own(a.fileno())
        poller.register(a.fileno(), R)
        fds.append(a.fileno())
    poller.select(0)
    assert poller._state == {}
    poller.unregister(fds[0])  # lazily kept: owned, applied R, not wanted
    poller.modify(fds[1], R | W)
    poller.select(0)
    assert sorted(poller._state) == sorted(fds[:2])
    poller.register(fds[0], R)  # back to the usual state, no system call
    poller.modify(fds[1], R)
    poller.select(0)
    assert poller._state == {}
    for fd in fds:
        poller.unregister(fd)
        poller.release(fd)
    assert (poller._state, poller._data) == ({}, {})


def test_owned_write_removal_is_sent_at_the_flush(poller: DeferredSelector, pair: Pair) -> None:
    a, _ = pair()
    poller.own(a.fileno())
    poller.register(a, R | W)
    poller.modify(a, R)
    assert poller.select(0) == []
    assert ctl(poller) == (1, 1, 0)


def test_lazy_read_removal_keeps_writes_flowing(poller: DeferredSelector, pair: Pair) -> None:
    """R|W -> W on an owned fd: lazy, W events still arrive; an R event
    nobody wants sends one MOD and is not reported."""
    a, b = pair()
    poller.own(a.fileno())
    poller.register(a, R | W)
    key = poller.modify(a, W)
    assert poller.select(0) == [(key, W)]
    assert ctl(poller) == (1, 0, 0)
    b.send(b"x")
    assert poller.select(0) == [(key, W)]
    assert ctl(poller) == (1, 1, 0)
    assert poller.select(0) == [(key, W)]
    assert ctl(poller) == (1, 1, 0)


# -- unregister + register before the flush -----------------------------------


def test_pause_resume_same_socket_costs_nothing(poller: DeferredSelector, pair: Pair) -> None:
    """unregister + register of an owned fd before the flush sends no epoll_ctl."""
    a, b = pair()
    poller.own(a.fileno())
    poller.register(a, R, "first")
    poller.unregister(a)
    key = poller.register(a, R, "second")
    assert poller.select(0) == []
    assert ctl(poller) == (1, 0, 0)
    b.send(b"x")
    assert poller.select(0) == [(key, R)]
    assert ctl(poller) == (1, 0, 0)
    assert poller.stats.events == 1


def test_pause_resume_with_other_events_is_one_mod(poller: DeferredSelector, pair: Pair) -> None:
    """unregister + register of an owned fd for other events is one MOD at the flush."""
    a, _ = pair()
    poller.own(a.fileno())
    poller.register(a, R)
    poller.unregister(a)
    key = poller.register(a, W)
    assert ctl(poller) == (1, 0, 0)
    assert poller.select(0) == [(key, W)]
    assert ctl(poller) == (1, 1, 0)


def test_pause_resume_then_pause_again_is_one_del(poller: DeferredSelector, pair: Pair) -> None:
    """unregister, register, unregister of an owned fd before the flush is a single DEL."""
    a, b = pair()
    poller.own(a.fileno())
    poller.register(a, R)
    poller.unregister(a)
    poller.register(a, R)
    poller.unregister(a)
    b.send(b"x")
    assert poller.select(0) == []
    assert ctl(poller) == (1, 0, 1)


def test_release_applies_the_pending_removal(poller: DeferredSelector, pair: Pair) -> None:
    """release() before close sends the deferred DEL while the fd is still open."""
    a, _ = pair()
    poller.own(a.fileno())
    poller.register(a, R)
    poller.unregister(a)
    assert ctl(poller) == (1, 0, 0)
    poller.release(a.fileno())
    assert ctl(poller) == (1, 0, 1)
    assert poller.pending_changes == 0
    poller.release(a.fileno())  # idempotent
    assert ctl(poller) == (1, 0, 1)


def test_reregister_int_fd_is_applied(poller: DeferredSelector, pair: Pair) -> None:
    """unregister + register of a plain int fd is sent to the kernel, and events still arrive."""
    a, b = pair()
    fd = a.fileno()
    poller.register(fd, R)
    poller.unregister(fd)
    key = poller.register(fd, R)
    assert sum(ctl(poller)) >= 2  # the re-register was not deferred
    assert poller.select(0) == []
    b.send(b"x")
    assert poller.select(0) == [(key, R)]
    assert poller.stats.events == 1


@pytest.mark.parametrize(
    ("first", "second"),
    [("object", "object"), ("object", "int"), ("int", "int"), ("int", "object")],
)
def test_reused_fd_number_reports_the_new_socket(
    poller: DeferredSelector, pair: Pair, first: str, second: str
) -> None:
    """A closed socket's fd number reused by a new socket in the same iteration still works."""
    a, _a_peer = pair()
    number = a.fileno()
    poller.register(a if first == "object" else number, R)
    poller.unregister(a if first == "object" else number)
    a.close()
    b, b_peer = pair()
    if b.fileno() != number:
        pytest.skip(f"the new socket got fd {b.fileno()}, not {number}")
    key = poller.register(b if second == "object" else number, R)
    assert poller.select(0) == []
    b_peer.send(b"x")
    assert poller.select(0) == [(key, R)]
    assert poller.stats.events == 1
    assert poller.stats.epoll_ctl_del == 1  # sent before the close: nobody owned a


@pytest.mark.parametrize("events", [R, R | W])
def test_reused_fd_number_with_wrapped_epoll_selector(pair: Pair, events: int) -> None:
    """A reused fd number works when the DeferredSelector wraps a stdlib EpollSelector."""
    p = DeferredSelector(selectors.EpollSelector())
    try:
        a, _a_peer = pair()
        number = a.fileno()
        p.register(a, R)
        p.unregister(a)
        a.close()
        b, b_peer = pair()
        if b.fileno() != number:
            pytest.skip(f"the new socket got fd {b.fileno()}, not {number}")
        key = p.register(b, events)
        b_peer.send(b"x")
        assert p.select(0) == [(key, events)]  # b is readable and writable
    finally:
        p.close()


# -- closed and dup'd descriptors ------------------------------------------------


@pytest.mark.parametrize("as_int", [False, True], ids=["pipe", "fd"])
def test_del_of_closed_fd_is_ignored(poller: DeferredSelector, as_int: bool) -> None:
    """A DEL pending for an fd closed in the meantime does not raise."""
    r, w = os.pipe()
    rfile = open(r, "rb", buffering=0)
    try:
        target: Any = r if as_int else rfile
        poller.register(target, R)
        poller.unregister(target)
    finally:
        rfile.close()
        os.close(w)
    assert poller.select(0) == []
    assert ctl(poller) == (1, 0, 1)
    assert len(poller.get_map()) == 0


@pytest.mark.parametrize("number_reused", [False, True], ids=["number-free", "number-reused"])
def test_stray_events_from_dup_rebuild_the_epoll_set(
    epoll: DeferredSelector, pair: Pair, number_reused: bool
) -> None:
    """A dup keeping a removed, closed fd's registration alive is cleared, other fds survive."""
    a, a_peer = pair()
    c, c_peer = pair()
    idle, _ = pair()
    epoll.register(a, R)
    key_c = epoll.register(c, R)
    # max_events is the number of keys: the idle key leaves room for the stray.
    epoll.register(idle, R)
    a_peer.send(b"x")
    c_peer.send(b"y")
    number = a.fileno()
    dup = os.dup(number)
    try:
        # An owner that breaks its promise: closes without release(), so the
        # deferred DEL can no longer name the file that dup keeps open.
        epoll.own(number)
        epoll.unregister(a)
        a.close()
        if number_reused:
            e, _ = pair()  # an unwatched socket now has a's number
            if e.fileno() != number:
                pytest.skip(f"the new socket got fd {e.fileno()}, not {number}")
        assert epoll.select(0) == [(key_c, R)]
        # ADD a, c, idle; the flush keeps a's reading interest (lazy
        # removal), the event for it sends the DEL, which fails; the
        # rebuilt epoll set gets c and idle again.
        assert ctl(epoll) == (5, 0, 1)
        for _ in range(3):
            assert epoll.select(0) == [(key_c, R)]
        assert ctl(epoll) == (5, 0, 1)
        assert epoll.stats.events == 4
        assert epoll.stats.poll_waits == 4
    finally:
        os.close(dup)
    c.recv(1)
    assert epoll.select(0) == []


def test_dup_then_reuse_by_registered_socket(epoll: DeferredSelector, pair: Pair) -> None:
    """A new socket on a dup'd, closed fd's number is not reported ready by the old file."""
    a, a_peer = pair()
    epoll.register(a, R)
    a_peer.send(b"x")
    number = a.fileno()
    dup = os.dup(number)
    try:
        epoll.unregister(a)
        a.close()
        b, b_peer = pair()
        if b.fileno() != number:
            pytest.skip(f"the new socket got fd {b.fileno()}, not {number}")
        key = epoll.register(b, R)
        assert epoll.select(0) == []  # b has nothing to read
        b_peer.send(b"z")
        assert epoll.select(0) == [(key, R)]
    finally:
        os.close(dup)


def test_deferred_change_on_closed_fd_is_ignored(epoll: DeferredSelector) -> None:
    """A deferred MOD of an fd closed while registered is dropped quietly, like stock."""
    r, w = os.pipe()
    os.close(w)
    epoll.register(r, R)
    epoll.modify(r, R | W)
    os.close(r)
    seen: list[tuple[int, BaseException]] = []
    epoll.on_error = lambda fd, exc: seen.append((fd, exc))
    assert epoll.select(0) == []
    assert seen == []
    assert ctl(epoll) == (1, 1, 0)  # one ADD, one refused MOD, no retry


class _FullEpoll(EpollBackend):
    """An epoll whose MOD fails as when max_user_watches is exhausted."""

    def modify(self, fd: int, mask: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_refused_deferred_change_goes_to_on_error() -> None:
    """A deferred MOD refused for a real reason reaches on_error, or raises without one."""
    poller = DeferredSelector(_FullEpoll())
    r, w = os.pipe()
    try:
        poller.register(r, R)
        poller.modify(r, R | W)
        seen: list[tuple[int, BaseException]] = []
        poller.on_error = lambda fd, exc: seen.append((fd, exc))
        poller.select(0)
        assert [(fd, exc.errno) for fd, exc in seen] == [(r, errno.ENOSPC)]
        poller.on_error = None
        poller.modify(r, R)
        poller.modify(r, R | W)
        with pytest.raises(OSError) as info:
            poller.select(0)
        assert info.value.errno == errno.ENOSPC
    finally:
        poller.close()
        os.close(r)
        os.close(w)


# -- EPERM: always-ready files -------------------------------------------------


@pytest.fixture(params=["regular-file", "dev-null"])
def always_ready(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    """A file object or fd epoll refuses with EPERM."""
    if request.param == "regular-file":
        path = tmp_path / "data"
        path.write_bytes(b"contents")
        with open(path, "rb") as f:
            yield f
    else:
        fd = os.open(os.devnull, os.O_RDONLY)
        try:
            yield fd
        finally:
            os.close(fd)


def test_eperm_file_is_always_ready(epoll: DeferredSelector, pair: Pair, always_ready: Any) -> None:
    """A file epoll refuses is registered without error and ready on every poll, never blocking."""
    a, _ = pair()
    epoll.register(a, R)  # not ready: would block select(None) alone
    key = epoll.register(always_ready, R)
    assert epoll.stats.always_ready_fds == 1
    assert epoll.get_key(always_ready) == key
    assert epoll.select(None) == [(key, R)]
    assert epoll.select(30) == [(key, R)]
    assert epoll.stats.events == 2
    assert epoll.stats.poll_waits == 2
    assert ctl(epoll) == (2, 0, 0)  # the refused ADD was one syscall

    assert epoll.unregister(always_ready) == key
    assert epoll.select(0) == []
    assert ctl(epoll) == (2, 0, 0)  # nothing to DEL: the kernel never held it
    assert epoll.stats.events == 2


def test_eperm_file_reports_its_current_events(epoll: DeferredSelector, always_ready: Any) -> None:
    """modify() of an always-ready file changes what it reports, without any epoll_ctl."""
    epoll.register(always_ready, R)
    key = epoll.modify(always_ready, R | W)
    assert epoll.select(None) == [(key, R | W)]
    assert ctl(epoll) == (1, 0, 0)
    assert epoll.stats.always_ready_fds == 1


# -- waiting --------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [1e-9, 1e-6, 0.0004, 0, -1])
def test_tiny_or_negative_timeout_returns_empty(
    poller: DeferredSelector, pair: Pair, timeout: float,
) -> None:
    """A tiny positive, zero or negative timeout does not raise and returns []."""
    a, _ = pair()
    poller.register(a, R)
    assert poller.select(timeout) == []
    assert poller.stats.poll_waits == 1
    assert poller.stats.events == 0


def test_events_counts_ready_pairs_filtered_by_interest(
    poller: DeferredSelector, pair: Pair,
) -> None:
    """select() reports each ready fd once, masked by its interest; events counts the pairs."""
    a, a_peer = pair()
    c, _ = pair()
    e, _ = pair()
    poller.register(a, R)  # readable and writable, wants only R
    poller.register(c, R | W)  # only writable
    poller.register(e, R)  # nothing
    a_peer.send(b"x")
    ready = poller.select(0)
    assert by_fd(ready) == sorted([(a.fileno(), R), (c.fileno(), W)])
    assert poller.stats.events == 2
    assert poller.stats.poll_waits == 1


@pytest.mark.parametrize("name", ["epoll", "poll", "select"])
def test_select_none_blocks_until_ready(pair: Pair, name: str) -> None:
    """select(None) waits for an event; it never returns an empty list."""
    p = BACKENDS[name]()
    a, b = pair()
    key = p.register(a, R)
    results: list[list[tuple[selectors.SelectorKey, int]]] = []
    waiter = threading.Thread(target=lambda: results.append(p.select(None)))
    try:
        waiter.start()
        # Proving a wait needs a bounded pause; the event that ends it is the send.
        waiter.join(0.3)
        still_waiting = waiter.is_alive()
        b.send(b"x")
        waiter.join()
        assert still_waiting
        assert results == [[(key, R)]]
        assert p.stats.poll_waits == 1
    finally:
        p.close()


# -- ready_readers, the selector loop's wait, against ready() ----------------------

#: What a test does to one fd before the wait, on both pollers alike.
_FD_SETUPS = ("common", "common+paused", "read", "write", "both", "unregistered-owned", "file")


@bounded(60)
@given(setups=st.lists(st.tuples(st.sampled_from(_FD_SETUPS),
                                 st.sampled_from(("idle", "data", "hang-up"))),
                       min_size=1, max_size=8))
def test_ready_readers_delivers_what_ready_does(setups: list[tuple[str, str]]) -> None:
    """ready_readers() (the selector loop's wait: a COMMON fd's input event
    appends its reader alone) reports what ready() does, with the same
    kernel calls, state and event count afterwards, for fds in every state
    the table knows (owned and reading; reading lazily removed; unowned;
    writing; both; a file), idle, readable or hung up."""
    fast, general = DeferredSelector(), DeferredSelector()
    socks: list[socket.socket] = []
    readers: dict[int, object] = {}
    files: list[Any] = []
    try:
        for setup, peer in setups:
            if setup == "file":  # epoll refuses a regular file: always ready
                files.append(tempfile.TemporaryFile())
                for p in (fast, general):
                    p.register(files[-1], R, (None, None))
                continue
            a, b = socket.socketpair()
            socks += (a, b)
            fd = a.fileno()
            readers[fd] = reader = object()
            for p in (fast, general):
                if setup != "read":
                    p.own(fd)
                if setup in ("common", "common+paused", "read", "unregistered-owned"):
                    p.register(a, R, (reader, None))
                elif setup == "write":
                    p.register(a, W, (None, "writer"))
                else:
                    p.register(a, R | W, (reader, "writer"))
                if setup == "common+paused":
                    p.modify(a, R | W, (reader, "writer"))
                    p.modify(a, R, (reader, None))
                if setup == "unregistered-owned":
                    p.flush()
                    p.unregister(a)  # lazily kept in the kernel: an unwanted event
            if peer == "data":
                b.send(b"x")
            elif peer == "hang-up":
                b.close()
        found: list[object] = []
        rest = fast.ready_readers(0, found)
        by_reader = {id(reader): fd for fd, reader in readers.items()}
        got = sorted([(by_reader[id(r)], R) for r in found]
                     + [(fd, mask) for fd, _, mask in rest])
        ready = {fd: (data, mask) for fd, data, mask in general.ready(0)}
        assert got == sorted((fd, mask) for fd, (_, mask) in ready.items())
        assert all(data == ready[fd][0] for fd, data, _ in rest)
        assert ctl(fast) == ctl(general)
        assert fast.stats.events == general.stats.events
        assert fast._state == general._state
    finally:
        fast.close()
        general.close()
        for sock in [*socks, *files]:
            sock.close()


# -- a transport's socket: its start and its close in one step each -----------------

def _kernel_holds(p: DeferredSelector, fd: int) -> bool:
    """Whether the epoll set holds *fd* (a MOD of an fd it lacks: ENOENT)."""
    try:
        p._epoll.modify(fd, 0)
    except FileNotFoundError:
        return False
    p._epoll.modify(fd, select.EPOLLIN)  # back to the only mask these tests give it
    return True


@pytest.mark.parametrize("setup", ["fresh", "registered-writer", "paused", "fileobj",
                                   "writer-round-trip"])
def test_a_transports_start_and_close_match_the_general_route(pair: Pair, setup: str) -> None:
    """set_callback() of a fresh owned fd (one ADD: COMMON at once) and
    release_reader() of a COMMON fd (one DEL) leave the table, the kernel and
    the counters as own/register and clear_callback/release do; any other
    fd takes the general route inside them."""
    fast, general = DeferredSelector(), DeferredSelector()
    a, b = pair()
    fd = a.fileno()
    target = a if setup == "fileobj" else fd
    reader, writer = object(), object()
    try:
        fast.own(fd)
        general.own(fd)
        if setup == "registered-writer":
            fast.set_callback(fd, 1, writer)
            general.register(fd, W, (None, writer))
        fast.set_callback(target, 0, reader)
        if setup == "registered-writer":
            general.set_callback(fd, 0, reader)
        else:
            general.register(target, R, (reader, None))
        if setup == "paused":  # reading dropped, lazily: not COMMON at the close
            for p in (fast, general):
                p.clear_callback(fd, 0)
                p.flush()
            fast.set_callback(fd, 0, reader)  # the kernel still holds it: not fresh
            general.register(fd, R, (reader, None))
            for p in (fast, general):
                p.clear_callback(fd, 0)
        assert (fast._state, fast._data, fast._fileobjs) == (
            general._state, general._data, general._fileobjs)
        assert ctl(fast) == ctl(general)
        assert _kernel_holds(fast, fd) == _kernel_holds(general, fd) == True  # noqa: E712
        b.send(b"x")
        assert fast.ready(0) == general.ready(0)
        if setup == "writer-round-trip":  # COMMON again, but dirty until the flush
            for p in (fast, general):
                p.set_callback(fd, 1, writer)
                p.clear_callback(fd, 1)
            assert fast.pending_changes == 1

        removed = fast.release_reader(fd)
        expected = general.clear_callback(fd, 0)
        general.release(fd)
        if setup == "paused":  # nothing registered: clear_callback finds nothing
            assert (removed, expected) == (None, MISSING)
        else:
            assert removed is expected is reader
        assert (fast._state, fast._data, fast._fileobjs, fast._table.dirty) == (
            general._state, general._data, general._fileobjs, general._table.dirty)
        assert ctl(fast) == ctl(general)
        assert _kernel_holds(fast, fd) == _kernel_holds(general, fd)
    finally:
        fast.close()
        general.close()


def test_a_refused_add_of_a_fresh_fd_takes_the_general_route(tmp_path: Any) -> None:
    """set_callback() makes a fresh fd COMMON before its ADD; when the kernel
    refuses it (epoll's EPERM for a regular file, edge 5), the fd is fresh
    again and register() decides, as it does for an fd own() and
    register() were called on."""
    fast, general = DeferredSelector(), DeferredSelector()
    with open(tmp_path / "file", "wb") as file:
        fd = file.fileno()
        reader = object()
        try:
            for p in (fast, general):
                p.own(fd)
            fast.set_callback(fd, 0, reader)
            general.register(fd, R, (reader, None))
            assert (fast._state, fast._data, fast._always_ready) == (
                general._state, general._data, general._always_ready)
            assert fd in fast._always_ready
            assert fast.ready(0) == general.ready(0)
        finally:
            fast.close()
            general.close()


def test_a_transports_socket_costs_one_add_and_one_del(pair: Pair) -> None:
    """The common case's kernel calls and table entries: an ADD at the
    start, no state entry while reading, a DEL at the close, nothing left."""
    p = DeferredSelector()
    a, _ = pair()
    fd = a.fileno()
    try:
        p.own(fd)
        reader = object()
        assert p.set_callback(fd, 0, reader) is None
        assert ctl(p) == (1, 0, 0)
        assert fd not in p._state and p._data[fd] == (reader, None)
        assert p.release_reader(fd) is reader
        assert ctl(p) == (1, 0, 1)
        assert fd not in p._state and fd not in p._data and not p.pending_changes
        assert not _kernel_holds(p, fd)
    finally:
        p.close()
