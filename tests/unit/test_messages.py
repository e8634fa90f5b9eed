"""Reply ids: random, 32 hex digits, never repeated by a forked child."""

from __future__ import annotations

import os

from contract.messages import new_reply_id


def test_reply_ids_are_random_hex_and_a_forked_child_draws_its_own() -> None:
    first = new_reply_id()  # the parent now holds a block of ids drawn ahead
    ids = {first, *(new_reply_id() for _ in range(600))}
    assert len(ids) == 601 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id must not be the parent's next one
        os.write(write, new_reply_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    assert child != new_reply_id() and child not in ids


def test_a_child_forked_while_a_thread_draws_ids_does_not_hang() -> None:
    """The fork hook gives the child a new lock: one a parent's thread held at the fork would
    stay held in the child for ever (the adversarial review: 20 hangs in 20 forks)."""
    import threading

    from contract import messages

    with messages._IDS.lock:  # as if another thread were drawing ids at the fork
        pid = os.fork()
        if pid == 0:
            done = threading.Event()
            threading.Thread(target=lambda: (new_reply_id(), done.set()), daemon=True).start()
            os._exit(0 if done.wait(5) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
