"""Interest bookkeeping: per fd, what the loop wants and what the kernel holds.

The table behind :class:`asyncio_relaxed._poller.DeferredSelector`, with no
system calls: each change says which kernel call it needs (none, now, or at
the next flush), and the poller makes the call and reports what the kernel
then holds (:meth:`InterestTable.set_applied`).

An fd's state is one small int (ints below 256 are shared objects):

* bits 0-1, *wanted*: the mask the loop asked for (a key's ``events``), 0
  when the fd is not registered;
* bits 2-3, *applied*: the mask the kernel holds, 0 when it holds none;
* bit 4, *owned*: :meth:`InterestTable.own` was called and
  :meth:`InterestTable.release` not yet (the owner promises to release the
  fd before closing it, which is what makes deferring a removal safe);
* bit 5, *exclusive*: registered with EPOLLEXCLUSIVE, which the kernel takes
  on ADD only (a change is a removal and a new registration), until the fd
  is unregistered.

Nearly every fd of a server is a connection's socket, owned by its
transport, reading, and the kernel told so: the state :data:`COMMON`.  A
registered fd in that state has no entry in ``states`` (a registered fd
without an entry is COMMON; an unregistered one without an entry is 0), so
an idle connection costs the table one dict entry, its data's, not two.
:meth:`InterestTable._store` is the one place that keeps that rule.

The rules, each a method below:

* a registration is applied at once (one system call either way, and errors
  surface where stock asyncio raises them), unless the owner's fd is still
  in the kernel from a removal not yet sent: then only a difference from
  what the kernel holds waits for the flush (:meth:`register`);
* a change of the wanted mask waits for the flush (:meth:`modify`);
* a removal waits for the flush when the fd is owned and in the kernel,
  else it is sent now (:meth:`unregister`);
* the flush sends each dirty fd's net change, except that dropping only
  reading interest from an owned fd is not sent at all (HAProxy's lazy
  updates): the kernel keeps polling it, and the change is sent only if an
  event for the unwanted direction arrives (:meth:`change`, :meth:`unwanted`);
* release applies the fd's pending change, lazy or not, while it is still
  open (:meth:`release`);
* a transport's socket starts and ends in one step each: an owned fd that
  nothing registered becomes COMMON (:meth:`start_common`), and a COMMON fd
  is unregistered and released at once (:meth:`end_common`), each the net
  of the general rules above for that case.

This module knows nothing of asyncio or of the kernel.
"""

from __future__ import annotations

from typing import Any

__all__ = ["APPLIED", "APPLIED_SHIFT", "APPLY", "BOTH", "COMMON", "EXCLUSIVE", "NOTHING", "OWNED",
           "READ", "REMOVE", "WANTED", "WRITE", "InterestTable"]

READ = 1  # selectors.EVENT_READ
WRITE = 2  # selectors.EVENT_WRITE
BOTH = READ | WRITE
WANTED = BOTH
APPLIED_SHIFT = 2
APPLIED = BOTH << APPLIED_SHIFT
OWNED = 16
EXCLUSIVE = 32
COMMON = READ | READ << APPLIED_SHIFT | OWNED


# What a change, a release or an unwanted event needs from the kernel for
# one fd (the poller makes the call):
NOTHING = 0
APPLY = 1  # register or modify to the wanted mask
REMOVE = 2  # remove the fd from the kernel


