"""Workers room: sender processes, so one soakd can load a server past one core.

``run.workers: N`` (N > 1, or ``auto``) starts N processes that only send and time
(``child.py``); the parent keeps the one schedule, the one journal and the one registry,
and hands requests and outcomes over a socket in compact batches (``wire.py``,
``pool.py``). ``workers: 1`` sends from the parent's own loop, as soakd always did.
See docs/architecture.md, "Worker processes".
"""
