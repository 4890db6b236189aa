"""The one restart back-off (soakd/spawn.py's ``Backoff``) the sender workers' pool and the
journal's link share: 0.25 s after a death, doubling to 30 s while the child keeps dying or
failing to start, 0.25 s again after one that lived a minute."""

from __future__ import annotations

from soakd.spawn import Backoff


def test_the_wait_doubles_while_a_child_keeps_dying_and_resets_after_a_steady_one() -> None:
    b = Backoff()
    assert [b.died(1.0) for _ in range(3)] == [0.25, 0.5, 1.0]
    assert b.failed() == 2.0  # a start that failed
    assert [b.died(59.0) for _ in range(6)] == [4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert b.failed() == 30.0
    assert b.died(60.0) == 0.25  # it lived a minute: from the start again
    assert b.delay_s == 0.25
