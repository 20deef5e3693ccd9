"""The poller: interest changes applied once per iteration, right before the wait.

Theory of operation
===================

asyncio's selector loop tells the kernel about every interest change at once:
``remove_reader`` is an ``EPOLL_CTL_DEL``, ``add_reader`` an ``EPOLL_CTL_ADD``,
``add_writer`` on a reading socket an ``EPOLL_CTL_MOD``.  A transport that
pauses and resumes reading in one callback, or that adds a writer and drains
its buffer before the loop polls again, pays for changes the kernel never
needed to see (HAProxy's figures for that dance are in docs/design.md); libuv
keeps a queue of changed watchers and flushes it in ``uv__io_poll`` just
before ``epoll_wait``.

This poller does the same.  For each fd its table
(:class:`~asyncio_relaxed._interest.InterestTable`, no system calls) knows two
masks:

* *wanted*: what the loop asked for (a key's ``events``), updated
  synchronously by ``register``/``modify``/``unregister`` so that ``get_key``
  and ``get_map`` (which the loop's ``add_reader`` relies on) always tell the
  truth;
* *applied*: what the kernel was last told.

A change marks the fd dirty; :meth:`select` sends the net change of every dirty
fd to the kernel, then waits.  A reader removed and added back before the next
poll costs nothing.

Lazy removal of reading interest (HAProxy's lazy updates: its 2.x pollers cut
``epoll_ctl`` from 20,078 to 66 per test).  When the only change of an owned
fd (edge 1 below) is that reading is no longer wanted, the flush does not tell
the kernel at all: the fd stays polled for input.  A keep-alive connection
that pauses reading and resumes it a few iterations later, while its peer
sends nothing, so costs no system call.  Only if an event for the unwanted
direction actually arrives is the change applied, then (one MOD or DEL, as an
eager flush would have sent, plus the wake-up that brought the event).  The
event itself is dropped: the loop only sees what is wanted.  Removing *write*
interest is never lazy: a socket whose buffer drained is writable, so the
EPOLLOUT nobody wants would arrive at the very next poll.

epoll's sharp edges, and what we do about each
----------------------------------------------

1. *Registrations belong to open files, not fd numbers.*  Closing the last
   descriptor of a file silently drops its registration, and the number can be
   handed to a new socket within the same iteration.  Worse, a registration
   whose fd is closed while a duplicate of the file lives on (a fork child,
   ``socket.dup``) can no longer be removed by number: epoll keeps reporting
   it under a number that may by then name something else.  So a removal may
   be deferred only while the fd is certainly open, and only an *owner* can
   promise that: a transport calls :meth:`DeferredSelector.own` for its socket and
   :meth:`DeferredSelector.release` right before closing it, which applies any pending
   change while the fd is still open.  Removals of owned fds are deferred
   (pause+resume in one iteration costs nothing); removals of any other fd go
   to the kernel at once, as in stock asyncio.

2. *New registrations are applied at once*, not at the flush: it is one
   syscall either way, and it keeps errors where stock asyncio raises them
   (``add_reader`` on a closed fd raises OSError immediately).  If the number
   was registered before, the new file may or may not be the one the kernel
   holds, so the change goes out as MOD falling back to ADD on ENOENT, or ADD
   falling back to MOD on EEXIST: correct whichever file the number names.

3. *DEL or MOD of a closed fd* fails with EBADF or ENOENT: the kernel already
   dropped it.  Both are ignored, as selectors' ``unregister`` ignores them
   and stock asyncio is silent when a registered fd is closed.

4. *Stray events*: if the kernel reports an fd we do not know (a registration
   kept alive by a duplicate, edge 1) and it cannot be removed, the epoll set
   is rebuilt from the wanted masks (rare, and always correct).

5. *epoll refuses regular files and /dev/null with EPERM* (they are always
   ready; stock asyncio raises PermissionError from ``add_reader``).  Such fds
   are kept out of the kernel and reported ready on every poll, with a zero
   timeout, like libuv serves what kqueue rejects with a select() thread.

Where epoll does not exist, or ``ASYNCIO_RELAXED_POLLER`` forces it, the same
bookkeeping drives a stdlib selector (kqueue, poll, select) through
:class:`~asyncio_relaxed._backends.SelectorBackend`; a stdlib selector passed to
the loop's constructor is wrapped the same way.

Here: the selectors facade (keys made only when asked), the kernel calls the
table asks for, the wait, and the recovery of edges 3-5.  The table's rules
are :mod:`asyncio_relaxed._interest`'s; the backends are
:mod:`asyncio_relaxed._backends`'.

This module knows nothing of asyncio but the selector loop's convention for a
key's data, a (reader, writer) pair (:meth:`DeferredSelector.ready_readers`);
it is tested with pipes and sockets only.
"""