class InterestTable:
    """Wanted and applied masks per fd, the owners' promises, the dirty set.

    ``data`` (registered fd -> its key's data) and ``states`` (fd -> state,
    see the module docstring) are read directly by the poller's wait, the
    one hot path.
    """

    __slots__ = ("data", "dirty", "states")

    def __init__(self) -> None:
        self.data: dict[int, Any] = {}
        self.states: dict[int, int] = {}
        self.dirty: set[int] = set()

    def state(self, fd: int) -> int:
        """*fd*'s state: its entry, or COMMON if registered, or 0."""
        state = self.states.get(fd)
        if state is None:
            return COMMON if fd in self.data else 0
        return state

    def _store(self, fd: int, state: int) -> None:
        """Keep *fd*'s state; the entry is dropped when it says what no entry
        says (COMMON while registered, 0 otherwise).  Call it after any
        change of ``data[fd]``."""
        if state == (COMMON if fd in self.data else 0):
            self.states.pop(fd, None)
        else:
            self.states[fd] = state

    def wanted(self, fd: int) -> int:
        return self.state(fd) & WANTED

    def applied(self, fd: int) -> int:
        """The mask the kernel holds for *fd* (0: none)."""
        return (self.state(fd) & APPLIED) >> APPLIED_SHIFT

    def set_applied(self, fd: int, mask: int) -> None:
        """The kernel now holds *mask* for *fd* (0: nothing)."""
        states = self.states
        registered = fd in self.data
        state = states.get(fd)
        if state is None:
            state = COMMON if registered else 0
        state = (state & ~APPLIED) | mask << APPLIED_SHIFT
        if state == (COMMON if registered else 0):  # _store, written out: per connection
            states.pop(fd, None)
        else:
            states[fd] = state

    def owned(self, fd: int) -> bool:
        return bool(self.state(fd) & OWNED)

    def exclusive(self, fd: int) -> bool:
        return bool(self.state(fd) & EXCLUSIVE)

    def set_exclusive(self, fd: int) -> None:
        """Register *fd* with EPOLLEXCLUSIVE from now until it is unregistered."""
        self._store(fd, self.state(fd) | EXCLUSIVE)

    # -- changes ------------------------------------------------------------

    def register(self, fd: int, events: int, data: Any) -> bool:
        """Register *fd* (not registered) for *events* with *data*: whether
        the kernel must be told now (it holds nothing for the fd, or may hold
        another file), else any difference waits for the flush."""
        states = self.states
        state = states.get(fd, 0) | events  # not registered: no entry means 0
        self.data[fd] = data
        if state == COMMON:  # _store, written out: per connection
            states.pop(fd, None)
        else:
            states[fd] = state
        applied = (state & APPLIED) >> APPLIED_SHIFT
        if state & OWNED and applied:
            # Removed earlier (this iteration, or lazily kept since) and the
            # owner has not closed it: the kernel holds this very file.
            if events == applied:
                self.dirty.discard(fd)
            else:
                self.dirty.add(fd)
            return False
        return True

    def fresh(self, fd: int) -> bool:
        """*fd* is owned and nothing else: not registered, and the kernel
        holds nothing for it (a transport's new socket)."""
        return self.states.get(fd) == OWNED

    def start_common(self, fd: int, data: Any) -> bool:
        """A :meth:`fresh` fd registered for reading with *data*, the
        kernel about to be told: COMMON (whether *fd* was fresh; any other
        is left as it is).  What :meth:`register` and :meth:`set_applied`
        make of it, in one step.  Undone by :meth:`end_common`, then
        :meth:`own`, if the kernel refuses."""
        if self.states.get(fd) != OWNED:  # not fresh
            return False
        del self.states[fd]
        self.data[fd] = data
        return True

    def common(self, fd: int) -> bool:
        """*fd* is in the COMMON state (registered, no entry)."""
        return fd not in self.states and fd in self.data

    def end_common(self, fd: int, other: Any) -> Any:
        """A COMMON fd unregistered and released, the kernel about to be
        told to drop it: its data.  What :meth:`unregister`, :meth:`release`
        and :meth:`set_applied` make of it (0: no entry), in one step.  An
        fd in any other state is left as it is, and *other* returned."""
        if fd in self.states or fd not in self.data:  # not COMMON
            return other
        self.dirty.discard(fd)
        return self.data.pop(fd)

    def forget(self, fd: int) -> None:
        """Undo :meth:`register` after the kernel refused it."""
        state = self.state(fd) & ~WANTED
        del self.data[fd]
        self._store(fd, state)

    def modify(self, fd: int, events: int, data: Any) -> None:
        """*fd* (registered) now wants *events*, with *data*."""
        self.data[fd] = data
        state = self.state(fd)
        if events != state & WANTED:
            self.dirty.add(fd)
            self._store(fd, (state & ~WANTED) | events)

    def unregister(self, fd: int) -> tuple[int, Any, int]:
        """Unregister *fd* (registered): its wanted mask, its data, and
        :data:`REMOVE` if the kernel must drop it now (not owned), or
        :data:`NOTHING` (nothing held, or the removal waits for the
        flush: the owner releases before closing)."""
        states = self.states
        state = states.get(fd, COMMON)  # registered
        data = self.data.pop(fd)
        left = state & ~(WANTED | EXCLUSIVE)
        if left:  # _store, written out (not registered now): per connection
            states[fd] = left
        else:
            states.pop(fd, None)
        if state & OWNED and state & APPLIED:
            self.dirty.add(fd)
            return state & WANTED, data, NOTHING
        self.dirty.discard(fd)
        return state & WANTED, data, REMOVE if state & APPLIED else NOTHING

    def own(self, fd: int) -> None:
        """The caller promises to release *fd* before closing it."""
        states = self.states
        if fd not in states and fd not in self.data:  # unknown (a new socket): 0 | OWNED
            states[fd] = OWNED
            return
        self._store(fd, self.state(fd) | OWNED)

    def release(self, fd: int) -> int:
        """*fd* is about to be closed: what the kernel must be told now,
        while the fd is open (a lazily kept reading interest included: a
        duplicate of the file could keep the registration alive where no
        number names it any more)."""
        state = self.state(fd) & ~OWNED
        self._store(fd, state)
        self.dirty.discard(fd)
        if state & APPLIED:
            return self._needed(fd, state, lazy=False)
        return NOTHING

    def take_dirty(self) -> set[int]:
        """The fds whose change may be due, leaving none dirty."""
        dirty = self.dirty
        self.dirty = set()
        return dirty

    def change(self, fd: int, lazy: bool) -> int:
        """What to send for *fd* to make the kernel hold its wanted mask.

        With *lazy* (the flush), dropping only reading interest from an
        owned fd is not sent: the owner releases the fd before closing it,
        and an unwanted event makes it due (:meth:`unwanted`).
        """
        return self._needed(fd, self.state(fd), lazy)

    @staticmethod
    def _needed(fd: int, state: int, lazy: bool) -> int:
        wanted = state & WANTED
        applied = (state & APPLIED) >> APPLIED_SHIFT
        if wanted == applied:
            return NOTHING
        if (
            lazy
            and not wanted & ~applied  # nothing to add
            and (applied & ~wanted) == READ  # only reading dropped
            and state & OWNED
            and not state & EXCLUSIVE  # a change would be DEL + ADD anyway
        ):
            return NOTHING
        return APPLY if wanted else REMOVE

    def unwanted(self, fd: int) -> int | None:
        """The kernel reported a direction nobody wants on *fd*: the change
        to send now, or None for a stray (an fd nobody registered, or one
        whose registration the kernel should no longer hold)."""
        state = self.state(fd)
        if state & OWNED and state & APPLIED:
            # A lazily kept interest (now due), or an error or hang-up on an
            # owned fd (nothing due if the kernel holds what is wanted).
            self.dirty.discard(fd)
            return self._needed(fd, state, lazy=False)
        if not state & WANTED:
            return None
        # An error or hang-up woke both directions of a registered fd whose
        # kernel mask is what is wanted: nothing to change.
        return NOTHING

    def reset_applied(self) -> set[int]:
        """The kernel holds nothing any more (a new epoll set): every
        registered fd is dirty; returns them."""
        for fd in {*self.states, *self.data}:
            self.set_applied(fd, 0)
        self.dirty = set(self.data)
        return self.dirty

    def clear(self) -> None:
        self.data.clear()
        self.states.clear()
        self.dirty.clear()
