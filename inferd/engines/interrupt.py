"""Engine processes that a terminal's Ctrl-C does not reach.

Ctrl-C in a terminal sends SIGINT to every process of the foreground process
group: the replica and the engine processes it started (vLLM's engine core
and its workers). The engine core then stops at once, aborting what is in
flight, while the replica has only begun to drain; the replica then logs an
`EngineDeadError` traceback and its in-flight requests fail. The replica
stops its engine itself once it has drained (vLLM's shutdown: SIGTERM), so
the engine processes need not hear the SIGINT at all.

A blocked signal stays blocked across fork and exec: the processes started
while SIGINT is blocked in the starting thread (and their children) never
receive it. A handler they install does not unblock it. One thing does:
multiprocessing's resource tracker, launched on first use, unblocks SIGINT
in the thread that launches it; it is launched before the block.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from multiprocessing import resource_tracker
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def start_deaf_to_interrupt(start: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`start(*args, **kwargs)` with SIGINT blocked in this thread meanwhile:
    the processes it starts inherit the block. Call it off the main thread
    (`asyncio.to_thread`): a signal that arrives meanwhile goes to a thread
    that does not block it, the main thread's handler runs as usual."""
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return start(*args, **kwargs)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
