"""forge.lab.memo: the bounded map of recent lowerings and the lock per key, with real threads."""

import threading

import pytest

from forge.lab.memo import KeyLocks, Recent


def test_recent_keeps_the_most_recently_used_and_makes_the_rest_again():
    made = []
    recent = Recent(2)

    def get(key):
        return recent.get(key, lambda: made.append(key) or key * 10)

    assert [get(1), get(2), get(1), get(3)] == [10, 20, 10, 30]  # 1 was used again, so 2 is the one to go
    assert 1 in recent and 3 in recent and 2 not in recent and len(recent) == 2
    assert get(2) == 20 and made == [1, 2, 3, 2]
    with pytest.raises(ValueError, match="Invalid size"):
        Recent(0)


def test_one_key_held_does_not_block_another_and_locks_go_when_free():
    locks = KeyLocks()
    inside, release, other_done = threading.Event(), threading.Event(), threading.Event()

    def hold_a():
        with locks.hold("a"):
            inside.set()
            release.wait(60)

    t = threading.Thread(target=hold_a)
    t.start()
    assert inside.wait(60)
    with locks.hold("b"):  # another key: at once
        other_done.set()
    assert other_done.is_set() and len(locks) == 1
    waiter_in = threading.Event()

    def wait_a():
        with locks.hold("a"):
            waiter_in.set()

    w = threading.Thread(target=wait_a)
    w.start()
    assert not waiter_in.wait(0.2)  # the same key waits for its holder
    release.set()
    t.join(60)
    w.join(60)
    assert waiter_in.is_set() and len(locks) == 0
