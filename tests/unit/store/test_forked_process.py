"""What a lane asks of the storage process the listener forked (:class:`lanes._Forked`): the
same answers as a ``Popen`` gives, from a real forked child."""

from __future__ import annotations

import os
import threading
import time

from broker.store.lanes import _Forked


def _child(code: int, wait_for: int | None = None) -> int:
    pid = os.fork()
    if pid == 0:
        if wait_for is not None:
            os.read(wait_for, 1)
        os._exit(code)
    return pid


def test_poll_is_none_while_it_runs_then_its_exit_code() -> None:
    r, w = os.pipe()
    try:
        process = _Forked(_child(3, wait_for=r))
        assert process.poll() is None
        os.write(w, b"x")
        assert process.wait() == 3
        assert process.poll() == 3
    finally:
        os.close(r)
        os.close(w)


def test_a_poll_during_a_wait_on_another_thread_does_not_block() -> None:
    r, w = os.pipe()
    try:
        process = _Forked(_child(0, wait_for=r))
        waiter = threading.Thread(target=process.wait)
        waiter.start()
        while not process._lock.locked():
            time.sleep(0.001)
        assert process.poll() is None  # returns at once: the waiter holds the lock
        os.write(w, b"x")
        waiter.join(timeout=10)
        assert not waiter.is_alive()
        assert process.poll() == 0
    finally:
        os.close(r)
        os.close(w)


def test_one_reaped_elsewhere_has_ended() -> None:
    pid = _child(0)
    os.waitpid(pid, 0)
    assert _Forked(pid).poll() == -1
