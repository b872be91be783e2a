"""What the lab keeps in memory while it serves: a bounded map of recent values (lowered entries, by shapes and
parameter) and a lock per key (so that one slow build blocks only the requests that wait for the same kernel).

Both are thread-safe: the web app runs each request in a thread of its own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Recent(Generic[K, V]):
    """At most `size` values, the least recently used dropped first (each new size a person tries adds one)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"Invalid size: {size} (at least 1)")
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value of `key`, made (outside the lock) and kept when it is not there."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value


class KeyLocks:
    """A lock per key, made on first use and dropped when nobody holds or waits for it (bounded by the
    requests in flight, not by the keys ever seen)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[Hashable, tuple[threading.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @contextmanager
    def hold(self, key: Hashable) -> Iterator[None]:
        """Hold `key`'s lock for the block (other keys go on)."""
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)
