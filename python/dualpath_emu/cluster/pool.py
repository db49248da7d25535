"""Capacities handed out in FIFO order: a node's DRAM buffer, a GPU's HBM for KV (:class:`Pool`)."""

from __future__ import annotations

from collections import deque

from dualpath_emu.cluster.observations import PoolCapacity, PoolGive, PoolTake
from dualpath_emu.runtime.engine import Outbox, Then

__all__ = ["Pool"]


class Pool:
    """A capacity in bytes granted in FIFO order (:meth:`acquire`, :meth:`release`), every grant observed."""

    def __init__(self, out: Outbox, name: str, capacity: int) -> None:
        self.out, self.name, self.capacity, self.free = out, name, capacity, capacity
        self._waiting: deque[tuple[int, int, Then]] = deque()
        self._announced = False

    def announce(self) -> None:
        """Observe this pool's capacity (done on first use; again by an engine restarted empty)."""
        self._announced = True
        self.out.observe(PoolCapacity(self.name, self.capacity))

    def acquire(self, now: int, rid: int, size: int, then: Then) -> None:
        if not self._announced:  # on first use
            self.announce()
        if size > self.capacity:
            raise ValueError(f"request {rid} needs {size} B of {self.name}, whose capacity is {self.capacity} B")
        if not self._waiting and size <= self.free:  # what _take does, without a call (made per request)
            self.free -= size
            self.out.observe(PoolTake(self.name, rid, size))
            then(now)
        else:
            self._waiting.append((rid, size, then))

    def release(self, now: int, rid: int, size: int) -> None:
        self.free += size
        self.out.observe(PoolGive(self.name, rid, size))
        self._grant(now)

    def _grant(self, now: int) -> None:
        while self._waiting and self._waiting[0][1] <= self.free:
            waiter, wanted, then = self._waiting.popleft()
            self._take(waiter, wanted)
            then(now)

    def cancel(self, now: int, rid: int) -> bool:
        """Withdraw ``rid``'s waiting acquire (its request was dropped): whether one waited."""
        for index, (waiter, _, _) in enumerate(self._waiting):
            if waiter == rid:
                del self._waiting[index]
                if index == 0:
                    self._grant(now)
                return True
        return False

    def reset(self, now: int) -> int:
        """The engine holding this pool crashed: all it held is gone; returns the bytes (one give, request id -1)."""
        self._waiting.clear()
        held = self.capacity - self.free
        self.free = self.capacity
        if held:
            self.out.observe(PoolGive(self.name, -1, held))
        return held

    def _take(self, rid: int, size: int) -> None:
        self.free -= size
        self.out.observe(PoolTake(self.name, rid, size))