from __future__ import annotations

import errno
import math
import selectors
import types
from collections.abc import Callable, Mapping
from typing import Any

from ._backends import (
    EPOLLIN,
    HAS_EXCLUSIVE,
    EpollBackend,
    SelectorBackend,
    default_backend,
    kernel_to_mask,
)
from ._interest import (
    APPLIED,
    APPLY,
    BOTH,
    COMMON,
    EXCLUSIVE,
    NOTHING,
    REMOVE,
    WANTED,
    InterestTable,
)
from ._stats import Counters

__all__ = ["EVENT_READ", "EVENT_WRITE", "MISSING", "DeferredSelector", "EpollBackend",
           "SelectorBackend", "default_backend"]

EVENT_READ = selectors.EVENT_READ
EVENT_WRITE = selectors.EVENT_WRITE
SelectorKey = selectors.SelectorKey

_MISSING: Any = object()
#: What clear_callback() returns for an fd that is not registered.
MISSING = _MISSING
# The methods whose replacement on an instance takes the loop off the
# poller's own route (see DeferredSelector.replaced).
_SELECTOR_METHODS = frozenset({"select", "ready", "ready_readers", "register", "modify",
                               "unregister", "get_key", "get_map"})
_new_key = tuple.__new__  # SelectorKey without its Python-level __new__


def _fileobj_to_fd(fileobj: Any) -> int:
    """Same rules and error texts as selectors._fileobj_to_fd."""
    if isinstance(fileobj, int):
        fd = fileobj
    else:
        try:
            fd = int(fileobj.fileno())
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"Invalid file object: {fileobj!r}") from None
    if fd < 0:
        raise ValueError(f"Invalid file descriptor: {fd}")
    return fd


#: get_map() of a closed selector: empty, and holding nothing.
_CLOSED_MAP: Mapping[Any, SelectorKey] = types.MappingProxyType({})


class _Mapping(Mapping[Any, SelectorKey]):
    """get_map(): the registered keys, looked up by fd or file object."""

    __slots__ = ("_poller",)

    def __init__(self, poller: DeferredSelector) -> None:
        self._poller = poller

    def __len__(self) -> int:
        return len(self._poller._data)

    def __getitem__(self, fileobj: Any) -> SelectorKey:
        return self._poller.get_key(fileobj)

    def get(self, fileobj: Any, default: Any = None) -> Any:
        # Read on every add_reader/remove_reader by 3.13's loop: without
        # Mapping.get's try/except around __getitem__.
        # An invalid file object raises ValueError, as selectors' does.
        poller = self._poller
        fd = poller._lookup(fileobj)
        data = poller._data.get(fd, _MISSING)
        if data is _MISSING:
            return default
        return poller._key(fd, data)

    def __iter__(self) -> Any:
        return iter(self._poller._data)


