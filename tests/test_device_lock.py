"""The device lock: one per device, re-entrant, and it tells who waits and who holds it."""

from __future__ import annotations

import threading

import torch

from genrec.utils.device_lock import DeviceLock, device_lock


def test_one_lock_per_device() -> None:
    assert device_lock("cpu") is device_lock(torch.device("cpu"))
    assert isinstance(device_lock("cpu"), DeviceLock)


def test_reentrant_and_checked() -> None:
    lock = DeviceLock()
    assert not lock.held() and lock.waiting() == 0
    with lock, lock:  # a thread preparing an ensemble's batch takes it once per member
        assert lock.held()
        got = threading.Event()

        def other() -> None:
            with lock:
                got.set()

        t = threading.Thread(target=other)
        t.start()
        while lock.waiting() != 1:
            threading.Event().wait(0.01)
        assert not got.is_set() and lock.held()
    t.join(10)
    assert got.is_set() and not lock.held() and lock.waiting() == 0


def test_engines_on_one_device_share_it() -> None:
    from serving_support import tiny_engine

    a, b = tiny_engine(), tiny_engine(seed=1)
    assert a.device_work() is b.device_work() is device_lock("cpu")
    assert a.scorers.capture_lock is a.searches.capture_lock is a.device_work()