class DeferredSelector(selectors.BaseSelector):
    """A selector whose kernel updates are deferred to the next :meth:`select`.

    *backend* is an :class:`EpollBackend` or a :class:`SelectorBackend`; a
    plain stdlib selector is wrapped.  *stats* receives the counts of kernel
    calls.  ``on_error(fd, exc)`` is told about a deferred change the kernel
    refused for a reason other than the fd being closed (ENOMEM, ENOSPC).

    Per registered fd the table keeps its data and, unless it is COMMON, a
    small int; SelectorKey objects are made only when asked (get_key,
    get_map, select): a server holding 10,000 idle connections would
    otherwise keep 10,000 keys of 80 bytes.  The loop polls with
    :meth:`ready_readers` (or :meth:`ready`), which make no keys.
    """

    # Slots: the compiled loop (asyncio_relaxed._speedups) reads these by
    # offset.  BaseSelector gives instances a __dict__ for anything else.
    __slots__ = ("_always_ready", "_backend", "_closed", "_data", "_epoll", "_fileobjs",
                 "_map", "_state", "_table", "on_error", "patched", "replaced", "stats")

    #: ``replaced``: names of this selector's methods replaced on the
    #: instance (a wrapped select(): time freezers, I/O meters), and of the
    #: driving loop's (its _process_events, entered by the loop): while any
    #: is, the loop polls through select() as stock does
    #: (asyncio_relaxed._loop).  ``patched``: names of any of this class's
    #: methods replaced on the instance (tests count the calls of one): the
    #: compiled loop, which runs the bodies of a few of them itself, then
    #: calls them all.
    replaced: frozenset[str]
    patched: frozenset[str]

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SELECTOR_METHODS:
            object.__setattr__(self, "replaced", self.replaced | {name})
        if name in _METHODS:
            object.__setattr__(self, "patched", self.patched | {name})
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name)
        if name in self.replaced:
            object.__setattr__(self, "replaced", self.replaced - {name})
        if name in self.patched:
            object.__setattr__(self, "patched", self.patched - {name})

    def __init__(
        self,
        backend: EpollBackend | SelectorBackend | selectors.BaseSelector | None = None,
        *,
        stats: Counters | None = None,
    ) -> None:
        self.replaced = frozenset()
        self.patched = frozenset()
        if backend is None:
            backend = default_backend()
        elif isinstance(backend, selectors.BaseSelector):
            backend = SelectorBackend(backend)
        self._backend: EpollBackend | SelectorBackend = backend
        self.stats = stats if stats is not None else Counters()
        self.on_error: Callable[[int, BaseException], None] | None = None
        self._table = table = InterestTable()
        self._data = table.data  # registered fd -> its key's data
        self._state = table.states  # fd -> its state, when not what no entry says
        self._fileobjs: dict[int, Any] = {}  # registered fd -> file object, if not the fd
        self._always_ready: set[int] = set()  # EPERM fds (edge 5)
        self._map: Mapping[Any, SelectorKey] = _Mapping(self)
        self._closed = False
        # The epoll object for the fast path of the wait, None on other backends.
        self._epoll: Any = backend._epoll if isinstance(backend, EpollBackend) else None

    # -- introspection -------------------------------------------------

    @property
    def backend_name(self) -> str:
        return self._backend.name

    @property
    def pending_changes(self) -> int:
        """Number of fds whose interest change has not reached the kernel."""
        return len(self._table.dirty)

    def fileno(self) -> int:
        return self._backend.fileno()

    def get_map(self) -> Mapping[Any, SelectorKey]:
        return self._map

    def _lookup(self, fileobj: Any) -> int:
        if type(fileobj) is int and fileobj >= 0:
            return fileobj  # the loop's case: _fileobj_to_fd without the call
        try:
            return _fileobj_to_fd(fileobj)
        except ValueError:
            # A closed file object: find it by identity, as selectors does.
            for fd, registered in self._fileobjs.items():
                if registered is fileobj:
                    return fd
            raise

    def _key(self, fd: int, data: Any) -> SelectorKey:
        """The key of registered *fd* (a registered fd without a state is COMMON)."""
        return _new_key(
            SelectorKey,
            (self._fileobjs.get(fd, fd), fd, self._state.get(fd, COMMON) & WANTED, data),
        )

    def get_key(self, fileobj: Any) -> SelectorKey:
        fd = self._lookup(fileobj)
        data = self._data.get(fd, _MISSING)
        if data is _MISSING:
            raise KeyError(f"{fileobj!r} is not registered")
        return self._key(fd, data)

    # -- ownership (edge 1) and listeners ----------------------------------

    def own(self, fd: int) -> None:
        """Promise to call :meth:`release` before closing *fd*.

        Until then, removing *fd*'s registration is deferred to the next
        flush, so that a removal undone within the iteration costs nothing.
        """
        self._table.own(fd)

    def release(self, fd: int) -> None:
        """The owner is done with *fd* (it will close it, and read no more):
        its pending change goes to the kernel now, and changes are no longer
        deferred."""
        change = self._table.release(fd)
        if change != NOTHING:
            self._send(fd, change)

    def exclusive(self, fd: int) -> None:
        """Register *fd* with EPOLLEXCLUSIVE (where epoll has it) from now on.

        For listeners shared by processes: one connection wakes one of them.
        The kernel allows the flag on ADD only, so a change of an exclusive
        registration is sent as DEL + ADD.  Cleared by unregister().
        """
        if isinstance(self._backend, EpollBackend) and HAS_EXCLUSIVE:
            self._table.set_exclusive(fd)

    def reregister(self, fd: int) -> bool:
        """Register *fd* with the kernel anew: EPOLL_CTL_DEL, then EPOLL_CTL_ADD.

        What is polled stays the same; what changes is this epoll set's place
        among the waiters of the file: epoll adds a new registration at the
        head of the file's wait queue (add_wait_queue), so the order in which
        the file's next event wakes the epoll sets that watch it changes.
        For a listener shared by processes (accept=balanced in the loop).
        A level-triggered fd that is still ready is reported again by the
        next poll, as before.  Returns False, and sends nothing, unless the
        kernel holds exactly what is wanted for *fd* (a change pending, an
        fd epoll refused, or a backend other than epoll).
        """
        table = self._table
        if fd not in self._data or self._epoll is None or fd in table.dirty:
            return False
        if table.applied(fd) != table.wanted(fd):
            return False
        self._remove_now(fd)
        self._send(fd, APPLY)  # the ADD; errors as for any deferred change
        return True

    # -- changes --------------------------------------------------------

    def register(self, fileobj: Any, events: int, data: Any = None) -> SelectorKey:
        if not events or events & ~BOTH:
            raise ValueError(f"Invalid events: {events!r}")
        fd = self._lookup(fileobj)  # a closed file object registered: KeyError below
        if fd in self._data:
            raise KeyError(f"{fileobj!r} (FD {fd}) is already registered")
        if fileobj is not fd:
            self._fileobjs[fd] = fileobj
        if self._table.register(fd, events, data):
            try:
                self._apply(fd, events)
            except BaseException:
                self._table.forget(fd)
                self._fileobjs.pop(fd, None)
                raise
        return _new_key(SelectorKey, (fileobj, fd, events, data))

    def modify(self, fileobj: Any, events: int, data: Any = None) -> SelectorKey:
        if not events or events & ~BOTH:
            raise ValueError(f"Invalid events: {events!r}")
        fd = self._lookup(fileobj)
        if fd not in self._data:
            raise KeyError(f"{fileobj!r} is not registered")
        self._table.modify(fd, events, data)
        return self._key(fd, data)

    def unregister(self, fileobj: Any) -> SelectorKey:
        fd = self._lookup(fileobj)
        if fd not in self._data:
            raise KeyError(f"{fileobj!r} is not registered")
        fileobj = self._fileobjs.get(fd, fd)
        events, data = self._unregister(fd)
        return _new_key(SelectorKey, (fileobj, fd, events, data))

    def _unregister(self, fd: int) -> tuple[int, Any]:
        """Unregister *fd* (registered): its wanted mask and its data."""
        events, data, change = self._table.unregister(fd)
        if self._fileobjs:
            self._fileobjs.pop(fd, None)
        if fd in self._always_ready:
            self._always_ready.discard(fd)
            self._table.dirty.discard(fd)
        elif change == REMOVE:
            self._remove_now(fd)
        return events, data

    # -- the selector loop's readers and writers ------------------------------

    def set_callback(self, fileobj: Any, which: int, handle: Any) -> Any:
        """The selector loop's add_reader (*which* 0) and add_writer (1): its
        data is a (reader, writer) pair; *handle* takes slot *which*, the fd
        registered or its mask widened.  Returns the handle it replaced, or
        None.  What stock's _add_reader/_add_writer do through get_map(),
        register() and modify(), without a SelectorKey."""
        # _lookup()'s first case, the loop's, without its call.
        fd = fileobj if type(fileobj) is int and fileobj >= 0 else self._lookup(fileobj)
        data = self._data.get(fd, _MISSING)
        if data is _MISSING:
            if (not which and fileobj is fd and self._epoll is not None
                    and self._table.start_common(fd, (handle, None))):
                # A transport's new socket (owned, nothing registered, the
                # kernel holding nothing): COMMON, and one ADD.
                self.stats.epoll_ctl_add += 1
                try:
                    self._epoll.register(fd, EPOLLIN)
                except BaseException as exc:
                    # Fresh again: register() below knows what each refusal means.
                    self._table.end_common(fd, None)
                    self._table.own(fd)
                    if not isinstance(exc, OSError):
                        raise
                else:
                    return None
            self.register(fileobj, EVENT_WRITE if which else EVENT_READ,
                          (None, handle) if which else (handle, None))
            return None
        reader, writer = data
        events = self._state.get(fd, COMMON) & WANTED
        if which:
            self._table.modify(fd, events | EVENT_WRITE, (reader, handle))
            return writer
        self._table.modify(fd, events | EVENT_READ, (handle, writer))
        return reader

    def clear_callback(self, fileobj: Any, which: int) -> Any:
        """The selector loop's remove_reader (*which* 0) and remove_writer
        (1): slot *which* of *fd*'s (reader, writer) emptied, the fd
        unregistered when neither is left.  Returns the handle removed; None
        where there was none, or _MISSING where *fileobj* is not registered."""
        fd = self._lookup(fileobj)
        data = self._data.get(fd, _MISSING)
        if data is _MISSING:
            return _MISSING
        reader, writer = data
        events = self._state.get(fd, COMMON) & WANTED & ~(EVENT_WRITE if which else EVENT_READ)
        if not events:
            self._unregister(fd)
        elif which:
            self._table.modify(fd, events, (reader, None))
        else:
            self._table.modify(fd, events, (None, writer))
        return writer if which else reader

    def release_reader(self, fd: int) -> Any:
        """clear_callback(fd, 0), then release(fd): a transport's close.  A
        COMMON fd (owned, reading only, the kernel told) is dropped with one
        DEL; any other goes through those two.  Returns the reader
        removed, or None."""
        data = _MISSING if self._epoll is None else self._table.end_common(fd, _MISSING)
        if data is _MISSING:  # not COMMON, or not epoll
            removed = self.clear_callback(fd, 0)
            self.release(fd)
            return None if removed is _MISSING else removed
        reader = data[0]
        if self._fileobjs:
            self._fileobjs.pop(fd, None)
        self.stats.epoll_ctl_del += 1
        try:
            self._epoll.unregister(fd)
        except OSError as exc:
            # _send's and _remove_now's rules: a closed fd or one the
            # kernel no longer holds needs nothing; another refusal is
            # the error callback's.
            if exc.errno not in (errno.ENOENT, errno.EBADF):
                if self.on_error is None:
                    raise
                self.on_error(fd, exc)
        return reader

    def _send(self, fd: int, change: int) -> None:
        """Make the kernel hold *fd*'s wanted mask (APPLY) or nothing
        (REMOVE).  A closed fd (EBADF) has nothing to wait on (edge
        3); any other refusal is real but must not surface in an unrelated
        caller: it goes to on_error."""
        try:
            if change == REMOVE:
                self._remove_now(fd)
            else:
                self._apply(fd, self._table.wanted(fd))
        except OSError as exc:
            if exc.errno == errno.EBADF:
                return
            if self.on_error is None:
                raise
            self.on_error(fd, exc)

    def _apply(self, fd: int, mask: int) -> None:
        """Tell the kernel *mask* for *fd* now, whatever file the number names."""
        stats = self.stats
        backend = self._backend
        table = self._table
        state = table.state(fd)
        if state & EXCLUSIVE:
            if state & APPLIED:
                self._remove_now(fd)
            stats.epoll_ctl_add += 1
            backend.add(fd, mask, exclusive=True)
            table.set_applied(fd, mask)
            return
        # What the kernel holds decides the call; if it guessed wrong, the
        # number names another file than the kernel's (edge 2): the other call.
        wrong: type[OSError]
        if state & APPLIED:
            first, then, wrong = self._modify, self._add, FileNotFoundError
        else:
            first, then, wrong = self._add, self._modify, FileExistsError
        try:
            try:
                first(fd, mask)
            except wrong:
                then(fd, mask)
        except PermissionError:
            # epoll refuses files that are always ready (edge 5).
            table.set_applied(fd, 0)
            self._always_ready.add(fd)
            stats.always_ready_fds += 1
            return
        except BaseException:
            table.set_applied(fd, 0)
            raise
        table.set_applied(fd, mask)

    def _add(self, fd: int, mask: int) -> None:
        self.stats.epoll_ctl_add += 1
        self._backend.add(fd, mask)

    def _modify(self, fd: int, mask: int) -> None:
        self.stats.epoll_ctl_mod += 1
        self._backend.modify(fd, mask)

    def _remove_now(self, fd: int) -> bool:
        """Remove *fd* from the kernel: False if the kernel held nothing
        under that number (ENOENT or EBADF: closed, edge 3); any other
        refusal raises."""
        self._table.set_applied(fd, 0)
        self.stats.epoll_ctl_del += 1
        try:
            self._backend.remove(fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EBADF):
                raise
            return False
        return True

    def flush(self) -> None:
        """Send the net interest change of every dirty fd to the kernel."""
        table = self._table
        if not table.dirty:
            return
        always_ready = self._always_ready
        for fd in table.take_dirty():
            if fd in always_ready:
                continue
            change = table.change(fd, lazy=True)
            if change != NOTHING:
                self._send(fd, change)

    # -- waiting ---------------------------------------------------------

    def select(self, timeout: float | None = None) -> list[tuple[SelectorKey, int]]:
        """Apply pending changes, then wait at most *timeout* seconds (None: block)."""
        return [(self._key(fd, data), mask) for fd, data, mask in self.ready(timeout)]

    def ready(self, timeout: float | None = None) -> list[tuple[int, Any, int]]:
        """select() without keys: (fd, data, mask) per ready fd."""
        events = self._wait(timeout)
        ready = [] if events is None else self._translate(events)
        self.stats.events += len(ready)
        return ready

    def ready_readers(self, timeout: float | None,
                      readers: Any) -> list[tuple[int, Any, int]]:
        """ready() for the selector loop, whose data is a (reader, writer)
        pair: each event that is input alone on an fd in the COMMON state
        appends its reader (``data[0]``) to *readers*, in the kernel's
        order; every other event is returned as (fd, data, mask).

        A COMMON fd is owned, reading and not writing: a transport's socket,
        whose data is (its reader, None) and whose reader the transport
        cancels only by removing it, so the reader needs no check here (the
        caller skips one cancelled since, as stock's ready queue does).
        The wait is :meth:`_wait`'s; the translation is :meth:`_translate`'s
        with the COMMON case first, which a busy server's events nearly all
        are (tests/test_poller.py pins the two to the same outcome).
        """
        if self._epoll is None:
            return self.ready(timeout)
        events = self._wait(timeout)
        if not events and (events is None or not self._always_ready):
            return []  # interrupted, or nothing to deliver (nothing to count)
        datas = self._data
        states = self._state
        epollin = EPOLLIN
        rest: list[tuple[int, Any, int]] = []
        delivered = len(events)
        for fd, kmask in events:
            if kmask == epollin and fd not in states:
                try:
                    # A method call, which CPython specializes (3.11: a
                    # method descriptor with one argument), where a bound
                    # method kept in a local costs an attribute load that
                    # it does not specialize.
                    readers.append(datas[fd][0])
                    continue
                except KeyError:  # not registered: a stray
                    pass
            if not self._cut(fd, kernel_to_mask(kmask), rest.append):
                delivered -= 1
        if self._always_ready:
            for fd in self._always_ready:
                rest.append((fd, datas[fd], states.get(fd, COMMON) & WANTED))
            delivered += len(self._always_ready)
        self.stats.events += delivered
        return rest

    def _wait(self, timeout: float | None) -> list[tuple[int, int]] | None:
        """Apply pending changes, then the kernel's (fd, mask) pairs: epoll
        masks with the epoll backend, EVENT_* masks otherwise."""
        if self._table.dirty:
            self.flush()
        if self._always_ready:
            timeout = 0
        if timeout is not None:
            if timeout <= 0:
                timeout = 0
            else:
                # epoll_wait has millisecond resolution: round up so that a
                # timer due in 0.3 ms does not become a busy loop of zero waits.
                timeout = math.ceil(timeout * 1e3) * 1e-3
        self.stats.poll_waits += 1
        datas = self._data
        epoll = self._epoll
        try:
            if epoll is not None:
                return epoll.poll(-1 if timeout is None else timeout,  # type: ignore[no-any-return]
                                  len(datas) or 1)
            return self._backend.poll(timeout, max(len(datas), 1))
        except InterruptedError:
            return None

    def _translate(self, events: list[tuple[int, int]]) -> list[tuple[int, Any, int]]:
        """The kernel's pairs as (fd, data, mask), each mask cut to what is
        wanted, and the always-ready fds."""
        datas = self._data
        states = self._state
        ready: list[tuple[int, Any, int]] = []
        append = ready.append
        if self._epoll is not None:
            for fd, kmask in events:
                self._cut(fd, kernel_to_mask(kmask), append)
        else:
            for fd, mask in events:
                self._cut(fd, mask, append)
        for fd in self._always_ready:
            append((fd, datas[fd], states.get(fd, COMMON) & WANTED))
        return ready

    def _cut(self, fd: int, mask: int, append: Callable[[tuple[int, Any, int]], None]) -> bool:
        """Report (fd, data, mask & wanted), unless nothing of it is wanted
        (then False); an unwanted direction is handled first (:meth:`_unwanted`)."""
        data = self._data.get(fd, _MISSING)
        if data is _MISSING:
            self._unwanted(fd)
            return False
        events = self._state.get(fd, COMMON) & WANTED
        if mask & ~events:
            self._unwanted(fd)
            mask &= events
            if not mask:
                return False
        append((fd, data, mask))
        return True

    def _unwanted(self, fd: int) -> None:
        """The kernel reported a direction nobody wants on *fd*: a lazily
        kept reading interest (send the change now), an error or hang-up
        (reported for both directions; nothing to do when the kernel holds
        what is wanted), or a stray (edge 4)."""
        change = self._table.unwanted(fd)
        if change is None:
            self._stray(fd)
        elif change == APPLY:
            self._send(fd, change)
        elif change == REMOVE:
            try:
                removed = self._remove_now(fd)
            except OSError as exc:
                if self.on_error is None:
                    raise
                self.on_error(fd, exc)
            else:
                if not removed and isinstance(self._backend, EpollBackend):
                    # The owner broke its promise and closed the fd while a
                    # duplicate keeps the registration alive: epoll reports
                    # it under a number we cannot remove (edges 1 and 4).
                    self._rebuild()

    def _stray(self, fd: int) -> None:
        """The kernel reported an fd we no longer watch (edge 4)."""
        if not isinstance(self._backend, EpollBackend):
            return
        self._table.set_applied(fd, 0)
        try:
            self.stats.epoll_ctl_del += 1
            self._backend.remove(fd)
        except OSError:
            self._rebuild()

    def _rebuild(self) -> None:
        """Replace the epoll set with one built from the wanted masks."""
        self._backend.close()
        self._backend = EpollBackend()
        self._epoll = self._backend._epoll
        self._table.reset_applied().difference_update(self._always_ready)
        self.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._table.clear()
        self._fileobjs.clear()
        self._always_ready.clear()
        self._backend.close()
        self._map = _CLOSED_MAP  # an empty map that, unlike _Mapping, holds no selector


#: DeferredSelector's methods, whose replacement on an instance sets its
#: ``patched``.
_METHODS = frozenset(name for name, value in vars(DeferredSelector).items()
                     if callable(value) and not name.startswith("__"))
